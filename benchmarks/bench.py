"""The sparse_mla benchmark: the published sparse-prefill protocol on its table of shapes, against the incumbents.

Protocol: q and kv drawn from randn, quantized to e4m3 with per-tensor scales,
sm_scale = 1/sqrt(d_qk), preallocated outputs, a 256 MiB L2 flush before every timed call, the median
of 30 calls timed with CUDA events; TFLOPS = 2 * s_q * h_q * topk * (d_qk + 512) / time. Each shape is
also checked against the reference on its first 16 query rows, so a number from a wrong kernel shows.

    python benchmarks/bench.py                              # all 9 shapes, uniform indices
    python benchmarks/bench.py --quick                      # 3 of them
    python benchmarks/bench.py --indices realistic-glm      # indexer-like overlap between neighbours
    python benchmarks/bench.py --incumbent .incumbent/sglang_q8kv8.so   # side by side, ratio per row
    python benchmarks/bench.py --plot benchmarks/results/bench-uniform-20261130-120000.json
    python benchmarks/bench.py --from benchmarks/results/bench-uniform-20261130-120000.json   # compare a saved run
    python benchmarks/bench.py --incumbent .incumbent/sglang_q8kv8.so --save-baseline        # a new baseline
    python benchmarks/bench.py --table tp --indices realistic-glm   # head counts per tensor-parallel rank (tp.py)

``--incumbent`` loads a tvm-ffi build of the incumbent FP8 kernel (sglang's SM90 Q8KV8 sparse prefill,
its ``dispatch`` function) and times it on the same inputs call by call in turn with ours, so the
ratio is measured under the same clocks; each row then records ``incumbent_tflops`` and
``ratio_vs_incumbent``. The incumbent reads out of bounds on indices >= s_kv: only valid inputs
(every benchmark pattern) may be given to it.

Writes ``bench-<indices>-<date>.json`` (GPU, date, commit, torch version, every row) and, where
matplotlib is installed, a ``.png`` bar chart next to it, under ``--out`` (default benchmarks/results/).
``--plot`` redraws the chart from a JSON file on any machine with matplotlib.

Every run ends with its change against the baseline, ``benchmarks/results/baseline.json`` (``--baseline``):
main's numbers per table (one per ``--indices`` pattern), row by row, our TFLOPS and, where both runs
timed the incumbent, the ratio. Absolute TFLOPS move 5-15% between GPU leases; the ratio, measured under
the same clocks, is the number to compare. ``--save-baseline`` writes the run's table into the baseline
(the other tables stay) and its chart beside it as ``baseline-<indices>.png``; ``--from JSON`` compares
(or, with ``--save-baseline``, saves) a run measured earlier, without a GPU.
"""

from __future__ import annotations

import argparse
import datetime
import json
import pathlib
import re
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))  # benchmarks/ is no package
from common import INDEX_PATTERNS, RESULTS_DIR, SHAPES, git_commit, incumbent_call, pattern_indices, waiting_columns  # noqa: E402

from sparse_mla import sparse_mla_q8kv8_prefill_fwd  # noqa: E402
from sparse_mla.testing import (  # noqa: E402
    index_overlap_stats,
    interleaved_median_ms,
    interleaved_waiting_median_ms,
    make_inputs,
    median_time_ms,
    poisoned_outputs,
    prefill_flops,
    reference_prefill,
    relative_error,
)

BASELINE = RESULTS_DIR / "baseline.json"
CHECK_ROWS = 16

QUICK = (0, 5, 6)  # one of each regime: h_q 128 at 8K, small s_q, d_qk 512 / topk 512
TABLES = ("main", "tp")  # --table tp: the tensor-parallel head-count table of benchmarks/tp.py


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--table", choices=TABLES, default="main",
                        help="main: this table; tp: benchmarks/tp.py's head counts per tensor-parallel rank")
    parser.add_argument("--quick", action="store_true", help=f"only shapes {QUICK} of the table")
    parser.add_argument("--indices", choices=INDEX_PATTERNS, default="uniform",
                        help="uniform random (the published protocol) or a realistic_indices preset; "
                             "-sorted: each token's rows in ascending order")
    parser.add_argument("--iters", type=int, default=30, help="timed calls per shape (median reported)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=pathlib.Path, default=RESULTS_DIR, help="directory for JSON and PNG")
    parser.add_argument("--plot", type=pathlib.Path, metavar="JSON", help="only redraw the chart of a JSON file")
    parser.add_argument("--incumbent", type=pathlib.Path, metavar="SO",
                        help="tvm-ffi module of the incumbent kernel to time side by side")
    parser.add_argument("--baseline", type=pathlib.Path, default=BASELINE, metavar="JSON",
                        help="the baseline the run is compared with (default: %(default)s)")
    parser.add_argument("--save-baseline", action="store_true",
                        help="write this run's table into --baseline, and its chart beside it")
    parser.add_argument("--from", dest="from_json", type=pathlib.Path, metavar="JSON",
                        help="do not measure: compare (or with --save-baseline, save) a run's JSON file")
    return parser.parse_args()


def measure(shape: dict, pattern: str, args: argparse.Namespace, dispatch=None) -> dict:
    """Time one shape (and the incumbent on it, given ``dispatch``) and check it on its first rows."""
    s_q, s_kv, h_q, d_qk, topk = (shape[name] for name in ("s_q", "s_kv", "h_q", "d_qk", "topk"))
    inputs = make_inputs(s_q, s_kv, h_q, d_qk, topk, seed=args.seed)
    inputs["indices"] = pattern_indices(pattern, s_q, s_kv, topk, args.seed, inputs["indices"])
    overlap = index_overlap_stats(inputs["indices"])
    outputs = poisoned_outputs(s_q, h_q, inputs["d_v"])

    ours = lambda: sparse_mla_q8kv8_prefill_fwd(**inputs, **outputs)  # noqa: E731
    flops = prefill_flops(s_q, h_q, topk, d_qk)
    if dispatch is None:
        calls = {"ours": ours}
        ms = median_time_ms(ours, iters=args.iters, warmup=args.warmup)
    else:
        theirs, incumbent_outputs = incumbent_call(dispatch, inputs, shape)
        calls = {"ours": ours, "incumbent": theirs}
        # Call by call, in turn, so that both see the same clocks.
        times = interleaved_median_ms(calls, iters=args.iters, warmup=args.warmup)
        ms, incumbent_ms = times["ours"], times["incumbent"]
    # The serving loop's view: each call waits for the one before, host path included.
    waiting = interleaved_waiting_median_ms(calls, iters=args.iters, warmup=args.warmup)
    tflops = flops / (ms * 1e-3) / 1e12

    ref_out, ref_max_logits, ref_lse = reference_prefill(
        inputs["q"][:CHECK_ROWS], inputs["kv"], inputs["indices"][:CHECK_ROWS], inputs["sm_scale"],
        inputs["q_scale"], inputs["kv_scale"], inputs["d_v"],
    )
    row = dict(shape)
    row.update(
        indices=pattern,
        ms=ms,
        tflops=tflops,
        waiting_ms=waiting["ours"],
        ratio_vs_sglang=tflops / shape["sglang"],
        retention=overlap.retention,
        union4=overlap.union4,
        out_rel_err=relative_error(outputs["out"][:CHECK_ROWS], ref_out),
        lse_rel_err=relative_error(outputs["lse"][:CHECK_ROWS], ref_lse),
        max_logits_rel_err=relative_error(outputs["max_logits"][:CHECK_ROWS], ref_max_logits),
    )
    if dispatch is not None:
        row.update(
            incumbent_ms=incumbent_ms,
            incumbent_tflops=flops / (incumbent_ms * 1e-3) / 1e12,
            ratio_vs_incumbent=incumbent_ms / ms,
            incumbent_waiting_ms=waiting["incumbent"],
            waiting_ratio_vs_incumbent=waiting["incumbent"] / waiting["ours"],
            incumbent_out_rel_err=relative_error(incumbent_outputs["out"][:CHECK_ROWS], ref_out),
        )
    return row


def print_table(rows: list[dict]) -> None:
    side = "incumbent_tflops" in rows[0]
    header = (f"{'s_q':>5} {'s_kv':>6} {'h_q':>4} {'d_qk':>4} {'topk':>5} | {'ms':>7} {'TFLOPS':>6} "
              + (f"{'incumb':>6} {'ratio':>5} " if side else f"{'sglang':>6} {'ratio':>5} ")
              + f"{'target':>6} | {'wait ms':>7} " + (f"{'ratio':>5} " if side else "")
              + f"| {'retain':>6} {'union4':>6} | {'out err':>8} {'lse err':>8}")
    print(header)
    print("-" * len(header))
    for row in rows:
        versus = (f"{row['incumbent_tflops']:>6.0f} {row['ratio_vs_incumbent']:>5.2f} " if side
                  else f"{row['sglang']:>6} {row['ratio_vs_sglang']:>5.2f} ")
        print(f"{row['s_q']:>5} {row['s_kv']:>6} {row['h_q']:>4} {row['d_qk']:>4} {row['topk']:>5} | "
              f"{row['ms']:>7.3f} {row['tflops']:>6.0f} " + versus +
              f"{row['target']:>6} | {waiting_columns(row, side)}| {row['retention']:>6.3f} {row['union4']:>6.2f} | {row['out_rel_err']:>8.2e} "
              f"{row['lse_rel_err']:>8.2e}")


def plot(result: dict, path: pathlib.Path) -> bool:
    """Bar chart of our TFLOPS next to the incumbents' and the target; False without matplotlib."""
    try:
        import matplotlib
    except ImportError:
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]
    labels = [f"{r['s_q']}x{r['s_kv'] // 1024}K\nh{r['h_q']} d{r['d_qk']}\ntopk{r['topk']}" for r in rows]
    series = [("sparse_mla", "tflops", "tab:blue"), ("sglang Q8KV8 (reference table)", "sglang", "tab:gray"),
              ("FlashMLA bf16", "flashmla", "tab:olive"), ("target", "target", "tab:red")]
    if "incumbent_tflops" in rows[0]:
        series.insert(1, ("incumbent, same run", "incumbent_tflops", "tab:orange"))
    width = 0.8 / len(series)
    figure, axes = plt.subplots(figsize=(max(8, 1.6 * len(rows)), 5))
    for k, (name, key, color) in enumerate(series):
        positions = [i + (k - (len(series) - 1) / 2) * width for i in range(len(rows))]
        axes.bar(positions, [r[key] for r in rows], width, label=name, color=color)
    axes.set_xticks(range(len(rows)), labels, fontsize=8)
    axes.set_ylabel("TFLOPS")
    axes.set_ylim(0, 1.15 * max(max(r["tflops"], r["target"]) for r in rows))  # room for the legend
    axes.set_title(f"sparse_mla on {result['gpu']}, {result['indices']} indices, {result['date']}")
    axes.legend(loc="upper center", ncols=len(series))
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return True

# ---- the baseline: main's numbers per table, and a run's change against them ----------------------------

BASELINE_ABOUT = ("main's numbers per table (--indices pattern), which every bench.py run is compared with; "
                  "written by `python benchmarks/bench.py ... --save-baseline`")
SHAPE_FIELDS = ("s_q", "s_kv", "h_q", "d_qk", "topk")
# What a baseline row keeps of a run's row (the rest is the run's own detail: reference tables, overlap).
BASELINE_FIELDS = SHAPE_FIELDS + ("ms", "tflops", "incumbent_ms", "incumbent_tflops", "ratio_vs_incumbent",
                                  "out_rel_err", "lse_rel_err", "max_logits_rel_err")


def shape_of(row: dict) -> tuple:
    return tuple(row[name] for name in SHAPE_FIELDS)


def run_command(result: dict) -> str:
    """The command line that measured ``result``: as recorded, else rebuilt from its fields."""
    if result.get("command"):
        return result["command"]
    words = ["python", "benchmarks/bench.py"]
    if result["indices"] != "uniform":
        words += ["--indices", result["indices"]]
    if result["rows"] and "incumbent_tflops" in result["rows"][0]:
        named = re.search(r"incumbent (\S+) timed", result.get("protocol", ""))
        words += ["--incumbent", named.group(1) if named else "INCUMBENT.so"]
    return " ".join(words)


def baseline_table(result: dict, source: str | None = None) -> dict:
    """The baseline entry of one run: where and how it was measured, and its rows' lean fields."""
    table = {name: result[name] for name in ("gpu", "date", "commit", "torch", "protocol") if name in result}
    table["command"] = run_command(result)
    if source is not None:
        table["source"] = source
    table["rows"] = [{name: row[name] for name in BASELINE_FIELDS if name in row} for row in result["rows"]]
    return table


def with_table(baseline: dict | None, indices: str, table: dict) -> dict:
    """``baseline`` with its table for ``indices`` replaced by ``table`` (the other tables kept)."""
    tables = dict((baseline or {}).get("tables", {}))
    tables[indices] = table
    return {"about": BASELINE_ABOUT, "tables": dict(sorted(tables.items()))}


def compare_to_baseline(rows: list[dict], table: dict) -> list[dict]:
    """Per row of a run, its TFLOPS and ratio against the baseline row of the same shape.

    ``change`` and ``ratio_change`` are fractions (0.02 is 2% faster); None where the baseline has no
    row of that shape, or one of the two runs did not time the incumbent.
    """
    base_rows = {shape_of(row): row for row in table.get("rows", [])}
    compared = []
    for row in rows:
        base = base_rows.get(shape_of(row))
        entry = dict(zip(SHAPE_FIELDS, shape_of(row)), tflops=row["tflops"], base_tflops=None, change=None,
                     ratio=row.get("ratio_vs_incumbent"), base_ratio=None, ratio_change=None)
        if base is not None:
            entry["base_tflops"] = base["tflops"]
            entry["change"] = row["tflops"] / base["tflops"] - 1
            entry["base_ratio"] = base.get("ratio_vs_incumbent")
            if entry["ratio"] is not None and entry["base_ratio"] is not None:
                entry["ratio_change"] = entry["ratio"] / entry["base_ratio"] - 1
        compared.append(entry)
    return compared


def format_comparison(compared: list[dict], table: dict) -> str:
    """The comparison as a table, one line per row of the run."""
    def number(value, spec):
        return format(value, spec) if value is not None else "-"

    def percent(value):
        return f"{100 * value:+.1f}%" if value is not None else "-"

    header = (f"{'s_q':>5} {'s_kv':>6} {'h_q':>4} {'d_qk':>4} {'topk':>5} | {'TFLOPS':>6} {'base':>6} {'change':>7} | "
              f"{'ratio':>5} {'base':>5} {'change':>7}")
    lines = [f"against the baseline (commit {table.get('commit', '?')}, {table.get('gpu', '?')}, {table.get('date', '?')}):",
             header, "-" * len(header)]
    for c in compared:
        lines.append(f"{c['s_q']:>5} {c['s_kv']:>6} {c['h_q']:>4} {c['d_qk']:>4} {c['topk']:>5} | "
                     f"{c['tflops']:>6.0f} {number(c['base_tflops'], '>6.0f')} {percent(c['change']):>7} | "
                     f"{number(c['ratio'], '>5.2f')} {number(c['base_ratio'], '>5.2f')} {percent(c['ratio_change']):>7}")
    return "\n".join(lines)


def print_comparison(result: dict, path: pathlib.Path) -> None:
    if not path.is_file():
        print(f"\nno baseline at {path}: --save-baseline writes one")
        return
    table = json.loads(path.read_text()).get("tables", {}).get(result["indices"])
    if table is None:
        print(f"\n{path} has no {result['indices']} table: --save-baseline adds it")
        return
    print()
    print(format_comparison(compare_to_baseline(result["rows"], table), table))


def save_baseline(result: dict, path: pathlib.Path, source: str | None) -> None:
    """Writes ``result``'s table into the baseline file and its chart beside it."""
    baseline = json.loads(path.read_text()) if path.is_file() else None
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(with_table(baseline, result["indices"], baseline_table(result, source)), indent=2) + "\n")
    print(f"wrote the {result['indices']} table of {path}")
    png = path.parent / f"baseline-{result['indices']}.png"
    if plot(result, png):
        print(f"wrote {png}")
    else:
        print(f"matplotlib is not installed: {png} was not redrawn")


def _relative_to_baseline(run: pathlib.Path, baseline: pathlib.Path) -> str:
    try:
        return run.resolve().relative_to(baseline.resolve().parent).as_posix()
    except ValueError:
        return run.name


def main() -> None:
    table = argparse.ArgumentParser(add_help=False)
    table.add_argument("--table", choices=TABLES, default="main")
    chosen, rest = table.parse_known_args()
    if chosen.table == "tp":  # its own options (benchmarks/tp.py --help)
        import tp

        tp.main(rest)
        return
    args = parse_args()
    if args.plot is not None:
        png = args.plot.with_suffix(".png")
        if not plot(json.loads(args.plot.read_text()), png):
            sys.exit("--plot needs matplotlib")
        print(f"wrote {png}")
        return
    if args.from_json is not None:
        result = json.loads(args.from_json.read_text())
        print(f"{result['gpu']}, {result['indices']} indices, commit {result['commit'][:12]} ({args.from_json})")
        print_table(result["rows"])
        print_comparison(result, args.baseline)
        if args.save_baseline:
            if len(result["rows"]) < len(SHAPES):
                sys.exit(f"--save-baseline needs every shape of the table; {args.from_json} has {len(result['rows'])}")
            save_baseline(result, args.baseline, _relative_to_baseline(args.from_json, args.baseline))
        return
    if args.save_baseline and args.quick:
        sys.exit("--save-baseline needs every shape of the table: drop --quick")

    dispatch = None
    if args.incumbent is not None:
        import tvm_ffi

        dispatch = tvm_ffi.load_module(str(args.incumbent))["dispatch"]
    shapes = [SHAPES[i] for i in QUICK] if args.quick else SHAPES
    rows = []
    for shape in shapes:
        row = measure(shape, args.indices, args, dispatch)
        rows.append(row)
        torch.cuda.empty_cache()  # the next shape's tensors start from a clean pool
        print(f"measured {row['s_q']}x{row['s_kv']} h_q={row['h_q']} d_qk={row['d_qk']} topk={row['topk']}: "
              f"{row['tflops']:.0f} TFLOPS"
              + (f", incumbent {row['incumbent_tflops']:.0f} ({row['ratio_vs_incumbent']:.2f}x)" if dispatch else ""),
              file=sys.stderr)
    now = datetime.datetime.now()
    result = {
        "gpu": torch.cuda.get_device_name(),
        "date": now.isoformat(timespec="seconds"),
        "commit": git_commit(),
        "torch": torch.__version__,
        "indices": args.indices,
        "command": " ".join(["python", "benchmarks/bench.py"] + [a for a in sys.argv[1:] if a != "--save-baseline"]),
        "protocol": f"median of {args.iters} after {args.warmup} warm-up calls, 256 MiB L2 flush, CUDA events"
                    + (f"; incumbent {args.incumbent.name} timed call by call in turn with ours"
                       if args.incumbent else ""),
        "rows": rows,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"bench-{args.indices}-{now:%Y%m%d-%H%M%S}"
    stem.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {stem.with_suffix('.json')}")
    if plot(result, stem.with_suffix(".png")):
        print(f"wrote {stem.with_suffix('.png')}")
    else:
        print(f"matplotlib is not installed: draw the chart elsewhere with --plot {stem.with_suffix('.json')}")
    print(f"\n{result['gpu']}, {args.indices} indices, commit {result['commit'][:12]}")
    print_table(rows)
    print_comparison(result, args.baseline)
    if args.save_baseline:
        save_baseline(result, args.baseline, _relative_to_baseline(stem.with_suffix(".json"), args.baseline))


if __name__ == "__main__":
    main()
