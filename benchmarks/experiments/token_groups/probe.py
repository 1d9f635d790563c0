"""Where a token-grouped call's time goes: the pre-pass alone, then the call with token groups off
(the narrow tile), automatic, and on for every group, at s_q 4096 x s_kv 32K, topk 2048, d_qk 576,
h_q 8 / 16 / 32 (L2 flushed, median of 20 calls), on realistic-glm and uniform indices and on
`shared` ones, where the tokens of a group select the same rows: there every row of a grouped tile is
valid wherever any is, so the per-row mask never runs, and a grouped entry's cost against a 64-head
token's slot (printed as `entry/slot`, the pre-pass left out) is what the tile costs without it.

    python benchmarks/experiments/token_groups/probe.py
"""

from __future__ import annotations

from sparse_mla.jit import KernelKey, get_module
from sparse_mla.jit.key import TOKEN_GROUPS_FUNCTION
from sparse_mla.launch import MAX_UNION_RATIO, group_size, launch, token_group_lists
from sparse_mla.testing import (
    PRESETS,
    make_inputs,
    median_time_ms,
    poisoned_outputs,
    realistic_indices,
    shared_neighbour_indices,
)

S_Q, S_KV, D_QK, TOPK = 4096, 32768, 576, 2048


def main() -> None:
    module = get_module(KernelKey(D_QK, TOPK))
    pre_pass = getattr(module, TOKEN_GROUPS_FUNCTION)
    for pattern in ("realistic-glm", "uniform", "shared"):
        wide_ms = None
        for h_q in (64, 8, 16, 32):
            inputs = make_inputs(S_Q, S_KV, h_q, D_QK, TOPK, seed=0)
            group = group_size(h_q, TOPK)
            if pattern == "shared":  # the same rows for the tokens of a group (of 8: also those of 4 and 2)
                inputs["indices"] = shared_neighbour_indices(S_Q, S_KV, TOPK, group=8, shared=1.0, seed=0)
            elif pattern != "uniform":
                inputs["indices"] = realistic_indices(S_Q, S_KV, TOPK, seed=0, **PRESETS[pattern])
            outputs = poisoned_outputs(S_Q, h_q)
            if h_q == 64:  # the wide tile's time per slot, the unit of `entry/slot`
                wide_ms = median_time_ms(lambda: launch(inputs["q"], inputs["kv"], inputs["indices"], inputs["q_scale"],
                                                        inputs["kv_scale"], None, None, outputs["out"],
                                                        outputs["max_logits"], outputs["lse"], inputs["sm_scale"],
                                                        False), iters=20, warmup=3)
                continue
            groups = (S_Q + group - 1) // group
            lists = token_group_lists(inputs["q"].device, S_Q, group, TOPK)
            pre_ms = median_time_ms(
                lambda: pre_pass(inputs["indices"], None, S_KV, h_q, group, MAX_UNION_RATIO, *lists), iters=20, warmup=3)

            def call(mode: str):
                return lambda: launch(inputs["q"], inputs["kv"], inputs["indices"], inputs["q_scale"],
                                      inputs["kv_scale"], None, None, outputs["out"], outputs["max_logits"],
                                      outputs["lse"], inputs["sm_scale"], False, token_groups=mode)

            times = {mode: median_time_ms(call(mode), iters=20, warmup=3) for mode in ("never", "auto", "always")}
            length = lists[2]
            paying = int((length >= 0).sum())
            entries = int(length.clamp(min=0).sum()) / max(1, paying)
            pre_pass(inputs["indices"], None, S_KV, h_q, group, float("inf"), *lists)  # every group's list
            entry_cost = (times["always"] - pre_ms) / int(lists[2].sum()) / (wide_ms / (S_Q * TOPK))
            print(f"{pattern:14s} h_q {h_q:2d} G {group}: pre-pass {pre_ms:.3f} ms; never {times['never']:.3f} "
                  f"auto {times['auto']:.3f} always {times['always']:.3f}; groups paying {paying / groups:.2f}, "
                  f"entries/group {entries:.0f}, entry/slot {entry_cost:.2f}", flush=True)


if __name__ == "__main__":
    main()
