"""Test and benchmark helpers for sparse_mla, shipped for users' own tests too.

- `reference_prefill`: the semantics in torch (CPU or CUDA), float32 results computed in float64, the
  reference every test compares with; `relative_error` and `assert_close_to_reference`: the
  acceptance rule (norm-wise and per (row, head)), with `OUT_TOL` the contract's out tolerances on the
  benchmark distribution.
- `error_model`, `logit_error_bound`, `out_error_limits`, `default_out_tolerance`: what an FP8 kernel
  may get wrong on a given input (the logit bound per (row, head), the e4m3-P floor of out); and
  `fp8_model_prefill`, a model FP8 kernel in torch that the rule is calibrated with.
- `quantize_fp8`, `make_inputs`, `random_indices`: random FP8 inputs, with every corner of the domain;
  `poisoned_outputs`: NaN-filled preallocated outputs.
- `quantize_paged_cache`, `dequantize_paged_cache`, `random_latent`, `shuffled_block_table`,
  `paged_indices`, `reference_prefill_paged`, `engine_requantized_kv`, `requantized_rows`,
  `requantized_keys`: the serving engines' 656-byte FP8 paged cache (format, writer, exact reader,
  scattered blocks), the float64 reference over it, the engines' gather-dequantize-requantize-to-scale-1.0
  path, and the paged kernel's own requantization of each row to one scale (the keys it reads).
- `as_paged_call`, `as_read_inputs`: a contiguous call as the same call over a paged cache, and a paged
  call as the contiguous keywords over the keys the kernel reads (for the acceptance rule).
- `realistic_indices`, `index_overlap_stats`, `PRESETS`: indexer-like selections and their overlap.
- `median_time_ms`, `prefill_flops`: the benchmark protocol (L2 flushed, CUDA events, median).
- `missing_sm90_gpu`: why the kernel cannot run in this process, for scripts that skip without a GPU.
- `load_module`, `launch_with_module`, `PrefillArgs`: the package's launch plan run on a kernel module
  built from other sources (A/B benchmarks); `token_group_lists`: the tensors of the token groups'
  pre-pass alone.

Importing this module imports torch only: no tvm-ffi, no CUDA initialization, no compiler.
"""

from sparse_mla.testing.device import missing_sm90_gpu
from sparse_mla.testing.index_patterns import (
    PRESETS,
    IndexOverlap,
    index_overlap_stats,
    realistic_indices,
    shared_neighbour_indices,
    with_duplicated_groups,
    with_shared_neighbours,
)
from sparse_mla.testing.inputs import (
    FP8_E4M3_MAX,
    HOSTILE_INDICES,
    INT32_MAX,
    INT32_MIN,
    make_inputs,
    poisoned_outputs,
    quantize_fp8,
    random_indices,
)
from sparse_mla.testing.modules import PrefillArgs, launch_with_module, load_module, token_group_lists
from sparse_mla.testing.numerics import (
    ErrorModel,
    default_out_tolerance,
    error_model,
    fp8_model_prefill,
    logit_error_bound,
    out_error_limits,
)
from sparse_mla.testing.paged_cache import (
    PAGED_ROW_BYTES,
    as_paged_call,
    as_read_inputs,
    dequantize_paged_cache,
    engine_requantized_kv,
    paged_indices,
    quantize_paged_cache,
    random_latent,
    reference_prefill_paged,
    requantized_keys,
    requantized_rows,
    shuffled_block_table,
)
from sparse_mla.testing.reference import OUT_TOL, assert_close_to_reference, reference_prefill, relative_error
from sparse_mla.testing.timing import (L2_FLUSH_BYTES, interleaved_median_ms, interleaved_waiting_median_ms, median_time_ms,
                                      prefill_flops)

__all__ = [
    "FP8_E4M3_MAX",
    "HOSTILE_INDICES",
    "INT32_MAX",
    "INT32_MIN",
    "L2_FLUSH_BYTES",
    "OUT_TOL",
    "PAGED_ROW_BYTES",
    "PRESETS",
    "ErrorModel",
    "PrefillArgs",
    "IndexOverlap",
    "as_paged_call",
    "as_read_inputs",
    "assert_close_to_reference",
    "default_out_tolerance",
    "dequantize_paged_cache",
    "engine_requantized_kv",
    "error_model",
    "fp8_model_prefill",
    "index_overlap_stats",
    "interleaved_median_ms",
    "interleaved_waiting_median_ms",
    "launch_with_module",
    "load_module",
    "logit_error_bound",
    "make_inputs",
    "median_time_ms",
    "missing_sm90_gpu",
    "out_error_limits",
    "paged_indices",
    "poisoned_outputs",
    "prefill_flops",
    "quantize_fp8",
    "quantize_paged_cache",
    "random_indices",
    "random_latent",
    "realistic_indices",
    "reference_prefill",
    "reference_prefill_paged",
    "relative_error",
    "requantized_keys",
    "requantized_rows",
    "shared_neighbour_indices",
    "shuffled_block_table",
    "token_group_lists",
    "with_duplicated_groups",
    "with_shared_neighbours",
]
