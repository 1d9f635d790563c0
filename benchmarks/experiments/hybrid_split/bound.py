"""A token group's rows split by how many of its tokens selected them (Experiment 123, a bound).

A grouped pair costs ~1.1 wide pairs whatever share of its 64 (token, head) rows a kv row serves; a
16-head narrow pair ~0.72. So a row that two or more tokens of the group selected is cheaper in the
grouped tile, and a row that one token alone selected is cheaper in that token's narrow tile. Per
group of G adjacent tokens (G the library's), this script lists the rows two or more tokens selected
(the shared list, in the pre-pass's order and masks: rows every token selected first, then the
others by first occurrence) and, per token, the rows it alone selected (its own list, in slot
order), and times the grouped launch over the shared lists followed by the narrow launch over the
own lists (``topk_length`` = their lengths), with no merge of the two parts and no pre-pass: what a
kernel that merges the two parts in the narrow tile's epilogue could reach at best, beside the
library's call, the narrow launch alone (token groups off) and the h_q 64 call on the same indices
(interleaved, L2 flushed before every timed call, median). A token whose own rows are fewer than
``--min-own`` keeps them in the shared list (masked).

The two parts are checked against the library's call: merged here in float32 through their ``lse``,
the output, ``lse`` and ``max_logits`` must agree with the call's within bf16 rounding.

    python benchmarks/experiments/hybrid_split/bound.py --json bound.json
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # benchmarks/: no package
from bench import git_commit, pattern_indices  # noqa: E402

import sparse_mla.launch as launch  # noqa: E402
from sparse_mla.jit import get_module  # noqa: E402
from sparse_mla.testing import interleaved_median_ms, make_inputs, poisoned_outputs  # noqa: E402

TOPK, D_QK, B_TOPK = 2048, 576, 64


def split_lists(indices: torch.Tensor, s_kv: int, group: int, min_own: int) -> tuple[tuple, torch.Tensor, torch.Tensor, dict]:
    """The shared lists in the pre-pass's format (lists, masks, lengths, units) and every token's own
    rows as indices with their lengths."""
    s_q, topk = indices.shape[0], indices.shape[2]
    device = indices.device
    rows = indices[:, 0, :].long()
    token = torch.arange(s_q, device=device).unsqueeze(1).expand(s_q, topk)
    slot = torch.arange(topk, device=device).unsqueeze(0).expand(s_q, topk)
    valid = (rows >= 0) & (rows < s_kv)
    g_of, t_of = token // group, token % group
    key = (g_of * s_kv + rows)[valid]
    entries, inverse, counts = torch.unique(key, return_inverse=True, return_counts=True)
    owners = torch.zeros_like(entries).scatter_add_(0, inverse, (1 << t_of)[valid])
    popcount = sum((owners >> t) & 1 for t in range(group))
    assert torch.equal(popcount, counts), "a token selected a row twice: not a case for this bound"
    first = torch.full_like(entries, 1 << 40).scatter_reduce_(0, inverse, (t_of * topk + slot)[valid], "amin")
    entry_group, entry_row = entries // s_kv, entries % s_kv
    first_token = first // topk
    groups = (s_q + group - 1) // group

    # A token keeps its own rows in the shared list where it has fewer than min_own of them.
    own_counts = torch.zeros(s_q, dtype=torch.int64, device=device)
    alone = counts == 1
    own_counts.scatter_add_(0, (entry_group * group + first_token)[alone], torch.ones_like(entries[alone]))
    moved = own_counts >= max(min_own, 1)
    to_own = alone & moved[(entry_group * group + first_token).clamp(max=s_q - 1)]

    # Shared lists: per group the rows every token selected first, then the others by first occurrence.
    tokens_in_group = torch.clamp(s_q - entry_group * group, max=group)
    common = owners == (1 << tokens_in_group) - 1
    shared = ~to_own
    order_key = entry_group * (4 * group * topk) + (~common).long() * (2 * group * topk) + first
    order = torch.argsort(torch.where(shared, order_key, torch.iinfo(torch.int64).max))[: int(shared.sum())]
    s_group, s_row, s_owner = entry_group[order], entry_row[order], owners[order]
    lengths = torch.zeros(groups, dtype=torch.int64, device=device).scatter_add_(0, s_group, torch.ones_like(s_group))
    starts = torch.cumsum(lengths, 0) - lengths
    pos = torch.arange(s_group.numel(), device=device) - starts[s_group]
    lists, masks, length32, units = launch.token_group_lists(device, s_q, group, topk)
    lists.zero_()
    lists[s_group, pos] = s_row.int()
    length32.copy_(lengths)
    masks.zero_()
    flat = masks.view(-1)
    blocks = masks.shape[1]
    for t in range(group):
        mine = ((s_owner >> t) & 1).bool()
        bit = torch.ones_like(pos[mine]) << (pos[mine] % B_TOPK)  # 1 << 63 wraps to the sign bit: still that bit
        flat.index_put_(((s_group[mine] * blocks + pos[mine] // B_TOPK) * group + t,), bit, accumulate=True)
    paying = torch.nonzero(lengths > 0).flatten().int()
    units.zero_()
    units[0] = paying.numel()
    units[2:2 + paying.numel()] = paying

    # Own lists: per token its moved rows in slot order, the rest of its slots -1.
    o_token = (entry_group * group + first_token)[to_own]
    o_slot = (first % topk)[to_own]
    o_row = entry_row[to_own]
    o_order = torch.argsort(o_token * topk + o_slot)
    o_token, o_row = o_token[o_order], o_row[o_order]
    own_len = torch.zeros(s_q, dtype=torch.int64, device=device).scatter_add_(0, o_token, torch.ones_like(o_token))
    o_pos = torch.arange(o_token.numel(), device=device) - (torch.cumsum(own_len, 0) - own_len)[o_token]
    own = torch.full_like(indices, -1)
    own[o_token, 0, o_pos] = o_row.int()
    valid_slots = int(valid.sum())
    stats = dict(shared_entries_per_group=float(lengths.float().mean()), own_rows_per_token=float(own_len.float().mean()),
                 moved_tokens=float(moved.float().mean()), shared_per_slot=float(lengths.sum()) / valid_slots,
                 own_per_slot=float(own_len.sum()) / valid_slots)
    return (lists, masks, length32, units), own, own_len.int(), stats


def merged(part_a: dict, part_b: dict) -> dict:
    """Two parts of a row's slots merged through their lse (an empty part: lse +inf, out 0)."""
    lse_a = torch.where(torch.isinf(part_a["lse"]), -torch.inf, part_a["lse"])
    lse_b = torch.where(torch.isinf(part_b["lse"]), -torch.inf, part_b["lse"])
    lse = torch.logaddexp(lse_a, lse_b)
    w_a, w_b = torch.exp(lse_a - lse), torch.exp(lse_b - lse)
    out = w_a.unsqueeze(-1) * part_a["out"].float() + w_b.unsqueeze(-1) * part_b["out"].float()
    return dict(out=out, lse=lse, max_logits=torch.maximum(part_a["max_logits"], part_b["max_logits"]))


def case(s_q: int, s_kv: int, h_q: int, pattern: str, min_own: list[int]) -> dict:
    inputs = make_inputs(s_q, s_kv, h_q, D_QK, TOPK, seed=0)
    indices = pattern_indices(pattern, s_q, s_kv, TOPK, 0, inputs["indices"])
    q, kv = inputs["q"], inputs["kv"]
    q_scale, kv_scale, sm_scale = inputs["q_scale"].reshape(1), inputs["kv_scale"].reshape(1), inputs["sm_scale"]
    group = launch.group_size(h_q, TOPK)
    module = get_module(launch._kernel_key(D_QK, TOPK))
    items = s_q * ((h_q + 63) // 64)
    h64 = make_inputs(s_q, s_kv, 64, D_QK, TOPK, seed=0)
    out64 = poisoned_outputs(s_q, 64)
    outs = {name: poisoned_outputs(s_q, h_q) for name in ("call", "narrow")}

    def library(name: str, mode: str, the_q=q, the_outs=None, the_indices=indices, length=None):
        o = the_outs if the_outs is not None else outs[name]
        return lambda: launch.launch(the_q, kv, the_indices, q_scale, kv_scale, None, length, o["out"], o["max_logits"],
                                     o["lse"], sm_scale, False, token_groups=mode)

    fns = {"h_q 64": library("", "auto", the_q=h64["q"], the_outs=out64), "call": library("call", "auto"),
           "narrow": library("narrow", "never")}
    stats, parts = {}, {}
    for m in min_own:
        lists, own, own_len, stats[m] = split_lists(indices, s_kv, group, m)
        shared_out, own_out = poisoned_outputs(s_q, h_q), poisoned_outputs(s_q, h_q)
        parts[m] = (shared_out, own_out)

        def hybrid(lists=lists, own=own, own_len=own_len, shared_out=shared_out, own_out=own_out) -> None:
            module.prefill_fwd(q, kv, indices, q_scale, kv_scale, None, None, shared_out["out"],
                               shared_out["max_logits"], shared_out["lse"], sm_scale, items, 1, None, None, group,
                               *lists, True)
            launch.launch(q, kv, own, q_scale, kv_scale, None, own_len, own_out["out"], own_out["max_logits"],
                          own_out["lse"], sm_scale, False, token_groups="never")

        fns[f"split {m}"] = hybrid
    times = interleaved_median_ms(fns, iters=20)
    reference = times.pop("h_q 64")
    row = dict(s_q=s_q, s_kv=s_kv, h_q=h_q, group=group, indices=pattern, h64_ms=reference, variants={})
    call = outs["call"]
    for name, t in times.items():
        entry = dict(ms=t, per_head=t / h_q / (reference / 64))
        if name.startswith("split"):
            m = int(name.split()[1])
            whole = merged(*parts[m])
            entry.update(stats[m], out_max_diff=float((whole["out"] - call["out"].float()).abs().max()),
                         lse_max_rel=float(((whole["lse"] - call["lse"]).abs() / call["lse"].abs()).max()),
                         max_logits_max_rel=float(((whole["max_logits"] - call["max_logits"]).abs()
                                                   / call["max_logits"].abs()).max()))
        row["variants"][name] = entry
        extra = {k: round(v, 4) if isinstance(v, float) else v for k, v in entry.items() if k not in ("ms", "per_head")}
        print(f"{pattern} {s_q} x {s_kv} h_q {h_q} (G {group}) {name}: {t * 1e3:.1f} us, {entry['per_head']:.3f} per head"
              f" {extra if extra else ''}", flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", required=True)
    parser.add_argument("--min-own", type=int, nargs="+", default=[0, 256])
    parser.add_argument("--cases", nargs="+", default=["uniform:4096:8192:16", "uniform:4096:8192:8",
                                                      "uniform:4096:8192:32", "realistic-dsv4:4096:131072:16",
                                                      "realistic-dsv4:4096:131072:8", "realistic-dsv4:4096:8192:16",
                                                      "realistic-glm:4096:8192:16", "realistic-dsv4:1024:131072:8"])
    args = parser.parse_args()
    rows = []
    for spec in args.cases:
        pattern, s_q, s_kv, h_q = spec.split(":")
        rows.append(case(int(s_q), int(s_kv), int(h_q), pattern, args.min_own))
        torch.cuda.empty_cache()
    result = dict(gpu=torch.cuda.get_device_name(), commit=git_commit(), rows=rows)
    pathlib.Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
