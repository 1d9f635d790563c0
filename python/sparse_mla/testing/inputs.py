"""Random inputs for sparse_mla_q8kv8_prefill_fwd: FP8 quantization, uniform indices, hostile corners.

`make_inputs` returns a dict of keyword arguments that both the kernel and `reference_prefill` accept:

    inputs = make_inputs(s_q=437, s_kv=8192, h_q=64, d_qk=576, topk=2048, seed=1)
    out, max_logits, lse = sparse_mla_q8kv8_prefill_fwd(**inputs)
    ref = reference_prefill(**inputs)

q and kv follow the benchmark protocol: drawn from randn in bf16, quantized to e4m3 with one scale
per tensor (amax / 448). Options add the corners of the semantics and the domain (invalid and hostile
indices, all-invalid rows, NaN rows that only invalid slots point to, duplicates, topk_length,
attn_sink, strided views). Nothing here imports tvm-ffi or touches CUDA until called with a CUDA device.
"""

from __future__ import annotations

import math
import secrets
from typing import Optional

import torch

__all__ = [
    "FP8_E4M3_MAX",
    "HOSTILE_INDICES",
    "INT32_MAX",
    "INT32_MIN",
    "make_inputs",
    "poisoned_outputs",
    "quantize_fp8",
    "random_indices",
]

FP8_E4M3_MAX = 448.0  # largest finite float8_e4m3fn value
INT32_MIN = -(2**31)
INT32_MAX = 2**31 - 1
# Invalid index values a caller may pass; each must be skipped without reading any KV row.
# The value s_kv (one past the end) is added per call.
HOSTILE_INDICES = (INT32_MIN, -1, INT32_MAX)

_FP8_NAN_BITS = 0x7F  # float8_e4m3fn NaN: fills the gaps of strided buffers and the poisoned KV rows
_CORNER_SHARE = 0.25  # share of slots made invalid (invalid="mixed"/"hostile"), or duplicated
_KV_ROW_STRIDE = 1152  # kv_strided: elements between kv rows (two 576-byte rows; a multiple of 16)
_Q_PAD = 64  # q_strided: q is sliced out of [s_q, 2 * h_q, d_qk + 64] (every other head)
_SAMPLE_ELEMENTS = 1 << 26  # random scores drawn at once when sampling indices (256 MiB of float32)


def quantize_fp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-tensor e4m3 quantization: returns ``(x_fp8, scale)`` with ``x ~= x_fp8.float() * scale``.

    ``scale = amax(|x|) / 448`` is a one-element float32 tensor on x's device (an all-zero or empty x
    gets the smallest positive scale, so the division stays finite). ``x_fp8`` is contiguous.
    """
    if x.numel() == 0:
        amax = torch.zeros(1, device=x.device)
    else:
        amax = x.detach().abs().amax().float().reshape(1)
    scale = amax.clamp_min(torch.finfo(torch.float32).tiny) / FP8_E4M3_MAX
    # The clamp guards against a rounding of x / scale just above 448, which some torch versions cast
    # to NaN instead of saturating.
    scaled = (x.detach().float() / scale).clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX)
    return scaled.to(torch.float8_e4m3fn).contiguous(), scale


def random_indices(
    s_q: int,
    s_kv: int,
    topk: int,
    *,
    device: str | torch.device = "cuda",
    seed: Optional[int] = None,
) -> torch.Tensor:
    """``[s_q, 1, topk]`` int32, contiguous: per query row, ``topk`` distinct rows of ``[0, s_kv)``
    in random order (the benchmark protocol). When ``topk > s_kv`` each row holds every KV row once and
    -1 in the remaining slots, at random positions."""
    generator = _generator(seed, device)
    pool = torch.arange(s_kv, device=device)
    return _sample_distinct(pool, s_q, topk, generator).to(torch.int32).unsqueeze(1).contiguous()


def make_inputs(
    s_q: int,
    s_kv: int,
    h_q: int,
    d_qk: int = 576,
    topk: int = 2048,
    *,
    device: str | torch.device = "cuda",
    seed: Optional[int] = None,
    invalid: str = "none",
    duplicates: bool = False,
    all_invalid_rows: int = 0,
    nan_kv_rows: bool = False,
    topk_length: Optional[str] = None,
    attn_sink: Optional[str] = None,
    q_strided: bool = False,
    kv_strided: bool = False,
) -> dict:
    """Keyword arguments for ``sparse_mla_q8kv8_prefill_fwd`` (and ``reference_prefill``).

    Returns ``dict(q, kv, indices, sm_scale, q_scale, kv_scale, d_v, attn_sink, topk_length)`` with
    ``sm_scale = 1 / sqrt(d_qk)`` and ``d_v = 512``. ``seed=None`` draws a fresh seed; pass one to
    reproduce a failure.

    Indices start as ``random_indices`` (distinct rows per query); then, in this order:

    - ``duplicates``: a quarter of the slots copy another slot of the same row.
    - ``invalid``: ``"none"``; ``"mixed"``: a quarter of the slots become -1; ``"hostile"``: a quarter
      of the slots become INT32_MIN, -1, INT32_MAX and s_kv in turn.
    - ``all_invalid_rows``: that many random query rows get no valid slot at all (-1, or the hostile
      values in turn when ``invalid="hostile"``).
    - ``topk_length``: ``None``, or ``"random"``: uniform in ``[1, topk]`` per row, except a random
      eighth of the rows, which get INT32_MIN, -1, 0, topk, topk + 1 or INT32_MAX.
    - ``nan_kv_rows``: row 0, row s_kv - 1 and a sixteenth of the other KV rows are NaN and no valid
      slot points to them; with ``topk_length`` every slot past ``topk_length[i]`` points to one of
      them (a valid-looking index in an invalid slot). A kernel that reads an invalid slot's row, or
      clamps an invalid index to 0, turns the output NaN.

    ``attn_sink``: ``None``; ``"random"``: ``ln(topk) + 2 * randn`` per head, from negligible to
    dominant next to the row's lse; ``"special"``: like random, except heads with ``h % 8`` in 0..3
    get -inf, +inf, -1e30, +1e30.

    ``q_strided``: q is ``buffer[:, ::2, :d_qk]`` of a ``[s_q, 2 * h_q, d_qk + 64]`` buffer.
    ``kv_strided``: kv rows are 1152 elements apart. The gaps of both buffers hold FP8 NaN, so a read
    outside the view shows up in the output.
    """
    if invalid not in ("none", "mixed", "hostile"):
        raise ValueError(f"invalid must be 'none', 'mixed' or 'hostile', got {invalid!r}")
    if topk_length not in (None, "random"):
        raise ValueError(f"topk_length must be None or 'random', got {topk_length!r}")
    if attn_sink not in (None, "random", "special"):
        raise ValueError(f"attn_sink must be None, 'random' or 'special', got {attn_sink!r}")
    if not 0 <= all_invalid_rows <= s_q:
        raise ValueError(f"all_invalid_rows must be in [0, s_q={s_q}], got {all_invalid_rows}")
    generator = _generator(seed, device)

    q, q_scale = quantize_fp8(torch.randn(s_q, h_q, d_qk, dtype=torch.bfloat16, device=device, generator=generator))
    kv, kv_scale = quantize_fp8(torch.randn(s_kv, 1, d_qk, dtype=torch.bfloat16, device=device, generator=generator))

    nan_rows = _nan_row_ids(s_kv, generator, device) if nan_kv_rows else None
    pool = torch.arange(s_kv, device=device)
    if nan_rows is not None:
        keep = torch.ones(s_kv, dtype=torch.bool, device=device)
        keep[nan_rows] = False
        pool = pool[keep]
        kv.view(torch.uint8)[nan_rows] = _FP8_NAN_BITS
    indices = _sample_distinct(pool, s_q, topk, generator)

    if duplicates and topk > 1:
        source = torch.randint(0, topk, (s_q, topk), device=device, generator=generator)
        copy = _random_mask((s_q, topk), _CORNER_SHARE, generator, device)
        indices = torch.where(copy, indices.gather(1, source), indices)
    hostile = (*HOSTILE_INDICES, s_kv) if invalid == "hostile" else (-1,)
    if invalid != "none":
        _fill_cyclic(indices, _random_mask((s_q, topk), _CORNER_SHARE, generator, device), hostile)
    if all_invalid_rows:
        rows = torch.zeros(s_q, dtype=torch.bool, device=device)
        rows[torch.randperm(s_q, device=device, generator=generator)[:all_invalid_rows]] = True
        _fill_cyclic(indices, rows.unsqueeze(1).expand(s_q, topk), hostile)

    lengths = _random_topk_length(s_q, topk, generator, device) if topk_length == "random" else None
    if lengths is not None and nan_rows is not None:
        past_length = torch.arange(topk, device=device) >= lengths.unsqueeze(1)
        pick = torch.randint(0, nan_rows.numel(), (s_q, topk), device=device, generator=generator)
        indices = torch.where(past_length, nan_rows[pick], indices)

    sinks = _attn_sink(attn_sink, h_q, topk, generator, device) if attn_sink is not None else None

    if q_strided:
        q = _strided_copy(q, (s_q, 2 * h_q, d_qk + _Q_PAD), lambda buffer: buffer[:, ::2, :d_qk])
    if kv_strided:
        kv = _strided_copy(kv, (s_kv, 1, _KV_ROW_STRIDE), lambda buffer: buffer[:, :, :d_qk])

    return {
        "q": q,
        "kv": kv,
        "indices": indices.to(torch.int32).unsqueeze(1).contiguous(),
        "sm_scale": 1.0 / math.sqrt(d_qk),
        "q_scale": q_scale,
        "kv_scale": kv_scale,
        "d_v": 512,
        "attn_sink": sinks,
        "topk_length": lengths,
    }


def poisoned_outputs(s_q: int, h_q: int, d_v: int = 512, *, device: str | torch.device = "cuda") -> dict:
    """Preallocated ``out`` (bf16), ``max_logits`` and ``lse`` (float32), all NaN, as a dict of the
    API's keyword arguments: an element the kernel fails to write stays NaN and fails the check."""
    return {
        "out": torch.full((s_q, h_q, d_v), math.nan, dtype=torch.bfloat16, device=device),
        "max_logits": torch.full((s_q, h_q), math.nan, dtype=torch.float32, device=device),
        "lse": torch.full((s_q, h_q), math.nan, dtype=torch.float32, device=device),
    }


def _generator(seed: Optional[int], device: str | torch.device) -> torch.Generator:
    generator = torch.Generator(device=device)
    generator.manual_seed(secrets.randbits(63) if seed is None else seed)
    return generator


def _sample_distinct(pool: torch.Tensor, rows: int, topk: int, generator: torch.Generator) -> torch.Tensor:
    """``[rows, topk]`` int64: per row, ``min(topk, len(pool))`` distinct entries of pool in random
    order, and -1 in the other slots (at random positions)."""
    width = max(pool.numel(), topk)  # candidates past the pool stand for the -1 padding
    out = torch.empty(rows, topk, dtype=torch.int64, device=pool.device)
    padded_pool = torch.cat([pool, pool.new_full((width - pool.numel(),), -1)])
    chunk = max(1, _SAMPLE_ELEMENTS // width)
    for start in range(0, rows, chunk):
        stop = min(start + chunk, rows)
        scores = torch.rand(stop - start, width, device=pool.device, generator=generator)
        out[start:stop] = padded_pool[scores.topk(topk, dim=1).indices]
    return out


def _random_mask(shape: tuple[int, ...], share: float, generator: torch.Generator, device) -> torch.Tensor:
    return torch.rand(shape, device=device, generator=generator) < share


def _fill_cyclic(indices: torch.Tensor, mask: torch.Tensor, values: tuple[int, ...]) -> None:
    """Write ``values[0], values[1], ...`` in turn into the masked slots of indices (in place)."""
    count = int(mask.sum())
    cycle = torch.tensor(values, dtype=indices.dtype, device=indices.device)
    indices[mask] = cycle.repeat(count // len(values) + 1)[:count]


def _nan_row_ids(s_kv: int, generator: torch.Generator, device) -> torch.Tensor:
    """KV rows to fill with NaN: row 0, row s_kv - 1 and a random sixteenth of the rest."""
    random_rows = torch.randperm(s_kv, device=device, generator=generator)[: s_kv // 16]
    edges = torch.tensor([0, s_kv - 1], device=device)
    return torch.unique(torch.cat([edges, random_rows]))


def _random_topk_length(s_q: int, topk: int, generator: torch.Generator, device) -> torch.Tensor:
    lengths = torch.randint(1, topk + 1, (s_q,), device=device, generator=generator, dtype=torch.int32)
    special = _random_mask((s_q,), 1 / 8, generator, device)
    _fill_cyclic(lengths, special, (INT32_MIN, -1, 0, topk, topk + 1, INT32_MAX))
    return lengths


def _attn_sink(kind: str, h_q: int, topk: int, generator: torch.Generator, device) -> torch.Tensor:
    sinks = math.log(topk) + 2 * torch.randn(h_q, device=device, generator=generator)
    if kind == "special":
        special = torch.tensor([-math.inf, math.inf, -1e30, 1e30], device=device)
        head = torch.arange(h_q, device=device) % 8
        sinks = torch.where(head < 4, special[head.clamp_max(3)], sinks)
    return sinks.float().contiguous()


def _strided_copy(x: torch.Tensor, buffer_shape: tuple[int, ...], view) -> torch.Tensor:
    """Copy x into ``view(buffer)`` of a NaN-filled FP8 buffer and return that strided view."""
    buffer = torch.empty(buffer_shape, dtype=x.dtype, device=x.device)
    buffer.view(torch.uint8).fill_(_FP8_NAN_BITS)
    strided = view(buffer)
    strided.copy_(x)
    return strided
