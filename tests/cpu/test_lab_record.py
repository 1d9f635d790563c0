"""docs/lab.md, the record of every performance experiment: one row per experiment, numbered without a gap,
each with its title, result, landing commit (or "no") and record, and the commit that brings the records
back named in full."""

from __future__ import annotations

import re
from pathlib import Path

LAB = Path(__file__).resolve().parents[2] / "docs" / "lab.md"


def _rows() -> list[list[str]]:
    rows = re.findall(r"(?m)^\| (\d+) \|(.*)\|$", LAB.read_text())
    return [[number] + [cell.strip() for cell in rest.split(" | ")] for number, rest in rows]


def test_every_experiment_has_one_row_in_order():
    numbers = [int(row[0]) for row in _rows()]
    assert numbers == list(range(1, len(numbers) + 1)) and len(numbers) >= 126


def test_each_row_says_what_was_tried_what_it_measured_and_whether_it_landed():
    for row in _rows():
        number, title, result, landed, record = row
        assert title and result and record, row
        # "no" (with a reason or a pointer to the row that landed it), or the landing commits.
        assert landed.startswith("no") or re.match(r"[0-9a-f]{7}\b", landed), row


def test_the_commit_that_brings_the_records_back_is_named_in_full():
    assert re.search(r"\*\*`[0-9a-f]{40}`\*\*", LAB.read_text())
