"""Two token-grouped calls at realistic-glm indices (4096 x 8K, h_q 16 unless given, topk 2048), for
`ncu --kernel-name-base demangled -k regex:prefill_kernel< --launch-skip 2 --launch-count 1`: each call launches the grouped
tile, then the token-by-token one (the pre-pass has a name of its own), so this profiles the second
call's grouped launch. ``python grouped_once.py [H_Q] [S_KV]``."""

import sys

import torch

from sparse_mla import sparse_mla_q8kv8_prefill_fwd
from sparse_mla.testing import PRESETS, make_inputs, poisoned_outputs, realistic_indices

h_q = int(sys.argv[1]) if len(sys.argv) > 1 else 16
s_kv = int(sys.argv[2]) if len(sys.argv) > 2 else 8192
inputs = make_inputs(4096, s_kv, h_q, 576, 2048, seed=0)
inputs["indices"] = realistic_indices(4096, s_kv, 2048, **PRESETS["realistic-glm"], seed=0)
outputs = poisoned_outputs(4096, h_q)
for _ in range(2):
    sparse_mla_q8kv8_prefill_fwd(**inputs, **outputs)
torch.cuda.synchronize()
