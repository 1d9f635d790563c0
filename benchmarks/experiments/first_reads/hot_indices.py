"""A token-grouped call with its indices in L2, as a serving engine's indexer leaves them (Experiment 112).

The benchmark protocol flushes L2 before every timed call, so the pre-pass's first loads, the call's
indices, come from DRAM (4-5.5 us of a ~10.5 us pre-pass at 1024 x 8K, h_q 8: Experiment 109). In a
serving engine the indexer's top-k kernel writes the indices just before this call, so they are
in L2. Per shape (topk 2048) and head count (8, 16, 32 and the h_q 64 reference), two ways, all timed
one call of each in turn (a new random order each turn): ``cold``, the protocol (L2 flushed, then the
timed call); ``hot``, L2 flushed, then the indices read once by a sum (untimed, outside the events),
then the timed call. Prints each one's time and per-(token, head) cost against h_q 64 timed the same
way, and writes them as JSON.

    python benchmarks/experiments/first_reads/hot_indices.py --json hot_indices.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import pathlib
import random
import statistics
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # benchmarks/: no package
from bench import git_commit, pattern_indices  # noqa: E402

from sparse_mla import sparse_mla_q8kv8_prefill_fwd  # noqa: E402
from sparse_mla.testing import make_inputs, poisoned_outputs  # noqa: E402
from sparse_mla.testing.timing import L2_FLUSH_BYTES  # noqa: E402

TOPK, D_QK = 2048, 576
HEAD_COUNTS = (8, 16, 32, 64)
WAYS = ("cold", "hot")


def time_cell(s_q: int, s_kv: int, pattern: str, iters: int, warmup: int) -> dict[tuple[int, str], float]:
    """Median ms of every (h_q, way) at one shape, one call of each in turn."""
    flush = torch.empty(L2_FLUSH_BYTES, dtype=torch.uint8, device="cuda")
    cases = {}
    for h_q in HEAD_COUNTS:
        inputs = make_inputs(s_q, s_kv, h_q, D_QK, TOPK, seed=0)
        inputs["indices"] = pattern_indices(pattern, s_q, s_kv, TOPK, 0, inputs["indices"])
        cases[h_q] = (inputs, poisoned_outputs(s_q, h_q), torch.empty((), dtype=torch.int64, device="cuda"))
    names = [(h_q, way) for h_q in HEAD_COUNTS for way in WAYS]
    events: dict[tuple[int, str], list] = {name: [] for name in names}
    order = random.Random(0)
    for turn in range(warmup + iters):
        for h_q, way in order.sample(names, len(names)):
            inputs, outputs, scratch = cases[h_q]
            flush.zero_()
            if way == "hot":
                torch.sum(inputs["indices"].reshape(-1), 0, out=scratch)  # into L2, as an indexer leaves them
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            sparse_mla_q8kv8_prefill_fwd(**inputs, **outputs)
            end.record()
            if turn >= warmup:
                events[h_q, way].append((start, end))
    torch.cuda.synchronize()
    return {name: statistics.median(s.elapsed_time(e) for s, e in pairs) for name, pairs in events.items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", required=True)
    parser.add_argument("--indices", default="realistic-glm")
    parser.add_argument("--s-q", type=int, nargs="+", default=[1024, 4096])
    parser.add_argument("--s-kv", type=int, nargs="+", default=[8192, 131072])
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3)
    args = parser.parse_args()
    rows = []
    print(f"{torch.cuda.get_device_name()}, {args.indices} indices, topk {TOPK}; per (token, head) against h_q 64 "
          f"timed the same way")
    print(f"{'s_q':>5} {'s_kv':>6} {'h_q':>3} | {'cold ms':>8} {'per head':>8} | {'hot ms':>8} {'per head':>8}")
    for s_q in args.s_q:
        for s_kv in args.s_kv:
            times = time_cell(s_q, s_kv, args.indices, args.iters, args.warmup)
            torch.cuda.empty_cache()
            for h_q in HEAD_COUNTS:
                row = dict(s_q=s_q, s_kv=s_kv, h_q=h_q)
                for way in WAYS:
                    row[f"{way}_ms"] = times[h_q, way]
                    row[f"{way}_per_head_vs_64"] = times[h_q, way] / h_q / (times[64, way] / 64)
                rows.append(row)
                print(f"{s_q:>5} {s_kv:>6} {h_q:>3} | {row['cold_ms']:>8.4f} {row['cold_per_head_vs_64']:>7.3f}x | "
                      f"{row['hot_ms']:>8.4f} {row['hot_per_head_vs_64']:>7.3f}x")
    pathlib.Path(args.json).write_text(json.dumps(dict(
        gpu=torch.cuda.get_device_name(), date=datetime.datetime.now().isoformat(timespec="seconds"),
        commit=git_commit(), indices=args.indices, topk=TOPK, d_qk=D_QK,
        protocol=f"median of {args.iters} after {args.warmup} warm-up turns, every (h_q, way) of a shape one call "
                 "each in turn; cold: L2 flushed; hot: L2 flushed, then the indices copied once, untimed",
        rows=rows), indent=2) + "\n")


if __name__ == "__main__":
    main()
