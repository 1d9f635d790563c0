"""Property-based validation: random shapes, dtypes, devices, ranks, strides and
output aliasing give either a call that passes validation or ValueError/TypeError naming the argument,
never another exception and never a step towards the compiler."""

from __future__ import annotations

from unittest import mock

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import fake_cuda, valid_args
from sparse_mla import api
from sparse_mla.validate import EXPECTED_DTYPES, check_pointers, validate_prefill_args

TENSORS = ["q", "kv", "indices", "q_scale", "kv_scale", "attn_sink", "topk_length", "out", "max_logits", "lse"]
DTYPES = [torch.float8_e4m3fn, torch.float8_e5m2, torch.bfloat16, torch.float16, torch.float32, torch.int32, torch.int64, torch.uint8]
SETTINGS = settings(max_examples=300, deadline=None)


@st.composite
def valid_calls(draw):
    s_q = draw(st.integers(0, 9))
    h_q = draw(st.integers(1, 130))
    d_qk = draw(st.sampled_from([512, 576]))
    topk = draw(st.integers(1, 3000))
    s_kv = draw(st.integers(1, 5000))
    args = valid_args(
        s_q=s_q, h_q=h_q, d_qk=d_qk, s_kv=s_kv, topk=topk,
        sink=draw(st.booleans()), lengths=draw(st.booleans()), outputs=draw(st.booleans()),
    )
    # q and kv as views of wider buffers: valid when the padding keeps strides multiples of 16.
    q_pad = draw(st.sampled_from([0, 16, 64, 128]))
    kv_pad = draw(st.sampled_from([0, 16, 64, 576]))
    args["q"] = fake_cuda((s_q, h_q, d_qk + q_pad), torch.float8_e4m3fn, view=lambda t: t[:, :, :d_qk])
    args["kv"] = fake_cuda((s_kv, 1, d_qk + kv_pad), torch.float8_e4m3fn, view=lambda t: t[:, :, kv_pad:])
    return args


@SETTINGS
@given(valid_calls())
def test_valid_calls_pass(args):
    validate_prefill_args(**args)


def _mutate(draw, args):
    """Break one thing. Returns the argument name the error must mention, or None when the change may
    surface as another argument's error or (a stride change of a one-element view) break nothing."""
    name = draw(st.sampled_from(TENSORS))
    current = args[name]
    kind = draw(st.sampled_from(["device", "dtype", "rank", "type", "stride"]))
    reference = current if current is not None else args["q"]
    if kind == "device":
        device = draw(st.sampled_from(["cpu", "cuda:1"]))
        shape, dtype = reference.shape, reference.dtype
        args[name] = torch.empty(shape, dtype=dtype) if device == "cpu" else fake_cuda(shape, dtype, index=1)
        return name
    if kind == "dtype":
        dtype = draw(st.sampled_from([d for d in DTYPES if d != EXPECTED_DTYPES[name]]))
        args[name] = fake_cuda(reference.shape if current is not None else (1,), dtype)
        return name
    if kind == "rank":
        shape = tuple(reference.shape) if current is not None else (1,)
        new_shape = shape + (2,) if draw(st.booleans()) or len(shape) == 1 else shape[:-1]
        args[name] = fake_cuda(new_shape, EXPECTED_DTYPES[name])
        return None  # a rank change can surface as a shape error of a related argument
    if kind == "type":
        args[name] = draw(st.sampled_from([[1.0], "tensor", 3.5, object()]))
        return name
    # stride: a view that breaks the stride rules of this argument
    if name in ("q", "kv"):
        s0, s1, d = reference.shape
        args[name] = fake_cuda((s0, s1, d + 8), reference.dtype, view=lambda t: t[:, :, :d])
        if s0 <= 1 and s1 <= 1:
            args[name] = fake_cuda((s0, s1, 2 * d), reference.dtype, view=lambda t: t[:, :, ::2])
        return name if d > 1 else None
    shape = tuple(reference.shape) if current is not None else (4,)
    widened = shape[:-1] + (shape[-1] * 2,)
    args[name] = fake_cuda(widened, EXPECTED_DTYPES[name], view=lambda t: t[..., ::2])
    return None


@SETTINGS
@given(data=st.data())
def test_broken_calls_raise_the_documented_exception_and_never_compile(data):
    args = data.draw(valid_calls())
    expected_name = _mutate(data.draw, args)
    if expected_name is None:
        try:
            validate_prefill_args(**args)
        except (ValueError, TypeError):
            pass
        return
    with mock.patch.object(api, "get_module", side_effect=AssertionError("reached the JIT")):
        with pytest.raises((ValueError, TypeError)) as raised:
            api.sparse_mla_q8kv8_prefill_fwd(**args)
    message = str(raised.value)
    assert message.startswith(expected_name) or f" {expected_name}" in message, (expected_name, message)


@given(
    st.lists(st.tuples(st.integers(0, 4096), st.integers(1, 512)), min_size=3, max_size=3),
)
@settings(max_examples=300, deadline=None)
def test_output_aliasing_is_detected_exactly(ranges):
    """Outputs carved from one byte buffer at random offsets: rejected exactly when two overlap."""
    buffer = torch.empty(8192, dtype=torch.uint8)
    names = ["out", "max_logits", "lse"]
    outputs = {name: buffer[start : start + length] for name, (start, length) in zip(names, ranges)}
    inputs = dict(
        q=torch.empty(16, dtype=torch.uint8), kv=torch.empty(16, dtype=torch.uint8),
        indices=torch.empty(1, dtype=torch.int32), q_scale=torch.empty(1), kv_scale=torch.empty(1),
        attn_sink=None, topk_length=None,
    )
    spans = [(s, s + n) for s, n in ranges]
    overlapping = any(a0 < b1 and b0 < a1 for i, (a0, a1) in enumerate(spans) for (b0, b1) in spans[i + 1 :])
    if overlapping:
        with pytest.raises(ValueError, match="must not overlap"):
            check_pointers(inputs, outputs)
    else:
        check_pointers(inputs, outputs)
