"""Test and benchmark helpers for sparse_mla, shipped for users' own tests too.

- `reference_prefill`: SPEC §3 in torch (CPU or CUDA), the reference every test compares with;
  `relative_error` and `assert_close_to_reference`: the SPEC §8 acceptance rule.
- `quantize_fp8`, `make_inputs`, `random_indices`: random FP8 inputs, with every corner of the domain;
  `poisoned_outputs`: NaN-filled preallocated outputs.
- `realistic_indices`, `index_overlap_stats`, `PRESETS`: indexer-like selections and their overlap.
- `median_time_ms`, `prefill_flops`: the benchmark protocol of ANCHORS.md.

Importing this module imports torch only: no tvm-ffi, no CUDA initialization, no compiler.
"""

from sparse_mla.testing.index_patterns import PRESETS, IndexOverlap, index_overlap_stats, realistic_indices
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
from sparse_mla.testing.reference import assert_close_to_reference, reference_prefill, relative_error
from sparse_mla.testing.timing import L2_FLUSH_BYTES, median_time_ms, prefill_flops

__all__ = [
    "FP8_E4M3_MAX",
    "HOSTILE_INDICES",
    "INT32_MAX",
    "INT32_MIN",
    "L2_FLUSH_BYTES",
    "PRESETS",
    "IndexOverlap",
    "assert_close_to_reference",
    "index_overlap_stats",
    "make_inputs",
    "median_time_ms",
    "poisoned_outputs",
    "prefill_flops",
    "quantize_fp8",
    "random_indices",
    "realistic_indices",
    "reference_prefill",
    "relative_error",
]
