"""The seed of the CPU tier's randomized tests (hypothesis, and the inputs drawn in a test).

Fixed, so that every run, CI's among them, tests the same inputs: a failure is a regression, never a
draw. ``SPARSE_MLA_TEST_SEED=N`` runs them at seed N instead, to replay a seed or to fuzz with another
one per run, outside CI. (The GPU tier draws a fresh seed per test: tests/gpu/conftest.py.)
"""

from __future__ import annotations

import os
from typing import Callable, TypeVar

import hypothesis

FIXED_SEED = 20261207

Test = TypeVar("Test", bound=Callable[..., object])


def run_seed() -> int:
    """SPARSE_MLA_TEST_SEED, or the fixed seed."""
    value = os.environ.get("SPARSE_MLA_TEST_SEED")
    return FIXED_SEED if value is None else int(value)


def hypothesis_run(max_examples: int) -> Callable[[Test], Test]:
    """For a hypothesis test (above its @given): ``max_examples`` examples drawn from ``run_seed()``, no
    deadline, and no example database, whose replays of earlier failures would make one run differ from
    the next."""

    def decorate(test: Test) -> Test:
        configured = hypothesis.settings(max_examples=max_examples, deadline=None, database=None)(test)
        return hypothesis.seed(run_seed())(configured)

    return decorate
