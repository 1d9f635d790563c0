"""Tensor-parallel head counts: what a rank with h_q = 8-32 heads pays per head, against h_q 64 and the incumbent.

Serving engines shard the query heads over the GPUs of a tensor-parallel group: DeepSeek-V3.2's 128
heads leave 16 per GPU at TP 8, GLM-5- and V4-class models 8. This table times h_q 8, 16, 32, 64 and
128 at s_q 1K and 4K, s_kv 8K and 128K (d_qk 576, topk 2048), on one index pattern, with the
benchmark protocol of bench.py (randn q and kv quantized to e4m3, L2 flushed before every timed call,
CUDA events, the median), the head counts of one (s_q, s_kv) timed one call of each in turn. Columns:

- time, and useful TFLOPS: 2 * (valid slots) * h_q * (d_qk + 512) / time, the valid slots counted in
  the indices (realistic patterns pad a short causal prefix with -1);
- per (token, head): the time per query row and head relative to h_q 64 at the same (s_q, s_kv) and
  indices, so 1.0 means a head costs what it costs in a full 64-head tile;
- vs pad: for fewer than 64 heads, the h_q 64 time over the row's, the gain over padding q to 64
  heads (marked ``!`` below 1: the few-head path lost);
- with ``--incumbent``: the incumbent's time on q padded to 64 heads (it accepts only multiples of
  64, and serving engines pad to call it), timed call by call in turn with ours, and the ratio.

    python benchmarks/tp.py --indices realistic-glm --incumbent .incumbent/sglang_q8kv8.so
    python benchmarks/bench.py --table tp --indices realistic-glm    # the same

Writes ``tp-<indices>-<date>.json`` (GPU, date, commit, every row) under ``--out``, with matplotlib a
``.png`` of the per-head cost beside it, and prints the table; ``--plot A.json B.json ...`` draws one chart
with a panel per pattern.
"""

from __future__ import annotations

import argparse
import datetime
import json
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))  # benchmarks/ is no package
from common import (INDEX_PATTERNS, RESULTS_DIR, git_commit, padded_incumbent_call, pattern_indices,  # noqa: E402
                    waiting_columns)

from sparse_mla import sparse_mla_q8kv8_prefill_fwd  # noqa: E402
from sparse_mla.testing import (  # noqa: E402
    interleaved_median_ms,
    interleaved_waiting_median_ms,
    make_inputs,
    poisoned_outputs,
    reference_prefill,
    relative_error,
)

HEAD_COUNTS = (8, 16, 32, 64, 128)
S_Q = (1024, 4096)
S_KV = (8192, 131072)
D_QK, TOPK, D_V = 576, 2048, 512
CHECK_ROWS = 16


def useful_flops(indices: torch.Tensor, s_kv: int, h_q: int, d_qk: int = D_QK, d_v: int = D_V) -> int:
    """2 * (valid slots) * h_q * (d_qk + d_v): the FLOPs of the slots that attend to a row."""
    valid = int(((indices >= 0) & (indices < s_kv)).sum())
    return 2 * valid * h_q * (d_qk + d_v)


def per_head_cost(rows: list[dict]) -> None:
    """Adds ``per_head_vs_64`` to every row: its time per (query row, head) over that of the h_q 64 row
    with the same s_q, s_kv and indices, and to the rows of fewer heads ``vs_padded``: the h_q 64 row's
    time over its own, what the few-head tiles gain over padding q to 64 heads (below 1: they lose).
    Rows without an h_q 64 row get None."""
    reference = {(r["s_q"], r["s_kv"], r["indices"]): r["ms"] for r in rows if r["h_q"] == 64}
    for r in rows:
        base = reference.get((r["s_q"], r["s_kv"], r["indices"]))
        r["per_head_vs_64"] = None if base is None else r["ms"] / r["h_q"] / (base / 64)
        r["vs_padded"] = None if base is None or r["h_q"] >= 64 else base / r["ms"]


def measure_cell(s_q: int, s_kv: int, pattern: str, args: argparse.Namespace, dispatch=None) -> list[dict]:
    """The rows of every head count at one (s_q, s_kv), their calls (and the incumbent's) timed one
    call of each in turn, so that the per-head ratios against h_q 64 compare calls made under the same
    clocks (timed one row after the other, the h_q 64 reference moved by up to 6% between two runs on one
    machine, and the ratios with it)."""
    calls, cases = {}, []
    for h_q in HEAD_COUNTS:
        inputs = make_inputs(s_q, s_kv, h_q, D_QK, TOPK, seed=args.seed)
        inputs["indices"] = pattern_indices(pattern, s_q, s_kv, TOPK, args.seed, inputs["indices"])
        outputs = poisoned_outputs(s_q, h_q, D_V)
        calls[f"ours {h_q}"] = lambda inputs=inputs, outputs=outputs: sparse_mla_q8kv8_prefill_fwd(**inputs, **outputs)
        if dispatch is not None:
            calls[f"incumbent {h_q}"] = padded_incumbent_call(dispatch, inputs, s_kv)
        cases.append((h_q, inputs, outputs))
    times = interleaved_median_ms(calls, iters=args.iters, warmup=args.warmup)
    # The serving loop's view: each call waits for the one before, host path included.
    waiting = interleaved_waiting_median_ms(calls, iters=args.iters, warmup=args.warmup)
    rows = []
    for h_q, inputs, outputs in cases:
        row = dict(s_q=s_q, s_kv=s_kv, h_q=h_q, d_qk=D_QK, topk=TOPK, indices=pattern, ms=times[f"ours {h_q}"],
                   waiting_ms=waiting[f"ours {h_q}"])
        if dispatch is not None:
            row.update(incumbent_ms=times[f"incumbent {h_q}"], ratio_vs_incumbent=times[f"incumbent {h_q}"] / row["ms"],
                       incumbent_waiting_ms=waiting[f"incumbent {h_q}"],
                       waiting_ratio_vs_incumbent=waiting[f"incumbent {h_q}"] / row["waiting_ms"])
        row["useful_tflops"] = useful_flops(inputs["indices"], s_kv, h_q) / (row["ms"] * 1e-3) / 1e12
        ref_out, _, _ = reference_prefill(inputs["q"][:CHECK_ROWS], inputs["kv"], inputs["indices"][:CHECK_ROWS],
                                          inputs["sm_scale"], inputs["q_scale"], inputs["kv_scale"], D_V)
        row["out_rel_err"] = relative_error(outputs["out"][:CHECK_ROWS], ref_out)
        rows.append(row)
    return rows


def format_table(rows: list[dict]) -> str:
    side = "incumbent_ms" in rows[0]
    lines = [f"{'s_q':>5} {'s_kv':>6} {'h_q':>4} | {'ms':>7} {'TFLOPS':>6} {'per head':>8} {'vs pad':>7}"
             + (f" | {'incumb ms':>9} {'ratio':>5}" if side else "")
             + f" | {'wait ms':>7}" + (f" {'ratio':>5}" if side else "") + f" | {'out err':>8}"]
    for r in rows:
        per = "-" if r["per_head_vs_64"] is None else f"{r['per_head_vs_64']:.2f}x"
        pad = "-" if r.get("vs_padded") is None else f"{r['vs_padded']:.2f}x" + ("!" if r["vs_padded"] < 1 else "")
        lines.append(f"{r['s_q']:>5} {r['s_kv']:>6} {r['h_q']:>4} | {r['ms']:>7.3f} {r['useful_tflops']:>6.0f} {per:>8}"
                     + f" {pad:>7}"
                     + (f" | {r['incumbent_ms']:>9.3f} {r['ratio_vs_incumbent']:>5.2f}" if side else "")
                     + f" | {waiting_columns(r, side)}| {r['out_rel_err']:>8.2e}")
    return "\n".join(lines)


def plot(results: list[dict], path: pathlib.Path) -> bool:
    """One panel per result (index pattern): per-(token, head) cost against h_q 64, a line per (s_q, s_kv).
    False without matplotlib."""
    try:
        import matplotlib
    except ImportError:
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(4.2 * len(results), 3.6), sharey=True, squeeze=False)
    for ax, result in zip(axes[0], results):
        shapes = sorted({(r["s_q"], r["s_kv"]) for r in result["rows"]})
        for s_q, s_kv in shapes:
            rows = [r for r in result["rows"] if (r["s_q"], r["s_kv"]) == (s_q, s_kv) and r["per_head_vs_64"]]
            ax.plot([r["h_q"] for r in rows], [r["per_head_vs_64"] for r in rows], marker="o",
                    label=f"{s_q} x {s_kv // 1024}K")
        ax.set_xscale("log", base=2)
        ax.set_xticks(HEAD_COUNTS, [str(h) for h in HEAD_COUNTS])
        ax.axhline(1.0, color="grey", linewidth=0.8)
        ax.set_title(f"{result['indices']} ({result['commit'][:7]})", fontsize=9)
        ax.set_xlabel("h_q (heads per rank)")
    axes[0][0].set_ylabel("time per (token, head) / h_q 64's")
    axes[0][0].legend(fontsize=7)
    fig.suptitle(f"{results[0]['gpu']}, d_qk {D_QK}, topk {TOPK}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--indices", choices=INDEX_PATTERNS, default="uniform")
    parser.add_argument("--incumbent", type=pathlib.Path, metavar="SO",
                        help="tvm-ffi module of the incumbent kernel, timed on q padded to 64 heads")
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=pathlib.Path, default=RESULTS_DIR)
    parser.add_argument("--plot", type=pathlib.Path, nargs="+", metavar="JSON",
                        help="only draw the per-head chart of these JSON files (a panel each) as tp.png under --out")
    args = parser.parse_args(argv)
    if args.plot:
        drawn = plot([json.loads(path.read_text()) for path in args.plot], args.out / "tp.png")
        print(f"wrote {args.out / 'tp.png'}" if drawn else "matplotlib is not installed: no chart")
        return

    dispatch = None
    if args.incumbent is not None:
        import tvm_ffi

        dispatch = tvm_ffi.load_module(str(args.incumbent))["dispatch"]
    rows = []
    for s_q in S_Q:
        for s_kv in S_KV:
            rows += measure_cell(s_q, s_kv, args.indices, args, dispatch)
            torch.cuda.empty_cache()
            print(f"measured {s_q}x{s_kv}: " + ", ".join(f"h_q {r['h_q']} {r['ms']:.3f} ms" for r in rows[-len(HEAD_COUNTS):]),
                  file=sys.stderr)
    per_head_cost(rows)
    now = datetime.datetime.now()
    result = dict(gpu=torch.cuda.get_device_name(), date=now.isoformat(timespec="seconds"), commit=git_commit(),
                  torch=torch.__version__, indices=args.indices, command=" ".join(["python", "benchmarks/tp.py"] + (sys.argv[1:] if argv is None else argv)),
                  protocol=f"median of {args.iters} after {args.warmup} warm-up calls, 256 MiB L2 flush, CUDA events"
                           + "; the head counts of one (s_q, s_kv) timed call by call in turn"
                           + (", with the incumbent on q padded to 64 heads" if dispatch else ""),
                  rows=rows)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"tp-{args.indices}-{now:%Y%m%d-%H%M%S}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    if plot([result], path.with_suffix(".png")):
        print(f"wrote {path.with_suffix('.png')}")
    print(f"wrote {path}\n\n{result['gpu']}, {args.indices} indices, commit {result['commit'][:12]}")
    print(format_table(rows))


if __name__ == "__main__":
    main()
