"""GPU tier fixtures: skip visibly without an SM90 GPU, fresh seeds, and the poisoned-output check.

Every test here is skipped, with the reason shown by ``pytest -rs``, unless torch sees a CUDA device
of compute capability 9.0. Seeds are fresh each run and printed in every failure message; set
``SPARSE_MLA_TEST_SEED`` to replay one.

The tier compiles these (d_qk, topk) keys; prebuild them to keep compiling out of the test run:
``python -m sparse_mla prebuild --d-qk 576 --topk 1 7 64 100 512 2048`` and
``python -m sparse_mla prebuild --d-qk 512 --topk 64 512``.
"""

from __future__ import annotations

import os
import secrets

import pytest
import torch

from sparse_mla.testing import assert_close_to_reference, poisoned_outputs, reference_prefill


def _missing_gpu_reason() -> str | None:
    if not torch.cuda.is_available():
        return "GPU tier: no CUDA device (torch.cuda.is_available() is False)"
    major, minor = torch.cuda.get_device_capability()
    if (major, minor) != (9, 0):
        return f"GPU tier: needs an SM90 (Hopper) GPU, found {torch.cuda.get_device_name()} (sm_{major}{minor})"
    return None


@pytest.fixture(autouse=True, scope="session")
def _require_sm90():
    reason = _missing_gpu_reason()
    if reason is not None:
        pytest.skip(reason)


@pytest.fixture
def seed() -> int:
    """A fresh seed per test, or ``SPARSE_MLA_TEST_SEED`` to replay a failure."""
    return int(os.environ.get("SPARSE_MLA_TEST_SEED", secrets.randbits(31)))


@pytest.fixture(scope="session")
def prefill_fwd():
    """The public API, imported on first use so collection works without the package's GPU parts."""
    from sparse_mla import sparse_mla_q8kv8_prefill_fwd

    return sparse_mla_q8kv8_prefill_fwd


def poison_free_memory(s_q: int, h_q: int, d_v: int, device) -> None:
    """Leave NaN in freed blocks of the output sizes, where the caching allocator will most likely
    place the library's own outputs next, so library-allocated outputs start out poisoned too."""
    poisoned_outputs(s_q, h_q, d_v, device=device)  # filled, then freed on return


@pytest.fixture
def check_prefill(prefill_fwd):
    """``check(inputs, context, **tolerances)``: run the API twice, into NaN-poisoned preallocated
    outputs and into outputs the library allocates, and compare both with reference_prefill.

    Returns the library-allocated result."""

    def check(inputs: dict, context: str, **tolerances):
        q = inputs["q"]
        s_q, h_q, _ = q.shape
        d_v = inputs["d_v"]
        ref = reference_prefill(**inputs)

        buffers = poisoned_outputs(s_q, h_q, d_v, device=q.device)
        result = prefill_fwd(**inputs, **buffers)
        assert all(got is want for got, want in zip(result, buffers.values())), (
            f"{context}: the returned tensors are not the preallocated outputs"
        )
        assert_close_to_reference(*result, ref, context=f"{context}, preallocated outputs", **tolerances)

        poison_free_memory(s_q, h_q, d_v, q.device)
        result = prefill_fwd(**inputs)
        expected = ((s_q, h_q, d_v), (s_q, h_q), (s_q, h_q))
        for tensor, shape, dtype in zip(result, expected, (torch.bfloat16, torch.float32, torch.float32)):
            assert tensor.shape == shape and tensor.dtype == dtype and tensor.device == q.device, (
                f"{context}: got {tuple(tensor.shape)} {tensor.dtype} on {tensor.device}, "
                f"expected {shape} {dtype} on {q.device}"
            )
        assert_close_to_reference(*result, ref, context=f"{context}, library-allocated outputs", **tolerances)
        return result

    return check
