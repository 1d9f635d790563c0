"""Argument checks of sparse_mla_q8kv8_prefill_fwd (SPEC §5), on tensor metadata only.

Nothing here reads tensor values, synchronizes the device or touches a compiler: a rejected call never
reaches the JIT. The checks run in a fixed order (types, devices, dtypes, ranks and shapes, strides,
domain, outputs), so a call with several faults reports the first in that order. Everything except the
pointer checks (the 16-byte alignment of q and kv, aliasing: :func:`check_pointers`, which runs on the
real tensors at launch) also works on the fake tensors that torch.compile traces with.
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from sparse_mla.jit.key import SUPPORTED_D_QK

D_V = 512
H_KV = 1
INT32_MAX = 2**31 - 1
# q and kv rows are gathered with 16-byte vector loads (one e4m3 value is one byte).
ROW_ALIGNMENT = 16

EXPECTED_DTYPES = {
    "q": torch.float8_e4m3fn,
    "kv": torch.float8_e4m3fn,
    "indices": torch.int32,
    "q_scale": torch.float32,
    "kv_scale": torch.float32,
    "attn_sink": torch.float32,
    "topk_length": torch.int32,
    "out": torch.bfloat16,
    "max_logits": torch.float32,
    "lse": torch.float32,
}


def _shape(t: torch.Tensor) -> tuple:
    return tuple(t.shape)


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)


def _require_shape(t: torch.Tensor, name: str, expected: tuple, meaning: str) -> None:
    _require(_shape(t) == expected, f"{name} must have shape {meaning} = {list(expected)}, got {list(t.shape)}")


def _require_contiguous(t: torch.Tensor, name: str) -> None:
    _require(t.is_contiguous(), f"{name} must be contiguous, got strides {list(t.stride())}")


def _require_last_dim_contiguous(t: torch.Tensor, name: str) -> None:
    _require(
        t.shape[-1] <= 1 or t.stride(-1) == 1,
        f"{name} must have a contiguous last dimension (stride 1), got strides {list(t.stride())}",
    )


def validate_prefill_args(
    q,
    kv,
    indices,
    sm_scale,
    q_scale,
    kv_scale,
    d_v,
    attn_sink,
    topk_length,
    out,
    max_logits,
    lse,
) -> None:
    """Raise TypeError/ValueError naming the first argument that breaks the contract."""
    tensors = {
        "q": q,
        "kv": kv,
        "indices": indices,
        "q_scale": q_scale,
        "kv_scale": kv_scale,
        "attn_sink": attn_sink,
        "topk_length": topk_length,
        "out": out,
        "max_logits": max_logits,
        "lse": lse,
    }
    optional = ("attn_sink", "topk_length", "out", "max_logits", "lse")
    for name, t in tensors.items():
        if t is None and name in optional:
            continue
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if isinstance(sm_scale, bool) or not isinstance(sm_scale, (int, float)):
        raise TypeError(f"sm_scale must be a Python float, got {type(sm_scale).__name__}")
    if isinstance(d_v, bool) or not isinstance(d_v, int):
        raise TypeError(f"d_v must be an int, got {type(d_v).__name__}")
    present = {name: t for name, t in tensors.items() if t is not None}

    # Devices: every tensor is a CUDA tensor on q's device.
    for name, t in present.items():
        _require(t.device.type == "cuda", f"{name} must be a CUDA tensor")
    for name, t in present.items():
        _require(t.device == q.device, f"{name} must be on q's device {q.device}, got {t.device}")

    for name, t in present.items():
        _require(t.dtype == EXPECTED_DTYPES[name], f"{name} must have dtype {EXPECTED_DTYPES[name]}, got {t.dtype}")

    # Ranks and shapes.
    _require(q.dim() == 3, f"q must have 3 dimensions [s_q, h_q, d_qk], got shape {list(q.shape)}")
    _require(kv.dim() == 3, f"kv must have 3 dimensions [s_kv, h_kv, d_qk], got shape {list(kv.shape)}")
    _require(
        indices.dim() == 3,
        f"indices must have 3 dimensions [s_q, h_kv, topk], got shape {list(indices.shape)}",
    )
    s_q, h_q, d_qk = q.shape
    s_kv = kv.shape[0]
    topk = indices.shape[2]
    _require(d_qk in SUPPORTED_D_QK, f"q.shape[2] (d_qk) must be one of {list(SUPPORTED_D_QK)}, got {d_qk}")
    _require(kv.shape[1] == H_KV, f"kv.shape[1] (h_kv) must be {H_KV}, got {kv.shape[1]}")
    _require(kv.shape[2] == d_qk, f"kv.shape[2] must equal q's d_qk {d_qk}, got {kv.shape[2]}")
    _require(
        indices.shape[0] == s_q and indices.shape[1] == H_KV,
        f"indices must have shape [s_q, h_kv, topk] = [{s_q}, {H_KV}, topk], got {list(indices.shape)}",
    )
    _require(d_v == D_V, f"d_v must be {D_V}, got {d_v}")
    for name in ("q_scale", "kv_scale"):
        _require(present[name].numel() == 1, f"{name} must have exactly one element, got shape {list(present[name].shape)}")
    if attn_sink is not None:
        _require_shape(attn_sink, "attn_sink", (h_q,), "[h_q]")
    if topk_length is not None:
        _require_shape(topk_length, "topk_length", (s_q,), "[s_q]")

    # Domain (SPEC §4).
    _require(h_q >= 1, f"h_q (q.shape[1]) must be positive, got {h_q}")
    _require(s_kv >= 1, f"s_kv (kv.shape[0]) must be positive, got {s_kv}")
    _require(topk >= 1, f"topk (indices.shape[2]) must be positive, got {topk}")
    for name, extent in (("s_q", s_q), ("s_kv", s_kv), ("h_q", h_q), ("topk", topk)):
        _require(extent <= INT32_MAX, f"{name} must fit in int32, got {extent}")
    _require(math.isfinite(sm_scale), f"sm_scale must be finite, got {sm_scale}")

    # Strides: q and kv may be views with a contiguous last dimension; the small inputs are contiguous.
    _require_last_dim_contiguous(q, "q")
    _require_last_dim_contiguous(kv, "kv")
    for name in ("q", "kv"):
        t = present[name]
        for dim in range(t.dim() - 1):
            _require(
                t.shape[dim] <= 1 or t.stride(dim) % ROW_ALIGNMENT == 0,
                f"{name}'s strides must be multiples of {ROW_ALIGNMENT} elements except the last, "
                f"got strides {list(t.stride())}",
            )
    for name in ("indices", "attn_sink", "topk_length"):
        if tensors[name] is not None:
            _require_contiguous(tensors[name], name)

    # Preallocated outputs.
    if out is not None:
        _require_shape(out, "out", (s_q, h_q, D_V), "[s_q, h_q, d_v]")
        _require_last_dim_contiguous(out, "out")
    for name in ("max_logits", "lse"):
        if tensors[name] is not None:
            _require_shape(tensors[name], name, (s_q, h_q), "[s_q, h_q]")
            _require_last_dim_contiguous(tensors[name], name)


def _byte_span(t: torch.Tensor) -> tuple[int, int]:
    if t.numel() == 0:
        return (0, 0)
    start = t.data_ptr()
    extent = sum((size - 1) * stride for size, stride in zip(t.shape, t.stride())) + 1
    return start, start + extent * t.element_size()


def check_pointers(inputs: dict[str, Optional[torch.Tensor]], outputs: dict[str, torch.Tensor]) -> None:
    """Alignment of q/kv and aliasing of the outputs; needs real (not fake) tensors."""
    for name in ("q", "kv"):
        _require(
            inputs[name].data_ptr() % ROW_ALIGNMENT == 0,
            f"{name} must start at a {ROW_ALIGNMENT}-byte aligned address, got {inputs[name].data_ptr():#x}",
        )
    spans = {name: _byte_span(t) for name, t in {**inputs, **outputs}.items() if t is not None}
    names = list(spans)  # inputs first, then outputs
    for i, first in enumerate(names):
        for second in names[i + 1 :]:
            if second not in outputs:
                continue
            (a0, a1), (b0, b1) = spans[first], spans[second]
            _require(not (a0 < b1 and b0 < a1), f"{second} must not overlap {first} in memory")
