"""Host overhead of one call: what a serving engine pays per prefill step outside CUDA graphs.

Times many back-to-back calls on a tiny problem (the GPU work is a few microseconds, so the host path
dominates: validation, output allocation, module lookup, the tvm-ffi call and the launch), with
library-allocated and with preallocated outputs, and the same call replayed from a CUDA graph.

    python benchmarks/overhead.py            # prints a table, writes results/overhead-<date>.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import pathlib
import time

import torch

from sparse_mla import sparse_mla_q8kv8_prefill_fwd
from sparse_mla.testing import make_inputs, poisoned_outputs

RESULTS_DIR = pathlib.Path(__file__).resolve().parent / "results"


def host_us_per_call(fn, calls: int) -> float:
    """Wall-clock microseconds per call of ``calls`` back-to-back calls, synchronized at the ends."""
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--out", type=pathlib.Path, default=RESULTS_DIR)
    args = parser.parse_args()

    inputs = make_inputs(s_q=1, s_kv=1024, h_q=16, d_qk=576, topk=64, seed=0, topk_length="random", attn_sink="random")
    buffers = poisoned_outputs(1, 16, device="cuda")
    rows = {
        "library-allocated outputs": host_us_per_call(lambda: sparse_mla_q8kv8_prefill_fwd(**inputs), args.calls),
        "preallocated outputs": host_us_per_call(lambda: sparse_mla_q8kv8_prefill_fwd(**inputs, **buffers), args.calls),
    }
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        sparse_mla_q8kv8_prefill_fwd(**inputs, **buffers)
    rows["CUDA graph replay"] = host_us_per_call(graph.replay, args.calls)

    print(f"{torch.cuda.get_device_name()}: host microseconds per call (s_q 1, h_q 16, topk 64)")
    for name, us in rows.items():
        print(f"  {name:28s} {us:7.1f} us")
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    path = args.out / f"overhead-{stamp}.json"
    path.write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "date": stamp, "us_per_call": rows}, indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
