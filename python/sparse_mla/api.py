"""The public entry points: sparse_mla_q8kv8_prefill_fwd, and sparse_mla_q8kv8_paged_prefill_fwd over the
serving engines' paged FP8 cache.

The call path is: validate metadata (no device sync) -> allocate missing outputs -> one
:class:`~sparse_mla.args.PrefillArgs` -> the launch plan (:mod:`sparse_mla.launch`: decided on a shape's
first call, with the Hopper check and the kernel module for (d_qk, topk), compiled on its very first
use; looked up on later calls) -> one call into the module, which launches on the caller's current
CUDA stream. Under torch.compile the launch goes through the custom op
``sparse_mla::q8kv8_prefill_fwd_`` (it mutates the three outputs), so the call traces without a graph
break; in eager mode it is called directly, saving the dispatcher's overhead.
"""

from __future__ import annotations

from typing import Optional

import torch

from sparse_mla.args import PrefillArgs
from sparse_mla.jit import env
from sparse_mla.launch import launch
from sparse_mla.validate import (MISSING, check_pointers, check_row_alignment, validate_paged_prefill_args,
                                 validate_prefill_args)

__all__ = ["sparse_mla_q8kv8_paged_prefill_fwd", "sparse_mla_q8kv8_prefill_fwd"]


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
    batch_invariant: Optional[bool] = None,
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
        batch_invariant: ``True``: each row's outputs are bitwise the same whatever else the call holds
            (s_q, the row's position, the other rows' indices); this turns off the tail split, which
            sums the rows of a short call's last round in parts, and (h_q <= 32) the token groups, which
            compute a row with its neighbours' union of selections. ``False``: the default mode, which is
            run-to-run deterministic but not batch-invariant. ``None`` (the default): ``True`` when the
            environment variable ``SPARSE_MLA_BATCH_INVARIANT=1`` is set.

    Returns:
        ``(out, max_logits, lse)``: ``out[i, h] = sum_j softmax_j(s_ij) * V[indices[i, 0, j]]`` in bf16
        with ``s_ij = sm_scale * <Q[i, h], K[indices[i, 0, j]]>`` over the valid slots;
        ``max_logits = max_j s_ij`` and ``lse = ln sum_j exp(s_ij)``, natural-log units. A row with no
        valid slot gets ``out = 0``, ``max_logits = -inf``, ``lse = +inf``.

    Raises:
        TypeError, ValueError: a bad argument (before anything is compiled or launched).
        sparse_mla.errors.UnsupportedGPUError: q is not on an SM90 GPU.
        sparse_mla.errors.SparseMLAError subclasses: the kernel could not be compiled or loaded
            (KernelBuildError, ...), or the CUDA runtime refused its launch (KernelLaunchError).

    The kernel for each (d_qk, topk) is compiled on its first call (several seconds, announced on
    stderr) and cached on disk; ``sparse_mla.warmup(d_qk, topk)`` loads it at startup instead, and
    ``python -m sparse_mla prebuild`` compiles it ahead of time. The call does not synchronize the
    device and is safe inside CUDA graphs (once the kernel is loaded) and torch.compile. A call whose
    last round of 64-head work items over the SMs is at most half full (outside the batch-invariant
    mode; past 8 rounds only at topk >= 1024 and h_q > 32) takes a scratch workspace of at most 135 KB
    per SM from torch's caching allocator on the current stream; with at most 32 heads, so do the
    token groups' lists (5 bytes per slot of ``indices``), see :mod:`sparse_mla.launch`.
    """
    validate_prefill_args(
        q, kv, indices, sm_scale, q_scale, kv_scale, d_v, attn_sink, topk_length, out, max_logits, lse
    )
    batch_invariant = _mode(batch_invariant)
    preallocated, out, max_logits, lse = _outputs(q, d_v, out, max_logits, lse)
    if torch.compiler.is_compiling():
        torch.ops.sparse_mla.q8kv8_prefill_fwd_(
            q, kv, indices, q_scale, kv_scale, attn_sink, topk_length, out, max_logits, lse, float(sm_scale),
            batch_invariant,
        )
        return out, max_logits, lse
    args = PrefillArgs(q, kv, indices, q_scale, kv_scale, attn_sink, topk_length, out, max_logits, lse,
                       float(sm_scale), batch_invariant)
    _check_pointers_and_launch(args, preallocated)
    return out, max_logits, lse


def _mode(batch_invariant: Optional[bool]) -> bool:
    """The call's mode: ``batch_invariant`` as passed, or the environment's where None."""
    if batch_invariant is None:
        return env.batch_invariant()
    if not isinstance(batch_invariant, bool):
        raise TypeError(f"batch_invariant must be True, False or None, got {batch_invariant!r}")
    return batch_invariant


def _outputs(q: torch.Tensor, d_v: int, out: Optional[torch.Tensor], max_logits: Optional[torch.Tensor],
             lse: Optional[torch.Tensor]) -> tuple[Optional[dict], torch.Tensor, torch.Tensor, torch.Tensor]:
    """The caller's outputs by name (None if it passed none: they are checked against the inputs and each
    other at launch; the library's own cannot overlap anything), then out, max_logits and lse, each the
    caller's or a new tensor."""
    s_q, h_q, _ = q.shape
    preallocated = None
    if out is not None or max_logits is not None or lse is not None:
        preallocated = {name: t for name, t in zip(_OUTPUTS, (out, max_logits, lse)) if t is not None}
    if out is None:
        out = q.new_empty((s_q, h_q, d_v), dtype=torch.bfloat16)
    if max_logits is None:
        max_logits = q.new_empty((s_q, h_q), dtype=torch.float32)
    if lse is None:
        lse = q.new_empty((s_q, h_q), dtype=torch.float32)
    return preallocated, out, max_logits, lse


def _check_pointers_and_launch(args: PrefillArgs, preallocated: Optional[dict]) -> None:
    """The checks that need real tensors (row alignment; the caller's outputs against the inputs and each
    other, where it passed any), then the launch."""
    if preallocated is None:
        check_row_alignment(args.q, args.kv, "kv" if args.kv_scale is not None else "kv_cache")
    else:
        check_pointers(_named_inputs(args), preallocated)
    launch(args)


_INPUTS = ("q", "kv", "indices", "q_scale", "kv_scale", "attn_sink", "topk_length")
_PAGED_INPUTS = ("q", "kv_cache", "indices", "q_scale", "kv_scale", "attn_sink", "topk_length")  # kv_scale None
_OUTPUTS = ("out", "max_logits", "lse")


def _named_inputs(args: PrefillArgs) -> dict:
    return dict(zip(_INPUTS if args.kv_scale is not None else _PAGED_INPUTS, args))


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
    batch_invariant: bool,
) -> None:
    """The launch as a torch custom op, for torch.compile (arguments already validated)."""
    args = PrefillArgs(q, kv, indices, q_scale, kv_scale, attn_sink, topk_length, out, max_logits, lse, sm_scale,
                       batch_invariant)
    _check_pointers_and_launch(args, dict(zip(_OUTPUTS, args[7:10])))


@_prefill_op.register_fake
def _(q, kv, indices, q_scale, kv_scale, attn_sink, topk_length, out, max_logits, lse, sm_scale, batch_invariant) -> None:
    return None


def sparse_mla_q8kv8_paged_prefill_fwd(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    indices: torch.Tensor,
    sm_scale: float,
    q_scale: torch.Tensor = MISSING,
    d_v: int = 512,
    attn_sink: Optional[torch.Tensor] = None,
    topk_length: Optional[torch.Tensor] = None,
    *,
    out: Optional[torch.Tensor] = None,
    max_logits: Optional[torch.Tensor] = None,
    lse: Optional[torch.Tensor] = None,
    batch_invariant: Optional[bool] = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`sparse_mla_q8kv8_prefill_fwd` over the serving engines' paged FP8 latent cache, read in place.

    Args:
        kv_cache: ``[num_blocks, block_size, 1, 656]``, ``uint8`` or any 1-byte dtype: one 656-byte row
            per token as DeepSeek-V3.2-family engines write it (bytes 0-511: 512 ``float8_e4m3fn``
            "nope" values in 4 tiles of 128; 512-527: the tiles' 4 ``float32`` scales, value =
            e4m3 * scale; 528-655: the 64 "rope" values in ``bfloat16``, unused at d_qk 512). The rows
            of a block are contiguous; the block stride is free (a multiple of 16 bytes). Row j's key is
            its dequantized nope part followed (d_qk 576) by its rope part, its value the nope part.
        indices: ``[s_q, 1, topk]`` ``int32``: rows ``block * block_size + offset``; anything outside
            ``[0, num_blocks * block_size)`` is an invalid slot, skipped and never read.
        q, sm_scale, q_scale, d_v, attn_sink, topk_length, out, max_logits, lse, batch_invariant: as
            :func:`sparse_mla_q8kv8_prefill_fwd` (there is no kv_scale: each row carries its scales).

    Numerics: the kernel requantizes each gathered row to one scale, its largest tile scale (or its rope's
    amax / 448 if larger), and applies that scale to the row's logit and its share of ``out`` exactly:
    the tiles at that scale keep their bytes, every other value (rope included) is rounded once more
    to e4m3 (relative error at most 2^-4, values below 2^-10 of the row's largest flush to zero). The
    serving engines' path (dequantize, requantize at scale 1.0, then the contiguous kernel) rounds every
    value a second time. The launches (tiles, tail split, token groups) are the contiguous call's.
    """
    validate_paged_prefill_args(q, kv_cache, indices, sm_scale, q_scale, d_v, attn_sink, topk_length, out, max_logits,
                                lse)
    batch_invariant = _mode(batch_invariant)
    preallocated, out, max_logits, lse = _outputs(q, d_v, out, max_logits, lse)
    if torch.compiler.is_compiling():
        torch.ops.sparse_mla.q8kv8_paged_prefill_fwd_(
            q, kv_cache, indices, q_scale, attn_sink, topk_length, out, max_logits, lse, float(sm_scale),
            batch_invariant,
        )
        return out, max_logits, lse
    args = PrefillArgs(q, kv_cache, indices, q_scale, None, attn_sink, topk_length, out, max_logits, lse,
                       float(sm_scale), batch_invariant)
    _check_pointers_and_launch(args, preallocated)
    return out, max_logits, lse


@torch.library.custom_op("sparse_mla::q8kv8_paged_prefill_fwd_", mutates_args=("out", "max_logits", "lse"))
def _paged_prefill_op(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    indices: torch.Tensor,
    q_scale: torch.Tensor,
    attn_sink: Optional[torch.Tensor],
    topk_length: Optional[torch.Tensor],
    out: torch.Tensor,
    max_logits: torch.Tensor,
    lse: torch.Tensor,
    sm_scale: float,
    batch_invariant: bool,
) -> None:
    """The paged launch as a torch custom op, for torch.compile (arguments already validated)."""
    args = PrefillArgs(q, kv_cache, indices, q_scale, None, attn_sink, topk_length, out, max_logits, lse, sm_scale,
                       batch_invariant)
    _check_pointers_and_launch(args, dict(zip(_OUTPUTS, args[7:10])))


@_paged_prefill_op.register_fake
def _(q, kv_cache, indices, q_scale, attn_sink, topk_length, out, max_logits, lse, sm_scale, batch_invariant) -> None:
    return None
