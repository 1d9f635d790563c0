"""Capture sparse_mla in a CUDA graph, the way a serving engine runs its prefill steps.

``sparse_mla.warmup`` loads (or compiles) the kernel module before anything is captured, and one
eager call on the static buffers runs it once outside the capture; the graph is then captured, and every step copies its new inputs into those buffers and replays. The
example checks each replay against the float32 reference and times eager calls against replays.

    python examples/cuda_graph_prefill.py --s-q 512 --h-q 64

Without an SM90 GPU it says so and exits with status 0.
"""

from __future__ import annotations

import argparse
import time

import torch

import sparse_mla
from sparse_mla import sparse_mla_q8kv8_prefill_fwd
from sparse_mla.testing import assert_close_to_reference, make_inputs, missing_sm90_gpu, reference_prefill


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--s-q", type=int, default=512)
    parser.add_argument("--s-kv", type=int, default=8192)
    parser.add_argument("--h-q", type=int, default=64)
    parser.add_argument("--topk", type=int, default=2048)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    shape = dict(s_q=args.s_q, s_kv=args.s_kv, h_q=args.h_q, d_qk=576, topk=args.topk)
    reason = missing_sm90_gpu()
    if reason is not None:
        print(f"skipped: {reason}")
        return

    sparse_mla.warmup(d_qk=576, topk=args.topk)  # load the kernel before any capture
    static = make_inputs(**shape, seed=0, topk_length="random", attn_sink="random")
    out, max_logits, lse = sparse_mla_q8kv8_prefill_fwd(**static)  # one eager call on the static buffers
    torch.cuda.synchronize()

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        sparse_mla_q8kv8_prefill_fwd(**static, out=out, max_logits=max_logits, lse=lse)

    for step in range(1, args.steps + 1):
        fresh = make_inputs(**shape, seed=step, topk_length="random", attn_sink="random")
        for name, value in fresh.items():
            if isinstance(value, torch.Tensor):
                static[name].copy_(value)  # new values into the captured buffers, same addresses
        graph.replay()
        assert_close_to_reference(out, max_logits, lse, reference_prefill(**fresh), inputs=fresh, context=f"replay {step}")
        print(f"step {step}: replay matches the reference")

    for name, run in (("eager", lambda: sparse_mla_q8kv8_prefill_fwd(**static, out=out, max_logits=max_logits, lse=lse)),
                      ("graph replay", graph.replay)):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(20):
            run()
        torch.cuda.synchronize()
        print(f"{name:12s} {(time.perf_counter() - start) / 20 * 1e3:.3f} ms per step")


if __name__ == "__main__":
    main()
