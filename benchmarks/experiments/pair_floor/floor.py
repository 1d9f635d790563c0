"""What the token-grouped path cannot go below, from the indices alone: each group's union in pairs.

A token group of G tokens (G * h_q = 64 tile rows) gathers its union of U distinct valid rows in
ceil(U / 128) pairs of two 64-row blocks, where a token alone takes ceil(topk / 128) = 16 at topk
2048; a pair costs about as much whether it is full or holds a few rows (Experiments 66 and 73 of
benchmarks/notes/). So the grouped launch alone costs, per (token, head) against h_q 64, at least

    pairs floor = mean over groups of ceil(U / 128) / 16

and, with one group per SM at a time and no split of the last round, at s_q rows on 132 SMs, at
least that times ceil(rounds) / rounds (rounds = groups / 132; the h_q 64 call splits its last
round). Everything else a call pays comes on top: the pre-pass, the masked softmax of blocks that
not every token owns, the grouped pair's extra instructions, the start and end of the launch.

This script builds the benchmark's index patterns on the CPU (`sparse_mla.testing`), 1024 rows each
(the patterns are stationary in the row), and prints, per (pattern, s_kv, h_q), the union per
token's topk, the groups' pairs, the two floors, the group share that falls back to a narrow tile
(the pre-pass's threshold, `max_union_ratio`), and, from a tp table's JSON if one is given, the
measured per-(token, head) cost at s_q 4096 and the target. Writes ``floor.json`` beside the table.

    python benchmarks/experiments/pair_floor/floor.py benchmarks/results/tp-*.json
"""

from __future__ import annotations

import datetime
import json
import math
import pathlib
import sys

import torch

from sparse_mla.launch import group_size, max_union_ratio
from sparse_mla.testing import PRESETS, realistic_indices
from sparse_mla.testing.inputs import random_indices

ROWS, TOPK, SMS, S_Q = 1024, 2048, 132, 4096
CASES = [(p, s_kv, h_q) for p in ("realistic-glm", "realistic-dsv4", "uniform") for s_kv in (8192, 131072)
         for h_q in (8, 16, 32)]
# The targets, per (token, head) against h_q 64 (None: no target for that cell).
TARGETS = {("realistic-glm", 8): 1.6, ("realistic-glm", 16): 1.3, ("realistic-glm", 32): 1.15,
           ("realistic-dsv4", 8): 3.0, ("realistic-dsv4", 16): 1.9, ("uniform", 16): 2.6}


def indices_of(pattern: str, s_kv: int) -> torch.Tensor:
    if pattern == "uniform":
        return random_indices(ROWS, s_kv, TOPK, device="cpu", seed=0)[:, 0, :]
    return realistic_indices(ROWS, s_kv, TOPK, seed=0, device="cpu", **PRESETS[pattern])[:, 0, :]


def measured(tables: list[pathlib.Path]) -> dict:
    out = {}
    for path in tables:
        table = json.loads(path.read_text())
        for row in table["rows"]:
            if row["s_q"] == S_Q and row.get("per_head_vs_64") is not None:
                out[(row["indices"], row["s_kv"], row["h_q"])] = row["per_head_vs_64"]
    return out


def main() -> None:
    torch.set_num_threads(2)
    seen = measured([pathlib.Path(a) for a in sys.argv[1:]])
    rows, cache = [], {}
    print(f"{'pattern':15s} {'s_kv':>6s} {'h_q':>3s} {'G':>2s} {'U/topk':>7s} {'pairs':>9s} {'floor':>6s} "
          f"{'+rounds':>7s} {'falls back':>10s} {'measured':>8s} {'target':>6s}")
    for pattern, s_kv, h_q in CASES:
        if (pattern, s_kv) not in cache:
            cache[(pattern, s_kv)] = indices_of(pattern, s_kv)
        indices = cache[(pattern, s_kv)]
        group = group_size(h_q, TOPK)
        n = ROWS // group * group
        unions, pairs, back = [], [], 0
        for members in indices[:n].reshape(n // group, group * TOPK):
            valid = members[(members >= 0) & (members < s_kv)]
            u = torch.unique(valid).numel()
            unions.append(u / TOPK)
            pairs.append(math.ceil(u / (2 * 64)))
            back += u > max_union_ratio(h_q) * valid.numel()
        floor = sum(pairs) / len(pairs) / math.ceil(TOPK / 128)
        rounds = S_Q / group / SMS
        row = dict(indices=pattern, s_kv=s_kv, h_q=h_q, group=group, union_per_topk=sum(unions) / len(unions),
                   pairs_min=min(pairs), pairs_max=max(pairs), pairs_floor=floor,
                   rounds_floor=floor * math.ceil(rounds) / rounds, falls_back=back / len(pairs),
                   measured=seen.get((pattern, s_kv, h_q)), target=TARGETS.get((pattern, h_q)))
        rows.append(row)
        fmt = lambda v: "-" if v is None else f"{v:.2f}"  # noqa: E731
        print(f"{pattern:15s} {s_kv:6d} {h_q:3d} {group:2d} {row['union_per_topk']:7.3f} "
              f"{row['pairs_min']:4d}-{row['pairs_max']:<4d} {floor:6.3f} {row['rounds_floor']:7.3f} "
              f"{row['falls_back']:10.2f} {fmt(row['measured']):>8s} {fmt(row['target']):>6s}")
    out = pathlib.Path(__file__).resolve().parent / "floor.json"
    out.write_text(json.dumps(dict(date=datetime.datetime.now().isoformat(timespec="seconds"), rows_per_pattern=ROWS,
                                   topk=TOPK, sms=SMS, s_q=S_Q, tables=[str(a) for a in sys.argv[1:]], rows=rows),
                              indent=1) + "\n")


if __name__ == "__main__":
    main()
