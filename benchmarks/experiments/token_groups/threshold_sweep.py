"""Whole calls with the union threshold swept, side by side, and with token groups off.

Each value of ``sparse_mla.launch.MAX_UNION_RATIO`` decides every group of the call; ``never`` runs
every token on the narrow tile. 4096 rows, topk 2048, d_qk 576, realistic-dsv4 / realistic-glm /
uniform indices at s_kv 32K and 128K (Experiment 44 of ``benchmarks/notes/2026-12-01.md``).

    python benchmarks/experiments/token_groups/threshold_sweep.py
"""

from __future__ import annotations

import sparse_mla.launch as launch
from sparse_mla.testing import PRESETS, interleaved_median_ms, make_inputs, poisoned_outputs, realistic_indices

RATIOS = (0.55, 0.65, 0.75, 0.85, 0.95)
CASES = [("realistic-dsv4", 32768, 32), ("realistic-dsv4", 32768, 24), ("realistic-dsv4", 131072, 32),
         ("realistic-dsv4", 131072, 16), ("realistic-glm", 131072, 32), ("uniform", 32768, 32)]


def main() -> None:
    for pattern, s_kv, h_q in CASES:
        inputs = make_inputs(4096, s_kv, h_q, 576, 2048, seed=0)
        if pattern != "uniform":
            inputs["indices"] = realistic_indices(4096, s_kv, 2048, seed=0, **PRESETS[pattern])
        out = poisoned_outputs(4096, h_q)

        def call(ratio: float, mode: str = "auto"):
            def run():
                launch.MAX_UNION_RATIO = ratio
                launch.launch(inputs["q"], inputs["kv"], inputs["indices"], inputs["q_scale"], inputs["kv_scale"],
                              None, None, out["out"], out["max_logits"], out["lse"], inputs["sm_scale"], False,
                              token_groups=mode)
            return run

        calls = {f"{ratio}": call(ratio) for ratio in RATIOS}
        calls["never"] = call(RATIOS[0], "never")
        ms = interleaved_median_ms(calls, iters=15)
        print(f"{pattern:15s} {s_kv} h_q {h_q:2d}: " + "  ".join(f"{k} {v:.3f}" for k, v in ms.items()), flush=True)


if __name__ == "__main__":
    main()
