"""Calls of the library at uniform indices, s_kv 8K, topk 2048, for `ncu` with ``--launch-skip 1``:
``python wide_once.py S_Q H_Q [CALLS]`` (132 rows at h_q 64: one work unit per CTA on an H100; 2
calls unless told)."""

import sys

import torch

from sparse_mla import sparse_mla_q8kv8_prefill_fwd
from sparse_mla.testing import make_inputs, poisoned_outputs

s_q, h_q = int(sys.argv[1]), int(sys.argv[2])
calls = int(sys.argv[3]) if len(sys.argv) > 3 else 2
inputs = make_inputs(s_q, 8192, h_q, 576, 2048, seed=0)
outputs = poisoned_outputs(s_q, h_q)
for _ in range(calls):
    sparse_mla_q8kv8_prefill_fwd(**inputs, **outputs)
torch.cuda.synchronize()
