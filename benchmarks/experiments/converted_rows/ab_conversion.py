"""Experiment 142 in one process (the patched tree's package): a paged call's rows converted once
(SPARSE_MLA_PAGED_CONVERSION=once) against per visit, beside the engines' pass, the contiguous kernel on
its output and the pass plus that kernel ((b) of prefix_hit.py), L2 flushed, interleaved. Checks the two
routes' outputs bitwise; then the conversion's four kernels' times (torch.profiler) on a few shapes.
Run from the repository root: python benchmarks/experiments/converted_rows/ab_conversion.py [--json F]"""
import argparse
import json
import os
import sys

sys.path.insert(0, "benchmarks")
import torch  # noqa: E402
from engine_pass import engine_pass  # noqa: E402
from prefix_hit import D_QK, TOPK, Batch  # noqa: E402

from sparse_mla import sparse_mla_q8kv8_paged_prefill_fwd, sparse_mla_q8kv8_prefill_fwd  # noqa: E402
from sparse_mla.launch import converted_capacity  # noqa: E402
from sparse_mla.testing import interleaved_median_ms, poisoned_outputs, quantize_fp8  # noqa: E402

SHAPES = [  # (requests, context, s_q per request, h_q, cache blocks: 0 = the batch's own)
    (1, 131072, 16, 128, 0), (1, 131072, 16, 16, 0), (1, 8192, 16, 128, 0), (1, 32768, 64, 16, 0),
    (1, 32768, 64, 128, 0), (1, 32768, 256, 16, 0), (1, 32768, 1024, 128, 0), (1, 32768, 4096, 16, 0),
    (1, 8192, 4096, 16, 0), (1, 131072, 1024, 16, 0), (8, 32768, 64, 16, 0), (8, 131072, 16, 128, 0),
    # the batch's blocks scattered over a serving pool of 2M rows (two of the mark pass's windows); a call
    # converts once only up to 2^20 workspace rows, min(pool rows, s_q * topk): 512 tokens here
    (1, 32768, 256, 16, 32768), (1, 131072, 16, 128, 32768),
]
parser = argparse.ArgumentParser()
parser.add_argument("--iters", type=int, default=30)
parser.add_argument("--json")
cli = parser.parse_args()
print(torch.cuda.get_device_name(), flush=True)
rows = []
for requests, context, s_q, h_q, pool_blocks in SHAPES:
    batch = Batch(requests, context, 0)
    buffer_indices, paged_indices = batch.indices(s_q, 0)
    cache = batch.cache
    if pool_blocks:  # block b of the batch's cache becomes block place[b] of the pool
        g = torch.Generator(device="cuda").manual_seed(1)
        place = torch.randperm(pool_blocks, device="cuda", generator=g)[:cache.shape[0]]
        cache = torch.zeros(pool_blocks, *cache.shape[1:], dtype=cache.dtype, device="cuda")
        cache[place] = batch.cache
        rows = paged_indices.long()
        paged_indices = torch.where(rows >= 0, place[rows.clamp(min=0) // 64] * 64 + rows.clamp(min=0) % 64, rows)
        paged_indices = paged_indices.to(torch.int32)
    tokens = requests * s_q
    g = torch.Generator(device="cuda").manual_seed(0)
    q, q_scale = quantize_fp8(0.2 * torch.randn(tokens, h_q, D_QK, device="cuda", generator=g))
    kv = engine_pass(batch.cache, batch.rows, TOPK)
    kv_scale = torch.ones(1, dtype=torch.float32, device="cuda")
    sm = D_QK ** -0.5
    outs = {name: poisoned_outputs(tokens, h_q, 512) for name in ("contiguous", "per-visit", "once")}

    def paged(mode):
        def call():
            os.environ["SPARSE_MLA_PAGED_CONVERSION"] = mode
            sparse_mla_q8kv8_paged_prefill_fwd(q, cache, paged_indices, sm, q_scale, **outs[mode])
        return call

    contiguous = lambda: sparse_mla_q8kv8_prefill_fwd(q, kv, buffer_indices, sm, q_scale, kv_scale, **outs["contiguous"])  # noqa: E731
    calls = {"pass": lambda: engine_pass(batch.cache, batch.rows, TOPK), "contiguous": contiguous,
             "(b)": lambda: sparse_mla_q8kv8_prefill_fwd(q, engine_pass(batch.cache, batch.rows, TOPK), buffer_indices,
                                                         sm, q_scale, kv_scale, **outs["contiguous"]),
             "per-visit": paged("per-visit"), "once": paged("once")}
    os.environ["SPARSE_MLA_PAGED_CONVERSION"] = "once"
    assert converted_capacity(cache.shape[0] * 64, tokens, TOPK) > 0, "this shape would convert per visit"
    t = interleaved_median_ms(calls, iters=cli.iters)
    for mode in ("per-visit", "once"):
        paged(mode)()
    torch.cuda.synchronize()
    same = all(torch.equal(outs["once"][k].view(torch.uint8), outs["per-visit"][k].view(torch.uint8))
               for k in ("out", "max_logits", "lse"))
    row = dict(requests=requests, context=context, s_q=s_q, h_q=h_q, cache_rows=cache.shape[0] * 64, bitwise_equal=same,
               **{f"{k}_us": v * 1e3 for k, v in t.items()})
    rows.append(row)
    print(f"{requests}x{context // 1024}K s_q {s_q:>4} h_q {h_q:>3} pool {cache.shape[0] * 64:>7} | pass {row['pass_us']:7.1f} contiguous "
          f"{row['contiguous_us']:7.1f} (b) {row['(b)_us']:7.1f} | per-visit {row['per-visit_us']:7.1f} once "
          f"{row['once_us']:7.1f} | once/(b) {row['once_us'] / row['(b)_us']:.2f} once/per-visit "
          f"{row['once_us'] / row['per-visit_us']:.2f} | bitwise {same}", flush=True)
    if (requests, context, s_q, h_q) in ((1, 32768, 4096, 16), (1, 32768, 1024, 128), (1, 131072, 16, 128)):  # noqa: E501
        os.environ["SPARSE_MLA_PAGED_CONVERSION"] = "once"
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                sparse_mla_q8kv8_paged_prefill_fwd(q, cache, paged_indices, sm, q_scale, **outs["once"])
            torch.cuda.synchronize()
        kernels = {}
        for e in prof.key_averages():
            if e.device_type == torch.autograd.DeviceType.CUDA:
                kernels[e.key[:60]] = e.device_time_total / 5 if hasattr(e, "device_time_total") else e.cuda_time_total / 5
        print("   kernels (us a call): " + "; ".join(f"{k} {v:.1f}" for k, v in sorted(kernels.items(), key=lambda x: -x[1])), flush=True)
        row["kernels_us"] = kernels
    del batch, kv, cache
    torch.cuda.empty_cache()
os.environ.pop("SPARSE_MLA_PAGED_CONVERSION", None)
if cli.json:
    with open(cli.json, "w") as f:
        json.dump(rows, f, indent=1)
