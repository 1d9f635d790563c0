"""Summarizes ncu's per-instruction source counters of the grouped kernel (CSV of `--page source
--print-source sass --csv`): warp stall samples by region (before the first wgmma, the pair loop
between the first and last wgmma, after it: the epilogue and the unit's end), the epilogue's stores,
and the instructions with the most samples.

    python benchmarks/experiments/epilogue_stores/ncu_summary.py src.csv
"""

from __future__ import annotations

import csv
import sys


def main() -> None:
    with open(sys.argv[1], newline="") as f:
        lines = f.read().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith('"') and '"Source"' in line)
    rows = list(csv.DictReader(lines[start:]))
    cols = list(rows[0].keys())
    print("columns:", cols)
    src = next(c for c in cols if c.strip() == "Source")
    all_col = next(c for c in cols if "Sampling (All" in c)
    not_col = next((c for c in cols if "Sampling (Not" in c), None)

    def samples(r: dict, c: str) -> int:
        return int(float((r.get(c) or "0").replace(",", "") or 0))

    gmma = [i for i, r in enumerate(rows) if "GMMA" in r[src]]
    first, last = gmma[0], gmma[-1]
    total = sum(samples(r, all_col) for r in rows)
    for name, lo, hi in (("prologue", 0, first), ("pair loop", first, last + 1), ("after", last + 1, len(rows))):
        s = sum(samples(r, all_col) for r in rows[lo:hi])
        print(f"{name:10s} instr {hi - lo:5d} samples {s:8d} ({s / total:.1%})")
    stg = [i for i, r in enumerate(rows) if r[src].lstrip("@!P0123456789 ").startswith("STG") and i > last]
    s = sum(samples(rows[i], all_col) for i in stg)
    print(f"STG after the loop: {len(stg)} instr, samples {s} ({s / total:.1%})")
    print("top 40 by samples (index, all, not issued, source):")
    for i in sorted(range(len(rows)), key=lambda i: -samples(rows[i], all_col))[:40]:
        r = rows[i]
        print(f"{i:5d} {samples(r, all_col):7d} {samples(r, not_col) if not_col else -1:7d}  {r[src][:80]}")


if __name__ == "__main__":
    main()
