"""Run under compute-sanitizer by test_reliability.py: hostile indices, NaN rows behind invalid slots,
all-invalid rows, special sinks and strided kv, on small shapes, checked against the reference."""

import sys

import torch

from sparse_mla import sparse_mla_q8kv8_prefill_fwd
from sparse_mla.testing import assert_close_to_reference, make_inputs, reference_prefill

seed = int(sys.argv[1])
for d_qk, topk in ((576, 64), (512, 64), (576, 7)):
    inputs = make_inputs(
        s_q=16, s_kv=256, h_q=20, d_qk=d_qk, topk=topk, seed=seed, invalid="hostile", all_invalid_rows=3,
        nan_kv_rows=True, topk_length="random", attn_sink="special", q_strided=True, kv_strided=True,
    )
    result = sparse_mla_q8kv8_prefill_fwd(**inputs)
    torch.cuda.synchronize()
    assert_close_to_reference(*result, reference_prefill(**inputs), context=f"seed {seed}, d_qk {d_qk}, topk {topk}")
print("SANITIZE-CASE-OK")
