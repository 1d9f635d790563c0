"""The launch plan of one prefill call, as ``include/sparse_mla/sm90/prefill/launch.cuh`` sees it.

Hopper check -> kernel key -> module (compiled on first use) -> token groups or tail split plan ->
scratch workspace -> launch(es) on the caller's current CUDA stream. The arguments were validated by
:mod:`sparse_mla.validate`; nothing here synchronizes the device.

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
from typing import Any, NamedTuple, Optional

import torch

from sparse_mla.errors import UnsupportedGPUError
from sparse_mla.jit import ENTRY_FUNCTION, KernelKey, env, get_module
from sparse_mla.jit.key import GROUPED_CALL_FUNCTION
from sparse_mla.validate import HEAD_BLOCK

__all__ = ["SPLIT_PART_FLOATS", "group_size", "launch", "split_plan", "token_group_lists"]


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


def check_hopper(device: torch.device) -> int:
    """Raises unless ``device`` is an SM90 GPU; returns its index."""
    index = device.index if device.index is not None else torch.cuda.current_device()
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
# (include/sparse_mla/sm90/prefill/launch.cuh), so a call that would run a narrow tile (at most 32
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


@functools.lru_cache(maxsize=None)
def _kernel_key(d_qk: int, topk: int) -> KernelKey:
    return KernelKey(d_qk=d_qk, topk=topk)  # built once per shape: the call path only looks it up


def launch(
    q: torch.Tensor,
    kv: torch.Tensor,
    indices: torch.Tensor,
    q_scale: torch.Tensor,
    kv_scale: torch.Tensor,
    attn_sink: Optional[torch.Tensor],
    topk_length: Optional[torch.Tensor],
    out: torch.Tensor,
    max_logits: torch.Tensor,
    lse: torch.Tensor,
    sm_scale: float,
    batch_invariant: bool,
    module: Any = None,
    token_groups: Optional[str] = None,
) -> None:
    """Launches the kernel on validated arguments, writing ``out``, ``max_logits`` and ``lse``.

    ``module`` is the kernel module to launch, by default the one of the call's (d_qk, topk) key;
    ``benchmarks/ab.py`` passes modules built from other sources, to time them side by side.
    ``token_groups``: ``auto``, ``always`` (every group grouped, save those in which a token selects a row
    more than once) or ``never``; by default ``SPARSE_MLA_TOKEN_GROUPS`` (``auto``).
    """
    if q.shape[0] == 0:
        return  # s_q = 0: empty outputs, nothing to launch
    device_index = check_hopper(q.device)
    topk = indices.shape[2]
    if module is None:
        module = get_module(_kernel_key(q.shape[2], topk))
    s_q, h_q, _ = q.shape
    mode = env.token_groups() if token_groups is None else token_groups
    if mode not in env.TOKEN_GROUP_MODES:
        raise ValueError(f"token_groups must be one of {', '.join(env.TOKEN_GROUP_MODES)}, got {mode!r}")
    group = group_size(h_q, topk) if mode != "never" and not batch_invariant else 1
    if group > 1:
        _launch_token_groups(module, q, kv, indices, q_scale, kv_scale, attn_sink, topk_length, out, max_logits, lse,
                             sm_scale, group, every_group=mode == "always")
        return
    items = s_q * ((h_q + HEAD_BLOCK - 1) // HEAD_BLOCK)
    split_begin, split_parts = split_plan(items, num_sms(device_index), indices.shape[2], batch_invariant,
                                          narrow=h_q <= NARROW_HEADS)
    workspace = counters = None
    if split_parts > 1:
        # Per call, from torch's caching allocator on the current stream: a concurrent call on another
        # stream gets its own. The module zeroes the counters in a kernel ahead of the prefill kernel's
        # launch, which a CUDA graph captures with it, so every replay starts from zero.
        workspace = q.new_empty((items - split_begin, split_parts, SPLIT_PART_FLOATS), dtype=torch.float32)
        counters = q.new_empty((items - split_begin,), dtype=torch.int32)
    getattr(module, ENTRY_FUNCTION)(
        q,
        kv,
        indices,
        _scalar(q_scale),
        _scalar(kv_scale),
        attn_sink,
        topk_length,
        out,
        max_logits,
        lse,
        sm_scale,
        split_begin,
        split_parts,
        workspace,
        counters,
        1,
        None,
        None,
        None,
        None,
        False,
    )


def _scalar(scale: torch.Tensor) -> torch.Tensor:
    return scale if scale.dim() == 1 else scale.reshape(1)  # the entry takes shape [1]


def _launch_token_groups(module, q, kv, indices, q_scale, kv_scale, attn_sink, topk_length, out, max_logits, lse,
                         sm_scale: float, group: int, every_group: bool) -> None:
    """The pre-pass, then the grouped launch and the launch of the other groups' tokens, without a tail
    split, in one call into the module. The lists are per call, from torch's caching allocator on the
    current stream (CUDA-graph safe)."""
    s_q, h_q, _ = q.shape
    lists = token_group_lists(q.device, s_q, group, indices.shape[2])
    ratio = float("inf") if every_group else max_union_ratio(h_q)
    getattr(module, GROUPED_CALL_FUNCTION)(q, kv, indices, _scalar(q_scale), _scalar(kv_scale), attn_sink, topk_length,
                                           out, max_logits, lse, sm_scale, group, ratio, *lists)


def token_group_lists(device: torch.device, s_q: int, group: int, topk: int) -> tuple[torch.Tensor, ...]:
    """The pre-pass's outputs for s_q tokens in groups of ``group`` (from torch's caching allocator on
    the current stream): per group its list of kv rows (int32), its tokens' masks (per block of 64
    entries that a pair of blocks can read, one 64-bit word per token; traits.cuh) and its length
    (int32); and the two launches' unit lists (int32: their two lengths, then at most every group, then
    at most every token; traits.cuh's group_units_size). All uninitialized: the pre-pass's launch zeroes
    the two lengths before it appends to the lists (a kernel of its own, which the pre-pass overlaps)."""
    groups = (s_q + group - 1) // group
    mask_blocks = (group * topk + 2 * _B_TOPK - 1) // (2 * _B_TOPK) * 2
    return (torch.empty((groups, group * topk), dtype=torch.int32, device=device),
            torch.empty((groups, mask_blocks, group), dtype=torch.int64, device=device),
            torch.empty((groups,), dtype=torch.int32, device=device),
            torch.empty((2 + groups + s_q,), dtype=torch.int32, device=device))
