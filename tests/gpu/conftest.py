"""GPU tier fixtures: skip visibly without an SM90 GPU, fresh seeds, the poisoned-output check and the
acceptance rule (per (row, head) and norm-wise, lse and max_logits within the logit bound).

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

from sparse_mla.testing import (OUT_TOL, assert_close_to_reference, error_model, missing_sm90_gpu, poisoned_outputs,
                                reference_prefill)


@pytest.fixture(autouse=True, scope="session")
def _require_sm90():
    reason = missing_sm90_gpu()
    if reason is not None:
        pytest.skip(f"GPU tier: {reason}")


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


def accept_result(result, inputs: dict, context: str, *, ref=None, model=None, benchmark: bool = False, **options):
    """Apply the acceptance rule to one result of the API: ``assert_close_to_reference`` with the
    inputs' error model, so every (row, head) is checked on its own and lse / max_logits against
    their logit bound. ``benchmark=True`` (inputs on the benchmark distribution: randn q and kv,
    distinct valid indices, no sink or topk_length, at a shape of ``OUT_TOL``) holds out to the
    contract's tolerance and lse / max_logits to 1e-4 / 1e-3 relative; otherwise out is held to 10%
    above the e4m3-P floor of that input, and lse / max_logits to the logit bound only. ``options``
    override either (``skip_near_ties=True`` for extreme inputs)."""
    q = inputs["q"]
    if benchmark:
        defaults = dict(out_tol=OUT_TOL[(q.shape[-1], inputs["indices"].shape[-1])], lse_tol=1e-4, max_logits_tol=1e-3)
    else:
        defaults = dict(out_tol=None, lse_tol=None, max_logits_tol=None)
    defaults.update(options)
    if ref is None:
        ref = reference_prefill(**inputs)
    if model is None:
        model = error_model(**inputs)
    assert_close_to_reference(*result, ref, model=model, context=context, **defaults)


@pytest.fixture(scope="session")
def accept():
    """`accept_result` as a fixture, for test modules (conftest is not importable from them); session
    scoped, so hypothesis tests may take it."""
    return accept_result


@pytest.fixture
def check_prefill(prefill_fwd):
    """``check(inputs, context, benchmark=False, **options)``: run the API twice, into NaN-poisoned
    preallocated outputs and into outputs the library allocates, and apply `accept_result` to both.

    Returns the library-allocated result."""

    def check(inputs: dict, context: str, *, benchmark: bool = False, **options):
        q = inputs["q"]
        s_q, h_q, _ = q.shape
        d_v = inputs["d_v"]
        ref = reference_prefill(**inputs)
        model = error_model(**inputs)

        buffers = poisoned_outputs(s_q, h_q, d_v, device=q.device)
        result = prefill_fwd(**inputs, **buffers)
        assert all(got is want for got, want in zip(result, buffers.values())), (
            f"{context}: the returned tensors are not the preallocated outputs"
        )
        accept_result(result, inputs, f"{context}, preallocated outputs", ref=ref, model=model, benchmark=benchmark,
                      **options)

        poison_free_memory(s_q, h_q, d_v, q.device)
        result = prefill_fwd(**inputs)
        expected = ((s_q, h_q, d_v), (s_q, h_q), (s_q, h_q))
        for tensor, shape, dtype in zip(result, expected, (torch.bfloat16, torch.float32, torch.float32)):
            assert tensor.shape == shape and tensor.dtype == dtype and tensor.device == q.device, (
                f"{context}: got {tuple(tensor.shape)} {tensor.dtype} on {tensor.device}, "
                f"expected {shape} {dtype} on {q.device}"
            )
        accept_result(result, inputs, f"{context}, library-allocated outputs", ref=ref, model=model,
                      benchmark=benchmark, **options)
        return result

    return check
