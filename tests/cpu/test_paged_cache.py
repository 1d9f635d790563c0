"""sparse_mla.testing.paged_cache on the CPU: the 656-byte row format byte by byte, the writer's scales
and rounding, scattered blocks and their indices, the float64 reference over the cache, and the error
of the engines' requantize-to-scale-1.0 path against it."""

from __future__ import annotations

import math
import struct

import pytest
import torch

from seeds import run_seed
from sparse_mla.testing import (
    FP8_E4M3_MAX,
    HOSTILE_INDICES,
    PAGED_ROW_BYTES,
    as_paged_call,
    as_read_inputs,
    assert_close_to_reference,
    dequantize_paged_cache,
    engine_requantized_kv,
    error_model,
    fp8_model_prefill,
    make_inputs,
    paged_indices,
    quantize_fp8,
    quantize_paged_cache,
    random_indices,
    random_latent,
    reference_prefill,
    reference_prefill_paged,
    relative_error,
    requantized_keys,
    requantized_rows,
    shuffled_block_table,
)
from sparse_mla.testing.numerics import E4M3_RMS_ROUNDING

pytestmark = pytest.mark.cpu

FLT_MIN = 2.0**-126
# e4m3 bytes of a few values: sign, 4 exponent bits (bias 7), 3 mantissa bits.
E4M3_BYTES = {448.0: 0x7E, 1.0: 0x38, -2.0: 0xC0, 0.5: 0x30, 0.0: 0x00, -1.5: 0xBC, 2.0**-9: 0x01}


def row_bytes(cache: torch.Tensor, flat_row: int) -> bytes:
    return bytes(cache.reshape(-1, PAGED_ROW_BYTES)[flat_row].tolist())


def test_hand_built_row():
    """One token whose every value is an exact e4m3 multiple of a non-power-of-two scale: the row's bytes
    are known in advance, offset by offset."""
    scales = (0.75, 3.0, 1.5 * 2.0**-10, 1.25)
    codes = [448.0, 1.0, -2.0, 0.5, 0.0, -1.5, 2.0**-9]
    tile_values = [codes[i % len(codes)] for i in range(128)]  # holds 448, so amax / 448 is the scale
    latent = torch.zeros(1, 576, dtype=torch.float32)
    for b, scale in enumerate(scales):
        latent[0, 128 * b:128 * (b + 1)] = torch.tensor(tile_values) * scale
    rope = [1.0, -2.0, 0.5, 3.0] * 16
    latent[0, 512:] = torch.tensor(rope)

    expected = bytes(E4M3_BYTES[v] for v in tile_values) * 4
    expected += struct.pack("<4f", *scales)
    expected += b"".join(struct.pack("<f", v)[2:] for v in rope)  # bf16: the float32's high half
    assert len(expected) == PAGED_ROW_BYTES

    cache = quantize_paged_cache(latent, block_size=4)
    assert cache.shape == (1, 4, 1, PAGED_ROW_BYTES) and cache.dtype == torch.uint8
    assert row_bytes(cache, 0) == expected
    assert row_bytes(cache, 1) == bytes(PAGED_ROW_BYTES)  # rows no token fills are zero
    assert torch.equal(dequantize_paged_cache(cache)[0], latent[0].double())
    assert torch.equal(dequantize_paged_cache(cache, 512)[0], latent[0, :512].double())
    # any 1-byte dtype, and a free block stride (pages 16 bytes apart here)
    assert torch.equal(dequantize_paged_cache(cache.view(torch.float8_e4m3fn)), dequantize_paged_cache(cache))
    second_block = quantize_paged_cache(latent, block_size=4, block_table=torch.tensor([1]), num_blocks=2)
    assert row_bytes(second_block, 4) == expected
    padded = torch.zeros(2, 4 * PAGED_ROW_BYTES + 16, dtype=torch.uint8)
    padded[:, :4 * PAGED_ROW_BYTES] = second_block.reshape(2, -1)
    strided = padded[:, :4 * PAGED_ROW_BYTES].view(2, 4, 1, PAGED_ROW_BYTES)
    assert not strided.is_contiguous()
    assert torch.equal(dequantize_paged_cache(strided), dequantize_paged_cache(second_block))


def test_zero_row_and_zero_tile():
    """An all-zero tile gets the scale FLT_MIN (a writer's max(amax / 448, FLT_MIN)) and zero bytes, so it
    reads back as exact zeros, next to tiles of ordinary magnitude in the same row."""
    latent = random_latent(2, seed=run_seed()).float()
    latent[0] = 0.0
    latent[1, 128:256] = 0.0
    cache = quantize_paged_cache(latent, block_size=2)
    zero = row_bytes(cache, 0)
    assert zero[:512] == bytes(512) and zero[528:] == bytes(128)
    assert zero[512:528] == struct.pack("<f", FLT_MIN) * 4
    one = row_bytes(cache, 1)
    assert one[128:256] == bytes(128)
    assert struct.unpack("<4f", one[512:528])[1] == FLT_MIN
    read = dequantize_paged_cache(cache)
    assert torch.equal(read[0], torch.zeros(576, dtype=torch.float64))
    assert torch.equal(read[1, 128:256], torch.zeros(128, dtype=torch.float64))


@pytest.mark.parametrize("d_qk", [576, 512])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_round_trip_per_tile(d_qk, dtype):
    """Scales are exactly float32 amax / 448 per tile, spread over >= 2^8 within every row; every
    element reads back within half an e4m3 step of its value (2^-4 relative, 2^-10 * scale below the
    normal range); rope is bf16-exact (float input: rounded to bf16 once)."""
    num_tokens, block_size = 300, 64
    latent = random_latent(num_tokens, d_qk, seed=run_seed()).to(dtype)
    cache = quantize_paged_cache(latent, block_size)
    assert cache.shape == (5, 64, 1, PAGED_ROW_BYTES)

    rows = cache.reshape(-1, PAGED_ROW_BYTES)[:num_tokens]
    scales = torch.tensor([struct.unpack("<4f", bytes(r[512:528].tolist())) for r in rows], dtype=torch.float64)
    tiles = latent.float()[:, :512].reshape(num_tokens, 4, 128)
    amax = tiles.abs().amax(dim=-1)
    want = torch.tensor([[struct.unpack("<f", struct.pack("<f", a / 448.0))[0] for a in row] for row in amax.tolist()],
                        dtype=torch.float64)  # the quotient in float64, rounded to float32 by struct
    assert torch.equal(scales, want)  # amax / 448 rounded to float32 once, as a float32 division rounds it
    spread = scales.amax(dim=1) / scales.amin(dim=1)
    assert float(spread.min()) >= 2.0**8, f"tile scales spread only {float(spread.min()):.1f}x within a row"

    read = dequantize_paged_cache(cache, d_qk)[:num_tokens]
    exact = latent.double()
    error = (read[:, :512] - exact[:, :512]).abs().reshape(num_tokens, 4, 128)
    allowed = (2.0**-4 * exact[:, :512].abs().reshape(num_tokens, 4, 128) + 2.0**-10 * scales.unsqueeze(-1))
    worst = float((error / allowed).max())
    assert worst <= 1.0 + 2.0**-16, f"an element moved {worst:.4f} of its half e4m3 step"
    assert worst > 0.5, "no element rounded by more than a quarter step: the rounding is not e4m3's"
    if d_qk == 576:
        assert torch.equal(read[:, 512:], latent[:, 512:].to(torch.bfloat16).double())


def test_writer_refuses_bad_shapes():
    with pytest.raises(ValueError, match="512 or 576 columns"):
        quantize_paged_cache(torch.zeros(3, 640))
    with pytest.raises(ValueError, match="3 tokens need 2"):
        quantize_paged_cache(torch.zeros(3, 576), 2, block_table=torch.tensor([5]))
    with pytest.raises(ValueError, match="d_qk must be 512 or 576"):
        dequantize_paged_cache(torch.zeros(1, 2, 1, PAGED_ROW_BYTES, dtype=torch.uint8), 640)


def test_scattered_blocks_and_indices():
    """A request spread over shuffled blocks of a larger cache reads back as its contiguous rows, its
    selections map onto them, invalid ones stay invalid, and the reference is the same either way."""
    seed = run_seed()
    num_tokens, block_size, s_q, h_q, topk = 200, 16, 5, 4, 24
    latent = random_latent(num_tokens, seed=seed)
    table = shuffled_block_table(num_tokens, block_size, seed=seed)
    num_blocks = 2 * len(table)
    assert sorted(set(table.tolist())) == sorted(table.tolist()) and int(table.max()) < num_blocks
    paged = quantize_paged_cache(latent, block_size, block_table=table, num_blocks=num_blocks)
    contiguous = quantize_paged_cache(latent, block_size)
    assert paged.shape == (num_blocks, block_size, 1, PAGED_ROW_BYTES)

    indices = random_indices(s_q, num_tokens, topk, device="cpu", seed=seed)
    edge = [-1, num_tokens, num_tokens + 3, num_blocks * block_size, *HOSTILE_INDICES]
    indices[:, 0, :len(edge)] = torch.tensor(edge, dtype=torch.int32)
    mapped = paged_indices(indices, table, block_size, num_tokens, num_blocks)
    assert mapped.dtype == indices.dtype and mapped.shape == indices.shape
    valid = (indices >= 0) & (indices < num_tokens)
    flat_paged = paged.reshape(-1, PAGED_ROW_BYTES)
    flat_contiguous = contiguous.reshape(-1, PAGED_ROW_BYTES)
    assert torch.equal(flat_paged[mapped[valid].long()], flat_contiguous[indices[valid].long()])
    # num_tokens and num_tokens + 3 would name paged rows: they become -1; the rest keep their value
    assert mapped[0, 0, :len(edge)].tolist() == [-1, -1, -1, num_blocks * block_size, *HOSTILE_INDICES]

    generator = torch.Generator().manual_seed(seed + 1)  # not the latent's draws
    q, q_scale = quantize_fp8(torch.randn(s_q, h_q, 576, generator=generator))
    sm_scale = 576**-0.5
    from_pages = reference_prefill_paged(q, paged, mapped, sm_scale, q_scale)
    # the contiguous cache holds exactly the request's rows, so num_tokens and above are invalid there
    rows = dequantize_paged_cache(contiguous)[:num_tokens].unsqueeze(1)
    from_rows = reference_prefill(q, rows, indices, sm_scale, q_scale, torch.ones(1))
    for got, want in zip(from_pages, from_rows):
        assert torch.equal(got, want)


@pytest.mark.parametrize("d_qk", [576, 512])
def test_reference_keeps_float64_keys(d_qk):
    """The paged reference is attention over the exact dequantized cache (at d_qk 512 the rope slot,
    filled here, is ignored): a per-(i, h) float64 loop agrees with it to float32 rounding, and a
    float64 kv handed to reference_prefill is not rounded to float32 first (a float32 one would lose
    these keys' low bits)."""
    seed = run_seed()
    num_tokens, s_q, h_q, topk = 70, 3, 2, 9
    cache = quantize_paged_cache(random_latent(num_tokens, seed=seed), 32)
    generator = torch.Generator().manual_seed(seed + 1)  # not the latent's draws
    q, q_scale = quantize_fp8(torch.randn(s_q, h_q, d_qk, generator=generator))
    indices = random_indices(s_q, num_tokens, topk, device="cpu", seed=seed)
    indices[1, 0, 2] = -1
    sm_scale = d_qk**-0.5
    out, max_logits, lse = reference_prefill_paged(q, cache, indices, sm_scale, q_scale)

    keys = dequantize_paged_cache(cache)[:, :d_qk]
    queries = (q.float() * q_scale).double()  # q dequantized in float32, as the contract says
    for i in range(s_q):
        rows = [r for r in indices[i, 0].tolist() if r >= 0]
        for h in range(h_q):
            logits = sm_scale * (keys[rows] @ queries[i, h])
            weights = torch.softmax(logits, dim=0)
            torch.testing.assert_close(out[i, h], (weights @ keys[rows, :512]).float(), rtol=1e-6, atol=1e-7)
            assert math.isclose(float(lse[i, h]), float(torch.logsumexp(logits, 0)), rel_tol=1e-6)
            assert math.isclose(float(max_logits[i, h]), float(logits.max()), rel_tol=1e-6)

    # Two keys equal in float32, 1 apart in logit in float64: their weights show which one was used.
    keys = torch.zeros(2, 1, 576, dtype=torch.float64)
    keys[:, 0, 0] = torch.tensor([1.0, 1.0 + 2.0**-40], dtype=torch.float64)
    keys[1, 0, 1] = 1.0
    query = torch.zeros(1, 1, 576, dtype=torch.float64)
    query[0, 0, 0] = 2.0**40
    unit = torch.ones(1)
    both = torch.tensor([[[0, 1]]], dtype=torch.int32)
    out64 = reference_prefill(query, keys, both, 1.0, unit, unit)[0]
    assert math.isclose(float(out64[0, 0, 1]), math.e / (1.0 + math.e), rel_tol=1e-6)
    out32 = reference_prefill(query, keys.float(), both, 1.0, unit, unit)[0]
    assert float(out32[0, 0, 1]) == 0.5


def engine_path_results(spread_log2: int, seed: int) -> dict:
    """One paged cache (a request in shuffled blocks) and the results on it: ``ref``, the float64
    reference over the cache; ``engine``, exact attention over the engines' requantized kv; ``engine_kernel``,
    the model FP8 kernel over that kv; ``direct_kernel``, the model FP8 kernel over the dequantized keys
    (the error a kernel applying the tile scales exactly would add); ``inputs``, the keywords of the
    contract's error model for the dequantized keys; ``element_moves``, the requantization's largest
    move of one value in half e4m3 steps (``max(2^-4 |k|, 2^-10)``)."""
    num_tokens, block_size, s_q, h_q, topk = 1000, 64, 16, 16, 256
    latent = random_latent(num_tokens, tile_spread_log2=spread_log2, seed=seed)
    table = shuffled_block_table(num_tokens, block_size, seed=seed)
    num_blocks = 2 * len(table)
    cache = quantize_paged_cache(latent, block_size, block_table=table, num_blocks=num_blocks)
    generator = torch.Generator().manual_seed(seed + 1)  # not the latent's draws
    q, q_scale = quantize_fp8(torch.randn(s_q, h_q, 576, generator=generator))
    sm_scale = 576**-0.5
    indices = random_indices(s_q, num_tokens, topk, device="cpu", seed=seed)
    ref = reference_prefill_paged(q, cache, paged_indices(indices, table, block_size, num_tokens, num_blocks),
                                  sm_scale, q_scale)

    context = paged_indices(torch.arange(num_tokens), table, block_size, num_tokens, num_blocks)
    kv, kv_scale = engine_requantized_kv(cache, context)
    assert kv.dtype == torch.float8_e4m3fn and kv.shape == (num_tokens, 1, 576) and float(kv_scale) == 1.0
    keys = dequantize_paged_cache(cache)[context.long()].unsqueeze(1)
    assert float(keys.abs().max()) <= FP8_E4M3_MAX  # nothing saturates at scale 1.0 here
    half_steps = torch.maximum(2.0**-4 * keys.abs(), torch.full_like(keys, 2.0**-10))
    unit = torch.ones(1)
    return dict(
        ref=ref,
        engine=reference_prefill(q, kv, indices, sm_scale, q_scale, kv_scale),
        engine_kernel=fp8_model_prefill(q, kv, indices, sm_scale, q_scale, kv_scale, logits="fp8"),
        direct_kernel=fp8_model_prefill(q, keys, indices, sm_scale, q_scale, unit, logits="fp8"),
        inputs=dict(q=q, kv=keys, indices=indices, sm_scale=sm_scale, q_scale=q_scale, kv_scale=unit),
        element_moves=float(((kv.double() - keys).abs() / half_steps).max()),
    )


@pytest.mark.parametrize("spread_log2", [0, 10])
def test_engine_path_error(spread_log2, capsys):
    """The engines' path (gather, dequantize, requantize to e4m3 at scale 1.0, rope too) against the
    float64 reference over the cache, on latents of one magnitude and with tiles spread over 2^10.

    Every value moves by at most half an e4m3 step (the float32 rounding before the cast may add
    2^-20 of it), and since amax / 448 scales are not powers of two, by a fresh rounding: at one
    magnitude out is off by one to two e4m3 root-mean-square roundings (values, and the logits through
    them). That breaks the contract's per-(row, head) logit bound (2^-9 of sum |Q K|) against the
    dequantized reference, which the model FP8 kernel given the dequantized keys keeps. Spread tiles
    make the engines' path worse (small tiles go subnormal at scale 1.0, large ones sharpen the
    attention). The errors are printed."""
    results = engine_path_results(spread_log2, run_seed())
    ref = results["ref"]
    errors = {name: relative_error(results[name][0], ref[0]) for name in ("engine", "engine_kernel", "direct_kernel")}
    lse_moves = {name: float((results[name][2] - ref[2]).abs().max()) for name in errors}
    with capsys.disabled():
        print(f"\ntiles spread 2^{spread_log2}: out relative error / largest lse difference against the "
              f"float64 reference: engines' requantized kv {errors['engine']:.3e} / {lse_moves['engine']:.2e} "
              f"(exact attention), {errors['engine_kernel']:.3e} / {lse_moves['engine_kernel']:.2e} (model "
              f"FP8 kernel); dequantized keys {errors['direct_kernel']:.3e} / {lse_moves['direct_kernel']:.2e} "
              f"(model FP8 kernel)")

    assert 0.5 < results["element_moves"] <= 1.0 + 2.0**-20
    # lse and max_logits norm-wise tolerances hold on the benchmark distribution only: the spread
    # tiles' large logits are checked against the per-(row, head) logit bound alone.
    checks = dict(inputs=results["inputs"], lse_tol=None, max_logits_tol=None)
    assert_close_to_reference(*results["direct_kernel"], ref, **checks)
    for name in ("engine", "engine_kernel"):
        with pytest.raises(AssertionError, match="outside the logit bound"):
            assert_close_to_reference(*results[name], ref, **checks)
    assert errors["engine_kernel"] > errors["direct_kernel"]
    if spread_log2 == 0:
        assert E4M3_RMS_ROUNDING <= errors["engine"] <= 2 * E4M3_RMS_ROUNDING


# The rounding the paged kernel adds (requantized_rows, a model of gather.cuh's requantize_row): each
# value once more to e4m3 at its row's scale sigma, within half an e4m3 step of it: 2^-4 of the value
# in the normal range (plus 2^-11 for the fp16 product and the fp16 factor), 2^-10 sigma below it.
REQUANT_RELATIVE, REQUANT_ABSOLUTE = 2.0**-4 + 2.0**-10, 2.0**-10


@pytest.mark.parametrize("spread", [10, 8, 4, 0])
@pytest.mark.parametrize("d_qk", [576, 512])
def test_the_kernels_requantization_stays_within_half_an_e4m3_step(spread, d_qk):
    cache = quantize_paged_cache(random_latent(512, d_qk, tile_spread_log2=spread, seed=spread))
    exact = dequantize_paged_cache(cache, d_qk)
    values, sigma = requantized_rows(cache, d_qk)
    assert (sigma >= exact[:, :512].abs().amax(dim=1) / FP8_E4M3_MAX * (1 - 2.0**-20)).all()
    error = (values * sigma[:, None] - exact).abs()
    assert (error <= REQUANT_RELATIVE * exact.abs() + REQUANT_ABSOLUTE * sigma[:, None]).all()
    # The row's largest tile keeps its bytes: exact there.
    nope_scales = cache.view(-1, PAGED_ROW_BYTES)[:, 512:528].contiguous().view(torch.float32).double()
    kept = (nope_scales == sigma[:, None]).repeat_interleave(128, dim=1)
    assert torch.equal(error[:, :512][kept], torch.zeros_like(error[:, :512][kept]))
    # The keys the GPU tests hold the kernel to are these values at their scales.
    assert torch.equal(requantized_keys(cache, d_qk), (values * sigma[:, None]).float().unsqueeze(1))


@pytest.mark.parametrize("spread", [10, 8, 4, 0])
def test_the_kernels_requantization_costs_less_than_the_engines_path(spread):
    """Exact attention over each path's keys against the dequantized cache's: the paged kernel's
    rounding (one, of the non-largest tiles and the rope) against the engines' (every value again at
    scale 1.0, the rope too)."""
    tokens, s_q, h_q, topk = 2048, 8, 16, 512
    cache = quantize_paged_cache(random_latent(tokens, 576, tile_spread_log2=spread, seed=spread))
    q, q_scale = quantize_fp8(0.2 * torch.randn(s_q, h_q, 576, generator=torch.Generator().manual_seed(spread)))
    indices = random_indices(s_q, tokens, topk, seed=spread, device="cpu")
    sm_scale = 576**-0.5
    unit = torch.ones(1)
    ref = reference_prefill(q, dequantize_paged_cache(cache).unsqueeze(1), indices, sm_scale, q_scale, unit)
    values, sigma = requantized_rows(cache)
    paged = reference_prefill(q, (values * sigma[:, None]).unsqueeze(1), indices, sm_scale, q_scale, unit)
    engine_kv, engine_scale = engine_requantized_kv(cache, torch.arange(tokens, dtype=torch.int32))
    engine = reference_prefill(q, engine_kv, indices, sm_scale, q_scale, engine_scale)
    paged_err, engine_err = relative_error(paged[0], ref[0]), relative_error(engine[0], ref[0])
    print(f"\nspread 2^{spread}: out error of exact attention over the paged kernel's keys {paged_err:.2e}, "
          f"over the engines' {engine_err:.2e}")
    assert paged_err < engine_err


def test_the_rule_over_the_keys_the_kernel_reads_sees_the_requantization():
    """The GPU tests hold a paged call to the acceptance rule over as_read_inputs: the reference over
    those keys passes it (hostile indices, NaN rows, sinks, topk_length); attention over the cache's
    exact values, which the requantization moves, does not (tiles of one scale: spread 2^0)."""
    a = make_inputs(16, 256, 20, 576, 64, seed=1, device="cpu", invalid="hostile", all_invalid_rows=3,
                    nan_kv_rows=True, topk_length="random", attn_sink="special")
    args = as_paged_call(a, 64, seed=1)
    inputs = as_read_inputs(**args)
    ref, model = reference_prefill(**inputs), error_model(**inputs)
    assert_close_to_reference(ref[0].to(torch.bfloat16), ref[1], ref[2], ref, model=model, lse_tol=None,
                              max_logits_tol=None)
    exact = reference_prefill_paged(**args)
    with pytest.raises(AssertionError):
        assert_close_to_reference(exact[0].to(torch.bfloat16), exact[1], exact[2], ref, model=model, lse_tol=None,
                                  max_logits_tol=None)


def test_a_contiguous_call_as_a_paged_one_reads_the_same_rows():
    """as_paged_call: every valid slot names, through the block table, a paged row holding its kv row's
    values (up to the cache's own rounding); every invalid slot stays invalid; the blocks lie
    block_stride_pad rows apart."""
    a = make_inputs(8, 1000, 16, 576, 256, seed=2, device="cpu", invalid="hostile", kv_strided=True,
                    attn_sink="special", topk_length="random")
    paged = as_paged_call(a, 64, block_stride_pad=1, seed=3)
    cache = paged["kv_cache"]
    assert cache.stride(0) == 65 * PAGED_ROW_BYTES and cache.shape[1] == 64
    assert {k: v for k, v in paged.items() if k not in ("kv_cache", "indices")}.keys() == a.keys() - {"kv", "kv_scale", "indices"}
    valid = (a["indices"] >= 0) & (a["indices"] < 1000)
    rows = cache.shape[0] * cache.shape[1]
    assert ((paged["indices"] >= 0) & (paged["indices"] < rows)).eq(valid).all()
    keys = dequantize_paged_cache(cache)
    expected = a["kv"][:, 0].double() * a["kv_scale"].double()
    got = keys[paged["indices"][valid].long()]
    want = expected[a["indices"][valid].long()]
    scale = want.abs().amax(dim=1, keepdim=True)
    assert ((got - want).abs() <= 2.0**-4 * want.abs() + 2.0**-9 * scale).all()
