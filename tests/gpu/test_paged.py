"""GPU tier: sparse_mla_q8kv8_paged_prefill_fwd over the engines' paged FP8 cache, against the float64
reference over the dequantized cache (reference_prefill_paged, norm-wise), and against the engines'
path (requantize at scale 1.0, then the contiguous kernel) on the same cache.

Each cache holds a latent whose 128-column tiles differ in magnitude by 2^10 within a row (as real
writers' tiles do), written in scattered blocks of a larger cache (shuffled_block_table). Outputs are
NaN-poisoned preallocated tensors unless a test says otherwise.
"""

from __future__ import annotations

import pytest
import torch

from sparse_mla.jit import KernelKey, get_module
from sparse_mla.jit.key import TOKEN_GROUPS_FUNCTION
from sparse_mla.launch import group_size
from sparse_mla.testing import (PRESETS, engine_requantized_kv, make_inputs, paged_indices, poisoned_outputs,
                                quantize_paged_cache, random_latent, realistic_indices, reference_prefill_paged,
                                relative_error, shuffled_block_table, token_group_lists)

pytestmark = pytest.mark.gpu

BLOCK = 64
# The paged path's out error against the dequantized cache's float64 attention, norm-wise over a call:
# e4m3 Q.K^T, P and the per-row requantization (docs/kernel.md); the engines' path reads 4-10e-2 here.
PAGED_OUT_TOL = 2.5e-2


@pytest.fixture(scope="module")
def paged_fwd():
    from sparse_mla import sparse_mla_q8kv8_paged_prefill_fwd

    return sparse_mla_q8kv8_paged_prefill_fwd


def paged_call(s_q, tokens, h_q, d_qk, topk, seed, block_stride_pad=0, **options):
    """Inputs of a call over a paged cache of `tokens` tokens: q, indices (mapped to the cache's rows),
    sm_scale, q_scale, optional sink and topk_length from make_inputs; the cache, and the request's rows
    in token order."""
    a = make_inputs(s_q, tokens, h_q, d_qk, topk, seed=seed, **options)
    table = shuffled_block_table(tokens, BLOCK, seed=seed)
    num_blocks = 2 * -(-tokens // BLOCK)
    latent = random_latent(tokens, d_qk, tile_spread_log2=10, seed=seed, device="cuda")
    cache = quantize_paged_cache(latent, BLOCK, block_table=table.cuda(), num_blocks=num_blocks)
    if block_stride_pad:  # blocks further apart than a block's rows: the block stride is free
        wide = torch.zeros(num_blocks, BLOCK + block_stride_pad, 1, 656, dtype=torch.uint8, device="cuda")
        wide[:, :BLOCK] = cache
        cache = wide[:, :BLOCK]
    indices = paged_indices(a["indices"], table, BLOCK, tokens, num_blocks)
    rows = paged_indices(torch.arange(tokens, dtype=torch.int32, device="cuda"), table, BLOCK, tokens, num_blocks)
    args = dict(q=a["q"], kv_cache=cache, indices=indices, sm_scale=a["sm_scale"], q_scale=a["q_scale"],
                attn_sink=a["attn_sink"], topk_length=a["topk_length"])
    return args, a, rows


def assert_matches_reference(got, args, message):
    ref = reference_prefill_paged(args["q"], args["kv_cache"], args["indices"], args["sm_scale"], args["q_scale"],
                                  attn_sink=args["attn_sink"], topk_length=args["topk_length"])
    out, max_logits, lse = got
    for name, value, expected in (("out", out, ref[0]), ("max_logits", max_logits, ref[1]), ("lse", lse, ref[2])):
        finite = torch.isfinite(expected)
        assert torch.equal(value.float()[~finite], expected[~finite]), f"{name}: special values differ; {message}"
        assert torch.isfinite(value.float()[finite]).all(), f"{name}: NaN or inf where the reference is finite; {message}"
    err = relative_error(out, ref[0])
    assert err < PAGED_OUT_TOL, f"out error {err:.3e}; {message}"
    assert relative_error(lse, ref[2]) < 1e-2, message
    assert relative_error(max_logits, ref[1]) < 1e-2, message
    # Not the contiguous call's per-(row, head) rule over the keys the kernel reads (as_read_inputs): on
    # these caches (tiles spread 2^10) both the paged and the contiguous kernel read the logits 0.5-1.4%
    # low even where the modelled keys are the cache's own (apparently the FP8 tensor cores'
    # accumulation; not isolated: docs/lab.md, Experiment 139), beyond the bound that rule allows. The
    # sanitizer's paged case holds that rule with its lse and max_logits bounds off.
    return err, ref


@pytest.mark.parametrize("d_qk, topk", [(576, 2048), (512, 512)])
@pytest.mark.parametrize("s_q, h_q", [(16, 16), (64, 128), (437, 64), (200, 8), (33, 100)])
def test_paged_matches_the_dequantized_reference(paged_fwd, seed, s_q, h_q, d_qk, topk):
    args, _, _ = paged_call(s_q, 4096, h_q, d_qk, topk, seed)
    got = paged_fwd(**args, **poisoned_outputs(s_q, h_q))
    assert_matches_reference(got, args, f"seed={seed} s_q={s_q} h_q={h_q} d_qk={d_qk} topk={topk}")


@pytest.mark.parametrize("d_qk, topk", [(576, 2048), (512, 512)])
def test_paged_error_is_below_the_engines_path(paged_fwd, prefill_fwd, seed, d_qk, topk):
    """The same cache through the engines' path (requantize the request's rows at scale 1.0, then the
    contiguous kernel): its error against the same reference is the bar."""
    s_q, h_q, tokens = 64, 64, 4096
    args, a, rows = paged_call(s_q, tokens, h_q, d_qk, topk, seed)
    err, ref = assert_matches_reference(paged_fwd(**args), args, f"seed={seed}")
    kv, kv_scale = engine_requantized_kv(args["kv_cache"], rows, d_qk)
    engine = prefill_fwd(a["q"], kv, a["indices"], a["sm_scale"], a["q_scale"], kv_scale)
    engine_err = relative_error(engine[0], ref[0])
    assert err < engine_err, f"paged {err:.3e} against the engines' {engine_err:.3e}; seed={seed}"


@pytest.mark.parametrize("options", [dict(invalid="hostile", all_invalid_rows=3), dict(invalid="mixed"),
                                     dict(topk_length="random", attn_sink="special")])
def test_paged_invalid_slots_lengths_and_sinks(paged_fwd, seed, options):
    args, _, _ = paged_call(96, 3000, 64, 576, 2048, seed, **options)
    got = paged_fwd(**args, **poisoned_outputs(96, 64))
    assert_matches_reference(got, args, f"seed={seed} {options}")


def test_paged_free_block_stride_and_any_byte_dtype(paged_fwd, seed):
    args, _, _ = paged_call(50, 2000, 128, 576, 2048, seed, block_stride_pad=3)
    assert args["kv_cache"].stride(0) == (BLOCK + 3) * 656
    got = paged_fwd(**args)
    assert_matches_reference(got, args, f"seed={seed}")
    as_fp8 = dict(args, kv_cache=args["kv_cache"].view(torch.float8_e4m3fn))
    again = paged_fwd(**as_fp8)
    assert all(torch.equal(x, y) for x, y in zip(got, again))


def test_paged_unwritten_rows_read_as_zero(paged_fwd, seed):
    """All-zero rows (scales 0: an unwritten page) are keys and values of zeros, logit 0."""
    args, _, _ = paged_call(32, 2048, 64, 576, 2048, seed)
    cache = args["kv_cache"].clone()
    flat = cache.view(-1, 656)
    chosen = args["indices"][:, 0, :100].flatten().long()
    flat[chosen[chosen >= 0]] = 0
    args["kv_cache"] = cache
    assert_matches_reference(paged_fwd(**args), args, f"seed={seed}")


def test_paged_nan_row_reaches_only_its_tokens(paged_fwd, seed):
    args, _, _ = paged_call(48, 4096, 64, 576, 2048, seed)
    cache = args["kv_cache"].clone()
    row = int(args["indices"][5, 0, 17])
    cache.view(-1, 656)[row, 512:516] = torch.tensor([0, 0, 0xC0, 0x7F], dtype=torch.uint8)  # scale 0 = NaN
    args["kv_cache"] = cache
    out, max_logits, lse = paged_fwd(**args)
    selects = (args["indices"][:, 0, :] == row).any(dim=1)
    assert selects[5]
    assert torch.isnan(out[selects]).all() and torch.isnan(lse[selects]).all() and torch.isnan(max_logits[selects]).all()
    assert torch.isfinite(out[~selects].float()).all() and torch.isfinite(lse[~selects]).all()


def test_paged_batch_invariant_rows(paged_fwd, seed):
    args, _, _ = paged_call(300, 4096, 16, 576, 2048, seed)
    whole = paged_fwd(**args, batch_invariant=True)
    for lo, hi in ((0, 1), (7, 19), (299, 300)):
        part = dict(args, q=args["q"][lo:hi], indices=args["indices"][lo:hi])
        alone = paged_fwd(**part, batch_invariant=True)
        for x, y in zip(alone, whole):
            assert torch.equal(x, y[lo:hi]), f"rows {lo}:{hi}; seed={seed}"


def test_paged_cuda_graph_replay(paged_fwd, seed):
    args, _, _ = paged_call(16, 4096, 128, 576, 2048, seed)  # a split call: its scratch in the graph
    expected = paged_fwd(**args)
    outputs = poisoned_outputs(16, 128)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        paged_fwd(**args, **outputs)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        paged_fwd(**args, **outputs)
    for t in outputs.values():
        t.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert all(torch.equal(x, outputs[name]) for x, name in zip(expected, ("out", "max_logits", "lse")))


@pytest.mark.parametrize("change, message", [
    (lambda c: c.cpu(), "kv_cache must be a CUDA tensor"),
    (lambda c: c.view(torch.int16), "1-byte elements"),
    (lambda c: c.float(), "1-byte elements"),
    (lambda c: c[..., :640], "kv_cache must have shape"),
    (lambda c: c.transpose(0, 1), "rows must be contiguous within a block"),
    (lambda c: c.reshape(-1)[8:8 + (c.shape[0] - 1) * c.shape[1] * 656].view(-1, c.shape[1], 1, 656), "16-byte"),
])
def test_paged_refuses_bad_caches(paged_fwd, seed, change, message):
    args, _, _ = paged_call(4, 512, 16, 576, 64, seed)
    args["kv_cache"] = change(args["kv_cache"])
    with pytest.raises(ValueError, match=message):
        paged_fwd(**args)


def test_paged_under_torch_compile(paged_fwd, seed):
    args, _, _ = paged_call(40, 2048, 64, 576, 2048, seed)
    expected = paged_fwd(**args)

    @torch.compile(fullgraph=True)
    def step(q, kv_cache, indices, q_scale):
        out, max_logits, lse = paged_fwd(q, kv_cache, indices, args["sm_scale"], q_scale)
        return out * 2, lse

    doubled, lse = step(args["q"], args["kv_cache"], args["indices"], args["q_scale"])
    assert torch.equal(lse, expected[2]) and torch.equal(doubled, expected[0] * 2)


@pytest.mark.parametrize("h_q", [8, 16, 24, 32])
def test_paged_token_groups(paged_fwd, seed, h_q, monkeypatch):
    """Neighbouring tokens' overlapping selections (realistic-glm, causal, no duplicates): groups form
    (the pre-pass says so) and the grouped tile reads the paged rows."""
    monkeypatch.setenv("SPARSE_MLA_TOKEN_GROUPS", "always")
    s_q, tokens = 96, 4096
    args, _, _ = paged_call(s_q, tokens, h_q, 576, 2048, seed)
    table = shuffled_block_table(tokens, BLOCK, seed=seed)
    local = realistic_indices(s_q, tokens, 2048, **PRESETS["realistic-glm"], seed=seed)
    args["indices"] = paged_indices(local, table, BLOCK, tokens, 2 * -(-tokens // BLOCK))
    group = group_size(h_q, 2048)
    lists = token_group_lists(args["q"].device, s_q, group, 2048)
    module = get_module(KernelKey(d_qk=576, topk=2048))
    getattr(module, TOKEN_GROUPS_FUNCTION)(args["indices"], None, args["kv_cache"].shape[0] * BLOCK, h_q, group,
                                           float("inf"), *lists)
    assert (lists[2] >= 0).any(), "no group formed"
    assert_matches_reference(paged_fwd(**args, **poisoned_outputs(s_q, h_q)), args, f"seed={seed} h_q={h_q}")


@pytest.mark.parametrize("h_q", [8, 16, 32])
def test_paged_nan_row_stays_out_of_its_token_group(paged_fwd, seed, h_q, monkeypatch):
    """A NaN scale in a row one token of a group selects: that token's outputs are NaN, its group's
    other tokens' are finite and match the reference."""
    monkeypatch.setenv("SPARSE_MLA_TOKEN_GROUPS", "always")
    s_q, tokens = 64, 4096
    args, _, _ = paged_call(s_q, tokens, h_q, 576, 2048, seed)
    table = shuffled_block_table(tokens, BLOCK, seed=seed)
    local = realistic_indices(s_q, tokens, 2048, **PRESETS["realistic-glm"], seed=seed)
    indices = paged_indices(local, table, BLOCK, tokens, 2 * -(-tokens // BLOCK))
    selected = indices[:, 0, :]
    counts = torch.zeros(args["kv_cache"].shape[0] * BLOCK, dtype=torch.int64, device="cuda")
    counts.scatter_add_(0, selected[selected >= 0].long(), torch.ones_like(selected[selected >= 0], dtype=torch.int64))
    only_one = torch.nonzero(counts == 1).flatten()
    assert only_one.numel() > 0
    row = int(only_one[0])
    cache = args["kv_cache"].clone()
    cache.view(-1, 656)[row, 512:516] = torch.tensor([0, 0, 0xC0, 0x7F], dtype=torch.uint8)
    args.update(kv_cache=cache, indices=indices)
    out, max_logits, lse = paged_fwd(**args)
    poisoned = (selected == row).any(dim=1)
    assert int(poisoned.sum()) == 1
    assert torch.isnan(out[poisoned]).all() and torch.isnan(lse[poisoned]).all() and torch.isnan(max_logits[poisoned]).all()
    assert torch.isfinite(out[~poisoned].float()).all() and torch.isfinite(lse[~poisoned]).all()
    clean = dict(args, q=args["q"][~poisoned].contiguous(), indices=indices[~poisoned].contiguous())
    ref = reference_prefill_paged(clean["q"], cache, clean["indices"], args["sm_scale"], args["q_scale"])
    assert relative_error(out[~poisoned], ref[0]) < PAGED_OUT_TOL, f"seed={seed}"
