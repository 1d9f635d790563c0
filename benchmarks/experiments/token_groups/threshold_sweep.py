"""Whole calls with the union threshold swept, side by side, and with token groups off.

Each swept value is set as ``sparse_mla.launch.MAX_UNION_RATIO`` (h_q 17-32), ``MAX_UNION_RATIO_16``
(h_q 9-16) and ``MAX_UNION_RATIO_8`` (h_q <= 8), so it decides every group of the call; ``never`` runs every
token on the narrow tiles. 4096 rows, topk 2048, d_qk 576. ``--cases 44``: realistic-dsv4 /
realistic-glm / uniform indices at s_kv 32K and 128K, h_q 16-32 (Experiment 44 of
``benchmarks/notes/2026-12-01.md``); ``--cases 60``: h_q 8 and 16, where the 16-head narrow tile is
the fallback, uniform at 8K-16K (the union ratios near the break-even) and the realistic patterns
(Experiment 60); ``--cases 62``: h_q 4 and 8 on the 8-head tile, uniform at 8K-14K and the realistic
patterns (Experiment 62). Each line also gives the share of groups that run grouped at each value.

    python benchmarks/experiments/token_groups/threshold_sweep.py --cases 60
"""

from __future__ import annotations

import argparse

import sparse_mla.launch as launch
from sparse_mla.jit.key import TOKEN_GROUPS_FUNCTION
from sparse_mla.testing import PRESETS, interleaved_median_ms, make_inputs, poisoned_outputs, realistic_indices

CASES = {
    "44": ((0.55, 0.65, 0.75, 0.85, 0.95),
           [("realistic-dsv4", 32768, 32), ("realistic-dsv4", 32768, 24), ("realistic-dsv4", 131072, 32),
            ("realistic-dsv4", 131072, 16), ("realistic-glm", 131072, 32), ("uniform", 32768, 32)]),
    "60": ((0.75, 0.7, 0.65, 0.6, 0.55, 0.5),
           [("uniform", 8192, 16), ("uniform", 8192, 8), ("uniform", 16384, 8), ("uniform", 12288, 8),
            ("realistic-dsv4", 131072, 16), ("realistic-dsv4", 131072, 8), ("realistic-dsv4", 32768, 16),
            ("realistic-dsv4", 32768, 8), ("realistic-glm", 131072, 8), ("realistic-glm", 8192, 16)]),
    "62": ((0.65, 0.6, 0.55, 0.5, 0.45, 0.4),
           [("uniform", 8192, 8), ("uniform", 10240, 8), ("uniform", 12288, 8), ("uniform", 14336, 8),
            ("uniform", 10240, 4), ("uniform", 12288, 4), ("realistic-dsv4", 131072, 8),
            ("realistic-dsv4", 32768, 8), ("realistic-glm", 131072, 8), ("realistic-dsv4", 131072, 4)]),
}


def set_threshold(ratio: float) -> None:
    launch.MAX_UNION_RATIO = launch.MAX_UNION_RATIO_16 = launch.MAX_UNION_RATIO_8 = ratio


def grouped_share(inputs: dict, h_q: int, ratio: float) -> float:
    """The share of the call's groups whose union pays at ``ratio`` (the pre-pass alone)."""
    s_q, _, topk = inputs["indices"].shape
    group = launch.group_size(h_q, topk)
    lists = launch.token_group_lists(inputs["q"].device, s_q, group, topk)
    module = launch.get_module(launch._kernel_key(inputs["q"].shape[2], topk))
    getattr(module, TOKEN_GROUPS_FUNCTION)(inputs["indices"], None, inputs["kv"].shape[0], h_q, group, ratio,
                                                  *lists)
    return (lists[2] >= 0).float().mean().item()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", choices=tuple(CASES), default="44")
    ratios, cases = CASES[parser.parse_args().cases]
    for pattern, s_kv, h_q in cases:
        inputs = make_inputs(4096, s_kv, h_q, 576, 2048, seed=0)
        if pattern != "uniform":
            inputs["indices"] = realistic_indices(4096, s_kv, 2048, seed=0, **PRESETS[pattern])
        out = poisoned_outputs(4096, h_q)

        def call(ratio: float, mode: str = "auto"):
            def run():
                set_threshold(ratio)
                launch.launch(inputs["q"], inputs["kv"], inputs["indices"], inputs["q_scale"], inputs["kv_scale"],
                              None, None, out["out"], out["max_logits"], out["lse"], inputs["sm_scale"], False,
                              token_groups=mode)
            return run

        calls = {f"{ratio}": call(ratio) for ratio in ratios}
        calls["never"] = call(ratios[0], "never")
        ms = interleaved_median_ms(calls, iters=20)
        shares = {ratio: grouped_share(inputs, h_q, ratio) for ratio in ratios}
        print(f"{pattern:15s} {s_kv:6d} h_q {h_q:2d}: " + "  ".join(f"{k} {v:.3f}" for k, v in ms.items())
              + "   grouped: " + " ".join(f"{r} {p:.2f}" for r, p in shares.items()), flush=True)


if __name__ == "__main__":
    main()
