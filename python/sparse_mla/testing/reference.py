"""The reference every test compares with, and the comparison itself.

`reference_prefill` restates the semantics in torch, on CPU or CUDA tensors. `relative_error` and
`assert_close_to_reference` implement the acceptance rule: exact agreement on the special values (rows
with no valid slot, out rows that must be exactly zero), no NaN anywhere, and, given the inputs, every
(row, head) of out within its own limit, lse and max_logits within the row's logit bound and out
within 10% of the e4m3-P floor norm-wise (`sparse_mla.testing.numerics` derives these limits).
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from sparse_mla.testing.numerics import (
    STAT_SLACK,
    ErrorModel,
    default_out_tolerance,
    error_model,
    out_error_limits,
)

__all__ = ["OUT_TOL", "assert_close_to_reference", "reference_prefill", "relative_error"]

# The contract's norm-wise out tolerance on the benchmark distribution (randn q and kv quantized with
# per-tensor amax/448 scales, topk distinct random indices per row), keyed by (d_qk, topk): 10% above
# the floor that rounding P to e4m3 sets there (1.7e-2 and 2.1e-2, `fp8_model_prefill`).
OUT_TOL = {(576, 2048): 1.85e-2, (512, 512): 2.3e-2}

# Working set of one chunk of query rows (the gathered KV rows in float64 dominate).
_CHUNK_BYTES = 512 * 2**20


def reference_prefill(
    q: torch.Tensor,
    kv: torch.Tensor,
    indices: torch.Tensor,
    sm_scale: float,
    q_scale: torch.Tensor,
    kv_scale: torch.Tensor,
    d_v: int = 512,
    attn_sink: Optional[torch.Tensor] = None,
    topk_length: Optional[torch.Tensor] = None,
    *,
    chunk: Optional[int] = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The semantics in torch: returns ``(out, max_logits, lse)``, all float32, on q's device.

    Dequantization is the spec's, in float32: ``Q = q.float() * q_scale``, ``K = kv[:, 0].float() *
    kv_scale``, ``V = K[:, :d_v]``. q and kv may be FP8 (as the kernel takes them) or any float dtype,
    e.g. the bf16 originals with unit scales to measure the error that FP8 quantization itself adds. A
    float64 kv stays float64 (an exactly dequantized cache whose values float32 cannot hold).
    Dot products, exponentials and sums run in float64 so the reference adds no error of its own
    (no TF32, no accumulation-order effects).

    Only valid slots (``0 <= index < s_kv`` and ``j < topk_length[i]``) contribute: invalid indices
    are clamped to row 0 for the gather and their gathered rows zeroed, so a NaN in a KV row that only
    invalid slots point to never reaches the result. A row with no valid slot gets ``out = 0``,
    ``max_logits = -inf``, ``lse = +inf``. The sink multiplies out by ``1 / (1 + exp(attn_sink - lse))``
    (= ``exp(lse) / (exp(lse) + exp(attn_sink))`` without overflow) and enters neither lse nor
    max_logits.

    ``chunk`` is the number of query rows processed at once; by default it keeps the working set near
    512 MiB, so s_q = 4096, topk = 2048, h_q = 128 fits in a few GB.
    """
    s_q, h_q, d_qk = q.shape
    s_kv, topk = kv.shape[0], indices.shape[-1]
    device = q.device
    if chunk is None:
        row_bytes = topk * d_qk * 13 + 3 * h_q * topk * 8 + h_q * (d_qk + d_v) * 8
        chunk = max(1, _CHUNK_BYTES // row_bytes)

    keys = kv[:, 0]
    out = torch.zeros(s_q, h_q, d_v, dtype=torch.float32, device=device)
    max_logits = torch.full((s_q, h_q), -math.inf, dtype=torch.float32, device=device)
    lse = torch.full((s_q, h_q), math.inf, dtype=torch.float32, device=device)
    slots = torch.arange(topk, device=device)

    for start in range(0, s_q, chunk):
        stop = min(start + chunk, s_q)
        rows = indices[start:stop, 0].long()  # [c, topk]
        valid = (rows >= 0) & (rows < s_kv)
        if topk_length is not None:
            valid &= slots < topk_length[start:stop].long().unsqueeze(1)
        gathered = _widened(_gather_rows(keys, torch.where(valid, rows, 0))) * kv_scale.float()  # [c, topk, d_qk]
        gathered = gathered.double().masked_fill(~valid.unsqueeze(-1), 0.0)

        queries = (q[start:stop].float() * q_scale.float()).double()  # [c, h_q, d_qk]
        logits = sm_scale * torch.bmm(queries, gathered.transpose(1, 2))  # [c, h_q, topk]
        logits = logits.masked_fill(~valid.unsqueeze(1), -math.inf)
        chunk_max = logits.amax(dim=-1)  # -inf for a row with no valid slot
        has_valid = valid.any(dim=-1, keepdim=True)  # [c, 1]
        shift = torch.where(has_valid, chunk_max, 0.0)  # keeps exp() finite on rows with no valid slot
        weights = torch.exp(logits - shift.unsqueeze(-1))  # zero at invalid slots
        chunk_lse = shift + torch.log(weights.sum(dim=-1))
        chunk_lse = torch.where(has_valid, chunk_lse, math.inf)
        chunk_out = torch.bmm(weights, gathered[:, :, :d_v]) / weights.sum(dim=-1, keepdim=True)
        if attn_sink is not None:
            sink_factor = 1.0 / (1.0 + torch.exp(attn_sink.double().unsqueeze(0) - chunk_lse))
            chunk_out = chunk_out * sink_factor.unsqueeze(-1)
        # Rows with no valid slot: the division above gave 0/0 (and an infinite sink inf - inf); both
        # are replaced here, never propagated.
        chunk_out = torch.where(has_valid.unsqueeze(-1), chunk_out, 0.0)

        out[start:stop] = chunk_out.float()
        max_logits[start:stop] = chunk_max.float()
        lse[start:stop] = chunk_lse.float()
    return out, max_logits, lse


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    """``||a - b|| / ||b||`` in float64 over the entries where b is finite.

    If b is zero there, returns 0.0 when a equals b and inf otherwise. A non-finite a where b is
    finite gives inf or NaN, which fails any tolerance.
    """
    finite = torch.isfinite(b)
    b64 = b[finite].double()
    diff = torch.linalg.vector_norm(a.to(b.device)[finite].double() - b64).item()
    norm = torch.linalg.vector_norm(b64).item()
    if norm == 0.0:
        return 0.0 if diff == 0.0 else math.inf
    return diff / norm


def assert_close_to_reference(
    out: torch.Tensor,
    max_logits: torch.Tensor,
    lse: torch.Tensor,
    ref: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    *,
    inputs: Optional[dict] = None,
    model: Optional[ErrorModel] = None,
    out_tol: Optional[float] = None,
    lse_tol: Optional[float] = 1e-4,
    max_logits_tol: Optional[float] = 1e-3,
    skip_near_ties: bool = False,
    context: str = "",
) -> None:
    """Assert the acceptance rule for an FP8 kernel's result against ``reference_prefill``'s ``ref``.

    Always: shapes match; no NaN anywhere; out finite; the -inf positions of max_logits and the +inf
    positions of lse exactly those of the reference (rows with no valid slot), with no other
    infinity; every out row that is exactly zero in the reference (no valid slot, or a +inf sink)
    exactly zero; ``lse`` and ``max_logits`` within ``lse_tol`` / ``max_logits_tol`` norm-wise relative
    error (pass None to skip: they hold on the benchmark distribution, not on extreme inputs).

    With ``inputs`` (the keyword arguments of the call, as ``make_inputs`` returns them) or their
    ``model`` (`error_model`), also the per-(row, head) rule of `sparse_mla.testing.numerics`:

    - every ``lse[i, h]`` and ``max_logits[i, h]`` within the row's logit bound (plus fp32 slack);
    - every out row ``out[i, h]`` within its own limit (`out_error_limits`), so a kernel that is
      wrong on a few (row, head) pairs fails even when the norm over the tensor hides it;
    - ``|out - ref| / |ref|`` within ``out_tol``, by default `default_out_tolerance` (10% above the
      e4m3-P floor this input sets); pass the contract's number (`OUT_TOL`) on the benchmark
      distribution.

    Without them, out is checked norm-wise only, against ``out_tol`` (2.5e-2 by default).

    ``skip_near_ties`` (extreme inputs): leave out of the out comparisons the (row, head) pairs whose
    attention is a near-tie between two KV rows (`ErrorModel.near_tie`), where the logit bound lets
    either win. ``context`` (say, the seed and shape) prefixes every message.
    """
    ref_out, ref_max_logits, ref_lse = (t.to(out.device) for t in ref)
    prefix = f"{context}: " if context else ""
    for name, got, want in (("out", out, ref_out), ("max_logits", max_logits, ref_max_logits), ("lse", lse, ref_lse)):
        assert got.shape == want.shape, f"{prefix}{name} has shape {tuple(got.shape)}, expected {tuple(want.shape)}"
        nan_count = int(torch.isnan(got).sum())
        assert nan_count == 0, f"{prefix}{name} has {nan_count} NaN of {got.numel()}"

    assert bool(torch.isfinite(out).all()), f"{prefix}out has infinite values"
    _assert_same_positions("max_logits == -inf", torch.isneginf(max_logits), torch.isneginf(ref_max_logits), prefix)
    assert not bool(torch.isposinf(max_logits).any()), f"{prefix}max_logits has +inf values"
    _assert_same_positions("lse == +inf", torch.isposinf(lse), torch.isposinf(ref_lse), prefix)
    assert not bool(torch.isneginf(lse).any()), f"{prefix}lse has -inf values"
    zero_rows = (ref_out == 0).all(dim=-1)
    nonzero = int((out[zero_rows] != 0).any(dim=-1).sum())
    assert nonzero == 0, f"{prefix}{nonzero} out rows are not exactly zero where the reference row is zero"

    for name, got, want, tol in (
        ("lse", lse, ref_lse, lse_tol),
        ("max_logits", max_logits, ref_max_logits, max_logits_tol),
    ):
        if tol is not None:
            error = relative_error(got, want)
            assert error <= tol, f"{prefix}{name} relative error {error:.3e} exceeds {tol:.1e}"

    if model is None and inputs is not None:
        model = error_model(**inputs)
    if model is None:
        tol = 2.5e-2 if out_tol is None else out_tol
        error = relative_error(out, ref_out)
        assert error <= tol, f"{prefix}out relative error {error:.3e} exceeds {tol:.1e}"
        return

    model = ErrorModel(*(t.to(out.device) for t in (model.logit_bound, model.floor_sigma, model.sigma,
                                                     model.near_tie, model.terms)))
    for name, got, want in (("lse", lse, ref_lse), ("max_logits", max_logits, ref_max_logits)):
        finite = torch.isfinite(want)
        allowed = model.logit_bound.double() + STAT_SLACK * (1.0 + want.double().abs())
        excess = torch.where(finite, (got.double() - want.double()).abs() - allowed, -math.inf)
        _assert_pairs_within(name, excess, got, want, allowed, prefix, "the logit bound")

    compared = ~zero_rows
    if skip_near_ties:
        compared &= ~model.near_tie
    error = torch.linalg.vector_norm(out.double() - ref_out.double(), dim=-1)
    limit = out_error_limits(model, ref_out)
    excess = torch.where(compared, error - limit, -math.inf)
    ref_norm = torch.linalg.vector_norm(ref_out.double(), dim=-1)
    _assert_pairs_within("out", excess, error, ref_norm, limit, prefix, "its per-(row, head) limit")

    tol = default_out_tolerance(model, ref_out, compared) if out_tol is None else out_tol
    error = relative_error(out[compared], ref_out[compared]) if bool(compared.any()) else 0.0
    assert error <= tol, f"{prefix}out relative error {error:.3e} exceeds {tol:.2e}"


def _assert_pairs_within(name, excess, got, want, allowed, prefix, what, shown: int = 4) -> None:
    """Fail with the worst (row, head) pairs where ``excess > 0``. For out, ``got`` is the error norm
    and ``want`` the reference norm; for lse and max_logits, the values themselves."""
    bad = excess > 0
    count = int(bad.sum())
    if count == 0:
        return
    worst = torch.topk(excess.flatten(), min(shown, count)).indices
    lines = []
    for flat in worst.tolist():
        i, h = divmod(flat, excess.shape[1])
        if name == "out":
            lines.append(f"row {i} head {h}: |out - ref| {float(got[i, h]):.3e} (relative "
                         f"{float(got[i, h] / want[i, h]):.3e}), limit {float(allowed[i, h]):.3e}")
        else:
            lines.append(f"row {i} head {h}: {name} {float(got[i, h]):.7g}, reference {float(want[i, h]):.7g}, "
                         f"allowed difference {float(allowed[i, h]):.3e}")
    raise AssertionError(
        f"{prefix}{name} is outside {what} at {count} of {excess.numel()} (row, head) pairs; worst: "
        + "; ".join(lines)
    )


def _assert_same_positions(what: str, got: torch.Tensor, want: torch.Tensor, prefix: str) -> None:
    mismatched = int((got != want).sum())
    assert mismatched == 0, (
        f"{prefix}{what} differs from the reference at {mismatched} positions "
        f"(kernel {int(got.sum())}, reference {int(want.sum())})"
    )


def _widened(x: torch.Tensor) -> torch.Tensor:
    """x in float32, or in float64 if it is float64 already."""
    return x if x.dtype == torch.float64 else x.float()


def _gather_rows(keys: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """``keys[rows]``; one-byte dtypes (FP8) are gathered as uint8, which every torch build indexes."""
    if keys.element_size() == 1:
        return keys.view(torch.uint8)[rows].view(keys.dtype)
    return keys[rows]
