"""The token groups' plan: how many adjacent tokens share a tile, and the switch that overrides it.

The Python constants must be the kernel's (traits.cuh, token_groups/plan.cuh): a group fills at most the
64-row tile, holds at most MAX_GROUP tokens (one owner bit each) and MAX_GROUP_SLOTS slots (the
pre-pass's hash table in shared memory), and only calls of at most NARROW_HEADS heads have groups.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from sparse_mla import launch
from sparse_mla.jit import env

pytestmark = pytest.mark.cpu

PREFILL = Path(__file__).resolve().parents[2] / "include" / "sparse_mla" / "sm90" / "prefill"


def _constant(header: str, name: str) -> int:
    match = re.search(rf"constexpr int {name} = (\d+);", (PREFILL / header).read_text())
    assert match, f"{name} not found in {header}"
    return int(match.group(1))


def test_the_limits_are_the_kernels():
    assert launch.NARROW_HEADS == _constant("traits.cuh", "NARROW_HEADS")
    assert launch.NARROW_16_HEADS == _constant("traits.cuh", "NARROW_16_HEADS")
    assert launch.NARROW_8_HEADS == _constant("traits.cuh", "NARROW_8_HEADS")
    assert launch._MAX_GROUP == _constant("traits.cuh", "MAX_GROUP")
    assert launch._MAX_GROUP_SLOTS == _constant("token_groups/plan.cuh", "MAX_GROUP_SLOTS")
    assert launch.HEAD_BLOCK == _constant("traits.cuh", "B_H")


@pytest.mark.parametrize(
    "h_q, topk, size",
    [
        (1, 2048, 8),    # 8 tokens (the owner bits), 8 x 2048 slots (the table)
        (8, 2048, 8),
        (12, 2048, 5),   # 60 of the 64 rows
        (16, 2048, 4),
        (24, 512, 2),
        (32, 2048, 2),
        (33, 64, 1),     # past the narrow tile: no groups
        (64, 2048, 1),
        (16, 8192, 2),   # 2 x 8192 slots fill the table
        (16, 16384, 1),  # one token would fill it alone
    ],
)
def test_group_size(h_q, topk, size):
    assert launch.group_size(h_q, topk) == size
    if size > 1:
        assert size * h_q <= launch.HEAD_BLOCK and size * topk <= launch._MAX_GROUP_SLOTS


@pytest.mark.parametrize("h_q, ratio", [(1, launch.MAX_UNION_RATIO_8), (8, launch.MAX_UNION_RATIO_8),
                                         (9, launch.MAX_UNION_RATIO_16), (16, launch.MAX_UNION_RATIO_16),
                                         (17, launch.MAX_UNION_RATIO), (32, launch.MAX_UNION_RATIO)])
def test_the_union_threshold_follows_the_narrow_tile_a_group_falls_back_to(h_q, ratio):
    """Up to 16 and up to 8 heads a group's tokens fall back to narrower tiles, whose slots cost less."""
    assert launch.max_union_ratio(h_q) == ratio
    assert launch.MAX_UNION_RATIO_8 < launch.MAX_UNION_RATIO_16 < launch.MAX_UNION_RATIO


@pytest.mark.parametrize("value, mode", [(None, "auto"), ("", "auto"), ("always", "always"), (" Never ", "never")])
def test_the_switch(monkeypatch, value, mode):
    if value is None:
        monkeypatch.delenv("SPARSE_MLA_TOKEN_GROUPS", raising=False)
    else:
        monkeypatch.setenv("SPARSE_MLA_TOKEN_GROUPS", value)
    assert env.token_groups() == mode


def test_a_misspelt_switch_names_the_choices(monkeypatch):
    monkeypatch.setenv("SPARSE_MLA_TOKEN_GROUPS", "sometimes")
    with pytest.raises(ValueError, match="auto, always, never, got 'sometimes'"):
        env.token_groups()
