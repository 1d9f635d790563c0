"""On the host: how evenly the two launches of a token-grouped call spread their work over the CTAs.

For realistic-dsv4 indices (4096 rows, s_kv 32K, topk 2048, 2 tokens per group: h_q 17-32) it prints
the quantiles of the groups' union ratios (entries per valid slot), then, per threshold, the share of
groups that pay and each launch's pairs per CTA, max and mean, with the kernel's static round robin
(unit u on CTA u mod 132), and with each launch's units compacted into a list of its own (the k-th
paying group, or the k-th token of a group that does not pay, on CTA k mod 132); a narrow token's
slots count 0.88 / 1.16 of a grouped entry's (Experiment 38's costs). Max over mean is the launch's
idle share (Experiment 44).

    python benchmarks/experiments/token_groups/launch_balance.py
"""

from __future__ import annotations

import torch

from sparse_mla.testing import PRESETS, realistic_indices

S_Q, S_KV, TOPK, GROUP, CTAS = 4096, 32768, 2048, 2, 132
NARROW_PER_GROUPED = 0.88 / 1.16


def main() -> None:
    indices = realistic_indices(S_Q, S_KV, TOPK, seed=0, device="cpu", **PRESETS["realistic-dsv4"])[:, 0]
    ratios = []
    for k in range(S_Q // GROUP):
        rows = indices[k * GROUP:(k + 1) * GROUP]
        valid = rows[(rows >= 0) & (rows < S_KV)]
        ratios.append(valid.unique().numel() / max(1, valid.numel()))
    ratio = torch.tensor(ratios)
    print("union ratio quantiles 0 / .1 / .5 / .9 / 1:",
          [round(float(q), 3) for q in torch.quantile(ratio, torch.tensor([0.0, 0.1, 0.5, 0.9, 1.0]))])
    for threshold in (0.55, 0.65, 0.75):
        pays = ratio <= threshold
        lines = []
        for scheme in ("round robin", "compacted"):
            grouped, narrow = torch.zeros(CTAS), torch.zeros(CTAS)
            placed = 0
            for k in range(S_Q // GROUP):
                if pays[k]:
                    grouped[(k if scheme == "round robin" else placed) % CTAS] += float(ratio[k]) * GROUP * TOPK / 128
                    placed += 1
            placed = 0
            for t in range(S_Q):
                if not pays[t // GROUP]:
                    narrow[(t if scheme == "round robin" else placed) % CTAS] += TOPK / 128 * NARROW_PER_GROUPED
                    placed += 1
            lines.append(f"{scheme}: grouped {grouped.max().item():.0f} / {grouped.mean().item():.0f}, "
                         f"narrow {narrow.max().item():.0f} / {narrow.mean().item():.0f}, "
                         f"both {(grouped.max() + narrow.max()).item():.0f}")
        print(f"threshold {threshold}: paying {pays.float().mean().item():.2f}; pairs per CTA, max / mean: " + "; ".join(lines))


if __name__ == "__main__":
    main()
