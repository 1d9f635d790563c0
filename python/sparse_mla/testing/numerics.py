"""The numerics contract of an FP8 kernel, and a model of such a kernel to calibrate it with.

An FP8 sparse-MLA kernel differs from the exact float32 reference (`reference_prefill`) in three ways,
and the acceptance rule (`assert_close_to_reference`) allows exactly these, no more:

1. **Logits.** Q·Kᵀ may run on FP8 tensor cores, whose accumulator keeps about 14 bits. Each logit may
   carry ``|s~_ij - s_ij| <= 2^-9 * |sm_scale| * sum_d |Q_id * K_jd|`` (Q and K dequantized): the
   *logit bound*. `logit_error_bound` computes, per (row, head), the largest bound over the row's valid
   slots; ``lse`` and ``max_logits`` must stay within it (a soft and a hard maximum of the logits move
   by at most the largest logit error).
2. **Probabilities.** P·V runs on FP8 tensor cores, so the probabilities are rounded to e4m3 (3 mantissa
   bits): a relative error of at most 1/17 per probability, ``E4M3_RMS_ROUNDING`` = 2.65e-2 in root mean
   square. This is the floor of any FP8 P·V design: about 1.7e-2 norm-wise relative error in ``out`` at
   d_qk 576 / topk 2048 and 2.1e-2 at d_qk 512 / topk 512 on the benchmark distribution.
3. **Output.** ``out`` is rounded to bf16 (2^-9 relative), and the P·V accumulator is FP8-tensor-core
   precision too.

`error_model` turns these into numbers for each (row, head) of a given input: the logit bound, the
root-mean-square error of ``out`` that the e4m3 rounding of P causes (``floor_sigma``), the same plus
an allowance for realistic logit errors (``sigma``), and whether the row's attention is a near-tie
between two KV rows whose winner the logit bound leaves open (``near_tie``).

`fp8_model_prefill` is an FP8 kernel written in torch: logits exact or accumulated like an FP8 tensor
core (products exact, every 32-term step truncated to 14 significant bits), probabilities rounded to
e4m3, out rounded to bf16. The CPU tests use it to show that the acceptance rule accepts a correct FP8
kernel and rejects broken ones; users can use it to see what their own tolerances should be.

Nothing here imports tvm-ffi or touches CUDA unless the inputs are CUDA tensors.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch

__all__ = [
    "E4M3_RMS_ROUNDING",
    "LOGIT_ERROR_FACTOR",
    "LOGIT_ERROR_ALLOWANCE",
    "FLOOR_MARGIN",
    "PAIR_SIGMAS",
    "PAIR_TAIL",
    "RELATIVE_SLACK",
    "STAT_SLACK",
    "ErrorModel",
    "error_model",
    "default_out_tolerance",
    "fp8_model_prefill",
    "logit_error_bound",
    "out_error_limits",
]

# Per logit, |s~ - s| <= LOGIT_ERROR_FACTOR * |sm_scale| * sum_d |Q_d K_jd| (the contract).
LOGIT_ERROR_FACTOR = 2.0**-9

# Root-mean-square relative error of rounding a positive value to e4m3 (round to nearest) when its
# mantissa is log-uniformly distributed, as exp() of a continuous logit is: the step is 2^-3 of the
# binade, so the error is uniform in +-2^-4 of the binade's bottom, and E[1/x^2] over a log-uniform
# mantissa in [1, 2) is 3 / (8 ln 2). The largest relative error is 1/17 (at 1 + 1/16).
E4M3_RMS_ROUNDING = math.sqrt(2.0**-8 / 3 * 3 / (8 * math.log(2)))  # 2.654e-2
_E4M3_MIN_NORMAL = 2.0**-6  # below it e4m3 is subnormal, with a fixed step of 2^-9
_E4M3_SUBNORMAL_VARIANCE = 2.0**-20 / 3  # (half step)^2 / 3: uniform rounding error of +-2^-10

# The acceptance rule (`out_error_limits`, `default_out_tolerance`, used by assert_close_to_reference):
# - every (row, head):  |out - ref| <= zeta * sigma + RELATIVE_SLACK * |ref|, where
#       zeta^2 = min(PAIR_SIGMAS^2, 1 + PAIR_TAIL * sqrt(0.8 / terms + 2 / d_v))
#   is how far above its mean |out - ref|^2 may stray, in units of sigma^2: a sum of `terms`
#   independent rounding errors has a squared norm of relative spread sqrt(0.8 / terms) (0.8 is
#   Var(u^2) / E[u^2]^2 for a uniform u), and d_v dimensions add sqrt(2 / d_v). Calibration: in
#   about 450,000 (row, head) pairs of the model kernel over 11 input families (topk 1 to 2048,
#   d_qk 512 and 576, duplicates, sinks, topk_length, hostile indices, FP8 or exact logits) the
#   squared error strayed by at most 4.3 spreads (with duplicate indices; 3.4 at topk 2048), so
#   PAIR_TAIL = 12 leaves a factor 2.8, and the worst pair used 0.62 of its limit. PAIR_SIGMAS caps
#   zeta where one term dominates: one rounding error is at most 1/17, 2.2x E4M3_RMS_ROUNDING.
#   With these limits, dropping one of 2048 slots per row fails on dozens of pairs out of 1,024.
# - norm-wise, unless the caller names a tolerance: |out - ref| / |ref| <= FLOOR_MARGIN times the
#   model's expected error (sigma pooled over the pairs; the pooled form of the rule above where
#   too few rounding errors make the norm itself uncertain). The contract's own numbers on the
#   benchmark distribution are OUT_TOL in reference.py: 1.1x the floor model's 1.7e-2 / 2.1e-2.
# - RELATIVE_SLACK covers what the model leaves out: out's rounding to bf16 (2^-9 of each element
#   at most) and the P·V accumulation on FP8 tensor cores.
# - sigma allows for logits off by LOGIT_ERROR_ALLOWANCE times their bound in root mean square. The
#   model kernel's FP8-accumulated logits are off by at most 0.23 of the bound, about 0.04 in root
#   mean square (its max_logits by 4e-4 relative, its lse by 1e-5: what the incumbent FP8 kernel
#   shows).
# - lse and max_logits: |got - ref| <= logit_bound + STAT_SLACK * (1 + |ref|) (fp32 arithmetic).
PAIR_SIGMAS = 3.0
PAIR_TAIL = 12.0
RELATIVE_SLACK = 2.0**-7
FLOOR_MARGIN = 1.1
LOGIT_ERROR_ALLOWANCE = 1.0 / 8
STAT_SLACK = 2.0**-18

_FP8_ACCUMULATOR_BITS = 14  # significant bits an FP8 tensor-core accumulation step keeps (model)
_FP8_MMA_K = 32  # terms one FP8 wgmma adds per output element

_CHUNK_BYTES = 512 * 2**20


@dataclass(frozen=True)
class ErrorModel:
    """What an FP8 kernel may get wrong, per (row, head); every field is ``[s_q, h_q]``, on q's device.

    - ``logit_bound``: the largest logit bound over the row's valid slots (0 with no valid slot):
      the absolute tolerance of ``lse`` and ``max_logits``.
    - ``floor_sigma``: root-mean-square norm of ``out - ref`` caused by rounding P to e4m3.
    - ``sigma``: ``floor_sigma`` combined with the effect of logit errors of ``LOGIT_ERROR_ALLOWANCE``
      times their bound (root mean square), including through the sink's share.
    - ``near_tie``: the two largest logits of distinct KV rows are closer than the sum of their bounds,
      so either may win; with a large bound (extreme inputs) out may then legitimately be either row.
    - ``terms``: the effective number of independent rounding errors behind ``floor_sigma``
      (``(sum a)^2 / sum a^2`` over the groups' variance terms ``a``; 1 when there are none).
    """

    logit_bound: torch.Tensor
    floor_sigma: torch.Tensor
    sigma: torch.Tensor
    near_tie: torch.Tensor
    terms: torch.Tensor


def logit_error_bound(
    q: torch.Tensor,
    kv: torch.Tensor,
    indices: torch.Tensor,
    sm_scale: float,
    q_scale: torch.Tensor,
    kv_scale: torch.Tensor,
    d_v: int = 512,
    attn_sink: Optional[torch.Tensor] = None,
    topk_length: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Per (row, head), ``max_j 2^-9 * |sm_scale| * sum_d |Q_id * K_jd|`` over the valid slots ``j``
    (0 for a row with no valid slot): float32 ``[s_q, h_q]``. Takes ``make_inputs``' keywords."""
    return error_model(q, kv, indices, sm_scale, q_scale, kv_scale, d_v, attn_sink, topk_length).logit_bound


def error_model(
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
) -> ErrorModel:
    """The `ErrorModel` of one input (``make_inputs``' keywords), computed in float64.

    With ``w_j`` the reference probabilities, ``o`` the reference output before the sink, ``f`` the
    sink's factor and ``V_g`` the value row of KV row ``g`` (duplicate slots are one group, weight
    ``W_g = sum of their w_j``, rounded alike), the model is::

        floor_sigma^2 = f^2 * sum_g r(p_g) * W_g^2 * max(|V_g|^2, |V_g - o|^2)
        sigma^2       = floor_sigma^2 + f^2 * sum_g (a * b_g)^2 * W_g^2 * |V_g - o|^2
                        + (f (1 - f) * a * max_g b_g)^2 * |o|^2

    where ``r(p)`` is the variance of e4m3's relative rounding error at ``p = exp(s - max s)``
    (``E4M3_RMS_ROUNDING^2`` for normal values, the subnormal step's below 2^-6, at most 1), ``b_g``
    the logit bound of the group and ``a = LOGIT_ERROR_ALLOWANCE``. Probabilities are taken relative
    to the row's maximum without any scaling, the least favourable choice for subnormals; the maximum
    itself is counted as rounded too (a kernel with a stale running maximum rounds it).
    """
    s_q, h_q, d_qk = q.shape
    s_kv, topk = kv.shape[0], indices.shape[-1]
    device = q.device
    if chunk is None:
        row_bytes = topk * d_qk * 26 + 12 * h_q * topk * 8 + 4 * h_q * d_v * 8
        chunk = max(1, _CHUNK_BYTES // row_bytes)
    logit_bound = torch.zeros(s_q, h_q, dtype=torch.float64, device=device)
    floor_var = torch.zeros(s_q, h_q, dtype=torch.float64, device=device)
    terms = torch.ones(s_q, h_q, dtype=torch.float64, device=device)
    var = torch.zeros(s_q, h_q, dtype=torch.float64, device=device)
    near_tie = torch.zeros(s_q, h_q, dtype=torch.bool, device=device)
    keys = kv[:, 0]
    slots = torch.arange(topk, device=device)

    for start in range(0, s_q, chunk):
        stop = min(start + chunk, s_q)
        rows, valid = _valid_slots(indices, topk_length, s_kv, start, stop, slots)
        gathered = _gather_rows(keys, torch.where(valid, rows, 0)).float() * kv_scale.float()
        gathered = gathered.double().masked_fill(~valid.unsqueeze(-1), 0.0)  # [c, topk, d_qk]
        queries = (q[start:stop].float() * q_scale.float()).double()  # [c, h_q, d_qk]

        logits = sm_scale * torch.bmm(queries, gathered.transpose(1, 2))  # [c, h_q, topk]
        bounds = (LOGIT_ERROR_FACTOR * abs(sm_scale)) * torch.bmm(queries.abs(), gathered.abs().transpose(1, 2))
        slot_valid = valid.unsqueeze(1)  # [c, 1, topk]
        bounds = bounds.masked_fill(~slot_valid, 0.0)
        logits = logits.masked_fill(~slot_valid, -math.inf)
        has_valid = valid.any(dim=-1)  # [c]
        logit_bound[start:stop] = bounds.amax(dim=-1)

        row_max = logits.amax(dim=-1, keepdim=True)
        shift = torch.where(has_valid[:, None, None], row_max, 0.0)
        p = torch.exp(logits - shift)  # 0 at invalid slots
        total = p.sum(dim=-1, keepdim=True)
        w = p / torch.where(total > 0, total, 1.0)
        values = gathered[:, :, :d_v]  # [c, topk, d_v]
        o = torch.bmm(w, values)  # [c, h_q, d_v]: out before the sink
        if attn_sink is not None:
            lse = (shift + torch.log(total)).squeeze(-1)
            factor = torch.where(has_valid[:, None], 1.0 / (1.0 + torch.exp(attn_sink.double()[None] - lse)), 0.0)
        else:
            factor = has_valid[:, None].double().expand(-1, h_q)

        # Duplicate slots (same KV row) form one group, rounded alike: weights add before squaring.
        group = _duplicate_groups(rows, valid)  # [c, topk], the group of each slot
        group_h = group.unsqueeze(1).expand(-1, h_q, -1)
        group_w = torch.zeros_like(w).scatter_add_(2, group_h, w)  # [c, h_q, topk], by group
        first = torch.zeros_like(rows).scatter_(1, group, slots.expand_as(rows))  # one slot of each group
        first_h = first.unsqueeze(1).expand(-1, h_q, -1)
        group_p = p.gather(2, first_h)
        group_b = bounds.gather(2, first_h)
        v_norm2 = values.pow(2).sum(dim=-1).gather(1, first).unsqueeze(1)  # [c, 1, topk]
        v_dot_o = torch.bmm(o, values.transpose(1, 2)).gather(2, first_h)  # [c, h_q, topk]
        centred2 = (v_norm2 - 2 * v_dot_o + o.pow(2).sum(dim=-1, keepdim=True)).clamp_min(0.0)

        rel_var = torch.where(
            group_p >= _E4M3_MIN_NORMAL,
            E4M3_RMS_ROUNDING**2,
            (_E4M3_SUBNORMAL_VARIANCE / group_p.pow(2)).clamp(max=1.0),
        )
        w2 = group_w.pow(2)
        f2 = factor.pow(2)
        floor_terms = rel_var * w2 * torch.maximum(v_norm2, centred2)
        floor_chunk = f2 * floor_terms.sum(dim=-1)
        square_sum = floor_terms.pow(2).sum(dim=-1)
        terms[start:stop] = torch.where(square_sum > 0, floor_terms.sum(dim=-1).pow(2) / square_sum, 1.0)
        logit_chunk = f2 * ((LOGIT_ERROR_ALLOWANCE * group_b).pow(2) * w2 * centred2).sum(dim=-1)
        sink_chunk = (factor * (1 - factor) * LOGIT_ERROR_ALLOWANCE * logit_bound[start:stop]).pow(2) * o.pow(2).sum(-1)
        floor_var[start:stop] = floor_chunk
        var[start:stop] = floor_chunk + logit_chunk + sink_chunk

        # Near-ties: the two largest logits of distinct KV rows, closer than the sum of their bounds.
        if topk >= 2:
            is_first = (first.gather(1, group) == slots).unsqueeze(1)  # the slot stands for its group
            distinct = logits.masked_fill(~is_first, -math.inf)
            top, where = distinct.topk(2, dim=-1)
            top_b = bounds.gather(2, where)
            near_tie[start:stop] = torch.isfinite(top[..., 1]) & (top[..., 0] - top[..., 1] < top_b.sum(dim=-1))

    return ErrorModel(
        logit_bound=logit_bound.float(),
        floor_sigma=floor_var.sqrt(),
        sigma=var.sqrt(),
        near_tie=near_tie,
        terms=terms,
    )


def out_error_limits(model: ErrorModel, ref_out: torch.Tensor) -> torch.Tensor:
    """The per-(row, head) limit of ``|out - ref|`` (float64 ``[s_q, h_q]``):
    ``zeta * sigma + RELATIVE_SLACK * |ref|`` (see the constants above)."""
    d_v = ref_out.shape[-1]
    spread = (0.8 / model.terms + 2.0 / d_v).sqrt()
    zeta = (1.0 + PAIR_TAIL * spread).clamp(max=PAIR_SIGMAS**2).sqrt()
    ref_norm = torch.linalg.vector_norm(ref_out.double(), dim=-1)
    return zeta * model.sigma + RELATIVE_SLACK * ref_norm


def default_out_tolerance(model: ErrorModel, ref_out: torch.Tensor, compared: Optional[torch.Tensor] = None) -> float:
    """The norm-wise tolerance of ``|out - ref| / |ref|`` over the ``compared`` (row, head) pairs (all
    by default) when the caller names none: ``FLOOR_MARGIN`` times the error the model expects for
    this input (the e4m3-P floor with the logit allowance, ``sigma``; about 1.8e-2 at d_qk 576 /
    topk 2048). Where the pairs hold too few rounding errors for their norm to settle (a handful of
    pairs, a few slots each), the factor grows to the pooled form of the per-pair rule. With nothing
    to compare, ``RELATIVE_SLACK``."""
    if compared is None:
        compared = torch.ones(model.sigma.shape, dtype=torch.bool, device=model.sigma.device)
    ref_norm2 = ref_out.double().pow(2).sum(dim=-1)[compared].sum()
    var = model.sigma[compared].pow(2)
    floor_var = model.floor_sigma[compared].pow(2)
    if ref_norm2 == 0 or var.sum() == 0:
        return RELATIVE_SLACK
    pooled_terms = floor_var.sum().pow(2) / (floor_var.pow(2) / model.terms[compared]).sum().clamp_min(1e-300)
    spread = (0.8 / pooled_terms.clamp_min(1.0) + 2.0 / (ref_out.shape[-1] * int(compared.sum()))).sqrt()
    factor = max(FLOOR_MARGIN, float((1.0 + PAIR_TAIL * spread).clamp(max=PAIR_SIGMAS**2).sqrt()))
    return factor * float((var.sum() / ref_norm2).sqrt())


def fp8_model_prefill(
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
    logits: str = "exact",
    p_scale: float = 1.0,
    chunk: Optional[int] = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A model FP8 kernel: returns ``(out, max_logits, lse)`` as the real kernel does (bf16, float32,
    float32), with the same conventions for empty rows and sinks as `reference_prefill`.

    - ``logits="exact"``: exact dot products (float64); ``"fp8"``: accumulated like an FP8 tensor
      core, in steps of 32 products of the e4m3 values, each step aligning the accumulator and the
      products to the largest exponent among them and truncating them (towards zero) to 14
      significant bits, then scaled by ``q_scale * kv_scale * sm_scale``.
    - The probabilities ``p_scale * exp(s - max s)`` are rounded to e4m3 (round to nearest,
      saturating) for the P·V product; the denominator sums the unrounded values (as a
      FlashAttention-style kernel does). ``p_scale`` (a power of two, say 2^8) shows that scaling P
      before the cast changes next to nothing.
    - out is rounded to bf16; lse and max_logits come from the (model) logits.
    """
    if logits not in ("exact", "fp8"):
        raise ValueError(f"logits must be 'exact' or 'fp8', got {logits!r}")
    s_q, h_q, d_qk = q.shape
    s_kv, topk = kv.shape[0], indices.shape[-1]
    device = q.device
    if chunk is None:
        per_row = h_q * topk * (_FP8_MMA_K * 4 * 3 if logits == "fp8" else 64) + topk * d_qk * 16
        chunk = max(1, _CHUNK_BYTES // per_row)
    keys = kv[:, 0]
    out = torch.zeros(s_q, h_q, d_v, dtype=torch.bfloat16, device=device)
    max_logits = torch.full((s_q, h_q), -math.inf, dtype=torch.float32, device=device)
    lse = torch.full((s_q, h_q), math.inf, dtype=torch.float32, device=device)
    slots = torch.arange(topk, device=device)
    multiplier = float(sm_scale) * q_scale.double().reshape(()) * kv_scale.double().reshape(())

    for start in range(0, s_q, chunk):
        stop = min(start + chunk, s_q)
        rows, valid = _valid_slots(indices, topk_length, s_kv, start, stop, slots)
        codes = _gather_rows(keys, torch.where(valid, rows, 0)).float().double()  # e4m3 values, [c, topk, d_qk]
        codes = codes.masked_fill(~valid.unsqueeze(-1), 0.0)
        q_codes = q[start:stop].float().double()  # [c, h_q, d_qk]
        if logits == "exact":
            raw = torch.bmm(q_codes, codes.transpose(1, 2))
        else:
            raw = _fp8_accumulate(q_codes, codes)
        s = (multiplier * raw).masked_fill(~valid.unsqueeze(1), -math.inf)  # [c, h_q, topk]
        has_valid = valid.any(dim=-1)[:, None, None]
        row_max = s.amax(dim=-1, keepdim=True)
        shift = torch.where(has_valid, row_max, 0.0)
        p = torch.exp(s - shift)
        total = p.sum(dim=-1, keepdim=True)
        p8 = (p * p_scale).float().to(torch.float8_e4m3fn).double() / p_scale
        values = codes[:, :, :d_v] * kv_scale.double()
        chunk_out = torch.bmm(p8, values) / torch.where(total > 0, total, 1.0)
        chunk_lse = torch.where(has_valid, shift + torch.log(total), math.inf).squeeze(-1)
        if attn_sink is not None:
            sink_factor = 1.0 / (1.0 + torch.exp(attn_sink.double().unsqueeze(0) - chunk_lse))
            chunk_out = chunk_out * sink_factor.unsqueeze(-1)
        chunk_out = torch.where(has_valid, chunk_out, 0.0)
        out[start:stop] = chunk_out.to(torch.bfloat16)
        max_logits[start:stop] = row_max.squeeze(-1).float()
        lse[start:stop] = chunk_lse.float()
    return out, max_logits, lse


def _fp8_accumulate(q_codes: torch.Tensor, k_codes: torch.Tensor) -> torch.Tensor:
    """``q_codes @ k_codes^T`` ([c, h, d] x [c, n, d] -> [c, h, n]) the way the model FP8 tensor core
    adds: 32 exact products at a time, which together with the running sum are aligned to the largest
    exponent among them and truncated towards zero to 14 significant bits before they are added."""
    # float32 is exact here: a product of two e4m3 values has 8 significant bits, a truncated term
    # at most 14, and 33 of them sum to less than 2^20 steps.
    q32, k32 = q_codes.float(), k_codes.float()
    c, h, d = q32.shape
    n = k32.shape[1]
    acc = torch.zeros(c, h, n, dtype=torch.float32, device=q32.device)
    for begin in range(0, d, _FP8_MMA_K):
        end = min(begin + _FP8_MMA_K, d)
        products = q32[:, :, None, begin:end] * k32[:, None, :, begin:end]  # [c, h, n, k], exact
        largest = torch.maximum(acc.abs(), products.abs().amax(dim=-1))
        exponent = torch.frexp(largest).exponent - 1  # largest in [2^exponent, 2^(exponent+1))
        step = torch.ldexp(torch.ones_like(largest), exponent - (_FP8_ACCUMULATOR_BITS - 1))
        products.div_(step.unsqueeze(-1)).trunc_()
        acc = (products.sum(dim=-1) + torch.trunc(acc / step)) * step
    return acc.double()


def _valid_slots(indices, topk_length, s_kv, start, stop, slots) -> tuple[torch.Tensor, torch.Tensor]:
    """``(rows, valid)`` of query rows ``start:stop``: int64 indices and the validity mask, [c, topk]."""
    rows = indices[start:stop, 0].long()
    valid = (rows >= 0) & (rows < s_kv)
    if topk_length is not None:
        valid &= slots < topk_length[start:stop].long().unsqueeze(1)
    return rows, valid


def _duplicate_groups(rows: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """``[c, topk]`` int64: for each slot, a group number shared by exactly the valid slots of the same
    query row that name the same KV row (each invalid slot is a group of its own)."""
    topk = rows.shape[1]
    slots = torch.arange(topk, device=rows.device)
    keyed = torch.where(valid, rows, -1 - slots)  # distinct negatives keep invalid slots apart
    ordered, order = keyed.sort(dim=1)
    starts = torch.ones_like(ordered, dtype=torch.bool)
    starts[:, 1:] = ordered[:, 1:] != ordered[:, :-1]
    group_sorted = starts.long().cumsum(dim=1) - 1
    return torch.empty_like(group_sorted).scatter_(1, order, group_sorted)


def _gather_rows(keys: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """``keys[rows]``; one-byte dtypes (FP8) are gathered as uint8, which every torch build indexes."""
    if keys.element_size() == 1:
        return keys.view(torch.uint8)[rows].view(keys.dtype)
    return keys[rows]
