"""How often the grouped tile's softmax can skip its per-slot masking, for four orders of a list.

A consumer thread of the grouped tile holds, per 64-entry block, the logits of two tile rows (g and
g + 8 of its warp's 16) at 16 slots (2c + 8j and 2c + 8j + 1, j < 8); where all 32 are valid for
its rows' tokens it takes the unmasked path (`all_valid` in include/sparse_mla/sm90/prefill/
consumer.cuh). This script builds, on the CPU, the lists of 16 groups of realistic selections (4096
rows, s_kv 8K, topk 2048, groups from row 2048 on) in four orders: first occurrence (e193b7a and
before), kv-row order (`lists_in_row_order.patch`), the entries every token owns first (main since
5b78948), and that with the other entries grouped by their owner set; it prints the share of
(thread, block) pairs that take that path and, in brackets, the share with no valid logit at all
(the masked path over nothing). No GPU needed (Experiments 51 and 52 of
benchmarks/notes/2026-12-01.md).

    python benchmarks/experiments/token_groups/unmasked_share.py
"""

from __future__ import annotations

from sparse_mla.testing import PRESETS, realistic_indices

S_Q, S_KV, TOPK, GROUPS = 4096, 8192, 2048, 16


def owner_bits(selections: list[list[int]], first: int, group: int, order: str) -> list[int]:
    """The owner bits of each entry of the list of tokens first .. first + group - 1."""
    owners: dict[int, int] = {}  # insertion order: first occurrence
    for t in range(first, first + group):
        for row in selections[t]:
            if row >= 0:
                owners[row] = owners.get(row, 0) | 1 << (t - first)
    if order == "kv-row":
        owners = dict(sorted(owners.items()))
    elif order in ("common first", "common, by owners"):
        everyone = (1 << group) - 1
        rest = {r: o for r, o in owners.items() if o != everyone}
        if order == "common, by owners":  # the other rows grouped by their owner set (stable)
            rest = dict(sorted(rest.items(), key=lambda item: item[1]))
        owners = {r: o for r, o in owners.items() if o == everyone} | rest
    return list(owners.values())


def path_shares(owners: list[int], h_q: int) -> tuple[float, float]:
    """The shares of (thread, block) pairs whose 32 logits are all valid (the unmasked path) and
    none valid (the masked path, over nothing)."""
    taken = empty = total = 0
    for begin in range(0, len(owners), 64):
        block = owners[begin:begin + 64] + [0] * max(0, begin + 64 - len(owners))
        for row in (16 * s + g for s in range(4) for g in range(8)):
            tokens = (row // h_q, (row + 8) // h_q)
            for c in range(4):
                slots = [2 * c + 8 * j + k for j in range(8) for k in (0, 1)]
                bits = [(block[s] >> t) & 1 for s in slots for t in tokens]
                taken += all(bits)
                empty += not any(bits)
                total += 1
    return taken / total, empty / total


def main() -> None:
    orders = ("first occurrence", "kv-row", "common first", "common, by owners")
    print("unmasked share (none valid) per order")
    print("indices         h_q  " + "  ".join(f"{o:>18s}" for o in orders))
    for pattern in ("realistic-glm", "realistic-dsv4"):
        selections = realistic_indices(S_Q, S_KV, TOPK, seed=0, device="cpu", **PRESETS[pattern])[:, 0].tolist()
        for h_q in (32, 16, 8):
            group = 64 // h_q
            firsts = range(S_Q // 2, S_Q // 2 + GROUPS * group, group)
            cells = []
            for o in orders:
                pairs = [path_shares(owner_bits(selections, f, group, o), h_q) for f in firsts]
                cells.append(f"{sum(p[0] for p in pairs) / GROUPS:.3f} ({sum(p[1] for p in pairs) / GROUPS:.3f})")
            print(f"{pattern:15s} {h_q:3d}  " + "  ".join(f"{c:>18s}" for c in cells), flush=True)


if __name__ == "__main__":
    main()
