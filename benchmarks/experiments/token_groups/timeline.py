"""A token-grouped call's timeline: every kernel the call runs, its start and the gap before it.

Per shape (s_q 4096 or ``--s-q``, topk 2048, d_qk 576), one call after three warm-up calls and an L2 flush (the
first kernel of the trace, left out), under the CUDA profiler: each kernel of the call (the counters' zeroing, the pre-pass, the grouped launch,
the narrow launch) with its start relative to the first one, its duration and the idle time before it;
then the same call timed with CUDA events (the median of 20, the benchmark protocol), so that what the
kernels' durations leave of the call's time is the launches' gaps; the same call captured in a CUDA
graph and its replay timed so; and the CPU's time to queue one call. Prints a table and writes JSON.

    python benchmarks/experiments/token_groups/timeline.py --json timeline.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import sys
import tempfile
import time

import torch
from torch.profiler import ProfilerActivity, profile

from sparse_mla.testing import PRESETS, make_inputs, median_time_ms, realistic_indices

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # benchmarks/bench.py: no package
from bench import git_commit  # noqa: E402
from breakdown import kernel_role, warm_call  # noqa: E402  (beside this script)

HOST_CALLS = 20
SHAPES = (("realistic-glm", 8192, 32), ("realistic-glm", 8192, 16), ("realistic-glm", 8192, 8),
          ("realistic-glm", 131072, 8), ("realistic-glm", 131072, 16), ("uniform", 131072, 16),
          ("realistic-glm", 8192, 64))


def short_name(name: str) -> str:
    return kernel_role(name) if "prefill_kernel" in name else name[:40]


def timeline(inputs: dict, h_q: int) -> dict:
    call = warm_call(inputs, h_q)
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        flush.zero_()  # the CPU queues the call's launches while the flush runs, as in the timed calls
        call()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f)["traceEvents"]
    kernels = sorted((e for e in events if e.get("cat") in ("kernel", "gpu_memset")), key=lambda e: e["ts"])[1:]
    rows, t0, end = [], kernels[0]["ts"], kernels[0]["ts"]
    for e in kernels:
        rows.append(dict(kernel=short_name(e["name"]), start_us=e["ts"] - t0, us=e["dur"], gap_us=e["ts"] - end))
        end = e["ts"] + e["dur"]
    call_ms = median_time_ms(call, iters=20)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    graph_ms = median_time_ms(graph.replay, iters=20)
    torch.cuda.synchronize()
    host = time.perf_counter()
    for _ in range(HOST_CALLS):
        call()
    host_us = (time.perf_counter() - host) / HOST_CALLS * 1e6  # the CPU's time to queue one call
    torch.cuda.synchronize()
    return dict(kernels=rows, span_us=end - t0, busy_us=sum(r["us"] for r in rows), call_us=call_ms * 1e3,
                graph_us=graph_ms * 1e3, host_us=host_us)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", required=True)
    parser.add_argument("--s-q", type=int, default=4096)
    args = parser.parse_args()
    results = []
    for pattern, s_kv, h_q in SHAPES:
        inputs = make_inputs(args.s_q, s_kv, h_q, 576, 2048, seed=0)
        if pattern != "uniform":
            inputs["indices"] = realistic_indices(args.s_q, s_kv, 2048, seed=0, **PRESETS[pattern])
        row = dict(pattern=pattern, s_kv=s_kv, h_q=h_q, **timeline(inputs, h_q))
        results.append(row)
        print(f"{pattern} s_kv {s_kv} h_q {h_q}: call {row['call_us']:.1f} us (events), as a CUDA graph "
              f"{row['graph_us']:.1f}, kernels' span {row['span_us']:.1f}, busy {row['busy_us']:.1f}, "
              f"host {row['host_us']:.1f} us to queue it")
        for k in row["kernels"]:
            print(f"  {k['kernel']:40s} start {k['start_us']:8.1f}  {k['us']:8.1f} us  gap before {k['gap_us']:6.1f}")
    with open(args.json, "w") as f:
        json.dump(dict(gpu=torch.cuda.get_device_name(), date=datetime.datetime.now().isoformat(timespec="seconds"),
                       commit=git_commit(), s_q=args.s_q, topk=2048, rows=results), f, indent=1)


if __name__ == "__main__":
    main()
