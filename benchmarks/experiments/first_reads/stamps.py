"""Where a token-grouped call's time goes between its kernels (Experiment 106, measurement).

Needs the tree built with `stamps.patch`: every kernel of the call writes the earliest and the latest
%globaltimer of each event (a pre-pass CTA's start and end, a grouped CTA's start, its return from the
wait for the pre-pass, a consumer warpgroup's last store; the token-by-token launch's start, last
store and exit) into a buffer whose address it reads from $SPARSE_MLA_STAMPS. Per shape: the call
timed with CUDA events (L2 flushed before it, as in the benchmark protocol) and its stamps, 20 times;
prints the medians of each event relative to the first pre-pass CTA's start, and the call's time.

    python benchmarks/experiments/first_reads/stamps.py --json stamps.json
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # benchmarks/: no package
from bench import git_commit, pattern_indices  # noqa: E402

from sparse_mla import sparse_mla_q8kv8_prefill_fwd  # noqa: E402
from sparse_mla.testing import L2_FLUSH_BYTES, make_inputs, poisoned_outputs  # noqa: E402

# The pre-pass's phases (pp_*) are stamped by phases.patch, on top of stamps.patch (Experiment 109), in
# its CTAs of 1024 threads only: thread 0's slots marked, then past each barrier.
EVENTS = ("prepass_start", "prepass_end", "grouped_start", "grouped_waited", "grouped_end", "tokens_start",
          "tokens_done", "tokens_end", "pp_loaded", "pp_marked", "pp_counted", "pp_scanned", "pp_listed",
          "pp_decided")
SHAPES = ((1024, 8192, 8), (1024, 8192, 16), (1024, 8192, 32), (1024, 131072, 8), (1024, 131072, 16),
          (4096, 8192, 16), (1024, 8192, 64))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", required=True)
    parser.add_argument("--indices", default="realistic-glm")
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--shape", type=int, nargs=3, action="append", metavar=("S_Q", "S_KV", "H_Q"),
                        help="s_q s_kv h_q (repeatable; default: the shapes above)")
    args = parser.parse_args()
    stamps = torch.zeros(2 * len(EVENTS), dtype=torch.int64, device="cuda")
    os.environ["SPARSE_MLA_STAMPS"] = str(stamps.data_ptr())
    flush = torch.empty(L2_FLUSH_BYTES, dtype=torch.uint8, device="cuda")
    rows = []
    for s_q, s_kv, h_q in args.shape or SHAPES:
        inputs = make_inputs(s_q, s_kv, h_q, 576, 2048, seed=0)
        inputs["indices"] = pattern_indices(args.indices, s_q, s_kv, 2048, 0, inputs["indices"])
        outputs = poisoned_outputs(s_q, h_q, 512)
        for _ in range(3):
            sparse_mla_q8kv8_prefill_fwd(**inputs, **outputs)
        samples: dict[str, list[float]] = {e + s: [] for e in EVENTS for s in ("_first", "_last")}
        calls = []
        for _ in range(args.calls):
            stamps[0::2] = 2**63 - 1
            stamps[1::2] = 0
            flush.zero_()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            sparse_mla_q8kv8_prefill_fwd(**inputs, **outputs)
            end.record()
            torch.cuda.synchronize()
            calls.append(start.elapsed_time(end) * 1e3)
            t = stamps.tolist()
            origin = t[0] if t[0] != 2**63 - 1 else min(x for x in t[0::2] if x != 2**63 - 1)
            for k, e in enumerate(EVENTS):
                if t[2 * k + 1] == 0:
                    continue
                samples[e + "_first"].append((t[2 * k] - origin) / 1e3)
                samples[e + "_last"].append((t[2 * k + 1] - origin) / 1e3)
        row = dict(s_q=s_q, s_kv=s_kv, h_q=h_q, indices=args.indices, call_us=statistics.median(calls),
                   **{k: statistics.median(v) for k, v in samples.items() if v})
        rows.append(row)
        print(f"{args.indices} {s_q} x {s_kv} h_q {h_q}: call {row['call_us']:.1f} us (events); from the first "
              "pre-pass CTA's start (first / last):")
        for e in EVENTS:
            if e + "_first" in row:
                print(f"  {e:<15} {row[e + '_first']:8.1f} {row[e + '_last']:8.1f}")
    result = dict(gpu=torch.cuda.get_device_name(), commit=git_commit(), rows=rows)
    pathlib.Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
