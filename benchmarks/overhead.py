"""Host cost of one call on every launch path: what a serving loop pays per layer outside CUDA graphs.

Serving engines run prefill attention eagerly, one call per layer, so the host time of a call adds to
every step wherever the GPU does not run far enough ahead to hide it. For real shapes of every path
(wide, tail split, token groups, narrow, batch-invariant; a short and a long call each) this times,
as the median of ``--reps`` calls:

- idle: the wall clock of one call with the GPU idle (synchronized before it);
- queued: the wall clock of one call queued behind ``--queued-ms`` of GPU work (``torch.cuda._sleep``),
  and in how many of those calls that work was still running when the call returned: a call that
  waits for the GPU reads about the queued work's length here, and 0 in that column;
- paged: the same two for sparse_mla_q8kv8_paged_prefill_fwd over the engines' paged cache holding the
  same rows (`sparse_mla.testing.as_paged_call`), outputs preallocated;
- with ``--incumbent``: the same two for the incumbent's tvm-ffi entry called directly (q padded to 64
  heads where it has fewer, as serving engines pad to call it).

    python benchmarks/overhead.py --incumbent .incumbent/sglang_q8kv8.so --json overhead.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import statistics
import time
from typing import Callable, NamedTuple

import torch

from sparse_mla import sparse_mla_q8kv8_paged_prefill_fwd, sparse_mla_q8kv8_prefill_fwd
from sparse_mla.testing import PRESETS, as_paged_call, make_inputs, poisoned_outputs, realistic_indices

D_QK, TOPK, D_V = 576, 2048, 512
INCUMBENT_HEADS = 64  # the incumbent takes multiples of 64 heads


class Row(NamedTuple):
    """One measured call: the launch path the package's plan gives it on a 132-SM Hopper GPU (H100 SXM,
    H200; tests/cpu/test_plan.py checks each label against the plan), its shape, and its mode."""

    path: str
    s_q: int
    s_kv: int
    h_q: int
    batch_invariant: bool = False
    token_groups: str = "auto"  # SPARSE_MLA_TOKEN_GROUPS for the call


ROWS = (
    Row("wide", 64, 65536, 128),
    Row("wide", 4000, 32768, 128),
    Row("split", 437, 8192, 64),
    Row("split", 4096, 32768, 128),
    Row("split", 16, 65536, 16),  # a short call at few heads: split, not grouped
    Row("grouped", 16, 65536, 16, token_groups="always"),
    Row("grouped", 4096, 8192, 16),
    Row("grouped", 1024, 131072, 8),
    Row("narrow", 100, 65536, 8, token_groups="never"),
    Row("narrow", 1024, 131072, 16, token_groups="never"),
    Row("batch-invariant narrow", 16, 65536, 16, batch_invariant=True),
    Row("batch-invariant wide", 4096, 32768, 128, batch_invariant=True),
)


def sleep_cycles_for(ms: float) -> int:
    """Cycles of ``torch.cuda._sleep`` that keep the GPU busy for about ``ms`` milliseconds."""
    cycles = 1 << 20
    torch.cuda._sleep(cycles)  # the first call loads the kernel
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(cycles)
    end.record()
    end.synchronize()
    return int(cycles * ms / start.elapsed_time(end))


def host_times(call: Callable[[], object], reps: int, queued_cycles: int) -> dict:
    """Median host microseconds of one call, idle and queued behind GPU work, and the share of queued
    calls that returned while that work still ran."""
    for _ in range(3):
        call()  # loads the kernel and warms the allocator
    idle, queued, returned_early = [], [], 0
    for _ in range(reps):
        torch.cuda.synchronize()
        start = time.perf_counter()
        call()
        idle.append(time.perf_counter() - start)
    for _ in range(reps):
        torch.cuda.synchronize()
        torch.cuda._sleep(queued_cycles)
        slept = torch.cuda.Event()
        slept.record()
        start = time.perf_counter()
        call()
        queued.append(time.perf_counter() - start)
        returned_early += not slept.query()
    torch.cuda.synchronize()
    return dict(idle_us=statistics.median(idle) * 1e6, queued_us=statistics.median(queued) * 1e6,
                returned_before_work_ended=returned_early / reps)


def incumbent_call(dispatch, inputs: dict, s_kv: int) -> Callable[[], None]:
    """The incumbent's entry on ``inputs``, q padded with zero heads to a multiple of 64, into its own
    preallocated outputs (its contract: contiguous tensors, every index valid)."""
    q = inputs["q"]
    s_q, h_q, _ = q.shape
    heads = -(-h_q // INCUMBENT_HEADS) * INCUMBENT_HEADS
    if heads != h_q:
        padded = torch.zeros(s_q, heads, D_QK, dtype=q.dtype, device=q.device)
        padded[:, :h_q] = q
        q = padded
    indices = inputs["indices"].clamp(0, s_kv - 1).contiguous()
    outputs = poisoned_outputs(s_q, heads, D_V)
    stream = torch.cuda.current_stream().cuda_stream

    def call() -> None:
        dispatch(q, inputs["kv"], indices, inputs["q_scale"], inputs["kv_scale"], outputs["out"],
                 outputs["max_logits"], outputs["lse"], s_q, s_kv, heads, 1, D_QK, D_V, TOPK, inputs["sm_scale"],
                 stream)
    return call


def measure(row: Row, reps: int, queued_cycles: int, dispatch) -> dict:
    inputs = make_inputs(row.s_q, row.s_kv, row.h_q, D_QK, TOPK, seed=0)
    inputs["indices"] = realistic_indices(row.s_q, row.s_kv, TOPK, **PRESETS["realistic-glm"], seed=0)
    os.environ["SPARSE_MLA_TOKEN_GROUPS"] = row.token_groups  # read by every call
    result = dict(row._asdict())
    result["ours"] = host_times(
        lambda: sparse_mla_q8kv8_prefill_fwd(**inputs, batch_invariant=row.batch_invariant), reps, queued_cycles)
    outputs = poisoned_outputs(row.s_q, row.h_q, D_V)
    result["ours_preallocated"] = host_times(
        lambda: sparse_mla_q8kv8_prefill_fwd(**inputs, **outputs, batch_invariant=row.batch_invariant), reps,
        queued_cycles)
    paged, paged_outputs = as_paged_call(inputs), poisoned_outputs(row.s_q, row.h_q, D_V)
    result["paged_preallocated"] = host_times(
        lambda: sparse_mla_q8kv8_paged_prefill_fwd(**paged, **paged_outputs, batch_invariant=row.batch_invariant),
        reps, queued_cycles)
    if dispatch is not None:
        result["incumbent"] = host_times(incumbent_call(dispatch, inputs, row.s_kv), reps, queued_cycles)
    del os.environ["SPARSE_MLA_TOKEN_GROUPS"]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=50, help="calls timed per row and condition (median)")
    parser.add_argument("--queued-ms", type=float, default=2.0, help="GPU work queued ahead of each queued call")
    parser.add_argument("--incumbent", type=pathlib.Path, metavar="SO",
                        help="tvm-ffi module of the incumbent kernel, timed on the same rows")
    parser.add_argument("--json", type=pathlib.Path, help="write every row here")
    args = parser.parse_args()

    dispatch = None
    if args.incumbent:
        import tvm_ffi

        dispatch = tvm_ffi.load_module(str(args.incumbent))["dispatch"]
    cycles = sleep_cycles_for(args.queued_ms)
    results = [measure(row, args.reps, cycles, dispatch) for row in ROWS]

    print(f"{torch.cuda.get_device_name()}: host us per call, median of {args.reps}; queued: behind "
          f"{args.queued_ms:g} ms of GPU work, 'early': share of those calls that returned before it ended")
    columns = ("ours", "ours_preallocated", "paged_preallocated") + (("incumbent",) if dispatch is not None else ())
    print(f"{'path':<24}{'s_q':>6}{'s_kv':>8}{'h_q':>5}" + "".join(f"{c + ' idle/queued/early':>36}" for c in columns))
    for r in results:
        cells = "".join(f"{r[c]['idle_us']:>16.1f}{r[c]['queued_us']:>12.1f}{r[c]['returned_before_work_ended']:>8.2f}"
                        for c in columns)
        print(f"{r['path']:<24}{r['s_q']:>6}{r['s_kv']:>8}{r['h_q']:>5}" + cells)
    if args.json:
        meta = dict(gpu=torch.cuda.get_device_name(), date=datetime.datetime.now().isoformat(timespec="seconds"),
                    reps=args.reps, queued_ms=args.queued_ms, incumbent=str(args.incumbent or ""))
        args.json.write_text(json.dumps(dict(meta, rows=results), indent=1) + "\n")


if __name__ == "__main__":
    main()
