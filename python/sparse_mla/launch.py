"""The launch plan of one prefill call, and its launch (``include/sparse_mla/entry.cuh``).

A call's plan (:class:`Plan`) is decided from its shape, its GPU and its mode alone, never from tensor
values, once per (shape, device, mode): which module entry runs (an ordinary call, a tail split, token
groups), which tiles it launches and what scratch memory it takes. :func:`launch` looks the plan up,
allocates that scratch memory from torch's caching allocator on the current stream and crosses into
the module once; the module launches on the caller's current CUDA stream. The arguments were
validated by :mod:`sparse_mla.validate`; nothing here synchronizes the device or waits for it.

Token groups (``include/sparse_mla/sm90/prefill/token_groups/``): with at most 32 heads, a 64-row
tile of one token is mostly empty, and adjacent tokens of a real indexer select mostly the same kv rows.
So G adjacent tokens (``group_size``) share one tile over the union of their selections, each row masked
to its own token's slots: a pre-pass lists each group's union, then the grouped launch runs the groups
whose union pays, and a second launch runs the other groups' tokens one by one with a narrow tile.
Which groups pay is decided on the device, per group, from the union's size: no host sync. Not in the
batch-invariant mode (a row's group depends on its position in the call).
"""

from __future__ import annotations

import functools
import math
from typing import Any, Callable, NamedTuple

import torch

from sparse_mla.args import ENTRY_ARGS, PrefillArgs
from sparse_mla.errors import UnsupportedGPUError
from sparse_mla.jit import ENTRY_FUNCTION, KernelKey, env, get_module
from sparse_mla.jit.key import (GROUPED_CALL_FUNCTION, PAGED_CALL_FUNCTION, PAGED_GROUPED_CALL_FUNCTION,
                                PAGED_SPLIT_CALL_FUNCTION, SPLIT_CALL_FUNCTION)
from sparse_mla.validate import HEAD_BLOCK

__all__ = ["SPLIT_PART_FLOATS", "Plan", "execute", "group_size", "launch", "paged_plan", "plan", "plan_on", "split_plan",
           "token_group_bytes", "token_group_list_shapes"]


class _Device(NamedTuple):
    capability: tuple[int, int]
    num_sms: int


# What the launch plan needs of each device, per device index, read once: torch caches device
# properties, this saves the call.
_DEVICES: dict[int, _Device] = {}


def _device(index: int) -> _Device:
    device = _DEVICES.get(index)
    if device is None:
        props = torch.cuda.get_device_properties(index)
        device = _DEVICES.setdefault(index, _Device((props.major, props.minor), props.multi_processor_count))
    return device


def check_hopper(index: int) -> int:
    """Raises unless CUDA device ``index`` is an SM90 GPU; returns the index."""
    capability = _device(index).capability
    if capability != (9, 0):
        name = torch.cuda.get_device_name(index)
        raise UnsupportedGPUError(
            f"sparse_mla needs an SM90 (Hopper: H100/H200/H800/H20) GPU; q is on cuda:{index}, "
            f"{name}, compute capability {capability[0]}.{capability[1]}"
        )
    return index


# The kernel's tail split (include/sparse_mla/sm90/prefill/split.cuh; PART_FLOATS in traits.cuh): floats
# of one part's state in the workspace (256 consumer threads x (128 O^T values + 4 row statistics) + 64
# head references), at most 4 parts per item, at least 2 pairs of 64-row blocks (256 slots) per part, so
# that a part's work stays well above the cost of merging it. Past 8 rounds of items the last round is
# a small share of the call, and a part needs at least 4 pairs (512 slots) to save more than it costs
# (publishing and merging it, the kernel that zeroes the counters); measured on an H200
# (docs/lab.md, Experiment 90), 4,096 items at topk 2048 in parts of 4 pairs ran
# 0.2-1.0% faster, at topk 512 in parts of 2 pairs 1.1% slower. A split call runs the wide tile
# (include/sparse_mla/sm90/prefill/tiles/select.cuh), so a call that would run a narrow tile (at most 32
# heads) splits only within 8 rounds, as before that measurement.
SPLIT_PART_FLOATS = 256 * 128 + 256 * 4 + 64
_MAX_SPLIT_PARTS = 4
_MIN_SPLIT_SLOTS = 256
_SHORT_CALL_ROUNDS = 8
_MIN_LONG_CALL_SPLIT_SLOTS = 512


def split_plan(
    items: int, num_sms: int, topk: int, batch_invariant: bool = False, narrow: bool = False
) -> tuple[int, int]:
    """Which work items to cut into parts, as ``(split_begin, split_parts)``.

    The kernel runs one CTA per SM, each taking every num_sms-th work item (a query token and a block of
    64 heads), so the last round holds ``tail`` items and leaves the other SMs idle. When the tail is at
    most half a round, each of its items is cut into ``parts`` ranges of topk (as many as fill the round,
    within the limits above) that run side by side and are merged. ``(items, 1)`` means no split, which
    is always the plan in the batch-invariant mode: a split row sums its slots in another order than an
    unsplit one, and whether a row is split depends on how many rows the call has. ``narrow``: the call
    has at most 32 heads, so that unsplit it runs a narrow tile.
    """
    tail = items - (items - 1) // num_sms * num_sms  # items of the last round, 1..num_sms
    short = items <= _SHORT_CALL_ROUNDS * num_sms
    min_slots = _MIN_SPLIT_SLOTS if short else _MIN_LONG_CALL_SPLIT_SLOTS
    parts = min(_MAX_SPLIT_PARTS, num_sms // tail, topk // min_slots)
    if batch_invariant or items == 0 or parts < 2 or (narrow and not short):
        return items, 1
    return items - tail, parts


# Token groups (traits.cuh and token_groups/plan.cuh): heads up to which the narrow tile and groups apply,
# list entries per block of a group's masks, tokens per group at most (one owner bit each), slots per
# group at most (the pre-pass's owner bytes in shared memory), and how many union entries per valid
# slot of its tokens a group may have and still run grouped. A group weighs its list in the grouped
# tile against its tokens' slots in the narrow tile; the pre-pass is paid either way. Measured on an
# H200 (docs/lab.md, Experiments 42 and 44): a grouped entry costs 1.10-1.23 of a 64-head
# token's slot (2 to 8 tokens per group), a narrow slot 0.88, so a union pays below ~0.72-0.80 entries
# per slot. Where the kv rows outgrow L2 (s_kv 128K) a group reads its rows from DRAM: there unions
# of 0.65-0.75 ran 1.3% slower grouped than narrow, while falling back left the pre-pass (5%) unpaid
# for, so one threshold holds for both (MAX_UNION_RATIO, h_q 17-32). Up to 16 heads the narrow tile has
# 16 heads, and a slot costs 0.83 of the 32-head tile's (Experiment 60): on uniform
# selections at 8K-16K kv rows, with groups of 4 and 8, grouped and token by token break even at
# 0.645-0.65 entries per slot (MAX_UNION_RATIO_16). Up to 8 heads the narrow tile has 8, 10% cheaper
# again at 8K (Experiment 62): groups of 8 break even at 0.575-0.58 (MAX_UNION_RATIO_8).
NARROW_HEADS = 32
NARROW_16_HEADS = 16
NARROW_8_HEADS = 8
_B_TOPK = 64
_MAX_GROUP = 8
_MAX_GROUP_SLOTS = 16384
MAX_UNION_RATIO = 0.75
MAX_UNION_RATIO_16 = 0.65
MAX_UNION_RATIO_8 = 0.57


def max_union_ratio(h_q: int) -> float:
    """Union entries per valid slot up to which a group of tokens with ``h_q`` heads runs grouped."""
    if h_q <= NARROW_8_HEADS:
        return MAX_UNION_RATIO_8
    return MAX_UNION_RATIO_16 if h_q <= NARROW_16_HEADS else MAX_UNION_RATIO


def group_size(h_q: int, topk: int) -> int:
    """Tokens per group: as many as fill the 64-row tile, within the limits above; 1 means no groups."""
    if h_q > NARROW_HEADS:
        return 1
    size = min(_MAX_GROUP, HEAD_BLOCK // h_q, _MAX_GROUP_SLOTS // topk)
    return size if size >= 2 else 1


def num_sms(index: int) -> int:
    return _device(index).num_sms


# Tiles, as include/sparse_mla/sm90/prefill/tiles/select.cuh (launch_tile) picks them from a launch's head
# count and split: a split call runs the wide tile, a grouped call the grouped tile and then, for the groups
# that run token by token, a narrow one.
NARROW_TILES = ((NARROW_8_HEADS, "narrow8"), (NARROW_16_HEADS, "narrow16"), (NARROW_HEADS, "narrow32"))


def _unsplit_tile(h_q: int) -> str:
    return next((tile for heads, tile in NARROW_TILES if h_q <= heads), "wide")


class Plan(NamedTuple):
    """What one call launches, for its shape, GPU and mode.

    ``entry``: the module function it calls (jit/key.py); ``tiles``: the prefill kernel's tiles it
    launches, in order; ``split_begin``, ``split_parts``: the tail split (``split_plan``), the work items'
    count and 1 without one; ``group_size``, ``max_union_ratio``: the token groups, 1 and 0.0 without.
    ``scratch_bytes``: the scratch memory the entry carves (include/sparse_mla/entry.cuh, scratch_of),
    0 for none: a split call's ``split_parts`` parts of ``SPLIT_PART_FLOATS`` floats and one int32
    counter per split item, a grouped call the pre-pass's lists (``token_group_bytes``)."""

    entry: str
    tiles: tuple[str, ...]
    split_begin: int
    split_parts: int
    group_size: int
    max_union_ratio: float
    scratch_bytes: int


@functools.lru_cache(maxsize=4096)
def plan(s_q: int, h_q: int, topk: int, num_sms: int, batch_invariant: bool, token_groups: str = "auto") -> Plan:
    """The plan of a call with these extents on a GPU of ``num_sms`` SMs. ``token_groups``: ``auto``,
    ``always`` (every group grouped, save those in which a token selects a row more than once) or
    ``never``; the batch-invariant mode never plans token groups nor a tail split."""
    if token_groups not in env.TOKEN_GROUP_MODES:
        raise ValueError(f"token_groups must be one of {', '.join(env.TOKEN_GROUP_MODES)}, got {token_groups!r}")
    items = s_q * ((h_q + HEAD_BLOCK - 1) // HEAD_BLOCK)
    # Automatically, only past one token an SM: below, every token has an SM of its own, so the call
    # lasts as long as its longest CTA, and a group's walks the union of its tokens' selections (at
    # least one token's slots, each entry dearer than a narrow slot) after the pre-pass, a token's only
    # its own slots. Such a call runs token by token, split across the idle SMs where split_plan cuts it.
    grouped = token_groups == "always" or (token_groups == "auto" and s_q > num_sms)
    group = group_size(h_q, topk) if grouped and not batch_invariant else 1
    if group > 1:
        ratio = float("inf") if token_groups == "always" else max_union_ratio(h_q)
        return Plan(GROUPED_CALL_FUNCTION, ("grouped", _unsplit_tile(h_q)), items, 1, group, ratio,
                    token_group_bytes(s_q, group, topk))
    split_begin, split_parts = split_plan(items, num_sms, topk, batch_invariant, narrow=h_q <= NARROW_HEADS)
    if split_parts > 1:
        return Plan(SPLIT_CALL_FUNCTION, ("wide",), split_begin, split_parts, 1, 0.0,
                    _split_scratch_bytes(items, split_begin, split_parts))
    return Plan(ENTRY_FUNCTION, (_unsplit_tile(h_q),), items, 1, 1, 0.0, 0)


def _split_scratch_bytes(items: int, split_begin: int, split_parts: int) -> int:
    """A split call's scratch: each split item's parts (SPLIT_PART_FLOATS floats each) and its counter."""
    return 4 * (items - split_begin) * (split_parts * SPLIT_PART_FLOATS + 1)


# The module's entries of a call over the engines' paged cache, by the contiguous call's entry: the same
# launches (tiles, split, token groups) with paged rows (include/sparse_mla/sm90/prefill/gather.cuh).
_PAGED_ENTRIES = {ENTRY_FUNCTION: PAGED_CALL_FUNCTION, SPLIT_CALL_FUNCTION: PAGED_SPLIT_CALL_FUNCTION,
                  GROUPED_CALL_FUNCTION: PAGED_GROUPED_CALL_FUNCTION}


@functools.lru_cache(maxsize=4096)
def paged_plan(s_q: int, h_q: int, topk: int, num_sms: int, batch_invariant: bool, token_groups: str = "auto") -> Plan:
    """`plan` of a call over the paged cache: the same launches, through the module's paged entries."""
    return _through_paged_entries(plan(s_q, h_q, topk, num_sms, batch_invariant, token_groups))


def _through_paged_entries(call_plan: Plan) -> Plan:
    return call_plan._replace(entry=_PAGED_ENTRIES[call_plan.entry])


@functools.lru_cache(maxsize=None)
def _kernel_key(d_qk: int, topk: int) -> KernelKey:
    return KernelKey(d_qk=d_qk, topk=topk)  # built once per shape: the call path only looks it up


@functools.lru_cache(maxsize=4096)
def _planned_entry(device_index: int, d_qk: int, s_q: int, h_q: int, topk: int, batch_invariant: bool,
                   token_groups: str, paged: bool) -> tuple[Plan, Callable[..., None]]:
    """The plan and the module function of a call, decided on its first call (the Hopper check and the
    kernel's module, compiled on its very first use, included): later calls of the shape look them up.
    ``paged``: a call over the engines' paged cache (``paged_plan``)."""
    call_plan = plan_on(device_index, s_q, h_q, topk, batch_invariant, token_groups)
    if paged:
        call_plan = _through_paged_entries(call_plan)
    return call_plan, getattr(get_module(_kernel_key(d_qk, topk)), call_plan.entry)


def plan_on(device_index: int, s_q: int, h_q: int, topk: int, batch_invariant: bool, token_groups: str) -> Plan:
    """`plan` for CUDA device ``device_index``, which must be an SM90 GPU."""
    return plan(s_q, h_q, topk, num_sms(check_hopper(device_index)), batch_invariant, token_groups)


def launch(args: PrefillArgs) -> None:
    """Plans and launches a validated call, writing ``args.out``, ``args.max_logits`` and ``args.lse``; a
    call over the engines' paged cache (``args.kv`` the cache, ``args.kv_scale`` None) through the
    module's paged entries."""
    s_q, h_q, d_qk = args.q.shape
    if s_q == 0:
        return  # empty outputs, nothing to launch
    call_plan, function = _planned_entry(args.q.get_device(), d_qk, s_q, h_q, args.indices.shape[2],
                                         args.batch_invariant, env.token_groups(), args.kv_scale is None)
    execute(call_plan, function, args)


def execute(call_plan: Plan, function: Callable[..., Any], args: PrefillArgs) -> None:
    """Calls ``function``, the module entry ``call_plan.entry``, on ``args`` with the plan's scratch
    memory: one allocation per call from torch's caching allocator on the current stream (so that a
    concurrent call on another stream gets its own and a CUDA graph captures it), which the entry
    carves. The module zeroes the counters in it in a kernel ahead of the prefill kernel's launch, which
    a CUDA graph captures with it, so every replay starts from zero. The paged entries take no
    kv_scale (``args.kv_scale`` None)."""
    entry_args = args[:ENTRY_ARGS] if args.kv_scale is not None else (*args[:4], *args[5:ENTRY_ARGS])
    if call_plan.scratch_bytes == 0:
        function(*entry_args)
        return
    scratch = args.q.new_empty((call_plan.scratch_bytes,), dtype=torch.uint8)
    if call_plan.group_size > 1:
        function(*entry_args, call_plan.group_size, call_plan.max_union_ratio, scratch)
    else:
        function(*entry_args, call_plan.split_begin, call_plan.split_parts, scratch)


def token_group_list_shapes(s_q: int, group: int, topk: int) -> tuple[tuple[tuple[int, ...], torch.dtype], ...]:
    """Shape and dtype of each of the pre-pass's lists for s_q tokens in groups of ``group``, in the
    order entry.cuh lays them out in a call's scratch (token_group_layout): per group its 64-bit owner
    masks (per block of 64 entries that a pair of blocks can read, one word per token; traits.cuh), its
    list of kv rows (int32) and its length (int32), then the two launches' unit lists (int32: their two
    lengths, then at most every group, then at most every token; traits.cuh's group_units_size)."""
    groups = (s_q + group - 1) // group
    mask_blocks = (group * topk + 2 * _B_TOPK - 1) // (2 * _B_TOPK) * 2
    return (((groups, mask_blocks, group), torch.int64), ((groups, group * topk), torch.int32),
            ((groups,), torch.int32), ((2 + groups + s_q,), torch.int32))


def token_group_bytes(s_q: int, group: int, topk: int) -> int:
    """Bytes of the pre-pass's lists (token_group_list_shapes) in a call's scratch, each but the last
    padded to a 16-byte boundary. All uninitialized: the pre-pass's launch zeroes the unit lists' two
    lengths before it appends to them."""
    sizes = [math.prod(shape) * dtype.itemsize for shape, dtype in token_group_list_shapes(s_q, group, topk)]
    return sum((size + 15) // 16 * 16 for size in sizes[:-1]) + sizes[-1]
