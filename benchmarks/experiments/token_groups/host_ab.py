"""The CPU's time to queue one call, for builds side by side (their own launch plans), in one process.

Variants as in `hazards/ab.py` (``NAME=CACHE_ROOT[@PLAN]``). Per shape, rounds in which each variant
queues a batch of calls in turn (the GPU synchronized before each batch, not during it, so the CPU
never waits for the GPU); the median over the rounds of each batch's wall time per call.

    python benchmarks/experiments/token_groups/host_ab.py --variant base=/tmp/j_base@PLAN --variant new=/tmp/j_new
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import sys
import time

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "hazards"))  # ab.py: no package
from ab import load_variant  # noqa: E402

from sparse_mla.testing import make_inputs, poisoned_outputs  # noqa: E402

SHAPES = ((64, 8192, 16, 576, 2048), (1024, 8192, 8, 576, 2048), (1024, 8192, 64, 576, 2048))
ROUNDS, BATCH = 15, 20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", action="append", required=True)
    args = parser.parse_args()
    variants = [load_variant(spec) for spec in args.variant]
    for s_q, s_kv, h_q, d_qk, topk in SHAPES:
        inputs = make_inputs(s_q, s_kv, h_q, d_qk, topk, seed=0)
        out = poisoned_outputs(s_q, h_q)
        per_call: dict = {name: [] for name, *_ in variants}
        for _ in range(ROUNDS):
            for name, modules, mode, plan in variants:
                torch.cuda.synchronize()
                start = time.perf_counter()
                for _ in range(BATCH):
                    plan(inputs["q"], inputs["kv"], inputs["indices"], inputs["q_scale"], inputs["kv_scale"], None,
                         None, out["out"], out["max_logits"], out["lse"], inputs["sm_scale"], False,
                         module=modules[(d_qk, topk)], token_groups=mode)
                per_call[name].append((time.perf_counter() - start) / BATCH * 1e6)
        torch.cuda.synchronize()
        print(f"{s_q}x{s_kv} h_q {h_q}: " + "  ".join(f"{n} {statistics.median(v):.1f} us" for n, v in per_call.items()))


if __name__ == "__main__":
    main()
