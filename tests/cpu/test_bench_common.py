"""benchmarks/common.py, what bench.py, tp.py and ab.py share: the index patterns, the commit a run names,
and that the scripts take these from it rather than from each other. The scripts are imported by path
(benchmarks/ is no package); nothing here needs a GPU."""

from __future__ import annotations

import sys

import torch


def test_a_sorted_pattern_lists_each_tokens_rows_ascending_and_its_invalid_slots_last(common):
    indices = torch.tensor([[[5, -1, 3, 9, 0]], [[7, 2, 10, 1, -5]]], dtype=torch.int32)  # s_kv 10: 10 is invalid
    assert common.sorted_rows(indices, s_kv=10).tolist() == [[[0, 3, 5, 9, -1]], [[1, 2, 7, 10, -5]]]
    assert common.pattern_indices("uniform", 2, 10, 5, 0, indices) is indices
    assert common.pattern_indices("uniform-sorted", 2, 10, 5, 0, indices).tolist() == [[[0, 3, 5, 9, -1]],
                                                                                       [[1, 2, 7, 10, -5]]]
    realistic = common.pattern_indices("realistic-glm-sorted", 64, 4096, 256, 0, indices)
    rows = realistic[:, 0]
    assert realistic.shape == (64, 1, 256) and bool((rows[:, 1:] >= rows[:, :-1]).all())
    score_order = common.pattern_indices("realistic-glm", 64, 4096, 256, 0, indices)
    assert torch.equal(realistic.sort(dim=-1).values, score_order.sort(dim=-1).values)  # the same rows


def test_every_pattern_comes_plain_and_sorted(common):
    assert common.INDEX_PATTERNS == ("uniform", "uniform-sorted", "realistic-glm", "realistic-glm-sorted",
                                     "realistic-dsv4", "realistic-dsv4-sorted")


def test_a_run_names_the_commit_it_was_given_where_the_tree_has_no_git(common, monkeypatch):
    monkeypatch.setenv("SPARSE_MLA_COMMIT", "0123abc")
    assert common.git_commit() == "0123abc"
    monkeypatch.delenv("SPARSE_MLA_COMMIT")
    commit = common.git_commit()
    assert commit == "unknown" or len(commit.removesuffix("-dirty")) == 40


def test_the_scripts_share_common_and_import_no_other_script(bench, tp, ab):
    # Each script takes the shared pieces from the one common module, not a copy or a sibling script.
    assert tp.pattern_indices is bench.pattern_indices is ab.pattern_indices
    assert bench.incumbent_call is ab.incumbent_call
    assert tp.padded_incumbent_call.__module__ == bench.incumbent_call.__module__  # the padded call is common's too
    assert bench.SHAPES is ab.SHAPES
    assert not {"bench", "tp"} & set(sys.modules)  # tp.py and ab.py no longer import bench.py
