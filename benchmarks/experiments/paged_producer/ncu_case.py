"""One paged call and one contiguous call of a shape, after warmup (for ncu: skip 2 of each, count 1 each)."""
import sys
sys.path.insert(0, "benchmarks")  # run from the repository root
import torch
from prefix_hit import Batch, TOPK, D_QK
from engine_pass import engine_pass
from sparse_mla import sparse_mla_q8kv8_prefill_fwd, sparse_mla_q8kv8_paged_prefill_fwd
from sparse_mla.testing import quantize_fp8, poisoned_outputs

s_q, ctx, h_q = map(int, sys.argv[1:4])
batch = Batch(1, ctx, 0)
bi, pi = batch.indices(s_q, 0)
q, q_scale = quantize_fp8(0.2 * torch.randn(s_q, h_q, D_QK, device="cuda"))
kv = engine_pass(batch.cache, batch.rows, TOPK)
one = torch.ones(1, dtype=torch.float32, device="cuda")
o = poisoned_outputs(s_q, h_q, 512)
for _ in range(3):
    sparse_mla_q8kv8_paged_prefill_fwd(q, batch.cache, pi, D_QK ** -0.5, q_scale, **o)
    sparse_mla_q8kv8_prefill_fwd(q, kv, bi, D_QK ** -0.5, q_scale, one, **o)
torch.cuda.synchronize()
