"""One token-grouped call (realistic-glm, groups forced on) for ncu: two calls to warm up, then the
profiled one. `ncu_device.sh` runs it under ncu and `ncu_summary.py` reads the source counters.

    python benchmarks/experiments/epilogue_stores/ncu_grouped.py S_Q S_KV H_Q
"""

from __future__ import annotations

import sys

import torch

import sparse_mla.launch as launch
from sparse_mla.testing import PRESETS, make_inputs, poisoned_outputs, realistic_indices


def main() -> None:
    s_q, s_kv, h_q = (int(x) for x in sys.argv[1:4])
    inputs = make_inputs(s_q, s_kv, h_q, 576, 2048, seed=0)
    inputs["indices"] = realistic_indices(s_q, s_kv, 2048, seed=0, **PRESETS["realistic-glm"])
    out = poisoned_outputs(s_q, h_q)
    for _ in range(3):
        launch.launch(inputs["q"], inputs["kv"], inputs["indices"], inputs["q_scale"], inputs["kv_scale"], None, None,
                      out["out"], out["max_logits"], out["lse"], inputs["sm_scale"], False, token_groups="always")
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
