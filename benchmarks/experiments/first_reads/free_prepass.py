"""What a token-grouped call would cost with its pre-pass free (Experiment 107, a bound).

Per shape (realistic-glm, topk 2048): the call as the library makes it (pre-pass, grouped launch,
token-by-token launch), and the same two launches alone over lists the pre-pass built once before
the timing (`token_groups_fwd`, then `prefill_fwd` grouped and not), side by side with the h_q 64
call at the same s_q and s_kv (the benchmark protocol: L2 flushed before every timed call,
interleaved, median). Prints each one's time and per-(token, head) cost against h_q 64; outputs of
the bound are checked bitwise against the call's.

    python benchmarks/experiments/first_reads/free_prepass.py --json free_prepass.json
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # benchmarks/: no package
from bench import git_commit, pattern_indices  # noqa: E402

import sparse_mla.launch as launch  # noqa: E402
from sparse_mla.jit import get_module  # noqa: E402
from sparse_mla.testing import interleaved_median_ms, make_inputs, poisoned_outputs  # noqa: E402

TOPK, D_QK = 2048, 576


def calls(s_q: int, s_kv: int, h_q: int, pattern: str) -> tuple[dict, dict]:
    inputs = make_inputs(s_q, s_kv, h_q, D_QK, TOPK, seed=0)
    inputs["indices"] = pattern_indices(pattern, s_q, s_kv, TOPK, 0, inputs["indices"])
    q, kv, indices = inputs["q"], inputs["kv"], inputs["indices"]
    q_scale, kv_scale, sm_scale = inputs["q_scale"].reshape(1), inputs["kv_scale"].reshape(1), inputs["sm_scale"]
    full, bound = poisoned_outputs(s_q, h_q), poisoned_outputs(s_q, h_q)
    result = {"call": lambda: launch.launch(q, kv, indices, q_scale, kv_scale, None, None, full["out"],
                                            full["max_logits"], full["lse"], sm_scale, False)}
    group = launch.group_size(h_q, TOPK)
    if h_q <= 32:
        module = get_module(launch._kernel_key(D_QK, TOPK))
        lists = launch.token_group_lists(q.device, s_q, group, TOPK)
        module.token_groups_fwd(indices, None, s_kv, h_q, group, launch.max_union_ratio(h_q), *lists)
        items = s_q * ((h_q + 63) // 64)

        def launches() -> None:
            for grouped in (True, False):
                module.prefill_fwd(q, kv, indices, q_scale, kv_scale, None, None, bound["out"], bound["max_logits"],
                                   bound["lse"], sm_scale, items, 1, None, None, group, *lists, grouped)

        result["lists given"] = launches
    return result, dict(full=full, bound=bound)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", required=True)
    parser.add_argument("--indices", default="realistic-glm")
    parser.add_argument("--s-q", type=int, nargs="+", default=[1024])
    args = parser.parse_args()
    rows = []
    for s_q in args.s_q:
        for s_kv in (8192, 131072):
            reference = None
            for h_q in (64, 8, 16, 32):
                fns, outs = calls(s_q, s_kv, h_q, args.indices)
                times = interleaved_median_ms(fns, iters=20)
                if h_q == 64:
                    reference = times["call"]
                    continue
                same = bool(torch.equal(outs["full"]["out"], outs["bound"]["out"]))
                row = dict(s_q=s_q, s_kv=s_kv, h_q=h_q, indices=args.indices, h64_ms=reference,
                           call_ms=times["call"], lists_given_ms=times["lists given"], outputs_equal=same,
                           call_per_head=times["call"] / h_q / (reference / 64),
                           lists_given_per_head=times["lists given"] / h_q / (reference / 64))
                rows.append(row)
                print(f"{args.indices} {s_q} x {s_kv} h_q {h_q}: call {row['call_ms'] * 1e3:.1f} us "
                      f"({row['call_per_head']:.3f} per head), lists given {row['lists_given_ms'] * 1e3:.1f} us "
                      f"({row['lists_given_per_head']:.3f}), h_q 64 {reference * 1e3:.1f} us, outputs equal {same}")
    result = dict(gpu=torch.cuda.get_device_name(), commit=git_commit(), rows=rows)
    pathlib.Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
