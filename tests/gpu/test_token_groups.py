"""Token groups (h_q <= 32): adjacent tokens share one tile over the union of their selections.

The pre-pass's lists are checked entry by entry against a host computation of the same rule; the
grouped launch (``SPARSE_MLA_TOKEN_GROUPS=always``: every group grouped) and the automatic mode
(grouped where the union pays, the narrow tile elsewhere) against the reference on every corner of
the contract: overlapping but unequal selections, duplicates inside and across rows of a group,
topk_length differing inside a group (0 included), hostile indices, sinks, tail groups, strided q,
head counts 1 to 32; and repeated launches, bitwise.
"""

from __future__ import annotations

import pytest
import torch

from sparse_mla.jit import KernelKey, get_module
from sparse_mla.jit.key import TOKEN_GROUPS_FUNCTION
from sparse_mla.launch import group_size, max_union_ratio
from sparse_mla.testing import (PRESETS, make_inputs, poisoned_outputs, realistic_indices, token_group_lists,
                                with_duplicated_groups, with_shared_neighbours)

pytestmark = pytest.mark.gpu


def describe(seed: int, **fields) -> str:
    return f"seed={seed} (SPARSE_MLA_TEST_SEED={seed} replays) " + " ".join(f"{k}={v}" for k, v in fields.items())


OWNER_MAP_BYTES = 196608  # token_groups/plan.cuh's MAX_MAP_BYTES


def owner_map_rows(group: int, topk: int) -> int:
    """kv rows per chunk of the pre-pass's owner map (token_groups/plan.cuh's map_capacity) past the first
    196,608, where a byte map never leaves an SM three CTAs: 2, 4 or 8 bits a row for groups of up to 2,
    4 or 8 tokens, and a byte at every group size past topk 2048. (With fewer kv rows there is one chunk,
    whatever the field's width.)"""
    bits = 8 if topk > 2048 else 2 if group <= 2 else 4 if group <= 4 else 8
    return OWNER_MAP_BYTES * 8 // bits


def host_lists(indices: torch.Tensor, topk_length, s_kv: int, group: int, ratio: float):
    """The pre-pass's rule on the host: per group, each distinct valid row once, owned by the tokens that
    selected it, chunk by chunk of owner_map_rows kv rows, in each first the rows every token of the
    group selected, then the others, each part in order of first occurrence over (token, slot); length
    -1 (the group runs token by token) where some token selected a row more than once or the list holds
    more than ``ratio`` entries per valid slot. Returns per group (entries, owners, length)."""
    rows = indices[:, 0].cpu().tolist()
    s_q, topk = len(rows), len(rows[0])
    chunk_rows = owner_map_rows(group, topk)
    lengths = [topk] * s_q if topk_length is None else [min(max(n, 0), topk) for n in topk_length.cpu().tolist()]
    result = []
    for first in range(0, s_q, group):
        tokens = range(first, min(first + group, s_q))
        valid = {t: [v for v in rows[t][: lengths[t]] if 0 <= v < s_kv] for t in tokens}
        owners_of: dict[int, int] = {}  # insertion order: first occurrence
        for t in tokens:
            for v in valid[t]:
                owners_of[v] = owners_of.get(v, 0) | 1 << (t - first)
        n_valid = sum(len(valid[t]) for t in tokens)
        duplicate = any(len(set(valid[t])) < len(valid[t]) for t in tokens)
        pays = not duplicate and (len(owners_of) == 0 or len(owners_of) <= ratio * n_valid)
        everyone = (1 << len(tokens)) - 1
        # Stable: first occurrence within each part.
        entries = sorted(owners_of, key=lambda v: (v // chunk_rows, owners_of[v] != everyone))
        result.append((entries, [owners_of[v] for v in entries], len(entries) if pays else -1))
    return result


def device_lists(inputs: dict, group: int, ratio: float):
    """The pre-pass's (group_indices, group_masks, group_length, group_units), on the host, from poisoned
    buffers, group_units' two counts included (the pre-pass's launch zeroes them)."""
    s_q, h_q, d_qk = inputs["q"].shape
    topk = inputs["indices"].shape[2]
    module = get_module(KernelKey(d_qk=d_qk, topk=topk))
    lists = token_group_lists(inputs["q"].device, s_q, group, topk)
    for tensor in lists:
        tensor.fill_(-7)
    getattr(module, TOKEN_GROUPS_FUNCTION)(inputs["indices"], inputs["topk_length"], inputs["kv"].shape[0], h_q,
                                           group, ratio, *lists)
    return tuple(tensor.cpu() for tensor in lists)


def mask_owners(masks: torch.Tensor, group: int, entries: int) -> list[int]:
    """Each of a group's first ``entries`` list entries' owner bits, from its masks [block, word]: bit t
    of entry 64 b + r is bit r of word t of block b."""
    words = masks.tolist()
    return [sum(((words[e // 64][t] >> (e % 64)) & 1) << t for t in range(group)) for e in range(entries)]


def assert_lists_follow_the_rule(inputs: dict, group: int, context: str) -> None:
    """The pre-pass's lists, at the package's threshold and at an infinite one, against host_lists."""
    s_kv = inputs["kv"].shape[0]
    for ratio in (max_union_ratio(inputs["q"].shape[1]), float("inf")):
        got_indices, got_masks, got_length, got_units = device_lists(inputs, group, ratio)
        assert_unit_lists_partition_the_call(got_length, got_units, inputs["q"].shape[0], group,
                                             f"{context}, ratio {ratio}")
        for k, (entries, owners, length) in enumerate(host_lists(inputs["indices"], inputs["topk_length"], s_kv,
                                                                 group, ratio)):
            assert got_length[k].item() == length, f"{context}, ratio {ratio}: group {k} length"
            if length < 0:
                continue  # a group that falls back has no list to read (ratio inf checks every group's)
            n = len(entries)
            assert got_indices[k, :n].tolist() == entries, f"{context}, ratio {ratio}: group {k} entries"
            # Every block a pair reads: the owners, then no bit past the list.
            read_blocks = (n + 127) // 128 * 2
            padded = mask_owners(got_masks[k, :read_blocks], group, read_blocks * 64)
            assert padded[:n] == owners, f"{context}, ratio {ratio}: group {k} owners"
            assert not any(padded[n:]), f"{context}, ratio {ratio}: group {k} masks past its list"


def assert_unit_lists_partition_the_call(length: torch.Tensor, units: torch.Tensor, s_q: int, group: int,
                                         context: str) -> None:
    """group_units: the grouped launch's list holds each group of length >= 0 once, the other launch's
    each token of the other groups once (in any order: the pre-pass appends with atomics)."""
    groups = length.numel()
    n_grouped, n_narrow = units[0].item(), units[1].item()
    grouped = sorted(units[2:2 + n_grouped].tolist())
    narrow = sorted(units[2 + groups:2 + groups + n_narrow].tolist())
    assert grouped == [k for k in range(groups) if length[k] >= 0], f"{context}: the grouped launch's units"
    assert narrow == [t for t in range(s_q) if length[t // group] < 0], f"{context}: the other launch's units"


@pytest.mark.parametrize(
    "s_q, h_q, topk, kind, s_kv",
    [
        (37, 16, 64, "duplicates", 4096),  # G 4, a tail group of 1
        (29, 8, 100, "hostile", 4096),     # G 8, ragged topk, INT32_MIN / -1 / s_kv / INT32_MAX
        (30, 24, 512, "lengths", 4096),    # G 2, topk_length differing inside groups, 0 included
        (21, 12, 7, "duplicates", 4096),   # G 5
        (64, 16, 2048, "realistic", 4096),
        (40, 1, 2048, "overlap", 4096),    # G 8: 8 * 2048 slots, the largest table
        (40, 8, 2048, "overlap", 131072),  # G 8, a byte map of 128 KB: the pre-pass's CTAs of 1024 threads
        (29, 8, 100, "hostile", 131072),   # the same, ragged topk, hostile indices
        (22, 16, 4096, "overlap", 131072),  # G 4 past topk 2048 (a byte map always): the same CTAs
        # More groups than SMs: CTAs of 512 threads, in rounds. Realistic selections put most later
        # tokens' entries on a few warps (their units are dealt to the warps in turn); shared neighbours
        # in random order spread them evenly (each warp lists its own).
        (600, 16, 2048, "realistic", 8192),
        (600, 16, 2048, "overlap", 8192),
        (600, 16, 2048, "realistic", 131072),  # a packed map of 4 bits a row
        (600, 16, 2048, "realistic", 500_000),  # the same map in two chunks of 393,216 kv rows
        # Groups of two (h_q 17-32) have a pre-pass of their own, two bitmaps of the kv rows:
        (37, 32, 64, "duplicates", 4096),   # a tail group of 1
        (29, 24, 100, "hostile", 131072),   # ragged topk, hostile indices
        (64, 32, 2048, "realistic", 8192),
        (22, 32, 4096, "overlap", 131072),  # past topk 2048
        (24, 20, 512, "overlap", 700_000),  # bitmaps of 175 KB: one CTA an SM
    ],
)
def test_the_lists_are_the_rule_computed_on_the_host(seed, s_q, h_q, topk, kind, s_kv):
    inputs = make_inputs(s_q=s_q, s_kv=s_kv, h_q=h_q, topk=topk, seed=seed,
                         invalid="hostile" if kind == "hostile" else "none",
                         topk_length="random" if kind == "lengths" else None)
    group = group_size(h_q, topk)
    if kind == "realistic":
        inputs["indices"] = realistic_indices(s_q, s_kv, topk, seed=seed, **PRESETS["realistic-glm"])
    elif kind != "hostile":
        inputs = with_shared_neighbours(inputs, group, 0.8, seed)
    if kind == "duplicates":
        inputs = with_duplicated_groups(inputs, group, seed=seed)
    if kind == "lengths":
        inputs["topk_length"][::5] = 0
    assert_lists_follow_the_rule(inputs, group, describe(seed, s_q=s_q, s_kv=s_kv, h_q=h_q, topk=topk, kind=kind, group=group))


@pytest.mark.parametrize("h_q, s_kv", [(8, 250_000), (16, 500_000), (32, 900_000)])
def test_kv_rows_past_one_owner_map_are_mapped_in_chunks(check_prefill, seed, h_q, s_kv):
    """More kv rows than the pre-pass's owner map holds (196,608 at a byte per row for groups of 8,
    393,216 and 786,432 at 4 and 2 bits for groups of 4 and 2): it covers them in chunks, walking the
    group's slots once per chunk; the lists and the call's results are the same rule's."""
    s_q, topk = 24, 512
    assert s_kv > owner_map_rows(group_size(h_q, topk), topk)
    inputs = make_inputs(s_q=s_q, s_kv=s_kv, h_q=h_q, topk=topk, seed=seed, invalid="hostile")
    group = group_size(h_q, topk)
    inputs = with_duplicated_groups(with_shared_neighbours(inputs, group, 0.8, seed), group, seed=seed)
    context = describe(seed, s_q=s_q, s_kv=s_kv, h_q=h_q, topk=topk, group=group)
    assert_lists_follow_the_rule(inputs, group, context)
    check_prefill(inputs, context)


GROUPED_CASES = [
    # s_q, s_kv, h_q, d_qk, topk, options
    (37, 2048, 16, 576, 64, dict(duplicates=True)),
    (29, 4096, 8, 576, 100, dict(invalid="hostile", attn_sink="special")),
    (30, 4096, 24, 576, 512, dict(topk_length="random", attn_sink="random")),
    (21, 1000, 12, 576, 7, dict(duplicates=True, invalid="mixed")),
    (41, 8192, 32, 512, 512, dict(q_strided=True, topk_length="random")),
    (19, 4096, 1, 576, 2048, dict(all_invalid_rows=3, nan_kv_rows=True, topk_length="random")),
    (64, 8192, 16, 576, 2048, dict(attn_sink="random")),
    (26, 4096, 20, 512, 64, dict(kv_strided=True, invalid="hostile", duplicates=True)),
]


@pytest.mark.parametrize("mode", ["always", "auto", "never"])
@pytest.mark.parametrize("s_q, s_kv, h_q, d_qk, topk, options", GROUPED_CASES)
def test_grouped_results_match_the_reference(check_prefill, seed, monkeypatch, mode, s_q, s_kv, h_q, d_qk, topk,
                                             options):
    """``never``: the same inputs through the narrow tiles alone (8 heads up to h_q 8, 16 up to h_q 16, 32 above)."""
    monkeypatch.setenv("SPARSE_MLA_TOKEN_GROUPS", mode)
    duplicates = options.get("duplicates", False)
    inputs = make_inputs(s_q=s_q, s_kv=s_kv, h_q=h_q, d_qk=d_qk, topk=topk, seed=seed,
                         **dict(options, duplicates=False))
    group = group_size(h_q, topk)
    assert group > 1
    # Half the groups overlap (they run grouped in the automatic mode), half are as drawn; with
    # duplicates, every other overlapping group has them too (it falls back in either mode).
    overlapped = with_shared_neighbours(inputs, group, 0.9, seed)
    half = (torch.arange(s_q, device="cuda") // group % 2 == 0).view(s_q, 1, 1)
    inputs["indices"] = torch.where(half, overlapped["indices"], inputs["indices"]).contiguous()
    if duplicates:
        inputs = with_duplicated_groups(inputs, group, seed=seed)
    if options.get("topk_length"):
        inputs["topk_length"][1::group] = 0  # a token without slots inside a group
    check_prefill(inputs, describe(seed, s_q=s_q, s_kv=s_kv, h_q=h_q, d_qk=d_qk, topk=topk, mode=mode, **options))


@pytest.mark.parametrize("h_q", [8, 16, 32])
@pytest.mark.parametrize("pattern", ["realistic-glm", "realistic-dsv4"])
def test_realistic_selections_run_grouped_and_match_the_reference(check_prefill, seed, h_q, pattern):
    s_q, s_kv, topk = 256, 8192, 2048
    inputs = make_inputs(s_q=s_q, s_kv=s_kv, h_q=h_q, topk=topk, seed=seed)
    inputs["indices"] = realistic_indices(s_q, s_kv, topk, seed=seed, **PRESETS[pattern])
    group = group_size(h_q, topk)
    _, _, length, _ = device_lists(inputs, group, max_union_ratio(h_q))
    context = describe(seed, pattern=pattern, h_q=h_q, group=group)
    assert (length >= 0).float().mean().item() > 0.9, f"{context}: most groups should pay ({length.tolist()})"
    check_prefill(inputs, context)


@pytest.mark.parametrize("h_q", [8, 16, 32])
def test_lists_ending_anywhere_in_their_last_pair_match_the_reference(check_prefill, seed, monkeypatch, h_q):
    """One group per list length 128 k + r, r = 1 .. 128 and k = 0 .. 2: every fill of a unit's last
    pair, as its only pair (Q released before the first softmax) and after others (released inside
    the pair loop). Each token of a group selects the list less every (G + 1)-th entry from its own
    offset, so the rows' masks differ and the union is the whole list."""
    monkeypatch.setenv("SPARSE_MLA_TOKEN_GROUPS", "always")
    s_kv, topk = 8192, 512
    group = group_size(h_q, topk)
    lengths = [128 * (r % 3) + r for r in range(1, 129)]
    inputs = make_inputs(s_q=group * len(lengths), s_kv=s_kv, h_q=h_q, topk=topk, seed=seed)
    generator = torch.Generator().manual_seed(seed)
    indices = torch.full((len(lengths), group, topk), -1, dtype=torch.int32)
    for k, length in enumerate(lengths):
        rows = torch.randperm(s_kv, generator=generator)[:length].to(torch.int32)
        for t in range(group):
            indices[k, t, :length] = torch.where(torch.arange(length) % (group + 1) == t, -1, rows)
    inputs["indices"] = indices.view(-1, 1, topk).to("cuda")
    context = describe(seed, h_q=h_q, group=group)
    _, _, got_length, _ = device_lists(inputs, group, max_union_ratio(h_q))
    assert got_length.tolist() == lengths, f"{context}: each group's list is the length it was built for"
    check_prefill(inputs, context)


def test_uniform_selections_fall_back_to_the_narrow_tile(seed):
    inputs = make_inputs(s_q=64, s_kv=131072, h_q=16, topk=2048, seed=seed)
    _, _, length, _ = device_lists(inputs, group_size(16, 2048), max_union_ratio(16))
    assert (length == -1).all(), f"seed {seed}: uniform selections over 128K rows share nothing: {length.tolist()}"


@pytest.mark.parametrize("mode", ["always", "auto", "never"])
def test_repeated_launches_are_bitwise_identical(prefill_fwd, seed, monkeypatch, mode):
    monkeypatch.setenv("SPARSE_MLA_TOKEN_GROUPS", mode)
    inputs = make_inputs(s_q=517, s_kv=8192, h_q=16, topk=2048, seed=seed, topk_length="random", attn_sink="random")
    group = group_size(16, 2048)
    inputs = with_duplicated_groups(with_shared_neighbours(inputs, group, 0.9, seed), group, seed=seed)
    first = prefill_fwd(**inputs)
    for _ in range(5):
        again = prefill_fwd(**inputs)
        for name, a, b in zip(("out", "max_logits", "lse"), first, again):
            assert torch.equal(a.view(torch.int16 if a.dtype == torch.bfloat16 else torch.int32),
                               b.view(torch.int16 if b.dtype == torch.bfloat16 else torch.int32)), (
                f"seed {seed}, {mode}: {name} changed between launches")


def test_grouped_calls_replay_in_a_cuda_graph(prefill_fwd, seed):
    inputs = make_inputs(s_q=300, s_kv=8192, h_q=16, topk=2048, seed=seed, topk_length="random")
    inputs["indices"] = realistic_indices(300, 8192, 2048, seed=seed, **PRESETS["realistic-glm"])
    eager = prefill_fwd(**inputs)
    out, max_logits, lse = (torch.full_like(t, float("nan")) for t in eager)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        prefill_fwd(**inputs, out=out, max_logits=max_logits, lse=lse)  # warm up on the capture stream
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        prefill_fwd(**inputs, out=out, max_logits=max_logits, lse=lse)
    for t in (out, max_logits, lse):
        t.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    for name, a, b in zip(("out", "max_logits", "lse"), eager, (out, max_logits, lse)):
        assert torch.equal(a, b), f"seed {seed}: the replay's {name} differs from the eager call's"


def _rows_selecting(indices: torch.Tensor, kv_row: int) -> list[int]:
    return sorted(set(torch.nonzero((indices[:, 0] == kv_row).any(dim=-1)).flatten().tolist()))


@pytest.mark.parametrize("where", ["nope", "rope", "two tokens"])
@pytest.mark.parametrize("h_q", [8, 16, 32, 12])
def test_a_nan_kv_row_reaches_only_the_tokens_that_selected_it(prefill_fwd, accept, seed, monkeypatch, h_q, where):
    """A token group gathers the union of its tokens' rows for every row of its tile and masks each
    token's unselected entries by P = 0: a NaN in such a row's V must not reach, through 0 x NaN, the
    tokens that did not select it. One kv row gets one e4m3 NaN (in a nope column: V and Q.K^T; in a
    rope column: Q.K^T only), selected by one token, or by two of its group ("two tokens"). The
    tokens are two requests of one batch over a shared context, the first one's last token (the
    poisoned one) and the second one's first tokens in one group. In the automatic mode and with
    every group grouped, the selecting tokens' out, max_logits and lse are NaN, as with the one-token
    tiles (``never``), and every other token is finite and within the acceptance rule."""
    s_kv, topk = 8192, 2048
    group = group_size(h_q, topk)
    s_q = 4 * group
    inputs = make_inputs(s_q=s_q, s_kv=s_kv, h_q=h_q, topk=topk, seed=seed)
    inputs = with_shared_neighbours(inputs, group, 0.97, seed)  # duplicate-free: the groups form
    indices = inputs["indices"]
    poisoned_token = group + group // 2 - 1  # the first request's last token, mid-group
    generator = torch.Generator().manual_seed(seed)
    slot = int(torch.randint(0, topk, (1,), generator=generator))
    kv_row = int(indices[poisoned_token, 0, slot])
    selecting = [poisoned_token]
    if where == "two tokens":  # a neighbour of the second request selects it too, in place of one of its own
        neighbour = poisoned_token + 1
        if kv_row not in indices[neighbour, 0].tolist():
            indices[neighbour, 0, int(torch.randint(0, topk, (1,), generator=generator))] = kv_row
        selecting.append(neighbour)
    others = torch.ones(s_q, dtype=torch.bool, device="cuda")
    others[selecting] = False
    indices[others] = torch.where(indices[others] == kv_row, -1, indices[others])  # only `selecting` read it
    assert _rows_selecting(indices, kv_row) == selecting
    column = 100 if where != "rope" else 512 + 17
    inputs["kv"].view(torch.uint8)[kv_row, 0, column] = 0x7F  # one e4m3 NaN
    context = describe(seed, h_q=h_q, group=group, where=where, kv_row=kv_row, selecting=selecting)

    _, _, length, units = device_lists(inputs, group, max_union_ratio(h_q))
    assert length[poisoned_token // group] >= 0, f"{context}: the poisoned token's group should run grouped"
    assert (length >= 0).all(), f"{context}: every group should run grouped ({length.tolist()})"

    rest = {**inputs, "q": inputs["q"][others], "indices": indices[others]}
    results = {}
    for mode in ("auto", "always", "never"):
        monkeypatch.setenv("SPARSE_MLA_TOKEN_GROUPS", mode)
        out, max_logits, lse = prefill_fwd(**inputs, **poisoned_outputs(s_q, h_q, 512, device="cuda"))
        for name, tensor in (("out", out), ("max_logits", max_logits), ("lse", lse)):
            assert tensor[selecting].float().isnan().all(), f"{context}, {mode}: {name} of a selecting token is not all NaN"
        accept((out[others], max_logits[others], lse[others]), rest, f"{context}, {mode}: the other tokens")
        results[mode] = out
    for mode in ("auto", "always"):
        assert torch.equal(results[mode].isnan(), results["never"].isnan()), f"{context}: NaN where the one-token tiles have none"
