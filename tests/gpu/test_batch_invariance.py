"""The batch-invariant mode: a row's outputs are bitwise the same whatever call it is computed in.

Rows are computed alone, in small and large calls, and at another position among other neighbours;
in the batch-invariant mode (``batch_invariant=True`` or ``SPARSE_MLA_BATCH_INVARIANT=1``) every
version of a row must have the same bits in out, max_logits and lse. The default mode is not
invariant: the tail split sums the rows of a short call's last round in parts, so on these shapes some
row differs there, which shows that the mode is what keeps the rows equal.
"""

from __future__ import annotations

import pytest
import torch

from sparse_mla.launch import group_size
from sparse_mla.testing import make_inputs, with_shared_neighbours

S_Q = 1200  # the large call: 9+ rounds of work items at h_q 64 on 132 SMs, never split
# Row ranges computed in their own call: one row, a few, and a block whose last round splits.
ALONE = [(0, 1), (5, 12), (0, 437), (300, 301)]


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16 if t.dtype == torch.bfloat16 else torch.int32)


def _rows(inputs: dict, begin: int, end: int) -> dict:
    """The call of rows [begin, end) alone: same kv, sink and scales."""
    rows = dict(inputs)
    rows["q"] = inputs["q"][begin:end]
    rows["indices"] = inputs["indices"][begin:end].contiguous()
    if inputs["topk_length"] is not None:
        rows["topk_length"] = inputs["topk_length"][begin:end].contiguous()
    return rows


def _embedded(inputs: dict, begin: int, end: int, position: int, seed: int) -> dict:
    """Rows [begin, end) at rows [position, position + end - begin) of a call whose other rows are new."""
    shape = dict(s_q=S_Q, s_kv=inputs["kv"].shape[0], h_q=inputs["q"].shape[1], d_qk=inputs["q"].shape[2],
                 topk=inputs["indices"].shape[2])
    other = make_inputs(**shape, seed=seed + 1, topk_length="random" if inputs["topk_length"] is not None else None)
    call = dict(inputs)
    span = slice(position, position + end - begin)
    for name in ("q", "indices", "topk_length"):
        if inputs[name] is None:
            continue
        mixed = other[name].clone()
        mixed[span] = inputs[name][begin:end]
        call[name] = mixed  # q keeps inputs' q_scale: the moved rows are the same numbers
    return call


def _differences(prefill_fwd, inputs: dict, seed: int, **mode) -> list[str]:
    """Every way a row's bits differ between the full call and its other calls."""
    full = prefill_fwd(**inputs, **mode)
    found = []
    versions = [(f"rows {b}:{e} alone", _rows(inputs, b, e), b, e, 0) for b, e in ALONE]
    versions.append(("rows 5:12 at position 900 among new rows", _embedded(inputs, 5, 12, 900, seed), 5, 12, 900))
    for label, call, begin, end, at in versions:
        result = prefill_fwd(**call, **mode)
        for name, whole, part in zip(("out", "max_logits", "lse"), full, result):
            got = part[at:at + end - begin]
            if not torch.equal(_bits(whole[begin:end]), _bits(got)):
                found.append(f"{label}: {name} differs from the same rows in the {S_Q}-row call")
    return found


@pytest.mark.parametrize(
    "h_q, d_qk, topk", [(128, 576, 2048), (64, 576, 2048), (16, 576, 2048), (64, 512, 512), (24, 576, 512)]
)
def test_rows_are_bitwise_the_same_in_any_call(prefill_fwd, accept, seed, h_q, d_qk, topk):
    inputs = make_inputs(s_q=S_Q, s_kv=8192, h_q=h_q, d_qk=d_qk, topk=topk, seed=seed, topk_length="random",
                         attn_sink="random", invalid="mixed")
    context = f"seed {seed}, h_q {h_q}, d_qk {d_qk}, topk {topk}"
    assert _differences(prefill_fwd, inputs, seed, batch_invariant=True) == [], context
    # The mode computes what the contract says, not merely the same thing every time.
    rows = _rows(inputs, 0, 64)
    accept(prefill_fwd(**rows, batch_invariant=True), rows, f"{context}, batch-invariant, rows 0:64")


def test_the_environment_variable_turns_the_mode_on(prefill_fwd, seed, monkeypatch):
    inputs = make_inputs(s_q=S_Q, s_kv=8192, h_q=64, d_qk=576, topk=2048, seed=seed)
    monkeypatch.setenv("SPARSE_MLA_BATCH_INVARIANT", "1")
    assert _differences(prefill_fwd, inputs, seed) == [], f"seed {seed}"
    # An explicit argument wins over the variable.
    assert _differences(prefill_fwd, inputs, seed, batch_invariant=False) != [], f"seed {seed}"


@pytest.mark.parametrize("h_q, d_qk, topk", [(64, 576, 2048), (16, 576, 2048)])
def test_the_default_mode_is_not_batch_invariant(prefill_fwd, seed, h_q, d_qk, topk):
    """The tail split cuts a row of a short call into parts, and at h_q <= 32 token groups compute a row
    with its neighbours' union: its sum runs in another order than in a large call. If this ever passes
    with no difference, the invariance test above proves nothing."""
    inputs = make_inputs(s_q=S_Q, s_kv=8192, h_q=h_q, d_qk=d_qk, topk=topk, seed=seed)
    if group_size(h_q, topk) > 1:  # neighbours that share most of their rows, so that their groups run grouped
        inputs = with_shared_neighbours(inputs, group_size(h_q, topk), 0.9, seed)
    found = _differences(prefill_fwd, inputs, seed)
    assert any("alone" in line for line in found), f"seed {seed}: no row changed with the call's s_q"


@pytest.mark.parametrize("h_q", [8, 16, 32])
def test_rows_are_bitwise_the_same_where_neighbours_share_their_rows(prefill_fwd, seed, h_q):
    """Selections whose neighbours share most rows, as a real indexer's: in the default mode they run in
    token groups, whose members depend on a row's position in the call (the test above draws uniform
    selections, on which every group falls back to one token a tile). The mode keeps token groups off:
    a row alone or moved among other rows has the same bits."""
    inputs = make_inputs(s_q=S_Q, s_kv=8192, h_q=h_q, d_qk=576, topk=2048, seed=seed, topk_length="random")
    inputs = with_shared_neighbours(inputs, group_size(h_q, 2048), 0.9, seed)
    assert _differences(prefill_fwd, inputs, seed, batch_invariant=True) == [], f"seed {seed}, h_q {h_q}"
