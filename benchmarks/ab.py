"""Builds of the kernel from different sources, timed side by side in one process (and the incumbent).

Each variant is a cache root that `python -m sparse_mla prebuild` filled from one source tree. For
every shape, all variants run on the same inputs through the package's own launch plan
(`sparse_mla.testing.launch_with_module` with the variant's module), interleaved call by call with the incumbent
(`sparse_mla.testing.interleaved_median_ms`: a new random order every turn), L2 flushed before each
timed call; the table gives each variant's median time relative to the first variant's and the
incumbent's over each variant's. The outputs of all variants are compared bitwise with the first
variant's (a "!" marks a difference: a variant that changes arithmetic, not only ordering), and every
variant's first rows against the float32 reference. Name each build twice: where two names of one
build read more than 1% apart (short calls at 40 calls a variant did, by up to 6%), a line says so,
and that shape's differences are noise.

    python benchmarks/ab.py --variant base=/tmp/ab/base --variant new=/tmp/ab/new --variant base2=/tmp/ab/base \\
        --indices realistic-glm --shape 4096,8192,16,576,2048 --incumbent .incumbent/sglang_q8kv8.so --json ab.json

`benchmarks/ab.sh` makes the source trees (HEAD and the working tree), builds them side by side on
the GPU machine and runs this script on them: an experiment's device command is a few lines of it.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import pathlib
import sys

import torch
import tvm_ffi

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))  # benchmarks/ is no package
from common import INDEX_PATTERNS, SHAPES, git_commit, incumbent_call, pattern_indices  # noqa: E402

from sparse_mla.testing import (  # noqa: E402
    PrefillArgs,
    interleaved_median_ms,
    launch_with_module,
    load_module,
    make_inputs,
    poisoned_outputs,
    prefill_flops,
    reference_prefill,
    relative_error,
)

SHAPE_FIELDS = ("s_q", "s_kv", "h_q", "d_qk", "topk")
QUICK = (0, 3, 5, 6)  # of the benchmark table: h_q 128 at 8K and 128K, small s_q, d_qk 512 / topk 512


def seam(q, kv, indices, q_scale, kv_scale, attn_sink, topk_length, out, max_logits, lse, sm_scale, batch_invariant,
         module, token_groups):
    """A call through this package's launch plan on ``module`` (a build of this package's entries)."""
    launch_with_module(module, PrefillArgs(q, kv, indices, q_scale, kv_scale, attn_sink, topk_length, out, max_logits,
                                           lse, sm_scale, batch_invariant), token_groups=token_groups)


def load_variant(spec: str) -> tuple[str, dict, str, object]:
    """``NAME=CACHE_ROOT[:MODE][@PLAN]`` -> (name, {(d_qk, topk): module}, token-group mode, launch) for
    every kernel the root holds; MODE is ``auto`` (default), ``always`` or ``never``; PLAN, the
    ``launch.py`` of the tree the root was built from, where its entries take other arguments than this
    package's (loaded beside it; its ``launch`` must take the call's tensors, then ``module=`` and
    ``token_groups=``, as the package's did before its entries took a plan's arguments). The same root under two names times one build twice: the spread between the two is
    the noise floor."""
    name, _, rest = spec.partition("=")
    rest, _, plan_path = rest.partition("@")
    root, _, mode = rest.partition(":")
    mode = mode or "auto"
    plan = seam
    if plan_path:
        plan_spec = importlib.util.spec_from_file_location(f"launch_plan_{name}", plan_path)
        plan_module = importlib.util.module_from_spec(plan_spec)
        plan_spec.loader.exec_module(plan_module)
        plan = plan_module.launch
    modules = {}
    for so in sorted(pathlib.Path(root).glob("sm90a/sparse_mla_prefill_dqk*_topk*_sm90a/*/*.so")):
        key = so.parent.parent.name.split("_")  # sparse_mla_prefill_dqk576_topk2048_sm90a
        modules[(int(key[3][3:]), int(key[4][4:]))] = load_module(so)
    if not modules:
        sys.exit(f"no kernel module under {root}")
    return name, modules, mode, plan


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", action="append", required=True, metavar="NAME=CACHE_ROOT[:MODE][@PLAN]")
    parser.add_argument("--incumbent", type=pathlib.Path, metavar="SO")
    parser.add_argument("--indices", choices=INDEX_PATTERNS, default="uniform")
    parser.add_argument("--quick", action="store_true", help=f"only shapes {QUICK}")
    parser.add_argument("--shape", action="append", metavar="S_Q,S_KV,H_Q,D_QK,TOPK",
                        help="time these shapes instead of the benchmark table's")
    parser.add_argument("--batch-invariant", action="store_true",
                        help="also time each variant in the batch-invariant mode (as NAME+bi)")
    parser.add_argument("--topk-length", choices=("random",),
                        help="per-row topk_length uniform in [1, topk] (make_inputs' 'random')")
    parser.add_argument("--iters", type=int, default=60, help="timed calls of each variant per shape")
    parser.add_argument("--json", type=pathlib.Path)
    parser.add_argument("--shared-outputs", action="store_true",
                        help="every variant writes one set of outputs (no bitwise comparison): where each "
                             "variant's own buffers read apart on short calls, the same build under two names too")
    args = parser.parse_args()

    variants = {name: (modules, mode, plan) for name, modules, mode, plan in map(load_variant, args.variant)}
    # Names of one build (the same root and mode): their spread is the run's noise floor.
    same_build: dict[str, list[str]] = {}
    for spec in args.variant:
        name, _, build = spec.partition("=")
        same_build.setdefault(build, []).append(name)
    dispatch = tvm_ffi.load_module(str(args.incumbent))["dispatch"] if args.incumbent else None
    table = [tuple(shape[name] for name in SHAPE_FIELDS) for shape in SHAPES]
    shapes = [table[i] for i in QUICK] if args.quick else table
    if args.shape:
        shapes = [tuple(int(x) for x in spec.split(",")) for spec in args.shape]
    rows = []
    for shape in shapes:
        s_q, s_kv, h_q, d_qk, topk = shape
        inputs = make_inputs(s_q, s_kv, h_q, d_qk, topk, seed=0, topk_length=args.topk_length)
        lengths = inputs["topk_length"]
        inputs["indices"] = pattern_indices(args.indices, s_q, s_kv, topk, 0, inputs["indices"])
        calls, outputs = {}, {}
        shared = poisoned_outputs(s_q, h_q) if args.shared_outputs else None
        for name, (modules, mode, plan) in variants.items():
            for invariant in (False, True) if args.batch_invariant else (False,):
                label = name + ("+bi" if invariant else "")
                out = outputs[label] = shared if shared is not None else poisoned_outputs(s_q, h_q)
                calls[label] = (lambda m=modules[(d_qk, topk)], o=out, bi=invariant, tg=mode, run=plan: run(
                    inputs["q"], inputs["kv"], inputs["indices"], inputs["q_scale"], inputs["kv_scale"], None, lengths,
                    o["out"], o["max_logits"], o["lse"], inputs["sm_scale"], bi, module=m, token_groups=tg))
        if dispatch is not None:
            shape_args = dict(zip(SHAPE_FIELDS, shape))
            calls["incumbent"] = incumbent_call(dispatch, inputs, shape_args)[0]
        ms = interleaved_median_ms(calls, iters=args.iters)
        first = next(iter(variants))
        identical = {name: all(torch.equal(outputs[name][k], outputs[first][k]) for k in ("out", "max_logits", "lse"))
                     for name in outputs}
        ref_out, _, ref_lse = reference_prefill(
            inputs["q"][:16], inputs["kv"], inputs["indices"][:16], inputs["sm_scale"], inputs["q_scale"],
            inputs["kv_scale"], 512, None, None if lengths is None else lengths[:16])
        row = dict(shape=shape, ms=ms, identical_to_first=identical,
                   out_rel_err=relative_error(outputs[first]["out"][:16], ref_out),
                   out_rel_err_of={n: relative_error(o["out"][:16], ref_out) for n, o in outputs.items()},
                   tflops={n: prefill_flops(s_q, h_q, topk, d_qk) / (t * 1e-3) / 1e12 for n, t in ms.items()})
        spreads = [max(ms[n] for n in names) / min(ms[n] for n in names) - 1
                   for names in same_build.values() if len(names) > 1]
        row["same_build_spread"] = max(spreads, default=None)
        rows.append(row)
        torch.cuda.empty_cache()
        print(" ".join(f"{n} {t:.3f}" for n, t in ms.items()), shape, file=sys.stderr)

    names = [name for name in rows[0]["identical_to_first"]]
    print(f"{torch.cuda.get_device_name()}, {args.indices} indices; median ms of {args.iters} interleaved calls; "
          f"vs {names[0]}; incumbent time / variant time")
    print(f"{'shape':<30}" + "".join(f"{n:>18}" for n in names) + (f"{'incumbent':>11}" if dispatch else ""))
    for row in rows:
        cells = ""
        for n in names:
            flag = "" if row["identical_to_first"][n] else "!"
            cells += f"{row['ms'][n]:>8.3f} {row['ms'][n] / row['ms'][names[0]]:>5.3f}"
            cells += f" {row['ms']['incumbent'] / row['ms'][n]:>3.2f}{flag}" if dispatch else f"{flag:>4}"
        print(f"{str(row['shape']):<30}" + cells + (f"{row['ms']['incumbent']:>11.3f}" if dispatch else "")
              + f"  err {row['out_rel_err']:.2e} (max {max(row['out_rel_err_of'].values()):.2e})")
    if any(not all(r["identical_to_first"].values()) for r in rows):
        print("! outputs differ from the first variant's")
    for row in rows:
        if row["same_build_spread"] is not None and row["same_build_spread"] > 0.01:
            print(f"noise: names of one build read {row['same_build_spread']:.1%} apart at {row['shape']}: "
                  "its differences are not to be read (more --iters)")
    if args.json:
        meta = dict(gpu=torch.cuda.get_device_name(), date=datetime.datetime.now().isoformat(timespec="seconds"),
                    commit=git_commit(), variants=args.variant, indices=args.indices, topk_length=args.topk_length)
        args.json.write_text(json.dumps(dict(meta, rows=rows), indent=1) + "\n")


if __name__ == "__main__":
    main()
