"""The serving engines' FP8 latent cache (DeepSeek-V3.2 family) in torch: format, writer, reader, paging,
the float64 reference over it and the engines' requantizing path, for tests of a kernel that reads it.

**Row format** (656 bytes a token, little-endian, as DeepSeek's FlashMLA, sglang and vLLM write it):

========  ===================================================================================
bytes     content
========  ===================================================================================
0-511     512 float8_e4m3fn: the "nope" latent, quantized in 4 tiles of 128 elements
512-527   4 float32 scales; scale b multiplies elements 128b ... 128b+127 (x = e4m3 * scale)
528-655   64 bfloat16: the "rope" part, not quantized (unused, left zero, at d_qk 512)
========  ===================================================================================

Each tile's scale is its float32 ``amax / 448``, not rounded to a power of two, and at least
``FLT_MIN`` (2^-126), which is what an all-zero tile gets; a reader must accept any positive float32
scale. Rows are 16-byte aligned (656 = 41 * 16), not 32-byte aligned.

**Paging.** ``kv_cache`` is ``[num_blocks, block_size, 1, 656]`` uint8 (64 tokens a block in serving);
the rows of a block are contiguous, and the flat row ``block * block_size + offset`` is what indices
name (-1 and anything outside ``[0, num_blocks * block_size)`` invalid). A request's tokens sit in the
blocks its block table lists, in any order.

- `quantize_paged_cache` writes a latent into a (shuffled) paged cache, `dequantize_paged_cache` reads
  it back exactly (float64), `random_latent` draws latents whose tiles differ in magnitude by 2^8 or
  more within a row, as real writers produce.
- `shuffled_block_table` and `paged_indices` put a request's rows in scattered blocks and map its
  contiguous selections to flat paged rows.
- `reference_prefill_paged`: float64 attention over the dequantized cache.
- `engine_requantized_kv` emulates what engines run before a contiguous FP8 kernel (gather, dequantize,
  requantize to e4m3 at scale 1.0, rope rounded to e4m3 too): a second rounding of every value, since
  the tile scales are not powers of two.
"""

from __future__ import annotations

from typing import Optional

import torch

from sparse_mla.testing.inputs import FP8_E4M3_MAX
from sparse_mla.testing.reference import reference_prefill

__all__ = [
    "PAGED_ROW_BYTES",
    "as_paged_call",
    "as_read_inputs",
    "dequantize_paged_cache",
    "engine_requantized_kv",
    "paged_indices",
    "quantize_paged_cache",
    "random_latent",
    "reference_prefill_paged",
    "requantized_keys",
    "requantized_rows",
    "shuffled_block_table",
]

PAGED_ROW_BYTES = 656
NOPE_DIM = 512
ROPE_DIM = 64
TILE = 128  # nope elements that share one scale
_TILES = NOPE_DIM // TILE
_SCALES_AT = NOPE_DIM  # byte offset of the 4 float32 scales
_ROPE_AT = _SCALES_AT + 4 * _TILES  # byte offset of the 64 bfloat16 rope values
_FLT_MIN = torch.finfo(torch.float32).tiny  # the scale of an all-zero tile


def quantize_paged_cache(
    latent: torch.Tensor,
    block_size: int = 64,
    *,
    block_table: Optional[torch.Tensor] = None,
    num_blocks: Optional[int] = None,
) -> torch.Tensor:
    """Write ``latent`` ``[num_tokens, 576]`` (or ``[num_tokens, 512]``: no rope, slot left zero), bf16 or
    float, as the engines do: returns ``kv_cache`` ``[num_blocks, block_size, 1, 656]`` uint8.

    Token t goes to block ``block_table[t // block_size]`` (by default block ``t // block_size``), row
    ``t % block_size``. ``num_blocks`` defaults to just enough; rows no token fills are all-zero bytes.
    The nope part is quantized from float32: per 128-element tile, ``scale = max(amax / 448, FLT_MIN)``
    in float32 and ``e4m3(clamp(x / scale, -448, 448))``; the rope part is rounded to bf16.
    """
    num_tokens, d_qk = latent.shape
    if d_qk not in (NOPE_DIM, NOPE_DIM + ROPE_DIM):
        raise ValueError(f"latent must have 512 or 576 columns, got {d_qk}")
    needed = -(-num_tokens // block_size)
    if block_table is None:
        block_table = torch.arange(needed, device=latent.device)
    if block_table.numel() < needed:
        raise ValueError(f"block_table lists {block_table.numel()} blocks, {num_tokens} tokens need {needed}")
    if num_blocks is None:
        num_blocks = int(block_table.max()) + 1 if needed else 0

    x = latent.float()
    tiles = x[:, :NOPE_DIM].reshape(num_tokens, _TILES, TILE)
    scales = (tiles.abs().amax(dim=-1) / FP8_E4M3_MAX).clamp_min(_FLT_MIN)  # [num_tokens, 4] float32
    nope = (tiles / scales.unsqueeze(-1)).clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(torch.float8_e4m3fn)

    rows = torch.zeros(num_tokens, PAGED_ROW_BYTES, dtype=torch.uint8, device=latent.device)
    rows[:, :_SCALES_AT] = nope.reshape(num_tokens, NOPE_DIM).view(torch.uint8)
    rows[:, _SCALES_AT:_ROPE_AT] = scales.contiguous().view(torch.uint8)
    if d_qk > NOPE_DIM:
        rows[:, _ROPE_AT:] = x[:, NOPE_DIM:].to(torch.bfloat16).contiguous().view(torch.uint8)

    flat = block_table.long()[torch.arange(num_tokens, device=latent.device) // block_size] * block_size
    flat += torch.arange(num_tokens, device=latent.device) % block_size
    cache = torch.zeros(num_blocks * block_size, PAGED_ROW_BYTES, dtype=torch.uint8, device=latent.device)
    cache[flat] = rows
    return cache.reshape(num_blocks, block_size, 1, PAGED_ROW_BYTES)


def dequantize_paged_cache(kv_cache: torch.Tensor, d_qk: int = 576) -> torch.Tensor:
    """Read every row of ``kv_cache`` (``[num_blocks, block_size, 1, 656]``, any 1-byte dtype): returns
    float64 ``[num_blocks * block_size, d_qk]``, ``e4m3 * scale`` per tile (exact in float64: 4 and 24
    significant bits) then, at d_qk 576, the bf16 rope values. At d_qk 512 the rope slot is not read."""
    if d_qk not in (NOPE_DIM, NOPE_DIM + ROPE_DIM):
        raise ValueError(f"d_qk must be 512 or 576, got {d_qk}")
    rows = kv_cache.view(torch.uint8).reshape(-1, PAGED_ROW_BYTES)
    nope = rows[:, :_SCALES_AT].contiguous().view(torch.float8_e4m3fn).double().reshape(-1, _TILES, TILE)
    scales = rows[:, _SCALES_AT:_ROPE_AT].contiguous().view(torch.float32).double()
    parts = [(nope * scales.unsqueeze(-1)).reshape(-1, NOPE_DIM)]
    if d_qk > NOPE_DIM:
        parts.append(rows[:, _ROPE_AT:].contiguous().view(torch.bfloat16).double())
    return torch.cat(parts, dim=1)


def random_latent(
    num_tokens: int,
    d_qk: int = 576,
    *,
    tile_spread_log2: int = 10,
    seed: int = 0,
    device: str | torch.device = "cpu",
) -> torch.Tensor:
    """A bf16 latent ``[num_tokens, d_qk]``: randn, each nope tile of a row multiplied by its own power
    of two, the four exponents spread evenly over ``[-tile_spread_log2 / 2, tile_spread_log2 / 2]``
    and shuffled per row, so a row's largest and smallest tile magnitudes differ by about
    ``2^tile_spread_log2`` (0: one magnitude). The rope part is plain randn."""
    generator = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(num_tokens, d_qk, generator=generator, device=device)
    steps = torch.linspace(-0.5, 0.5, _TILES, device=device) * tile_spread_log2
    order = torch.rand(num_tokens, _TILES, generator=generator, device=device).argsort(dim=1)
    exponents = steps[order].round()  # [num_tokens, 4]
    tiles = x[:, :NOPE_DIM].reshape(num_tokens, _TILES, TILE) * torch.exp2(exponents).unsqueeze(-1)
    x[:, :NOPE_DIM] = tiles.reshape(num_tokens, NOPE_DIM)
    return x.to(torch.bfloat16)


def shuffled_block_table(num_tokens: int, block_size: int = 64, num_blocks: Optional[int] = None, *,
                         seed: int = 0) -> torch.Tensor:
    """The block table of a request of ``num_tokens`` tokens scattered over a cache of ``num_blocks``
    blocks (default: twice what it needs, so other requests' blocks sit between its own): distinct
    block ids in random order, int32."""
    needed = -(-num_tokens // block_size)
    num_blocks = 2 * needed if num_blocks is None else num_blocks
    if num_blocks < needed:
        raise ValueError(f"{num_tokens} tokens need {needed} blocks, the cache has {num_blocks}")
    generator = torch.Generator().manual_seed(seed)
    return torch.randperm(num_blocks, generator=generator)[:needed].to(torch.int32)


def paged_indices(indices: torch.Tensor, block_table: torch.Tensor, block_size: int, num_tokens: int,
                  num_blocks: int) -> torch.Tensor:
    """Map selections of a contiguous cache of ``num_tokens`` rows to flat rows of the paged cache whose
    block table is ``block_table``: a valid index t (``0 <= t < num_tokens``) becomes
    ``block_table[t // block_size] * block_size + t % block_size``. Every invalid index stays invalid:
    kept as it is (hostile values included) where that is outside ``[0, num_blocks * block_size)``,
    made -1 where it would name a paged row. Same shape and dtype as ``indices``."""
    table = block_table.long().to(indices.device)
    wide = indices.long()
    valid = (wide >= 0) & (wide < num_tokens)
    safe = torch.where(valid, wide, 0)
    mapped = table[safe // block_size] * block_size + safe % block_size
    in_cache = (wide >= 0) & (wide < num_blocks * block_size)
    invalid = torch.where(in_cache, -1, wide)
    return torch.where(valid, mapped, invalid).to(indices.dtype)


def as_paged_call(inputs: dict, block_size: int = 64, *, block_stride_pad: int = 0, seed: int = 0) -> dict:
    """A contiguous call's arguments (`make_inputs`' keywords) as the same call over the engines' paged
    cache: kv's values (times kv_scale) written as 656-byte rows into shuffled blocks of ``block_size``
    rows (`shuffled_block_table`, twice the blocks they need), blocks ``block_stride_pad`` rows further
    apart than their rows, and the indices mapped to them (values outside the rows kept). Keywords of
    sparse_mla_q8kv8_paged_prefill_fwd."""
    kv = inputs["kv"]
    s_kv, device = kv.shape[0], kv.device
    table = shuffled_block_table(s_kv, block_size, seed=seed).to(device)
    blocks = 2 * -(-s_kv // block_size)
    cache = quantize_paged_cache(kv[:, 0].float() * inputs["kv_scale"], block_size, block_table=table,
                                 num_blocks=blocks)
    if block_stride_pad:
        spaced = torch.zeros(blocks, block_size + block_stride_pad, 1, PAGED_ROW_BYTES, dtype=torch.uint8,
                             device=device)
        spaced[:, :block_size] = cache
        cache = spaced[:, :block_size]
    others = {name: value for name, value in inputs.items() if name not in ("kv", "kv_scale", "indices")}
    return dict(others, kv_cache=cache, indices=paged_indices(inputs["indices"], table, block_size, s_kv, blocks))


def reference_prefill_paged(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    indices: torch.Tensor,
    sm_scale: float,
    q_scale: torch.Tensor,
    d_v: int = 512,
    attn_sink: Optional[torch.Tensor] = None,
    topk_length: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`reference_prefill` over the paged cache, with ``indices`` naming its flat rows: the keys are the
    cache dequantized exactly (`dequantize_paged_cache`, float64, d_qk from q), so the reference adds no
    rounding of its own. Returns ``(out, max_logits, lse)``, float32."""
    keys = dequantize_paged_cache(kv_cache, q.shape[-1]).to(q.device)
    unit = torch.ones(1, dtype=torch.float32, device=q.device)
    return reference_prefill(q, keys.unsqueeze(1), indices, sm_scale, q_scale, unit, d_v, attn_sink, topk_length)


# The smallest row scale the kernel gives a row (include/sparse_mla/sm90/prefill/gather.cuh, MIN_ROW_SCALE).
MIN_ROW_SCALE = 2.0**-100


def requantized_rows(kv_cache: torch.Tensor, d_qk: int = 576) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel's requantization of every row of ``kv_cache``, as a float model of
    include/sparse_mla/sm90/prefill/gather.cuh (requantize_row): each row's scale sigma is the largest of
    its 4 tile scales and (d_qk 576) its rope's amax / 448, at least ``MIN_ROW_SCALE`` (NaN stays NaN);
    the tiles whose scale is sigma keep their e4m3 values, every other tile's values are multiplied by
    scale / sigma in fp16 (the factor rounded to fp16 too) and rounded to e4m3, the rope divided by sigma
    in float32 and rounded to e4m3. Returns ``(values, sigma)``: float64 ``[rows, d_qk]`` (the e4m3
    values at scale sigma) and float64 ``[rows]``; ``values * sigma`` is the key the kernel reads."""
    rows = kv_cache.view(torch.uint8).reshape(-1, PAGED_ROW_BYTES)
    nope = rows[:, :_SCALES_AT].contiguous().view(torch.float8_e4m3fn).reshape(-1, _TILES, TILE)
    scales = rows[:, _SCALES_AT:_ROPE_AT].contiguous().view(torch.float32)
    sigma = scales.amax(dim=1)
    sigma = torch.where(scales.isnan().any(dim=1), torch.nan, sigma)
    rope = None
    if d_qk > NOPE_DIM:
        rope = rows[:, _ROPE_AT:].contiguous().view(torch.bfloat16).float()
        amax = rope.abs().amax(dim=1)
        sigma = torch.where(rope.isnan().any(dim=1), torch.nan, torch.maximum(sigma, amax / FP8_E4M3_MAX))
    sigma = torch.where(sigma.isnan() | (sigma >= MIN_ROW_SCALE), sigma, torch.full_like(sigma, MIN_ROW_SCALE))
    factor = (scales / sigma[:, None]).half()
    scaled = (nope.half() * factor[:, :, None]).float().clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(torch.float8_e4m3fn)
    kept = (scales == sigma[:, None])[:, :, None]
    values = torch.where(kept, nope.double(), scaled.double()).reshape(-1, NOPE_DIM)
    if rope is not None:
        rope_e4m3 = (rope * (1.0 / sigma[:, None])).clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(torch.float8_e4m3fn)
        values = torch.cat([values, rope_e4m3.double()], dim=1)
    return values, sigma.double()


def requantized_keys(kv_cache: torch.Tensor, d_qk: int = 576) -> torch.Tensor:
    """The keys the paged kernel reads, row for row (`requantized_rows`' values times their sigma):
    float32 ``[rows, 1, d_qk]``. With a kv_scale of 1 they stand in for kv in `reference_prefill` and
    `error_model` (`as_read_inputs`), which holds a paged call to the contiguous call's acceptance rule
    over the rows it actually multiplies; `requantized_rows` bounds how far those lie from the cache's
    own values."""
    values, sigma = requantized_rows(kv_cache, d_qk)
    return (values * sigma[:, None]).float().unsqueeze(1)


def as_read_inputs(q: torch.Tensor, kv_cache: torch.Tensor, indices: torch.Tensor, sm_scale: float,
                   q_scale: torch.Tensor, d_v: int = 512, attn_sink: Optional[torch.Tensor] = None,
                   topk_length: Optional[torch.Tensor] = None) -> dict:
    """A paged call's arguments as the contiguous call's keywords over the keys the kernel reads
    (`requantized_keys`, kv_scale 1): for `reference_prefill`, `error_model` and so
    `assert_close_to_reference`."""
    return dict(q=q, kv=requantized_keys(kv_cache, q.shape[-1]), indices=indices, sm_scale=sm_scale,
                q_scale=q_scale, kv_scale=torch.ones(1, dtype=torch.float32, device=q.device), d_v=d_v,
                attn_sink=attn_sink, topk_length=topk_length)


def engine_requantized_kv(kv_cache: torch.Tensor, rows: torch.Tensor,
                          d_qk: int = 576) -> tuple[torch.Tensor, torch.Tensor]:
    """The engines' pass before a contiguous FP8 kernel: gather the flat paged ``rows`` (a request's
    context in token order, e.g. ``paged_indices(torch.arange(num_tokens), ...)``), dequantize in
    float32 (``e4m3 * scale``, rope bf16), then cast every value, rope included, to e4m3 at scale 1.0
    (saturating at 448). Returns ``(kv, kv_scale)``: ``[len(rows), 1, d_qk]`` float8_e4m3fn and a
    float32 one. Indices into it are the request's contiguous token positions."""
    gathered = kv_cache.view(torch.uint8).reshape(-1, 1, 1, PAGED_ROW_BYTES)[rows.long()]
    values = dequantize_paged_cache(gathered, d_qk).float()  # rounding to float32 as the engines' pass does
    kv = values.clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(torch.float8_e4m3fn).unsqueeze(1)
    return kv, torch.ones(1, dtype=torch.float32, device=kv.device)
