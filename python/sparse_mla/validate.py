"""Argument checks of sparse_mla_q8kv8_prefill_fwd, on tensor metadata only.

Nothing here reads tensor values, synchronizes the device or touches a compiler: a rejected call never
reaches the JIT. The checks run in a fixed order (types, devices, dtypes, ranks and shapes, strides,
domain, outputs), so a call with several faults reports the first in that order. Everything except the
pointer checks (the 16-byte alignment of q and kv, aliasing: :func:`check_pointers`, which runs on the
real tensors at launch) also works on the fake tensors that torch.compile traces with.
"""

from __future__ import annotations

import math
from typing import Any, Optional

import torch

from sparse_mla.jit.key import SUPPORTED_D_QK

D_V = 512
H_KV = 1
INT32_MAX = 2**31 - 1
# The kernel counts its work items, one per (query row, block of 64 heads), in int, with room left for
# its CTA stride; include/sparse_mla/entry.cuh refuses more items with the same rule (kMaxItems).
HEAD_BLOCK = 64
MAX_WORK_ITEMS = INT32_MAX - (1 << 20)
# The kernel folds sm_scale * q_scale * kv_scale * log2(e) into one fp32 multiplier clamped to 2^100
# (no logit can overflow fp32 then; include/sparse_mla/sm90/prefill/kernel.cuh): with unit scales the
# clamp binds past |sm_scale| = 2^100 / log2(e), so larger values are refused.
MAX_SM_SCALE = 2.0**99
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


def _fail(message: str) -> None:
    raise ValueError(message)


# Each check tests its condition first and builds its message only on failure: this runs on every
# call, and formatting shapes eagerly would cost more than all the checks together.


def _check_shape(t: torch.Tensor, name: str, expected: tuple, meaning: str) -> None:
    if t.shape != expected:
        _fail(f"{name} must have shape {meaning} = {list(expected)}, got {list(t.shape)}")


def _check_contiguous(t: torch.Tensor, name: str) -> None:
    if not t.is_contiguous():
        _fail(f"{name} must be contiguous, got strides {list(t.stride())}")


def _check_last_dim_contiguous(t: torch.Tensor, name: str) -> None:
    if t.shape[-1] > 1 and t.stride(-1) != 1:
        _fail(f"{name} must have a contiguous last dimension (stride 1), got strides {list(t.stride())}")


def _check_no_self_overlap(t: torch.Tensor, name: str) -> None:
    """Two elements of an output must never share an address (a zero stride, say): the kernel would
    write both. Taking dimensions by increasing stride, each stride must step past everything the
    smaller ones span."""
    span = 1
    for stride, size in sorted((stride, size) for size, stride in zip(t.shape, t.stride()) if size > 1):
        if stride < span:
            _fail(f"{name} must not overlap itself, got shape {list(t.shape)} and strides {list(t.stride())}")
        span += stride * (size - 1)


_REQUIRED = ("q", "kv", "indices", "q_scale", "kv_scale")


class _Missing:
    def __repr__(self) -> str:
        return "<required>"


# The default of q_scale and kv_scale: they are required, but a call that leaves them out is most
# likely a FlashMLA-style call, and deserves that message rather than Python's "missing argument".
MISSING: Any = _Missing()  # Any: it stands in the signature for a required tensor


def _not_a_tensor(name: str, value) -> str:
    if value is MISSING:
        return (
            f"{name} is required (a one-element float32 CUDA tensor), got nothing; the arguments are (q, kv, "
            "indices, sm_scale, q_scale, kv_scale, d_v=512, attn_sink=None, topk_length=None)"
        )
    message = f"{name} must be a torch.Tensor, got {type(value).__name__}"
    if name == "q_scale" and type(value) is int:
        # FlashMLA's sparse prefill takes (q, kv, indices, sm_scale, d_v, ...): its d_v lands here.
        message += (
            f" {value}: this looks like a FlashMLA-style call (q, kv, indices, sm_scale, d_v); here the fifth "
            "and sixth arguments are q_scale and kv_scale (one-element float32 CUDA tensors) and d_v follows "
            "them: pass it as d_v=512"
        )
    return message


_TENSOR = torch.Tensor
_FP8, _I32, _F32, _BF16 = torch.float8_e4m3fn, torch.int32, torch.float32, torch.bfloat16


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
    if not _plainly_valid(q, kv, indices, sm_scale, q_scale, kv_scale, d_v, attn_sink, topk_length, out, max_logits,
                          lse):
        _check_in_order(q, kv, indices, sm_scale, q_scale, kv_scale, d_v, attn_sink, topk_length, out, max_logits, lse)


def _plainly_valid(q, kv, indices, sm_scale, q_scale, kv_scale, d_v, attn_sink, topk_length, out, max_logits, lse,
                   cuda: bool = True) -> bool:
    """True only for a call that passes every check of ``_check_in_order``, in fewer steps: plain tensors
    on one CUDA device, contiguous preallocated outputs, a float sm_scale. Anything else (a tensor
    subclass, a strided output, an int sm_scale, a fault) returns False and takes the ordered checks,
    which accept it or name its first fault. ``cuda=False`` asks the same of CPU tensors (for tests)."""
    if type(kv) is not _TENSOR or type(kv_scale) is not _TENSOR or kv.is_cuda is not cuda or kv_scale.is_cuda is not cuda:
        return False
    kv_shape = kv.shape
    if kv.dtype is not _FP8 or kv_scale.dtype is not _F32 or kv_scale.numel() != 1 or len(kv_shape) != 3:
        return False
    s_kv, h_kv, kv_d_qk = kv_shape
    kv_strides = kv.stride()
    if (h_kv != H_KV or not 1 <= s_kv <= INT32_MAX or kv_strides[2] != 1 or (s_kv > 1 and kv_strides[0] % ROW_ALIGNMENT)
            or kv_scale.get_device() != kv.get_device()):
        return False
    return _plainly_valid_rest(q, indices, sm_scale, q_scale, d_v, attn_sink, topk_length, out, max_logits, lse,
                               kv.get_device(), kv_d_qk, cuda)


def _plainly_valid_paged(q, kv_cache, indices, sm_scale, q_scale, d_v, attn_sink, topk_length, out, max_logits, lse,
                         cuda: bool = True) -> bool:
    """`_plainly_valid` of a call over the paged cache: True only where validate_paged_prefill_args accepts."""
    if type(kv_cache) is not _TENSOR or kv_cache.is_cuda is not cuda or kv_cache.element_size() != 1:
        return False
    shape, strides = kv_cache.shape, kv_cache.stride()
    if kv_cache.dtype is torch.bool or len(shape) != 4 or shape[2] != H_KV or shape[3] != PAGED_ROW_BYTES:
        return False
    num_blocks, block_size = shape[0], shape[1]
    if (strides[3] != 1 or (block_size > 1 and strides[1] != PAGED_ROW_BYTES)
            or (num_blocks > 1 and strides[0] % ROW_ALIGNMENT) or not 1 <= num_blocks * block_size <= INT32_MAX):
        return False
    return _plainly_valid_rest(q, indices, sm_scale, q_scale, d_v, attn_sink, topk_length, out, max_logits, lse,
                               kv_cache.get_device(), None, cuda)


def _plainly_valid_rest(q, indices, sm_scale, q_scale, d_v, attn_sink, topk_length, out, max_logits, lse, device: int,
                        kv_d_qk: Optional[int], cuda: bool) -> bool:
    """The shortcut's checks of every argument but the kv rows (on ``device``, of ``kv_d_qk`` columns;
    None: the paged cache's rows, which serve either head dimension)."""
    if type(sm_scale) is not float or not -MAX_SM_SCALE <= sm_scale <= MAX_SM_SCALE or type(d_v) is not int or d_v != D_V:
        return False
    if type(q) is not _TENSOR or type(indices) is not _TENSOR or type(q_scale) is not _TENSOR:
        return False
    if (q.is_cuda is not cuda or indices.is_cuda is not cuda or q_scale.is_cuda is not cuda or q.get_device() != device
            or indices.get_device() != device or q_scale.get_device() != device):
        return False
    if q.dtype is not _FP8 or indices.dtype is not _I32 or q_scale.dtype is not _F32:
        return False
    q_shape, indices_shape = q.shape, indices.shape
    if len(q_shape) != 3 or len(indices_shape) != 3:
        return False
    s_q, h_q, d_qk = q_shape
    topk = indices_shape[2]
    if (d_qk not in SUPPORTED_D_QK or (kv_d_qk is not None and kv_d_qk != d_qk) or indices_shape[0] != s_q
            or indices_shape[1] != H_KV or not 1 <= h_q <= INT32_MAX or not 1 <= topk <= INT32_MAX or s_q > INT32_MAX
            or s_q * -(-h_q // HEAD_BLOCK) > MAX_WORK_ITEMS or q_scale.numel() != 1):
        return False
    q_strides = q.stride()
    if (q_strides[2] != 1 or (s_q > 1 and q_strides[0] % ROW_ALIGNMENT) or (h_q > 1 and q_strides[1] % ROW_ALIGNMENT)
            or not indices.is_contiguous()):
        return False
    return ((attn_sink is None or _plain(attn_sink, cuda, device, _F32, (h_q,)))
            and (topk_length is None or _plain(topk_length, cuda, device, _I32, (s_q,)))
            and (out is None or _plain(out, cuda, device, _BF16, (s_q, h_q, D_V)))
            and (max_logits is None or _plain(max_logits, cuda, device, _F32, (s_q, h_q)))
            and (lse is None or _plain(lse, cuda, device, _F32, (s_q, h_q))))


def _plain(t, cuda: bool, device: int, dtype: torch.dtype, shape: tuple) -> bool:
    """A plain contiguous tensor of this dtype and shape on the device (contiguous: no self-overlap)."""
    return (type(t) is _TENSOR and t.is_cuda is cuda and t.get_device() == device and t.dtype is dtype
            and t.shape == shape and t.is_contiguous())


def _check_in_order(q, kv, indices, sm_scale, q_scale, kv_scale, d_v, attn_sink, topk_length, out, max_logits,
                    lse, paged_rows: Optional[int] = None) -> None:
    """Every check, in the documented order: raises on the first fault. ``paged_rows``: a call over the
    paged cache (validate_paged_prefill_args, which checked it) of that many rows, without kv and
    kv_scale."""
    tensors: tuple[tuple[str, Any], ...] = (
        ("q", q),
        ("kv", kv),
        ("indices", indices),
        ("q_scale", q_scale),
        ("kv_scale", kv_scale),
        ("attn_sink", attn_sink),
        ("topk_length", topk_length),
        ("out", out),
        ("max_logits", max_logits),
        ("lse", lse),
    )
    if paged_rows is not None:
        tensors = tuple((name, t) for name, t in tensors if name not in ("kv", "kv_scale"))
    for name, t in tensors:
        if not isinstance(t, torch.Tensor) and (t is not None or name in _REQUIRED):
            raise TypeError(_not_a_tensor(name, t))
    if isinstance(sm_scale, bool) or not isinstance(sm_scale, (int, float)):
        raise TypeError(f"sm_scale must be a Python float, got {type(sm_scale).__name__}")
    if isinstance(d_v, bool) or not isinstance(d_v, int):
        raise TypeError(f"d_v must be an int, got {type(d_v).__name__}")
    present = [(name, t) for name, t in tensors if t is not None]

    # Devices: every tensor is a CUDA tensor on q's device.
    for name, t in present:
        if not t.is_cuda:
            _fail(f"{name} must be a CUDA tensor, got {t.device}")
    device = q.device
    for name, t in present:
        if t.device != device:
            _fail(f"{name} must be on q's device {device}, got {t.device}")

    for name, t in present:
        if t.dtype is not EXPECTED_DTYPES[name]:
            _fail(f"{name} must have dtype {EXPECTED_DTYPES[name]}, got {t.dtype}")

    # Ranks and shapes.
    if q.dim() != 3:
        _fail(f"q must have 3 dimensions [s_q, h_q, d_qk], got shape {list(q.shape)}")
    if paged_rows is None and kv.dim() != 3:
        _fail(f"kv must have 3 dimensions [s_kv, h_kv, d_qk], got shape {list(kv.shape)}")
    if indices.dim() != 3:
        _fail(f"indices must have 3 dimensions [s_q, h_kv, topk], got shape {list(indices.shape)}")
    s_q, h_q, d_qk = q.shape
    s_kv, h_kv, kv_d_qk = kv.shape if paged_rows is None else (paged_rows, H_KV, d_qk)
    topk = indices.shape[2]
    if d_qk not in SUPPORTED_D_QK:
        _fail(f"q.shape[2] (d_qk) must be one of {list(SUPPORTED_D_QK)}, got {d_qk}")
    if h_kv != H_KV:
        _fail(f"kv.shape[1] (h_kv) must be {H_KV}, got {h_kv}")
    if kv_d_qk != d_qk:
        _fail(f"kv.shape[2] must equal q's d_qk {d_qk}, got {kv_d_qk}")
    if indices.shape[0] != s_q or indices.shape[1] != H_KV:
        _fail(f"indices must have shape [s_q, h_kv, topk] = [{s_q}, {H_KV}, topk], got {list(indices.shape)}")
    if d_v != D_V:
        _fail(f"d_v must be {D_V}, got {d_v}")
    for name, scale in (("q_scale", q_scale), ("kv_scale", kv_scale)):
        if scale is not None and scale.numel() != 1:
            _fail(f"{name} must have exactly one element, got shape {list(scale.shape)}")
    if attn_sink is not None:
        _check_shape(attn_sink, "attn_sink", (h_q,), "[h_q]")
    if topk_length is not None:
        _check_shape(topk_length, "topk_length", (s_q,), "[s_q]")

    # Domain: the extents the kernel supports.
    if h_q < 1:
        _fail(f"h_q (q.shape[1]) must be positive, got {h_q}")
    if s_kv < 1:
        _fail(f"s_kv (kv.shape[0]) must be positive, got {s_kv}")
    if topk < 1:
        _fail(f"topk (indices.shape[2]) must be positive, got {topk}")
    for name, extent in (("s_q", s_q), ("s_kv", s_kv), ("h_q", h_q), ("topk", topk)):
        if extent > INT32_MAX:
            _fail(f"{name} must fit in int32, got {extent}")
    if s_q * -(-h_q // HEAD_BLOCK) > MAX_WORK_ITEMS:
        _fail(
            f"s_q * ceil(h_q / {HEAD_BLOCK}) (the kernel's work items) must not exceed {MAX_WORK_ITEMS}, got "
            f"s_q {s_q} and h_q {h_q}"
        )
    if not math.isfinite(sm_scale) or abs(sm_scale) > MAX_SM_SCALE:
        _fail(f"sm_scale must be finite and at most 2^99 = {MAX_SM_SCALE:.3g} in magnitude, got {sm_scale}")

    # Strides: q and kv may be views with a contiguous last dimension; the small inputs are contiguous.
    for name, t in (("q", q), ("kv", kv)) if paged_rows is None else (("q", q),):
        _check_last_dim_contiguous(t, name)
        shape, strides = t.shape, t.stride()
        if (shape[0] > 1 and strides[0] % ROW_ALIGNMENT) or (shape[1] > 1 and strides[1] % ROW_ALIGNMENT):
            _fail(
                f"{name}'s strides must be multiples of {ROW_ALIGNMENT} elements except the last, "
                f"got strides {list(strides)}"
            )
    _check_contiguous(indices, "indices")
    if attn_sink is not None:
        _check_contiguous(attn_sink, "attn_sink")
    if topk_length is not None:
        _check_contiguous(topk_length, "topk_length")

    # Preallocated outputs.
    if out is not None:
        _check_shape(out, "out", (s_q, h_q, D_V), "[s_q, h_q, d_v]")
        _check_last_dim_contiguous(out, "out")
        _check_no_self_overlap(out, "out")
    for name, t in (("max_logits", max_logits), ("lse", lse)):
        if t is not None:
            _check_shape(t, name, (s_q, h_q), "[s_q, h_q]")
            _check_last_dim_contiguous(t, name)
            _check_no_self_overlap(t, name)


# The engines' paged FP8 cache (include/sparse_mla/sm90/prefill/gather.cuh, PagedRows): bytes a row.
PAGED_ROW_BYTES = 656


def validate_paged_prefill_args(q, kv_cache, indices, sm_scale, q_scale, d_v, attn_sink, topk_length, out, max_logits,
                                lse) -> None:
    """validate_prefill_args for a call over the paged cache: kv_cache first (a CUDA tensor on q's device,
    1-byte elements, [num_blocks, block_size, 1, 656], each block's rows contiguous, blocks a multiple
    of 16 bytes apart), then every other argument as the contiguous call's."""
    if _plainly_valid_paged(q, kv_cache, indices, sm_scale, q_scale, d_v, attn_sink, topk_length, out, max_logits, lse):
        return
    for name, t in (("q", q), ("kv_cache", kv_cache)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(_not_a_tensor(name, t))
    if not kv_cache.is_cuda:
        _fail(f"kv_cache must be a CUDA tensor, got {kv_cache.device}")
    if kv_cache.device != q.device:
        _fail(f"kv_cache must be on q's device {q.device}, got {kv_cache.device}")
    if kv_cache.element_size() != 1 or kv_cache.dtype is torch.bool:
        _fail(f"kv_cache must have 1-byte elements (uint8, or any 1-byte dtype), got {kv_cache.dtype}")
    if kv_cache.dim() != 4 or kv_cache.shape[2] != H_KV or kv_cache.shape[3] != PAGED_ROW_BYTES:
        _fail(f"kv_cache must have shape [num_blocks, block_size, 1, {PAGED_ROW_BYTES}], got {list(kv_cache.shape)}")
    num_blocks, block_size = kv_cache.shape[:2]
    strides = kv_cache.stride()
    if strides[3] != 1 or (block_size > 1 and strides[1] != PAGED_ROW_BYTES):
        _fail(f"kv_cache's rows must be contiguous within a block ({PAGED_ROW_BYTES} bytes apart), got strides "
              f"{list(strides)}")
    if num_blocks > 1 and strides[0] % ROW_ALIGNMENT:
        _fail(f"kv_cache's block stride must be a multiple of {ROW_ALIGNMENT} bytes, got {strides[0]}")
    rows = num_blocks * block_size
    if not 1 <= rows <= INT32_MAX:
        _fail(f"kv_cache must hold 1 to {INT32_MAX} rows (num_blocks * block_size), got {rows}")
    _check_in_order(q, None, indices, sm_scale, q_scale, None, d_v, attn_sink, topk_length, out, max_logits, lse,
                    paged_rows=rows)


def _byte_span(t: torch.Tensor) -> tuple[int, int]:
    start = t.data_ptr()
    if t.is_contiguous():
        return start, start + t.numel() * t.element_size()
    if t.numel() == 0:
        return start, start
    extent = sum((size - 1) * stride for size, stride in zip(t.shape, t.stride())) + 1
    return start, start + extent * t.element_size()


def check_row_alignment(q: torch.Tensor, kv: torch.Tensor, kv_name: str = "kv") -> None:
    """q and kv (or the paged call's kv_cache: ``kv_name``) start at 16-byte aligned addresses; needs real
    (not fake) tensors."""
    if q.data_ptr() % ROW_ALIGNMENT or kv.data_ptr() % ROW_ALIGNMENT:
        for name, tensor in (("q", q), (kv_name, kv)):
            if tensor.data_ptr() % ROW_ALIGNMENT:
                _fail(f"{name} must start at a {ROW_ALIGNMENT}-byte aligned address, got {tensor.data_ptr():#x}")


def check_pointers(inputs: dict[str, Optional[torch.Tensor]], outputs: dict[str, torch.Tensor]) -> None:
    """Alignment of q/kv (or kv_cache) and aliasing of the caller's preallocated outputs; needs real (not
    fake) tensors. Outputs the library allocated itself are not passed: they cannot overlap anything."""
    kv_name = "kv" if "kv" in inputs else "kv_cache"
    q, kv = inputs["q"], inputs[kv_name]
    assert q is not None and kv is not None  # required arguments, validated before
    check_row_alignment(q, kv, kv_name)
    if not outputs:
        return
    spans = [(name, _byte_span(t)) for name, t in (*inputs.items(), *outputs.items()) if t is not None]
    for i, (second, (b0, b1)) in enumerate(spans):
        if second not in outputs:
            continue
        for first, (a0, a1) in spans[:i]:  # inputs come first, then outputs
            if a0 < b1 and b0 < a1:
                _fail(f"{second} must not overlap {first} in memory")
