"""Two calls of the library at uniform indices, token groups off (the narrow tile alone), for `ncu`
with ``--launch-skip 1``: ``python narrow_once.py H_Q [S_KV]`` (s_q 4096, topk 2048)."""

import os
import sys

os.environ["SPARSE_MLA_TOKEN_GROUPS"] = "never"

import torch  # noqa: E402

from sparse_mla import sparse_mla_q8kv8_prefill_fwd  # noqa: E402
from sparse_mla.testing import make_inputs, poisoned_outputs  # noqa: E402

h_q = int(sys.argv[1])
s_kv = int(sys.argv[2]) if len(sys.argv) > 2 else 8192
inputs = make_inputs(4096, s_kv, h_q, 576, 2048, seed=0)
outputs = poisoned_outputs(4096, h_q)
for _ in range(2):
    sparse_mla_q8kv8_prefill_fwd(**inputs, **outputs)
torch.cuda.synchronize()
