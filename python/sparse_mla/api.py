"""The public entry point: sparse_mla_q8kv8_prefill_fwd.

The call path is: validate metadata (no device sync) -> allocate missing outputs -> check the GPU is
Hopper -> fetch the kernel module for (d_qk, topk) from the in-process memo (compiling it on the very
first use) -> launch on the caller's current CUDA stream. Under torch.compile the launch goes through
the custom op ``sparse_mla::q8kv8_prefill_fwd_`` (it mutates the three outputs), so the call traces
without a graph break; in eager mode it is called directly, saving the dispatcher's overhead.
"""

from __future__ import annotations

import functools
from typing import Optional

import torch

from sparse_mla.errors import UnsupportedGPUError
from sparse_mla.jit import ENTRY_FUNCTION, KernelKey, get_module
from sparse_mla.validate import MISSING, check_pointers, validate_prefill_args

__all__ = ["sparse_mla_q8kv8_prefill_fwd"]


def sparse_mla_q8kv8_prefill_fwd(
    q: torch.Tensor,
    kv: torch.Tensor,
    indices: torch.Tensor,
    sm_scale: float,
    q_scale: torch.Tensor = MISSING,  # required: the default only lets validation explain a call without it
    kv_scale: torch.Tensor = MISSING,
    d_v: int = 512,
    attn_sink: Optional[torch.Tensor] = None,
    topk_length: Optional[torch.Tensor] = None,
    *,
    out: Optional[torch.Tensor] = None,
    max_logits: Optional[torch.Tensor] = None,
    lse: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """FP8 sparse MLA prefill attention on Hopper (SM90): each query row attends to its own topk rows.

    Args:
        q: ``[s_q, h_q, d_qk]`` ``float8_e4m3fn`` CUDA tensor; d_qk is 512 or 576; any h_q >= 1. May be a
            strided view whose last dimension is contiguous (strides multiples of 16).
        kv: ``[s_kv, 1, d_qk]`` ``float8_e4m3fn``: the shared latent KV cache (h_kv = 1); the first d_v
            columns of each row are its value vector. May be strided like q.
        indices: ``[s_q, 1, topk]`` ``int32``, contiguous: the KV rows each query row attends to. Any
            value outside ``[0, s_kv)`` marks an invalid slot, which is skipped and never read.
        sm_scale: softmax scale (Python float), applied to ``<Q, K>``.
        q_scale, kv_scale: one-element ``float32`` CUDA tensors, the per-tensor dequantization scales
            (``Q = q.float() * q_scale``, ``K = kv.float() * kv_scale``); read on the device.
        d_v: must be 512.
        attn_sink: optional ``[h_q]`` ``float32``: one extra logit per head with a zero value vector;
            scales ``out`` by ``exp(lse) / (exp(lse) + exp(attn_sink))``; enters neither lse nor
            max_logits.
        topk_length: optional ``[s_q]`` ``int32``: slot j of row i is used only if
            ``j < topk_length[i]`` (negative: none; above topk: all). Not checked on the host.
        out, max_logits, lse: optional preallocated outputs (``[s_q, h_q, 512]`` bf16, ``[s_q, h_q]``
            float32, ``[s_q, h_q]`` float32, each with a contiguous last dimension), written in place
            and returned.

    Returns:
        ``(out, max_logits, lse)``: ``out[i, h] = sum_j softmax_j(s_ij) * V[indices[i, 0, j]]`` in bf16
        with ``s_ij = sm_scale * <Q[i, h], K[indices[i, 0, j]]>`` over the valid slots;
        ``max_logits = max_j s_ij`` and ``lse = ln sum_j exp(s_ij)``, natural-log units. A row with no
        valid slot gets ``out = 0``, ``max_logits = -inf``, ``lse = +inf``.

    Raises:
        TypeError, ValueError: a bad argument (before anything is compiled or launched).
        sparse_mla.errors.UnsupportedGPUError: q is not on an SM90 GPU.
        sparse_mla.errors.SparseMLAError subclasses: the kernel could not be compiled or loaded.

    The kernel for each (d_qk, topk) is compiled on its first call (several seconds, announced on
    stderr) and cached on disk; ``sparse_mla.warmup(d_qk, topk)`` loads it at startup instead, and
    ``python -m sparse_mla prebuild`` compiles it ahead of time. The call does not synchronize the
    device and is safe inside CUDA graphs (once the kernel is loaded) and torch.compile. A short call
    (at most 8 rounds of 64-head work items over the SMs) takes a scratch workspace of at most 135 KB
    per SM from torch's caching allocator on the current stream.
    """
    validate_prefill_args(
        q, kv, indices, sm_scale, q_scale, kv_scale, d_v, attn_sink, topk_length, out, max_logits, lse
    )
    s_q, h_q, _ = q.shape
    preallocated = {name: t for name, t in (("out", out), ("max_logits", max_logits), ("lse", lse)) if t is not None}
    if out is None:
        out = q.new_empty((s_q, h_q, d_v), dtype=torch.bfloat16)
    if max_logits is None:
        max_logits = q.new_empty((s_q, h_q), dtype=torch.float32)
    if lse is None:
        lse = q.new_empty((s_q, h_q), dtype=torch.float32)
    if torch.compiler.is_compiling():
        torch.ops.sparse_mla.q8kv8_prefill_fwd_(
            q, kv, indices, q_scale, kv_scale, attn_sink, topk_length, out, max_logits, lse, float(sm_scale)
        )
    else:
        check_pointers(_named_inputs(q, kv, indices, q_scale, kv_scale, attn_sink, topk_length), preallocated)
        _launch(q, kv, indices, q_scale, kv_scale, attn_sink, topk_length, out, max_logits, lse, float(sm_scale))
    return out, max_logits, lse


def _named_inputs(q, kv, indices, q_scale, kv_scale, attn_sink, topk_length) -> dict:
    return {
        "q": q,
        "kv": kv,
        "indices": indices,
        "q_scale": q_scale,
        "kv_scale": kv_scale,
        "attn_sink": attn_sink,
        "topk_length": topk_length,
    }


# Compute capability per device index, read once: torch caches device properties, this saves the call.
_CAPABILITY: dict[int, tuple[int, int]] = {}


def _check_hopper(device: torch.device) -> int:
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


# The kernel's tail split (include/sparse_mla/sm90/prefill/split.cuh): floats of one part's state in the
# workspace (256 consumer threads x (128 O^T values + 4 row statistics) + 64 head references), at most
# 4 parts per item, at least 2 pairs of 64-row blocks (256 slots) per part, so that a part's work stays
# well above the cost of merging it, and at most 8 rounds of items: beyond, the last round is a small
# share of the call and the split's fixed costs (the kernel that zeroes the counters, the merges)
# outweigh what it saves.
SPLIT_PART_FLOATS = 256 * 128 + 256 * 4 + 64
_MAX_SPLIT_PARTS = 4
_MIN_SPLIT_SLOTS = 256
_MAX_SPLIT_ROUNDS = 8


def _split_plan(items: int, num_sms: int, topk: int) -> tuple[int, int]:
    """Which work items to cut into parts, as ``(split_begin, split_parts)``.

    The kernel runs one CTA per SM, each taking every num_sms-th work item (a query token and a block of
    64 heads), so the last round holds ``tail`` items and leaves the other SMs idle. When the tail is at
    most half a round, each of its items is cut into ``parts`` ranges of topk (as many as fill the round,
    within the limits above) that run side by side and are merged. ``(items, 1)`` means no split.
    """
    tail = items - (items - 1) // num_sms * num_sms  # items of the last round, 1..num_sms
    parts = min(_MAX_SPLIT_PARTS, num_sms // tail, topk // _MIN_SPLIT_SLOTS)
    if items == 0 or parts < 2 or items > _MAX_SPLIT_ROUNDS * num_sms:
        return items, 1
    return items - tail, parts


# SM count per device index, read once (the split plan needs it on every call).
_NUM_SMS: dict[int, int] = {}


def _num_sms(index: int) -> int:
    count = _NUM_SMS.get(index)
    if count is None:
        count = _NUM_SMS.setdefault(index, torch.cuda.get_device_properties(index).multi_processor_count)
    return count


@functools.lru_cache(maxsize=None)
def _kernel_key(d_qk: int, topk: int) -> KernelKey:
    return KernelKey(d_qk=d_qk, topk=topk)  # built once per shape: the call path only looks it up


def _launch(q, kv, indices, q_scale, kv_scale, attn_sink, topk_length, out, max_logits, lse, sm_scale):
    if q.shape[0] == 0:
        return  # s_q = 0: empty outputs, nothing to launch
    device_index = _check_hopper(q.device)
    module = get_module(_kernel_key(q.shape[2], indices.shape[2]))
    s_q, h_q, _ = q.shape
    items = s_q * ((h_q + 63) // 64)
    split_begin, split_parts = _split_plan(items, _num_sms(device_index), indices.shape[2])
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


@torch.library.custom_op("sparse_mla::q8kv8_prefill_fwd_", mutates_args=("out", "max_logits", "lse"))
def _prefill_op(
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
) -> None:
    """The launch as a torch custom op, for torch.compile (arguments already validated)."""
    check_pointers(
        _named_inputs(q, kv, indices, q_scale, kv_scale, attn_sink, topk_length),
        {"out": out, "max_logits": max_logits, "lse": lse},
    )
    _launch(q, kv, indices, q_scale, kv_scale, attn_sink, topk_length, out, max_logits, lse, sm_scale)


@_prefill_op.register_fake
def _(q, kv, indices, q_scale, kv_scale, attn_sink, topk_length, out, max_logits, lse, sm_scale) -> None:
    return None
