"""DeepSeek-V3.2 sparse-attention prefill with sparse_mla: quantize, run, check, time.

The attention step of DeepSeek-V3.2's prefill at its real shape: 128 query heads attend, through a
576-wide latent (512 "nope" + 64 "rope" columns, the first 512 doubling as the value), to the 2048 KV
rows the indexer picked per token. bf16 q and kv are quantized to FP8 with one scale per tensor, the
kernel runs, its output is compared (on the first query rows) with two float32 references:

- on the dequantized FP8 inputs: what the kernel itself controls (`docs/numerics.md`
  gives the bound);
- on the exact bf16 inputs: that plus the FP8 quantization of q and kv (about 4e-2).

Then it is timed as the benchmarks are (``sparse_mla.testing.median_time_ms``: L2 flushed before each
call, CUDA events, median).

    python examples/deepseek_v32_prefill.py                  # s_q 4096, s_kv 32768
    python examples/deepseek_v32_prefill.py --s-kv 131072 --iters 50

Without an SM90 GPU it says so and exits with status 0.
"""

from __future__ import annotations

import argparse
import math

import torch

from sparse_mla import sparse_mla_q8kv8_prefill_fwd
from sparse_mla.testing import (
    median_time_ms,
    missing_sm90_gpu,
    prefill_flops,
    quantize_fp8,
    random_indices,
    reference_prefill,
    relative_error,
)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--s-q", type=int, default=4096, help="query tokens in this prefill chunk")
    parser.add_argument("--s-kv", type=int, default=32768, help="tokens in the latent KV cache")
    parser.add_argument("--h-q", type=int, default=128, help="query heads")
    parser.add_argument("--d-qk", type=int, default=576, choices=(512, 576))
    parser.add_argument("--topk", type=int, default=2048, help="KV rows per query token")
    parser.add_argument("--check-rows", type=int, default=64, help="query rows compared with the references")
    parser.add_argument("--iters", type=int, default=30, help="timed calls (the median is reported)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    reason = missing_sm90_gpu()
    if reason is not None:
        print(f"skipped: {reason}")
        return
    s_q, s_kv, h_q, d_qk, topk, d_v = args.s_q, args.s_kv, args.h_q, args.d_qk, args.topk, 512
    torch.manual_seed(args.seed)

    # What the model produces: bf16 queries and one shared latent KV row per token.
    q_bf16 = torch.randn(s_q, h_q, d_qk, dtype=torch.bfloat16, device="cuda")
    kv_bf16 = torch.randn(s_kv, 1, d_qk, dtype=torch.bfloat16, device="cuda")
    indices = random_indices(s_q, s_kv, topk, device="cuda", seed=args.seed)  # the indexer's picks
    sm_scale = 1.0 / math.sqrt(d_qk)

    q, q_scale = quantize_fp8(q_bf16)
    kv, kv_scale = quantize_fp8(kv_bf16)
    out, max_logits, lse = sparse_mla_q8kv8_prefill_fwd(q, kv, indices, sm_scale, q_scale, kv_scale, d_v)

    rows = slice(0, min(args.check_rows, s_q))
    fp8_ref = reference_prefill(q[rows], kv, indices[rows], sm_scale, q_scale, kv_scale, d_v)
    unit = torch.ones(1, device="cuda")
    bf16_ref = reference_prefill(q_bf16[rows], kv_bf16, indices[rows], sm_scale, unit, unit, d_v)
    print(f"s_q={s_q} s_kv={s_kv} h_q={h_q} d_qk={d_qk} topk={topk}; errors on the first {rows.stop} query rows")
    for name, ref in (("dequantized FP8 inputs", fp8_ref), ("exact bf16 inputs", bf16_ref)):
        print(
            f"  vs reference on {name:23s} out {relative_error(out[rows], ref[0]):.2e}  "
            f"lse {relative_error(lse[rows], ref[2]):.2e}  max_logits {relative_error(max_logits[rows], ref[1]):.2e}"
        )

    def call():
        sparse_mla_q8kv8_prefill_fwd(
            q, kv, indices, sm_scale, q_scale, kv_scale, d_v, out=out, max_logits=max_logits, lse=lse
        )

    ms = median_time_ms(call, iters=args.iters, warmup=args.warmup)
    tflops = prefill_flops(s_q, h_q, topk, d_qk, d_v) / (ms * 1e-3) / 1e12
    print(f"  {ms:.3f} ms (median of {args.iters}, L2 flushed), {tflops:.0f} TFLOPS on {torch.cuda.get_device_name()}")


if __name__ == "__main__":
    main()
