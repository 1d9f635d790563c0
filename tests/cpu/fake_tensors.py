"""CUDA-looking fake tensors (metadata only) and a valid argument set, for the validation tests.

A module of its own rather than conftest.py: test modules import these, and ``import conftest`` is
ambiguous when several test folders are collected at once (each has its own conftest.py).
"""

from __future__ import annotations

import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

_MODE = FakeTensorMode()


def fake_cuda(shape, dtype, *, index: int = 0, view=None) -> torch.Tensor:
    """A tensor that reports device cuda:<index> but holds no memory (a meta tensor underneath).

    ``view`` maps the base meta tensor to a view of it (slicing, transposition) before wrapping, so
    strides and storage offsets are the view's.
    """
    base = torch.empty(shape, dtype=dtype, device="meta")
    return FakeTensor(_MODE, view(base) if view else base, torch.device("cuda", index))


def valid_args(s_q=4, h_q=16, d_qk=576, s_kv=100, topk=64, *, sink=False, lengths=False, outputs=False):
    """Keyword arguments of a call that passes validation."""
    args = dict(
        q=fake_cuda((s_q, h_q, d_qk), torch.float8_e4m3fn),
        kv=fake_cuda((s_kv, 1, d_qk), torch.float8_e4m3fn),
        indices=fake_cuda((s_q, 1, topk), torch.int32),
        sm_scale=d_qk**-0.5,
        q_scale=fake_cuda((1,), torch.float32),
        kv_scale=fake_cuda((1,), torch.float32),
        d_v=512,
        attn_sink=fake_cuda((h_q,), torch.float32) if sink else None,
        topk_length=fake_cuda((s_q,), torch.int32) if lengths else None,
        out=fake_cuda((s_q, h_q, 512), torch.bfloat16) if outputs else None,
        max_logits=fake_cuda((s_q, h_q), torch.float32) if outputs else None,
        lse=fake_cuda((s_q, h_q), torch.float32) if outputs else None,
    )
    return args
