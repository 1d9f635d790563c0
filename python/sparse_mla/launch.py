"""The launch plan of one prefill call, as ``include/sparse_mla/sm90/prefill/launch.cuh`` sees it.

Hopper check -> kernel key -> module (compiled on first use) -> tail split plan over the SMs ->
scratch workspace -> launch on the caller's current CUDA stream. The arguments were validated by
:mod:`sparse_mla.validate`; nothing here synchronizes the device.
"""

from __future__ import annotations

import functools
from typing import Any, Optional

import torch

from sparse_mla.errors import UnsupportedGPUError
from sparse_mla.jit import ENTRY_FUNCTION, KernelKey, get_module
from sparse_mla.validate import HEAD_BLOCK

__all__ = ["SPLIT_PART_FLOATS", "launch", "split_plan"]

# Compute capability per device index, read once: torch caches device properties, this saves the call.
_CAPABILITY: dict[int, tuple[int, int]] = {}


def check_hopper(device: torch.device) -> int:
    """Raises unless ``device`` is an SM90 GPU; returns its index."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    capability = _CAPABILITY.get(index)
    if capability is None:
        capability = _CAPABILITY.setdefault(index, torch.cuda.get_device_capability(index))
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
# that a part's work stays well above the cost of merging it, and at most 8 rounds of items: beyond, the
# last round is a small share of the call and the split's fixed costs (the kernel that zeroes the
# counters, the merges) outweigh what it saves.
SPLIT_PART_FLOATS = 256 * 128 + 256 * 4 + 64
_MAX_SPLIT_PARTS = 4
_MIN_SPLIT_SLOTS = 256
_MAX_SPLIT_ROUNDS = 8


def split_plan(items: int, num_sms: int, topk: int, batch_invariant: bool = False) -> tuple[int, int]:
    """Which work items to cut into parts, as ``(split_begin, split_parts)``.

    The kernel runs one CTA per SM, each taking every num_sms-th work item (a query token and a block of
    64 heads), so the last round holds ``tail`` items and leaves the other SMs idle. When the tail is at
    most half a round, each of its items is cut into ``parts`` ranges of topk (as many as fill the round,
    within the limits above) that run side by side and are merged. ``(items, 1)`` means no split, which
    is always the plan in the batch-invariant mode: a split row sums its slots in another order than an
    unsplit one, and whether a row is split depends on how many rows the call has.
    """
    tail = items - (items - 1) // num_sms * num_sms  # items of the last round, 1..num_sms
    parts = min(_MAX_SPLIT_PARTS, num_sms // tail, topk // _MIN_SPLIT_SLOTS)
    if batch_invariant or items == 0 or parts < 2 or items > _MAX_SPLIT_ROUNDS * num_sms:
        return items, 1
    return items - tail, parts


# SM count per device index, read once (the split plan needs it on every call).
_NUM_SMS: dict[int, int] = {}


def num_sms(index: int) -> int:
    count = _NUM_SMS.get(index)
    if count is None:
        count = _NUM_SMS.setdefault(index, torch.cuda.get_device_properties(index).multi_processor_count)
    return count


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
) -> None:
    """Launches the kernel on validated arguments, writing ``out``, ``max_logits`` and ``lse``.

    ``module`` is the kernel module to launch, by default the one of the call's (d_qk, topk) key;
    ``benchmarks/experiments`` passes modules built from other sources, to time them side by side.
    """
    if q.shape[0] == 0:
        return  # s_q = 0: empty outputs, nothing to launch
    device_index = check_hopper(q.device)
    if module is None:
        module = get_module(_kernel_key(q.shape[2], indices.shape[2]))
    s_q, h_q, _ = q.shape
    items = s_q * ((h_q + HEAD_BLOCK - 1) // HEAD_BLOCK)
    split_begin, split_parts = split_plan(items, num_sms(device_index), indices.shape[2], batch_invariant)
    workspace = counters = None
    if split_parts > 1:
        # Per call, from torch's caching allocator on the current stream: a concurrent call on another
        # stream gets its own, and a CUDA graph captures the zeroing of the counters with the launch,
        # so every replay starts from zero.
        workspace = q.new_empty((items - split_begin, split_parts, SPLIT_PART_FLOATS), dtype=torch.float32)
        counters = q.new_zeros((items - split_begin,), dtype=torch.int32)
    getattr(module, ENTRY_FUNCTION)(
        q,
        kv,
        indices,
        q_scale if q_scale.dim() == 1 else q_scale.reshape(1),  # the entry takes shape [1]
        kv_scale if kv_scale.dim() == 1 else kv_scale.reshape(1),
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
    )
