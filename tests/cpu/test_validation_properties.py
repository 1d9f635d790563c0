"""Property-based validation: random valid calls pass; a random valid call with one rule broken for
one argument (its device, dtype, rank, type or layout) raises ValueError/TypeError naming that
argument, and never takes a step towards the compiler; the checks' shortcut for plain calls accepts
every valid call and nothing the ordered checks refuse; output aliasing is detected exactly."""

from __future__ import annotations

import re
from unittest import mock

import numpy as np
import pytest
import torch
from hypothesis import assume, given
from hypothesis import strategies as st

from fake_tensors import fake_cuda, valid_args
from seeds import hypothesis_run
from sparse_mla import api, launch
from sparse_mla import validate
from sparse_mla.validate import EXPECTED_DTYPES, check_pointers, validate_paged_prefill_args, validate_prefill_args

TENSORS = ["q", "kv", "indices", "q_scale", "kv_scale", "attn_sink", "topk_length", "out", "max_logits", "lse"]
DTYPES = [torch.float8_e4m3fn, torch.float8_e5m2, torch.bfloat16, torch.float16, torch.float32, torch.int32, torch.int64, torch.uint8]
SETTINGS = hypothesis_run(max_examples=300)


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


# The shape each tensor argument must have in a call of this shape.
def _expected_shape(name: str, args: dict) -> tuple:
    s_q, h_q, _ = args["q"].shape
    return {"attn_sink": (h_q,), "topk_length": (s_q,), "out": (s_q, h_q, 512), "max_logits": (s_q, h_q),
            "lse": (s_q, h_q)}.get(name) or tuple(args[name].shape)


def _mutate(draw, args, names=TENSORS) -> str:
    """Break one rule for one of ``names``; returns the argument the error must name."""
    name = draw(st.sampled_from(names))
    # One-element scales have no layout rule: a strided view of one is still a valid scale.
    kinds = ["device", "dtype", "rank", "type"] + ([] if name in ("q_scale", "kv_scale") else ["stride"])
    kind = draw(st.sampled_from(kinds))
    shape = _expected_shape(name, args)
    if kind == "device":
        device = draw(st.sampled_from(["cpu", "cuda:1"]))
        dtype = EXPECTED_DTYPES[name]
        args[name] = torch.empty(shape, dtype=dtype) if device == "cpu" else fake_cuda(shape, dtype, index=1)
    elif kind == "dtype":
        dtype = draw(st.sampled_from([d for d in DTYPES if d != EXPECTED_DTYPES[name]]))
        args[name] = fake_cuda(shape, dtype)
    elif kind == "rank":
        args[name] = fake_cuda(shape + (2,), EXPECTED_DTYPES[name])  # one dimension too many
    elif kind == "type":
        args[name] = draw(st.sampled_from([[1.0], "tensor", 3.5, object()]))
    elif name in ("q", "kv"):
        s0, s1, d = shape
        if s0 > 1 or s1 > 1:  # rows 8 elements longer: strides that are not multiples of 16
            args[name] = fake_cuda((s0, s1, d + 8), EXPECTED_DTYPES[name], view=lambda t: t[:, :, :d])
        else:  # a single row: every other element
            args[name] = fake_cuda((s0, s1, 2 * d), EXPECTED_DTYPES[name], view=lambda t: t[:, :, ::2])
    else:
        # Every other element of the last dimension: breaks the contiguity rules of these arguments
        # unless that dimension (or the whole tensor) is too small to tell.
        assume(shape[-1] > 1 and 0 not in shape)
        widened = shape[:-1] + (shape[-1] * 2,)
        args[name] = fake_cuda(widened, EXPECTED_DTYPES[name], view=lambda t: t[..., ::2])
    return name


@SETTINGS
@given(data=st.data())
def test_broken_calls_raise_the_documented_exception_and_never_compile(data):
    args = data.draw(valid_calls())
    expected_name = _mutate(data.draw, args)
    with mock.patch.object(launch, "get_module", side_effect=AssertionError("reached the JIT")):
        with pytest.raises((ValueError, TypeError)) as raised:
            api.sparse_mla_q8kv8_prefill_fwd(**args)
    message = str(raised.value)
    # The message starts with the argument's name, except when q moved to another GPU: then the first
    # other tensor is named as not being on q's device.
    named = re.match(rf"{expected_name}(?![a-z_])", message) or (expected_name == "q" and "on q's device" in message)
    assert named, (expected_name, message)


def _cpu_twins(args: dict) -> dict:
    """The call with each fake CUDA tensor replaced by a CPU tensor of its dtype, shape and strides: what
    the shortcut reads of a tensor, save its device (``cuda=False`` asks it of CPU tensors)."""
    return {name: torch.empty_strided(v.shape, v.stride(), dtype=v.dtype) if isinstance(v, torch.Tensor) else v
            for name, v in args.items()}


@SETTINGS
@given(valid_calls())
def test_the_shortcut_takes_every_valid_call(args):
    """Valid calls with contiguous outputs and a float sm_scale (all of valid_calls'): the common call
    never runs the ordered checks."""
    assert validate._plainly_valid(**_cpu_twins(args), cuda=False)


@SETTINGS
@given(data=st.data())
def test_the_shortcut_accepts_nothing_the_ordered_checks_refuse(data):
    args = data.draw(valid_calls())
    if data.draw(st.booleans()):
        _mutate(data.draw, args)
    # A tensor moved to another device has a twin on the one CPU device: device rules are the GPU tier's.
    assume(len({v.device for v in args.values() if isinstance(v, torch.Tensor)}) == 1)
    if validate._plainly_valid(**_cpu_twins(args), cuda=False):
        validate._check_in_order(**args)


@st.composite
def valid_paged_calls(draw):
    """valid_calls over a paged cache: kv and kv_scale replaced by [num_blocks, block_size, 1, 656] rows of a
    1-byte dtype, each block's rows contiguous, blocks `pad` rows further apart than their rows."""
    args = draw(valid_calls())
    del args["kv"], args["kv_scale"]
    block_size, pad = draw(st.sampled_from([1, 16, 64])), draw(st.sampled_from([0, 1, 3]))
    dtype = draw(st.sampled_from([torch.uint8, torch.int8, torch.float8_e4m3fn]))
    args["kv_cache"] = fake_cuda((draw(st.integers(1, 40)), block_size + pad, 1, 656), dtype,
                                 view=lambda t: t[:, :block_size])
    return args


def _mutate_cache(draw, args) -> None:
    """Break one rule of kv_cache: its device, element size, rank, row or block layout, or type."""
    num_blocks, block_size = args["kv_cache"].shape[:2]
    kind = draw(st.sampled_from(["device", "dtype", "rank", "rows", "blocks", "type"]))
    if kind == "device":
        args["kv_cache"] = torch.empty((num_blocks, block_size, 1, 656), dtype=torch.uint8)
    elif kind == "dtype":
        args["kv_cache"] = fake_cuda((num_blocks, block_size, 1, 328), draw(st.sampled_from([torch.int16, torch.bfloat16])))
    elif kind == "rank":
        args["kv_cache"] = fake_cuda((num_blocks * block_size, 1, 656), torch.uint8)
    elif kind == "rows":  # rows 8 bytes apart more than their length
        assume(block_size > 1)
        args["kv_cache"] = fake_cuda((num_blocks, block_size, 1, 664), torch.uint8, view=lambda t: t[..., :656])
    elif kind == "blocks":  # a block stride that is no multiple of 16 bytes
        assume(num_blocks > 1)
        stride = block_size * 656 + 8
        args["kv_cache"] = fake_cuda((num_blocks * stride,), torch.uint8,
                                     view=lambda t: t.as_strided((num_blocks, block_size, 1, 656), (stride, 656, 656, 1)))
    else:
        args["kv_cache"] = draw(st.sampled_from([[1.0], "cache", object()]))


@SETTINGS
@given(valid_paged_calls())
def test_valid_paged_calls_pass_and_take_the_shortcut(args):
    validate_paged_prefill_args(**args)  # fake tensors: the ordered checks
    assert validate._plainly_valid_paged(**_cpu_twins(args), cuda=False)


@SETTINGS
@given(data=st.data())
def test_the_paged_shortcut_accepts_nothing_the_ordered_checks_refuse(data):
    args = data.draw(valid_paged_calls())
    mutation = data.draw(st.sampled_from(["none", "cache", "other"]))
    if mutation == "cache":
        _mutate_cache(data.draw, args)
    elif mutation == "other":
        _mutate(data.draw, args, [name for name in TENSORS if name not in ("kv", "kv_scale")])
    assume(len({v.device for v in args.values() if isinstance(v, torch.Tensor)}) == 1)
    if validate._plainly_valid_paged(**_cpu_twins(args), cuda=False):
        validate_paged_prefill_args(**args)


@SETTINGS
@given(
    st.lists(st.tuples(st.integers(0, 4096), st.integers(1, 512)), min_size=3, max_size=3),
)
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


def _overlaps_itself(shape, strides) -> bool:
    offsets = np.zeros((), dtype=np.int64)
    for size, stride in zip(shape, strides):
        offsets = offsets[..., None] + np.arange(size) * stride
    return np.unique(offsets).size < offsets.size


@SETTINGS
@given(
    s_q=st.integers(1, 3),
    h_q=st.integers(1, 3),
    stride_s=st.integers(0, 3).map(lambda k: k * 256),
    stride_h=st.integers(0, 3).map(lambda k: k * 256),
)
def test_an_output_that_overlaps_itself_is_rejected(s_q, h_q, stride_s, stride_h):
    """A zero or too small stride makes two elements of out share an address: the kernel would write
    both. Brute force finds every such layout; validation must reject each."""
    shape, strides = (s_q, h_q, 512), (stride_s, stride_h, 1)
    assume(_overlaps_itself(shape, strides))
    args = valid_args(s_q=s_q, h_q=h_q, outputs=True)
    args["out"] = fake_cuda((1,), torch.bfloat16, view=lambda t: t.as_strided(shape, strides))
    with pytest.raises(ValueError, match=r"^out must not overlap itself"):
        validate_prefill_args(**args)


@SETTINGS
@given(
    s_q=st.integers(1, 4),
    h_q=st.integers(1, 4),
    steps=st.tuples(st.integers(1, 3), st.integers(1, 3)),
    pad=st.sampled_from([0, 64, 512]),
    heads_first=st.booleans(),
)
def test_an_output_viewed_from_a_larger_buffer_is_accepted(s_q, h_q, steps, pad, heads_first):
    """Slices with steps, and transposes, of a dense buffer never overlap themselves: all accepted."""
    step_s, step_h = steps
    if heads_first:  # a [h, s, d] buffer seen as [s, h, d]
        view = lambda t: t.transpose(0, 1)[::step_s, ::step_h, :512]  # noqa: E731
        base = (h_q * step_h, s_q * step_s, 512 + pad)
    else:
        view = lambda t: t[::step_s, ::step_h, :512]  # noqa: E731
        base = (s_q * step_s, h_q * step_h, 512 + pad)
    args = valid_args(s_q=s_q, h_q=h_q, outputs=True)
    args["out"] = fake_cuda(base, torch.bfloat16, view=view)
    assert tuple(args["out"].shape) == (s_q, h_q, 512)
    validate_prefill_args(**args)
