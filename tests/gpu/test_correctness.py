"""GPU tier: sparse_mla_q8kv8_prefill_fwd against reference_prefill on every corner of the semantics
and the domain (head counts, topk, invalid and hostile indices, topk_length, sinks, strides).

Each test draws fresh inputs (the seed is in every failure message), runs the kernel into NaN-poisoned
preallocated outputs and into library-allocated ones, and applies the acceptance rule: every
(row, head) of out within its own limit, lse and max_logits within their row's logit bound, out
norm-wise within the contract's tolerance on the benchmark distribution (1.85e-2 at d_qk 576 /
topk 2048, 2.3e-2 at 512 / 512, with lse 1e-4 and max_logits 1e-3 relative) and within 10% of the
e4m3-P floor elsewhere; special values exact, no NaN.
"""

from __future__ import annotations

import pytest
import torch

from sparse_mla.testing import INT32_MAX, INT32_MIN, OUT_TOL, make_inputs, poisoned_outputs

pytestmark = pytest.mark.gpu


def describe(seed: int, **shape) -> str:
    fields = " ".join(f"{name}={value}" for name, value in shape.items())
    return f"seed={seed} (SPARSE_MLA_TEST_SEED={seed} replays) {fields}"


@pytest.mark.parametrize("d_qk", [512, 576])
@pytest.mark.parametrize("h_q", [1, 8, 16, 32, 64, 100, 128])
def test_head_counts(check_prefill, seed, h_q, d_qk):
    shape = dict(s_q=19, s_kv=1000, h_q=h_q, d_qk=d_qk, topk=64)
    check_prefill(make_inputs(**shape, seed=seed), describe(seed, **shape))


@pytest.mark.parametrize(
    "s_q, s_kv, h_q, d_qk, topk",
    [
        (1, 1, 1, 576, 1),  # the smallest call: one row, one slot, one KV row
        (300, 50, 16, 576, 1),
        (37, 100, 8, 576, 7),
        (437, 4096, 16, 576, 64),
        (64, 1000, 32, 576, 100),  # ragged topk tail
        (128, 8192, 64, 576, 512),
        (64, 1000, 64, 576, 2048),  # topk > s_kv: -1 padding
        (64, 8192, 100, 576, 2048),
        (32, 8192, 128, 576, 2048),
        (96, 4096, 64, 512, 512),
        (437, 8192, 128, 512, 512),
    ],
)
def test_shapes(check_prefill, seed, s_q, s_kv, h_q, d_qk, topk):
    shape = dict(s_q=s_q, s_kv=s_kv, h_q=h_q, d_qk=d_qk, topk=topk)
    benchmark = (d_qk, topk) in OUT_TOL and topk <= s_kv  # the contract's distribution and shapes
    check_prefill(make_inputs(**shape, seed=seed), describe(seed, **shape), benchmark=benchmark)


@pytest.mark.parametrize("h_q", [1, 8])
def test_more_than_65535_ctas(check_prefill, seed, h_q):
    shape = dict(s_q=70000, s_kv=4096, h_q=h_q, d_qk=576, topk=7)
    check_prefill(make_inputs(**shape, seed=seed, invalid="mixed"), describe(seed, **shape))


@pytest.mark.parametrize("h_q", [1, 100])
def test_empty_s_q(prefill_fwd, seed, h_q):
    inputs = make_inputs(s_q=0, s_kv=64, h_q=h_q, d_qk=576, topk=64, seed=seed)
    out, max_logits, lse = prefill_fwd(**inputs)
    assert out.shape == (0, h_q, 512) and out.dtype == torch.bfloat16 and out.is_cuda
    assert max_logits.shape == (0, h_q) and max_logits.dtype == torch.float32
    assert lse.shape == (0, h_q) and lse.dtype == torch.float32
    buffers = poisoned_outputs(0, h_q, 512)
    result = prefill_fwd(**inputs, **buffers)
    assert all(got is want for got, want in zip(result, buffers.values()))


@pytest.mark.parametrize("q_strided, kv_strided", [(True, False), (False, True), (True, True)])
@pytest.mark.parametrize("d_qk, topk", [(576, 2048), (512, 512)])
def test_strided_q_and_kv(check_prefill, seed, q_strided, kv_strided, d_qk, topk):
    shape = dict(s_q=64, s_kv=8192, h_q=100, d_qk=d_qk, topk=topk)
    inputs = make_inputs(**shape, seed=seed, q_strided=q_strided, kv_strided=kv_strided)
    check_prefill(inputs, describe(seed, q_strided=q_strided, kv_strided=kv_strided, **shape), benchmark=True)


@pytest.mark.parametrize("attn_sink", [None, "random"])
@pytest.mark.parametrize("topk_length", [None, "random"])
@pytest.mark.parametrize("d_qk, topk", [(576, 2048), (576, 100), (512, 512)])
def test_attn_sink_and_topk_length(check_prefill, seed, attn_sink, topk_length, d_qk, topk):
    shape = dict(s_q=128, s_kv=8192, h_q=64, d_qk=d_qk, topk=topk)
    inputs = make_inputs(**shape, seed=seed, invalid="mixed", attn_sink=attn_sink, topk_length=topk_length)
    check_prefill(inputs, describe(seed, attn_sink=attn_sink, topk_length=topk_length, **shape))


@pytest.mark.parametrize("topk_length", [None, "random"])
def test_special_sinks(check_prefill, seed, topk_length):
    """Heads with sinks -inf, +inf, -1e30, +1e30 (h % 8 in 0..3) in both head blocks."""
    shape = dict(s_q=64, s_kv=4096, h_q=128, d_qk=576, topk=512)
    inputs = make_inputs(**shape, seed=seed, attn_sink="special", topk_length=topk_length)
    check_prefill(inputs, describe(seed, attn_sink="special", topk_length=topk_length, **shape))


@pytest.mark.parametrize("topk", [64, 100, 2048])
def test_topk_length_extremes(check_prefill, seed, topk):
    lengths = [INT32_MIN, -5, -1, 0, 1, topk - 1, topk, topk + 1, INT32_MAX]
    shape = dict(s_q=4 * len(lengths), s_kv=4096, h_q=64, d_qk=576, topk=topk)
    inputs = make_inputs(**shape, seed=seed)
    inputs["topk_length"] = torch.tensor(lengths * 4, dtype=torch.int32, device="cuda")
    check_prefill(inputs, describe(seed, topk_length=lengths, **shape))


@pytest.mark.parametrize("topk_length", [None, "random"])
@pytest.mark.parametrize("d_qk, topk", [(576, 2048), (576, 7), (512, 512)])
def test_hostile_indices_and_all_invalid_rows(check_prefill, seed, topk_length, d_qk, topk):
    """INT32_MIN, -1, INT32_MAX and s_kv in a quarter of the slots; some rows with no valid slot."""
    shape = dict(s_q=200, s_kv=8192, h_q=64, d_qk=d_qk, topk=topk)
    inputs = make_inputs(**shape, seed=seed, invalid="hostile", all_invalid_rows=9, topk_length=topk_length)
    check_prefill(inputs, describe(seed, invalid="hostile", topk_length=topk_length, **shape))


@pytest.mark.parametrize("invalid", ["mixed", "hostile"])
@pytest.mark.parametrize("d_qk, topk", [(576, 2048), (576, 100), (512, 512)])
def test_nan_rows_behind_invalid_slots(check_prefill, seed, invalid, d_qk, topk):
    """NaN KV rows (including row 0) that only invalid slots point to, by index or by topk_length."""
    shape = dict(s_q=128, s_kv=8192, h_q=64, d_qk=d_qk, topk=topk)
    inputs = make_inputs(
        **shape, seed=seed, invalid=invalid, nan_kv_rows=True, topk_length="random", attn_sink="random"
    )
    check_prefill(inputs, describe(seed, invalid=invalid, nan_kv_rows=True, **shape))


@pytest.mark.parametrize("d_qk, topk", [(576, 2048), (576, 64), (512, 512)])
def test_duplicate_indices(check_prefill, seed, d_qk, topk):
    shape = dict(s_q=128, s_kv=4096, h_q=64, d_qk=d_qk, topk=topk)
    check_prefill(make_inputs(**shape, seed=seed, duplicates=True), describe(seed, duplicates=True, **shape))


def test_every_corner_at_once(check_prefill, seed):
    shape = dict(s_q=437, s_kv=8192, h_q=100, d_qk=576, topk=2048)
    inputs = make_inputs(
        **shape, seed=seed, invalid="hostile", duplicates=True, all_invalid_rows=5, nan_kv_rows=True,
        topk_length="random", attn_sink="special", q_strided=True, kv_strided=True,
    )
    check_prefill(inputs, describe(seed, everything=True, **shape))


# out views: (extra elements per head row, first element of the view, extra heads per token). The
# kernel stores pairs of bf16 with one 4-byte store when the view's base and strides keep every pair
# 4-byte aligned, and with two 2-byte stores otherwise; a token group's tile addresses its rows from
# the group's first token where a token's heads follow each other (no extra heads), and through each
# row's token otherwise.
_OUT_VIEWS = {
    "aligned, padded rows and heads": (64, 0, 3),
    "base offset by one element": (2, 1, 0),
    "odd head stride": (1, 0, 0),
    "odd head stride, padded heads": (1, 0, 3),
}


@pytest.mark.parametrize("view", list(_OUT_VIEWS))
@pytest.mark.parametrize("h_q", [72, 16])
def test_preallocated_out_views(prefill_fwd, accept, seed, monkeypatch, view, h_q):
    """out may be any view with a contiguous last dimension: every element of the view is written,
    in either store path, and nothing around it; 16 heads in token groups of 4 (37 rows: a tail group)."""
    monkeypatch.setenv("SPARSE_MLA_TOKEN_GROUPS", "always")
    shape = dict(s_q=37, s_kv=4096, h_q=h_q, d_qk=576, topk=100)
    inputs = make_inputs(**shape, seed=seed, topk_length="random")
    s_q, h_q, d_v = shape["s_q"], shape["h_q"], inputs["d_v"]
    extra, first, extra_heads = _OUT_VIEWS[view]
    storage = torch.full((s_q, h_q + extra_heads, d_v + extra), float("nan"), dtype=torch.bfloat16, device="cuda")
    out = storage[:, :h_q, first:first + d_v]
    buffers = poisoned_outputs(s_q, h_q, d_v, device="cuda")
    buffers["out"] = out
    result = prefill_fwd(**inputs, **buffers)
    context = describe(seed, view=view, **shape)
    assert result[0] is out, f"{context}: the returned out is not the preallocated view"
    accept(result, inputs, context)
    outside = torch.ones(storage.shape, dtype=torch.bool, device="cuda")
    outside[:, :h_q, first:first + d_v] = False
    assert storage[outside].isnan().all(), f"{context}: the kernel wrote outside the out view"


def _split_shape(parts: int, h_q: int, rounds: int) -> int:
    """s_q whose last round of work items (query token, 64-head block) is cut into `parts` parts on
    this GPU: `rounds` full rounds of items, then a tail of num_sms // parts items."""
    from sparse_mla.launch import num_sms as sm_count

    num_sms = sm_count(torch.cuda.current_device())
    head_blocks = (h_q + 63) // 64
    return (rounds * num_sms + num_sms // parts) // head_blocks


@pytest.mark.parametrize(
    "parts, d_qk, topk, h_q, rounds",
    [(parts, 576, 2048, 64, 1) for parts in (2, 3, 4)]
    + [(parts, 512, 512, 128, 1) for parts in (2, 3, 4)]
    + [(4, 576, 2048, 64, 9)],  # past 8 rounds: parts of at least 512 slots
)
def test_tail_split(check_prefill, prefill_fwd, seed, parts, d_qk, topk, h_q, rounds):
    """The last round's items cut into parts on idle SMs and merged (include/sparse_mla/sm90/prefill/
    split.cuh): every corner that empties a part or a row, and the same bits on every run whichever
    part finishes last."""
    from sparse_mla.launch import num_sms, split_plan

    s_q = _split_shape(parts, h_q, rounds)
    items = s_q * ((h_q + 63) // 64)
    split_begin, split_parts = split_plan(items, num_sms(torch.cuda.current_device()), topk)
    assert split_parts >= 2 and split_begin < items, f"s_q {s_q} does not split on this GPU"
    shape = dict(s_q=s_q, s_kv=8192, h_q=h_q, d_qk=d_qk, topk=topk)
    context = describe(seed, parts=split_parts, **shape)
    check_prefill(make_inputs(**shape, seed=seed), context, benchmark=True)
    inputs = make_inputs(
        **shape, seed=seed, invalid="hostile", all_invalid_rows=5, topk_length="random", attn_sink="random",
    )
    first = check_prefill(inputs, f"{context} hostile, topk_length, attn_sink")
    for run in range(3):
        again = prefill_fwd(**inputs)
        for name, a, b in zip(("out", "max_logits", "lse"), first, again):
            bits = torch.int16 if a.dtype == torch.bfloat16 else torch.int32
            assert torch.equal(a.view(bits), b.view(bits)), f"{context}: {name} of run {run + 2} differs in its bits"


def test_tail_split_zeroes_its_own_counters(prefill_fwd, seed):
    """The launch zeroes the split counters itself (a kernel ahead of the prefill kernel, which waits for
    it only where it counts a part, launch.cuh): counters that would name every item's first part its
    last give the library call's bits, and end at the parts' count."""
    from sparse_mla.jit import KernelKey, get_module
    from sparse_mla.jit.key import SPLIT_CALL_FUNCTION
    from sparse_mla.launch import SPLIT_PART_FLOATS, num_sms, split_plan

    s_q = _split_shape(3, 64, 1)
    shape = dict(s_q=s_q, s_kv=8192, h_q=64, d_qk=576, topk=2048)
    context = describe(seed, **shape)
    inputs = make_inputs(**shape, seed=seed, invalid="hostile", topk_length="random")
    expected = prefill_fwd(**inputs)
    split_begin, parts = split_plan(s_q, num_sms(torch.cuda.current_device()), 2048)
    assert parts >= 2, f"{context}: does not split on this GPU"
    tail = s_q - split_begin
    # The scratch as entry.cuh lays it out: the parts' states (NaN here), then the counters.
    workspace_floats = tail * parts * SPLIT_PART_FLOATS
    scratch = torch.full((workspace_floats + tail,), float("nan"), device="cuda")
    counters = scratch[workspace_floats:].view(torch.int32)
    counters.fill_(parts - 1)
    got = poisoned_outputs(s_q, 64)
    getattr(get_module(KernelKey(576, 2048)), SPLIT_CALL_FUNCTION)(
        inputs["q"], inputs["kv"], inputs["indices"], inputs["q_scale"], inputs["kv_scale"], None,
        inputs["topk_length"], got["out"], got["max_logits"], got["lse"], inputs["sm_scale"], split_begin, parts,
        scratch.view(torch.uint8))
    for name, a in zip(("out", "max_logits", "lse"), expected):
        bits = torch.int16 if a.dtype == torch.bfloat16 else torch.int32
        assert torch.equal(a.view(bits), got[name].view(bits)), f"{context}: {name} differs from the library call's"
    assert counters.tolist() == [parts] * tail, f"{context}: the counters did not start from zero"
