"""What a work unit's boundary costs the wide and grouped tiles: the same pairs per CTA in more, shorter units.

Each CTA runs 256 pairs in every case, in units of 16, 8, 4 or 2 pairs (topk 2048, 1024, 512 and 256
at the wide tile; the grouped tile's groups of two uniform tokens at s_kv 128K list ~2 x topk rows, so
topk 1024, 512, 256 and 128 give 16, 8, 4 and 2 pairs), s_q a multiple of 132 units so that every CTA
runs the same number of whole units (no partial round; the wide tile in the batch-invariant mode, so
no tail split). The launch's kernel time (the CUDA profiler, mean of CALLS calls, an L2 flush before
each) then fits  time = per_pair * 256 + per_unit * units_per_cta  by least squares: per_unit is what a
unit's start and end cost beyond its pairs (the epilogue, the first Q.K^T and softmax without a P.V
beside them, the Q tile's load and the output's stores), per_pair a pair inside a unit.

    python benchmarks/experiments/unit_boundary/measure.py --json unit_boundary.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import pathlib
import sys
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

import sparse_mla.launch as launch
from sparse_mla.testing import make_inputs, poisoned_outputs
from sparse_mla.testing.timing import L2_FLUSH_BYTES

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # benchmarks/bench.py: no package
from bench import git_commit  # noqa: E402

CALLS = 20
PAIRS_PER_CTA = 256
SMS = 132


def kernel_us(inputs: dict, h_q: int, batch_invariant: bool, token_groups: str) -> dict:
    """Mean GPU time per call of each prefill kernel the call launches (the pre-pass, the grouped launch,
    the launch of single tokens), by role."""
    out = poisoned_outputs(inputs["q"].shape[0], h_q)
    flush = torch.empty(L2_FLUSH_BYTES, dtype=torch.uint8, device="cuda")

    def call():
        launch.launch(inputs["q"], inputs["kv"], inputs["indices"], inputs["q_scale"], inputs["kv_scale"], None, None,
                      out["out"], out["max_logits"], out["lse"], inputs["sm_scale"], batch_invariant,
                      token_groups=token_groups)

    for _ in range(3):
        call()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(CALLS):
            flush.zero_()
            call()
        torch.cuda.synchronize()
    us: dict = defaultdict(float)
    for event in prof.key_averages():
        if "prefill_kernel" not in event.key:
            continue
        role = ("prepass" if "token_groups" in event.key else
                "grouped" if "Tile)2" in event.key or "TileE2" in event.key else "tokens")
        us[role] += event.device_time_total / CALLS
    return dict(us)


def fit(points: list[tuple[int, float]]) -> tuple[float, float]:
    """Least squares of  t = per_pair * PAIRS_PER_CTA + per_unit * units  over (units, t): (per_pair, per_unit)."""
    n = len(points)
    mx = sum(u for u, _ in points) / n
    my = sum(t for _, t in points) / n
    per_unit = sum((u - mx) * (t - my) for u, t in points) / sum((u - mx) ** 2 for u, _ in points)
    return (my - per_unit * mx) / PAIRS_PER_CTA, per_unit


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", required=True)
    args = parser.parse_args()
    rows, fits = [], {}
    # (tile, h_q, s_kv, [(topk, pairs per unit)], tokens per unit, role of the launch timed)
    cases = [("wide", 64, 8192, [(2048, 16), (1024, 8), (512, 4), (256, 2)], 1, "tokens"),
             ("grouped", 32, 131072, [(1024, 16), (512, 8), (256, 4), (128, 2)], 2, "grouped")]
    for tile, h_q, s_kv, shapes, tokens_per_unit, role in cases:
        points = []
        for topk, pairs in shapes:
            units = PAIRS_PER_CTA // pairs
            s_q = SMS * units * tokens_per_unit
            inputs = make_inputs(s_q, s_kv, h_q, 576, topk, seed=0)
            us = kernel_us(inputs, h_q, batch_invariant=tile == "wide", token_groups="always" if tile == "grouped" else "never")
            points.append((units, us[role]))
            rows.append(dict(tile=tile, h_q=h_q, s_kv=s_kv, topk=topk, s_q=s_q, pairs_per_unit=pairs,
                             units_per_cta=units, us=us))
            print(f"{tile:8s} h_q {h_q:2d} s_kv {s_kv:6d} topk {topk:4d} s_q {s_q:5d}: {units:3d} units of {pairs:2d} "
                  f"pairs a CTA, {role} {us[role]:7.1f} us ({us[role] / PAIRS_PER_CTA:.3f} us a pair)"
                  + (f", pre-pass {us['prepass']:.1f} us" if "prepass" in us else ""), flush=True)
        per_pair, per_unit = fit(points)
        fits[tile] = dict(per_pair_us=per_pair, per_unit_us=per_unit)
        print(f"{tile}: {per_pair:.3f} us a pair, {per_unit:.3f} us a unit beyond its pairs "
              f"({per_unit / per_pair:.2f} pairs; {per_unit / (16 * per_pair + per_unit):.1%} of a 16-pair unit)",
              flush=True)
    with open(args.json, "w") as f:
        json.dump(dict(gpu=torch.cuda.get_device_name(), date=datetime.datetime.now().isoformat(timespec="seconds"),
                       commit=git_commit(), calls=CALLS, pairs_per_cta=PAIRS_PER_CTA, rows=rows, fits=fits), f, indent=1)


if __name__ == "__main__":
    main()
