"""benchmarks/tp.py's arithmetic: useful FLOPs, the per-(token, head) cost against h_q 64, the padding
the incumbent is called with (common.py). The scripts are imported by path (benchmarks/ is no
package); no GPU needed."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.cpu


def test_useful_flops_count_only_valid_slots(tp):
    indices = torch.tensor([[[0, 5, -1, 9]], [[10, 3, 2, 1]]], dtype=torch.int32)  # 10 is s_kv: invalid
    assert tp.useful_flops(indices, s_kv=10, h_q=16) == 2 * 6 * 16 * (576 + 512)


def test_per_head_cost_is_relative_to_h_q_64_of_the_same_shape_and_indices(tp):
    rows = [
        dict(s_q=1024, s_kv=8192, indices="uniform", h_q=64, ms=1.0),
        dict(s_q=1024, s_kv=8192, indices="uniform", h_q=16, ms=0.5),   # a quarter of the heads, half the time
        dict(s_q=1024, s_kv=8192, indices="uniform", h_q=128, ms=2.0),
        dict(s_q=4096, s_kv=8192, indices="uniform", h_q=16, ms=1.0),   # no h_q 64 row of its own
    ]
    tp.per_head_cost(rows)
    assert [r["per_head_vs_64"] for r in rows] == [1.0, 2.0, 1.0, None]
    assert [r["vs_padded"] for r in rows] == [None, 2.0, None, None]  # twice as fast as the 64-head call


def test_the_table_marks_a_few_head_row_slower_than_padding(tp):
    rows = [dict(s_q=1024, s_kv=8192, h_q=16, ms=0.3, useful_tflops=500.0, out_rel_err=1.7e-2, per_head_vs_64=2.0,
                 vs_padded=2.0),
            dict(s_q=1024, s_kv=131072, h_q=16, ms=0.4, useful_tflops=400.0, out_rel_err=1.7e-2, per_head_vs_64=4.1,
                 vs_padded=0.97)]
    lines = tp.format_table(rows).splitlines()
    assert lines[1].split("|")[1].split()[-1] == "2.00x" and lines[2].split("|")[1].split()[-1] == "0.97x!"


@pytest.mark.parametrize("h_q, padded", [(1, 64), (8, 64), (64, 64), (65, 128), (128, 128)])
def test_the_incumbent_gets_q_padded_to_64_heads(common, h_q, padded):
    assert common.padded_heads(h_q) == padded


def test_the_table_prints_every_row_and_a_dash_where_no_h_q_64_row_exists(tp):
    rows = [dict(s_q=1024, s_kv=8192, h_q=16, ms=0.3, useful_tflops=500.0, out_rel_err=1.7e-2, per_head_vs_64=None),
            dict(s_q=1024, s_kv=8192, h_q=64, ms=0.6, useful_tflops=1000.0, out_rel_err=1.7e-2, per_head_vs_64=1.0)]
    lines = tp.format_table(rows).splitlines()
    assert len(lines) == 3
    assert lines[1].split("|")[1].split()[-2] == "-" and lines[2].split("|")[1].split()[-2] == "1.00x"
