"""The GPU tier's compute-sanitizer runs check only kernels whose name contains a filter string
(torch's own kernels are left alone): every kernel in the headers must match it, or the sanitizer
would pass without looking at a renamed or newly added kernel. No GPU, no compiler."""

from __future__ import annotations

import pytest

from sparse_mla.jit.env import header_kernels

pytestmark = pytest.mark.cpu

# Must equal SANITIZER_KERNEL_FILTER in tests/gpu/test_reliability.py.
SANITIZER_KERNEL_FILTER = "prefill_kernel"


def test_the_sanitizer_filter_names_every_kernel():
    kernels = header_kernels()
    assert kernels, "found no __global__ function in the headers: header_kernels' pattern needs updating"
    missed = [name for name in kernels if SANITIZER_KERNEL_FILTER not in name]
    assert not missed, (
        f"compute-sanitizer (tests/gpu/test_reliability.py) checks kernels whose name contains "
        f"{SANITIZER_KERNEL_FILTER!r} only; these would go unchecked: {missed}"
    )


def test_the_gpu_tier_uses_the_same_filter():
    from pathlib import Path

    source = (Path(__file__).parents[1] / "gpu" / "test_reliability.py").read_text()
    assert f'SANITIZER_KERNEL_FILTER = "{SANITIZER_KERNEL_FILTER}"' in source
