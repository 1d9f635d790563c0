"""sparse_mla.testing on the CPU: the reference against a naive per-(i, h) loop, the input generators,
the realistic index patterns and the acceptance check. No GPU, no compiler."""

from __future__ import annotations

import math

import pytest
import torch

from sparse_mla.testing import (
    FP8_E4M3_MAX,
    INT32_MAX,
    INT32_MIN,
    assert_close_to_reference,
    index_overlap_stats,
    make_inputs,
    quantize_fp8,
    random_indices,
    realistic_indices,
    reference_prefill,
    relative_error,
)

pytestmark = pytest.mark.cpu


def cpu_inputs(**options) -> dict:
    return make_inputs(device="cpu", **options)


def naive_prefill(q, kv, indices, sm_scale, q_scale, kv_scale, d_v=512, attn_sink=None, topk_length=None):
    """The semantics read literally: one (i, h) at a time, float64, Python control flow for validity."""
    s_q, h_q, _ = q.shape
    s_kv, topk = kv.shape[0], indices.shape[-1]
    queries = (q.float() * q_scale).double()
    keys = (kv[:, 0].float() * kv_scale).double()
    out = torch.zeros(s_q, h_q, d_v, dtype=torch.float64)
    max_logits = torch.full((s_q, h_q), -math.inf, dtype=torch.float64)
    lse = torch.full((s_q, h_q), math.inf, dtype=torch.float64)
    for i in range(s_q):
        length = topk if topk_length is None else int(topk_length[i])
        rows = [int(r) for j, r in enumerate(indices[i, 0].tolist()) if 0 <= r < s_kv and j < length]
        if not rows:
            continue
        for h in range(h_q):
            logits = [sm_scale * float(queries[i, h] @ keys[r]) for r in rows]
            top = max(logits)
            row_lse = top + math.log(sum(math.exp(s - top) for s in logits))
            value = sum(math.exp(s - row_lse) * keys[r, :d_v] for s, r in zip(logits, rows))
            if attn_sink is not None:
                value = value * _sink_factor(float(attn_sink[h]), row_lse)
            out[i, h], max_logits[i, h], lse[i, h] = value, top, row_lse
    return out, max_logits, lse


def _sink_factor(sink: float, row_lse: float) -> float:
    """exp(lse) / (exp(lse) + exp(sink)), written out case by case."""
    if sink == -math.inf:
        return 1.0
    if sink == math.inf or sink - row_lse > 700.0:
        return 0.0
    return 1.0 / (1.0 + math.exp(sink - row_lse))


def assert_matches_naive(inputs: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    ref = reference_prefill(**inputs)
    naive = naive_prefill(**inputs)
    for name, got, want in zip(("out", "max_logits", "lse"), ref, naive):
        assert got.dtype == torch.float32, name
        torch.testing.assert_close(got, want.float(), rtol=1e-5, atol=1e-6, msg=lambda m: f"{name}: {m}")
    return ref


@pytest.mark.parametrize(
    "options",
    [
        dict(s_q=6, s_kv=40, h_q=3, d_qk=576, topk=8),
        dict(s_q=5, s_kv=33, h_q=2, d_qk=512, topk=7),
        dict(s_q=4, s_kv=5, h_q=2, topk=8),  # topk > s_kv: -1 padding
        dict(s_q=8, s_kv=30, h_q=3, topk=6, invalid="mixed", attn_sink="random"),
        dict(s_q=8, s_kv=30, h_q=8, topk=6, invalid="hostile", attn_sink="special", topk_length="random"),
        dict(s_q=9, s_kv=50, h_q=2, topk=9, duplicates=True, all_invalid_rows=2, nan_kv_rows=True),
        dict(
            s_q=16, s_kv=64, h_q=3, topk=10, invalid="hostile", duplicates=True, all_invalid_rows=3,
            nan_kv_rows=True, topk_length="random", attn_sink="random", q_strided=True, kv_strided=True,
        ),
    ],
    ids=["plain576", "plain512", "topk_over_s_kv", "mixed_sink", "hostile_special_sink_length", "dup_nan",
         "everything_strided"],
)
def test_reference_matches_naive_loop(options):
    ref = assert_matches_naive(cpu_inputs(seed=7, **options))
    assert not any(bool(t.isnan().any()) for t in ref)


def test_sink_special_values():
    inputs = cpu_inputs(s_q=5, s_kv=40, h_q=4, topk=8, seed=3)
    plain = reference_prefill(**inputs)
    inputs["attn_sink"] = torch.tensor([-math.inf, math.inf, -1e30, 1e30])
    out, max_logits, lse = assert_matches_naive(inputs)
    assert torch.equal(out[:, [0, 2]], plain[0][:, [0, 2]])  # -inf and -1e30: no effect
    assert torch.equal(out[:, [1, 3]], torch.zeros_like(out[:, [1, 3]]))  # +inf and 1e30: out = 0
    assert torch.equal(max_logits, plain[1]) and torch.equal(lse, plain[2])  # the sink enters neither


def test_sink_scales_out_by_its_share():
    inputs = cpu_inputs(s_q=3, s_kv=20, h_q=2, topk=4, seed=4)
    out, _, lse = reference_prefill(**inputs)
    inputs["attn_sink"] = lse[0].clone()  # sink logit = lse of row 0: row 0 keeps half its mass
    sunk, _, _ = assert_matches_naive(inputs)
    torch.testing.assert_close(sunk[0], out[0] / 2)


def test_topk_length_extremes():
    topk = 6
    lengths = [INT32_MIN, -3, 0, 1, topk, topk + 1, INT32_MAX]
    inputs = cpu_inputs(s_q=len(lengths), s_kv=30, h_q=3, topk=topk, seed=5)
    full = reference_prefill(**inputs)
    inputs["topk_length"] = torch.tensor(lengths, dtype=torch.int32)
    out, max_logits, lse = assert_matches_naive(inputs)

    assert torch.equal(out[:3], torch.zeros_like(out[:3]))  # no valid slot
    assert bool(torch.isneginf(max_logits[:3]).all()) and bool(torch.isposinf(lse[:3]).all())
    first_row = inputs["indices"][3, 0, 0]
    value = (inputs["kv"][first_row, 0, :512].float() * inputs["kv_scale"]).expand(3, 512)
    torch.testing.assert_close(out[3], value)  # one slot: weight 1
    torch.testing.assert_close(lse[3], max_logits[3])
    for got, want in zip((out, max_logits, lse), full):
        assert torch.equal(got[4:], want[4:])  # topk_length >= topk: every slot


def test_all_invalid_rows():
    inputs = cpu_inputs(s_q=12, s_kv=40, h_q=2, topk=8, seed=6, invalid="hostile", all_invalid_rows=4)
    out, max_logits, lse = assert_matches_naive(inputs)
    empty = torch.isneginf(max_logits[:, 0])
    assert int(empty.sum()) == 4
    assert torch.equal(out[empty], torch.zeros_like(out[empty]))
    assert bool(torch.isposinf(lse[empty]).all()) and bool(torch.isneginf(max_logits[empty]).all())
    assert bool(torch.isfinite(lse[~empty]).all())


def test_nan_rows_behind_invalid_slots_never_leak():
    inputs = cpu_inputs(
        s_q=16, s_kv=64, h_q=4, topk=8, seed=8, invalid="hostile", nan_kv_rows=True, topk_length="random",
        attn_sink="special",
    )
    assert bool(inputs["kv"].float().isnan().any())
    ref = assert_matches_naive(inputs)
    assert not any(bool(t.isnan().any()) for t in ref)


def test_nan_row_behind_a_valid_slot_does_reach_the_output():
    """The control for the test above: the NaN rows would show up if a valid slot read them."""
    inputs = cpu_inputs(s_q=4, s_kv=64, h_q=2, topk=8, seed=9, nan_kv_rows=True)
    inputs["indices"][1, 0, 3] = 0  # row 0 is always one of the NaN rows
    out, _, _ = reference_prefill(**inputs)
    assert bool(out[1].isnan().all()) and not bool(out[[0, 2, 3]].isnan().any())


def test_duplicates_count_once_each():
    inputs = cpu_inputs(s_q=1, s_kv=10, h_q=1, topk=3, seed=10)
    inputs["indices"] = torch.tensor([[[4, 4, 7]]], dtype=torch.int32)
    out, max_logits, lse = assert_matches_naive(inputs)
    queries = inputs["q"][0, 0].float() * inputs["q_scale"]
    keys = inputs["kv"][[4, 7], 0].float() * inputs["kv_scale"]
    s_4, s_7 = (inputs["sm_scale"] * keys.double() @ queries.double()).tolist()
    assert lse.item() == pytest.approx(math.log(2 * math.exp(s_4) + math.exp(s_7)), rel=1e-6)
    assert max_logits.item() == pytest.approx(max(s_4, s_7), rel=1e-6)
    weights = torch.tensor([2 * math.exp(s_4), math.exp(s_7)], dtype=torch.float64) / math.exp(lse.item())
    torch.testing.assert_close(out[0, 0], (weights @ keys[:, :512].double()).float())


def test_chunking_does_not_change_the_result():
    inputs = cpu_inputs(s_q=9, s_kv=50, h_q=4, topk=12, seed=11, invalid="mixed", topk_length="random")
    for whole, chunked in zip(reference_prefill(**inputs), reference_prefill(**inputs, chunk=2)):
        torch.testing.assert_close(chunked, whole, rtol=1e-6, atol=1e-7)


def test_empty_s_q():
    out, max_logits, lse = reference_prefill(**cpu_inputs(s_q=0, s_kv=10, h_q=3, topk=4, seed=12))
    assert out.shape == (0, 3, 512) and max_logits.shape == (0, 3) and lse.shape == (0, 3)


def test_reference_of_bf16_inputs_with_unit_scales():
    """The exact-bf16 reference of the examples: FP8 quantization error is a few percent, no more."""
    generator = torch.Generator().manual_seed(13)
    q_bf16 = torch.randn(4, 2, 576, dtype=torch.bfloat16, generator=generator)
    kv_bf16 = torch.randn(40, 1, 576, dtype=torch.bfloat16, generator=generator)
    (q, q_scale), (kv, kv_scale) = quantize_fp8(q_bf16), quantize_fp8(kv_bf16)
    indices = random_indices(4, 40, 16, device="cpu", seed=13)
    one = torch.ones(1)
    exact = reference_prefill(q_bf16, kv_bf16, indices, 1 / 24, one, one)
    quantized = reference_prefill(q, kv, indices, 1 / 24, q_scale, kv_scale)
    assert 1e-3 < relative_error(quantized[0], exact[0]) < 0.1


# ---- quantize_fp8 and make_inputs ----


def test_random_indices_layout_is_what_the_api_takes():
    indices = random_indices(8, 100, 64, device="cpu", seed=3)
    assert indices.shape == (8, 1, 64) and indices.dtype == torch.int32 and indices.is_contiguous()
    for row in indices[:, 0]:
        assert row.unique().numel() == 64 and 0 <= row.min() and row.max() < 100


def test_quantize_fp8():
    x = torch.randn(64, 576, dtype=torch.bfloat16, generator=torch.Generator().manual_seed(35)) * 3
    x_fp8, scale = quantize_fp8(x)
    assert x_fp8.dtype == torch.float8_e4m3fn and x_fp8.shape == x.shape and x_fp8.is_contiguous()
    assert scale.dtype == torch.float32 and scale.shape == (1,)
    assert scale.item() == pytest.approx(x.float().abs().max().item() / FP8_E4M3_MAX, rel=1e-6)
    dequantized = x_fp8.float() * scale
    assert dequantized.abs().max().item() == pytest.approx(x.float().abs().max().item(), rel=1e-6)
    assert relative_error(dequantized, x.float()) < 0.05  # 3 mantissa bits


def test_quantize_fp8_of_zeros_is_finite():
    x_fp8, scale = quantize_fp8(torch.zeros(8))
    assert scale.item() > 0 and torch.equal(x_fp8.float(), torch.zeros(8))


def test_make_inputs_default_layout():
    s_q, s_kv, h_q, d_qk, topk = 7, 300, 5, 512, 64
    inputs = cpu_inputs(s_q=s_q, s_kv=s_kv, h_q=h_q, d_qk=d_qk, topk=topk, seed=14)
    assert set(inputs) == {"q", "kv", "indices", "sm_scale", "q_scale", "kv_scale", "d_v", "attn_sink", "topk_length"}
    q, kv, indices = inputs["q"], inputs["kv"], inputs["indices"]
    assert q.shape == (s_q, h_q, d_qk) and q.dtype == torch.float8_e4m3fn and q.is_contiguous()
    assert kv.shape == (s_kv, 1, d_qk) and kv.dtype == torch.float8_e4m3fn and kv.is_contiguous()
    assert indices.shape == (s_q, 1, topk) and indices.dtype == torch.int32 and indices.is_contiguous()
    for scale in (inputs["q_scale"], inputs["kv_scale"]):
        assert scale.shape == (1,) and scale.dtype == torch.float32 and scale.item() > 0
    assert inputs["sm_scale"] == 1 / math.sqrt(d_qk) and inputs["d_v"] == 512
    assert inputs["attn_sink"] is None and inputs["topk_length"] is None
    assert all(t.device.type == "cpu" for t in (q, kv, indices, inputs["q_scale"], inputs["kv_scale"]))
    assert bool(((indices >= 0) & (indices < s_kv)).all())
    assert all(row.unique().numel() == topk for row in indices[:, 0])  # distinct per row


def test_make_inputs_strided_views_hold_the_same_values():
    options = dict(s_q=6, s_kv=50, h_q=3, d_qk=576, topk=8, seed=15)
    plain = cpu_inputs(**options)
    strided = cpu_inputs(q_strided=True, kv_strided=True, **options)
    q, kv = strided["q"], strided["kv"]
    assert q.stride() == (2 * 3 * 640, 2 * 640, 1) and not q.is_contiguous()
    assert kv.stride(0) == 1152 and kv.stride(-1) == 1 and not kv.is_contiguous()
    assert torch.equal(q.float(), plain["q"].float()) and torch.equal(kv.float(), plain["kv"].float())
    for got, want in zip(reference_prefill(**strided), reference_prefill(**plain)):
        assert torch.equal(got, want)


def test_make_inputs_topk_over_s_kv_holds_every_row_once():
    indices = cpu_inputs(s_q=5, s_kv=6, h_q=1, topk=10, seed=16)["indices"][:, 0]
    for row in indices:
        assert sorted(row[row >= 0].tolist()) == list(range(6)) and int((row == -1).sum()) == 4


@pytest.mark.parametrize("invalid, values", [("mixed", {-1}), ("hostile", {INT32_MIN, -1, INT32_MAX, 200})])
def test_make_inputs_invalid_slots(invalid, values):
    indices = cpu_inputs(s_q=32, s_kv=200, h_q=1, topk=64, seed=17, invalid=invalid)["indices"]
    bad = indices[(indices < 0) | (indices >= 200)]
    assert set(bad.tolist()) == values
    assert 0.15 < bad.numel() / indices.numel() < 0.35


def test_make_inputs_all_invalid_rows_and_duplicates():
    inputs = cpu_inputs(s_q=20, s_kv=100, h_q=1, topk=16, seed=18, duplicates=True, all_invalid_rows=5)
    indices = inputs["indices"][:, 0]
    valid = (indices >= 0) & (indices < 100)
    assert int((~valid.any(dim=1)).sum()) == 5
    assert any(row[row >= 0].unique().numel() < int((row >= 0).sum()) for row in indices)


def test_make_inputs_nan_rows_only_behind_invalid_slots():
    inputs = cpu_inputs(s_q=40, s_kv=64, h_q=1, topk=8, seed=19, nan_kv_rows=True, topk_length="random")
    nan_rows = inputs["kv"][:, 0].float().isnan().any(dim=1)
    assert bool(nan_rows[0]) and bool(nan_rows[-1])
    indices, lengths = inputs["indices"][:, 0].long(), inputs["topk_length"].long()
    in_range = (indices >= 0) & (indices < 64)
    valid = in_range & (torch.arange(8) < lengths.unsqueeze(1))
    assert not bool(nan_rows[indices[valid]].any())
    assert bool(nan_rows[indices[in_range & ~valid]].all())  # every slot past its length points to NaN
    assert bool((in_range & ~valid).any())


def test_make_inputs_topk_length_random():
    topk = 32
    lengths = cpu_inputs(s_q=400, s_kv=64, h_q=1, topk=topk, seed=20, topk_length="random")["topk_length"]
    assert lengths.shape == (400,) and lengths.dtype == torch.int32 and lengths.is_contiguous()
    special = {INT32_MIN, -1, 0, topk, topk + 1, INT32_MAX}
    assert special <= set(lengths.tolist()) <= special | set(range(1, topk + 1))


def test_make_inputs_attn_sink():
    random_sink = cpu_inputs(s_q=1, s_kv=8, h_q=16, topk=4, seed=21, attn_sink="random")["attn_sink"]
    assert random_sink.shape == (16,) and random_sink.dtype == torch.float32 and bool(random_sink.isfinite().all())
    special = cpu_inputs(s_q=1, s_kv=8, h_q=16, topk=4, seed=21, attn_sink="special")["attn_sink"]
    expected = torch.tensor([-math.inf, math.inf, -1e30, 1e30])
    assert torch.equal(special[0:4], expected) and torch.equal(special[8:12], expected)
    assert bool(special[4:8].isfinite().all()) and bool(special[12:].isfinite().all())


def test_make_inputs_seed():
    options = dict(s_q=4, s_kv=30, h_q=2, topk=8, invalid="hostile", topk_length="random", attn_sink="random")
    first, again, other = (cpu_inputs(seed=seed, **options) for seed in (22, 22, 23))
    assert torch.equal(first["q"].view(torch.uint8), again["q"].view(torch.uint8))
    assert torch.equal(first["kv"].view(torch.uint8), again["kv"].view(torch.uint8))
    for name in ("indices", "topk_length", "attn_sink"):
        assert torch.equal(first[name], again[name]), name
    assert not torch.equal(first["indices"], other["indices"])


@pytest.mark.parametrize("option", [dict(invalid="all"), dict(topk_length="full"), dict(attn_sink="zero"),
                                    dict(all_invalid_rows=5)])
def test_make_inputs_rejects_unknown_options(option):
    with pytest.raises(ValueError):
        cpu_inputs(s_q=4, s_kv=30, h_q=2, topk=8, seed=36, **option)


# ---- realistic index patterns ----


def test_realistic_indices_slow_drift_gives_high_retention():
    indices = realistic_indices(256, 8192, 512, rho=0.999, noise=0.0, hubs=16, seed=24, device="cpu")
    stats = index_overlap_stats(indices)
    assert stats.retention > 0.9 and stats.union4 < 1.3


def test_realistic_indices_noise_lowers_retention_and_uniform_is_lowest():
    options = dict(rho=0.99, hubs=16, seed=25, device="cpu")
    quiet = index_overlap_stats(realistic_indices(128, 4096, 512, noise=0.0, **options))
    noisy = index_overlap_stats(realistic_indices(128, 4096, 512, noise=0.4, **options))
    uniform = index_overlap_stats(random_indices(128, 4096, 512, device="cpu", seed=25))
    assert quiet.retention > noisy.retention > uniform.retention
    assert quiet.union4 < noisy.union4 < uniform.union4
    assert uniform.retention == pytest.approx(512 / 4096, abs=0.02)


def test_realistic_indices_are_causal_distinct_and_padded():
    s_q, s_kv, topk = 64, 80, 32
    indices = realistic_indices(s_q, s_kv, topk, rho=0.99, noise=0.4, hubs=4, seed=26, device="cpu")
    assert indices.shape == (s_q, 1, topk) and indices.dtype == torch.int32 and indices.is_contiguous()
    for i, row in enumerate(indices[:, 0]):
        visible = s_kv - s_q + i + 1
        selected = row[row >= 0]
        assert selected.numel() == min(topk, visible) and selected.unique().numel() == selected.numel()
        assert int(selected.max()) < visible
        assert bool((row[selected.numel():] == -1).all())


def test_index_overlap_stats_by_hand():
    rows = [[0, 1, 2, 3], [1, 2, 3, 4], [4, 3, 2, 1], [5, 6, -1, -1], [7, 7, 8, 9]]
    stats = index_overlap_stats(torch.tensor(rows, dtype=torch.int32).unsqueeze(1))
    assert stats.retention == pytest.approx((3 / 4 + 4 / 4 + 0 / 2 + 0 / 3) / 4)
    assert stats.union4 == pytest.approx(7 / ((4 + 4 + 4 + 2) / 4))  # the 5th row is not in a full group


def test_index_overlap_stats_of_one_row_is_nan():
    stats = index_overlap_stats(torch.tensor([[[0, 1]]], dtype=torch.int32))
    assert math.isnan(stats.retention) and math.isnan(stats.union4)


# ---- relative_error and assert_close_to_reference ----


def test_relative_error():
    b = torch.tensor([3.0, -4.0, math.inf, -math.inf])
    assert relative_error(b, b) == 0.0
    assert relative_error(b * 1.001, b) == pytest.approx(1e-3, rel=1e-3)  # the infinities are skipped
    assert relative_error(torch.tensor([0.0, 1.0]), torch.zeros(2)) == math.inf
    assert relative_error(torch.zeros(2), torch.zeros(2)) == 0.0
    assert math.isinf(relative_error(torch.tensor([math.inf, 0.0]), torch.tensor([1.0, 0.0])))


def _reference_and_result():
    inputs = cpu_inputs(s_q=8, s_kv=40, h_q=4, topk=8, seed=27, all_invalid_rows=2, attn_sink="special")
    ref = reference_prefill(**inputs)
    return ref, (ref[0].bfloat16(), ref[1].clone(), ref[2].clone())


def test_assert_close_to_reference_accepts_a_close_result():
    ref, result = _reference_and_result()
    assert_close_to_reference(*result, ref)


def _empty_row(result):
    return int(torch.isneginf(result[1][:, 0]).nonzero()[0])


def _full_row(result):
    return int(torch.isfinite(result[1][:, 0]).nonzero()[0])


@pytest.mark.parametrize(
    "corrupt, message",
    [
        (lambda r: r[0][_full_row(r), 0, 5].fill_(math.nan), "out has 1 NaN"),
        (lambda r: r[2][_full_row(r), 0].fill_(math.nan), "lse has 1 NaN"),
        (lambda r: r[0][_full_row(r), 0, 5].fill_(math.inf), "out has infinite"),
        (lambda r: r[1][_empty_row(r), 0].fill_(0.0), "max_logits == -inf differs"),
        (lambda r: r[2][_full_row(r), 0].fill_(math.inf), "lse == \\+inf differs"),
        (lambda r: r[0][_empty_row(r), 0, 0].fill_(1e-3), "not exactly zero"),
        (lambda r: r[0].mul_(1.05), "out relative error"),
        (lambda r: r[2].mul_(1 + 1e-3), "lse relative error"),
        (lambda r: r[1].mul_(1 + 1e-2), "max_logits relative error"),
    ],
    ids=["nan_out", "nan_lse", "inf_out", "moved_neg_inf", "extra_pos_inf", "nonzero_empty_row", "out_tol",
         "lse_tol", "max_logits_tol"],
)
def test_assert_close_to_reference_rejects(corrupt, message):
    ref, result = _reference_and_result()
    corrupt(result)
    with pytest.raises(AssertionError, match=message):
        assert_close_to_reference(*result, ref, context="seed=27")


@pytest.mark.parametrize(
    "options",
    [
        dict(s_q=0, s_kv=10, h_q=3, topk=4),
        dict(s_q=6, s_kv=5, h_q=2, topk=8),  # topk > s_kv: -1 padding
        dict(s_q=12, s_kv=40, h_q=4, topk=8, invalid="hostile", all_invalid_rows=4, attn_sink="special"),
        dict(s_q=16, s_kv=64, h_q=8, topk=10, invalid="hostile", duplicates=True, all_invalid_rows=3,
             nan_kv_rows=True, topk_length="random", attn_sink="special", q_strided=True, kv_strided=True),
        dict(s_q=1, s_kv=3, h_q=1, topk=1),
    ],
    ids=["empty", "topk_over_s_kv", "hostile_special_sinks", "everything", "one_slot"],
)
def test_assert_close_to_reference_with_inputs_accepts_the_reference_in_bf16(options):
    """The per-(row, head) rule on every corner of the domain: the reference itself, rounded to bf16,
    passes (empty rows, infinite sinks, NaN rows behind invalid slots, no query rows at all)."""
    inputs = cpu_inputs(seed=34, **options)
    ref = reference_prefill(**inputs)
    assert_close_to_reference(ref[0].bfloat16(), ref[1].clone(), ref[2].clone(), ref, inputs=inputs)
