"""One call of the shape in $CASE (``PATTERN:S_KV:H_Q``, 4096 rows, topk 2048, token groups off) after
one warm-up call: the second call's kernel is the one ncu profiles (``--launch-skip 1 -c 1``)."""

import os

import sparse_mla.launch as launch
from sparse_mla.testing import PRESETS, make_inputs, poisoned_outputs, realistic_indices

pattern, s_kv, h_q = os.environ["CASE"].split(":")
s_kv, h_q = int(s_kv), int(h_q)
inputs = make_inputs(4096, s_kv, h_q, 576, 2048, seed=0)
if pattern != "uniform":
    inputs["indices"] = realistic_indices(4096, s_kv, 2048, seed=0, **PRESETS[pattern])
out = poisoned_outputs(4096, h_q)
for _ in range(2):
    launch.launch(inputs["q"], inputs["kv"], inputs["indices"], inputs["q_scale"], inputs["kv_scale"], None, None,
                  out["out"], out["max_logits"], out["lse"], inputs["sm_scale"], False, token_groups="never")
