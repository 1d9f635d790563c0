"""benchmarks/bench.py's baseline: what a baseline table keeps of a run, and a run's change against it.

bench.py is imported by path (benchmarks/ is no package); the functions tested here need no GPU.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _row(s_q=4096, s_kv=8192, h_q=128, d_qk=576, topk=2048, tflops=900.0, ratio=None, **extra):
    row = dict(s_q=s_q, s_kv=s_kv, h_q=h_q, d_qk=d_qk, topk=topk, ms=1.0, tflops=tflops, sglang=716,
               flashmla=589, target=1070, retention=0.25, union4=2.7, out_rel_err=1.7e-2, lse_rel_err=9e-6,
               max_logits_rel_err=4e-4, **extra)
    if ratio is not None:
        row.update(incumbent_ms=ratio, incumbent_tflops=tflops / ratio, ratio_vs_incumbent=ratio)
    return row


def _result(rows, indices="uniform", **extra):
    return dict(gpu="NVIDIA H200", date="2026-11-30T12:47:37", commit="a7dd047", torch="2.11.0+cu130",
                indices=indices, protocol="median of 30; incumbent sglang_q8kv8.so timed in 2 alternating rounds",
                rows=rows, **extra)


def test_a_baseline_table_keeps_the_shape_the_times_and_the_errors_only(bench):
    table = bench.baseline_table(_result([_row(ratio=1.3)]), source="bench-uniform-run.json")
    (row,) = table["rows"]
    assert set(row) == {"s_q", "s_kv", "h_q", "d_qk", "topk", "ms", "tflops", "incumbent_ms", "incumbent_tflops",
                        "ratio_vs_incumbent", "out_rel_err", "lse_rel_err", "max_logits_rel_err"}
    assert table["commit"] == "a7dd047" and table["gpu"] == "NVIDIA H200" and table["source"] == "bench-uniform-run.json"


def test_the_command_is_the_recorded_one_or_rebuilt_from_the_run(bench):
    assert bench.run_command(_result([_row()], command="python benchmarks/bench.py --quick")) == (
        "python benchmarks/bench.py --quick")
    assert bench.run_command(_result([_row()])) == "python benchmarks/bench.py"
    assert bench.run_command(_result([_row(ratio=1.3)], indices="realistic-glm")) == (
        "python benchmarks/bench.py --indices realistic-glm --incumbent sglang_q8kv8.so")


def test_each_row_is_compared_with_the_baseline_row_of_its_shape(bench):
    table = bench.baseline_table(_result([_row(tflops=800.0, ratio=1.25), _row(s_q=437, h_q=64, tflops=700.0, ratio=1.4)]))
    # A run in another order, one shape the baseline lacks.
    run = [_row(s_q=437, h_q=64, tflops=735.0, ratio=1.47), _row(tflops=792.0, ratio=1.25), _row(topk=64, tflops=100.0)]
    short, anchor, new = bench.compare_to_baseline(run, table)
    assert short["base_tflops"] == 700.0 and short["change"] == pytest.approx(0.05)
    assert short["ratio_change"] == pytest.approx(0.05)
    assert anchor["change"] == pytest.approx(-0.01) and anchor["ratio_change"] == pytest.approx(0.0)
    assert new["base_tflops"] is None and new["change"] is None and new["ratio_change"] is None


def test_a_run_without_the_incumbent_compares_its_tflops_only(bench):
    table = bench.baseline_table(_result([_row(tflops=800.0, ratio=1.25)]))
    (entry,) = bench.compare_to_baseline([_row(tflops=880.0)], table)
    assert entry["change"] == pytest.approx(0.10)
    assert entry["ratio"] is None and entry["base_ratio"] == 1.25 and entry["ratio_change"] is None
    text = bench.format_comparison([entry], table)
    assert "+10.0%" in text and "a7dd047" in text
    assert text.splitlines()[-1].rstrip().endswith("-")  # no ratio change to print


def test_saving_a_table_keeps_the_other_tables(bench):
    uniform = bench.baseline_table(_result([_row()]))
    glm = bench.baseline_table(_result([_row(tflops=910.0)], indices="realistic-glm"))
    baseline = bench.with_table(None, "uniform", uniform)
    baseline = bench.with_table(baseline, "realistic-glm", glm)
    newer = bench.baseline_table(_result([_row(tflops=950.0)]))
    baseline = bench.with_table(baseline, "uniform", newer)
    assert list(baseline["tables"]) == ["realistic-glm", "uniform"]
    assert baseline["tables"]["uniform"]["rows"][0]["tflops"] == 950.0
    assert baseline["tables"]["realistic-glm"]["rows"][0]["tflops"] == 910.0


def test_the_committed_baseline_has_every_shape_of_both_tables(bench):
    baseline = json.loads((ROOT / "benchmarks" / "results" / "baseline.json").read_text())
    shapes = {bench.shape_of(shape) for shape in bench.SHAPES}
    for indices in ("uniform", "realistic-glm"):
        table = baseline["tables"][indices]
        assert {bench.shape_of(row) for row in table["rows"]} == shapes
        assert all(row["ratio_vs_incumbent"] > 1 for row in table["rows"])
        # The run it came from is in the repository.
        assert (ROOT / "benchmarks" / "results" / table["source"]).is_file()
