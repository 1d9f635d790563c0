"""Where a token-grouped call's time goes: each of its kernels' GPU time, from the CUDA profiler.

Per shape (s_q 4096, topk 2048, d_qk 576; realistic-glm, realistic-dsv4 and uniform indices at s_kv 8K
and 128K, h_q 8, 16 and 32), the mean time per call of the pre-pass (``prefill_kernel_token_groups``),
the grouped launch and the narrow launch, over 20 calls, and the share of groups that pay. Then a
call whose groups straddle the threshold (uniform, s_kv 8K, h_q 8: a union of ~0.45 entries per slot)
at thresholds below, at and above it. Prints a table and writes JSON.

    python benchmarks/experiments/token_groups/breakdown.py --json breakdown.json
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
from sparse_mla.testing import PRESETS, make_inputs, poisoned_outputs, realistic_indices

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # benchmarks/bench.py: no package
from bench import git_commit  # noqa: E402
from threshold_sweep import grouped_share  # noqa: E402  (beside this script)

CALLS = 20


def kernel_role(name: str) -> str:
    """The pre-pass, the grouped launch (Tile::kGrouped, the enum's value 2 in the kernel's name,
    demangled or not), or the launch of the tokens that run one by one (a narrow tile, or the wide one)."""
    if "token_groups" in name:
        return "prepass"
    if "Tile)2" in name or "TileE2" in name:
        return "grouped"
    return "tokens"


def warm_call(inputs: dict, h_q: int):
    """The package's call on ``inputs`` into poisoned outputs, as a function, after three warm-up calls."""
    out = poisoned_outputs(inputs["q"].shape[0], h_q)

    def call():
        launch.launch(inputs["q"], inputs["kv"], inputs["indices"], inputs["q_scale"], inputs["kv_scale"], None, None,
                      out["out"], out["max_logits"], out["lse"], inputs["sm_scale"], False)

    for _ in range(3):
        call()
    return call


def breakdown(inputs: dict, h_q: int) -> dict:
    call = warm_call(inputs, h_q)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(CALLS):
            call()
        torch.cuda.synchronize()
    us: dict = defaultdict(float)
    kernels = {}
    for event in prof.key_averages():
        if "prefill_kernel" not in event.key:
            continue
        us[kernel_role(event.key)] += event.device_time_total / CALLS
        kernels[event.key.rsplit("(", 1)[0]] = event.device_time_total / CALLS  # the name up to its parameters
    return dict(us=dict(us), total_us=sum(us.values()), paying=grouped_share(inputs, h_q, launch.max_union_ratio(h_q)),
                kernels=kernels)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", required=True)
    args = parser.parse_args()
    rows = []

    def report(row: dict) -> None:
        rows.append(row)
        us = row["us"]
        print(f"{row['pattern']:15s} {row['s_kv']:6d} h_q {row['h_q']:2d} ratio {row['threshold']:.2f}: "
              f"pre-pass {us.get('prepass', 0):6.1f}  grouped {us.get('grouped', 0):6.1f}  "
              f"tokens {us.get('tokens', 0):6.1f}  total {row['total_us']:6.1f} us  paying {row['paying']:.2f}",
              flush=True)

    for pattern in ("realistic-glm", "realistic-dsv4", "uniform"):
        for s_kv in (8192, 131072):
            for h_q in (8, 16, 32):
                inputs = make_inputs(4096, s_kv, h_q, 576, 2048, seed=0)
                if pattern != "uniform":
                    inputs["indices"] = realistic_indices(4096, s_kv, 2048, seed=0, **PRESETS[pattern])
                report(dict(pattern=pattern, s_kv=s_kv, h_q=h_q, threshold=launch.max_union_ratio(h_q),
                            **breakdown(inputs, h_q)))
    inputs = make_inputs(4096, 8192, 8, 576, 2048, seed=0)
    default = launch.MAX_UNION_RATIO_8
    for threshold in (0.40, 0.44, 0.45, 0.46, 0.50):
        launch.MAX_UNION_RATIO_8 = threshold
        report(dict(pattern="uniform", s_kv=8192, h_q=8, threshold=threshold, **breakdown(inputs, 8)))
    launch.MAX_UNION_RATIO_8 = default
    with open(args.json, "w") as f:
        json.dump(dict(gpu=torch.cuda.get_device_name(), date=datetime.datetime.now().isoformat(timespec="seconds"),
                       commit=git_commit(), s_q=4096, topk=2048, calls=CALLS, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
