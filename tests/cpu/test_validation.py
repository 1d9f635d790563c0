"""Every validation rule: the exception type, the words of the message, and that a rejected call never
reaches the JIT. Tensors are fake CUDA tensors (metadata only), so no GPU is needed."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from fake_tensors import fake_cuda, valid_args
from sparse_mla import sparse_mla_q8kv8_prefill_fwd
from sparse_mla.args import PrefillArgs
from sparse_mla.jit import env
from sparse_mla.validate import HEAD_BLOCK, INT32_MAX, MAX_WORK_ITEMS, check_pointers, validate_prefill_args

TENSOR_ARGS = ["q", "kv", "indices", "q_scale", "kv_scale", "attn_sink", "topk_length", "out", "max_logits", "lse"]


def _full_args(**overrides):
    args = valid_args(sink=True, lengths=True, outputs=True)
    args.update(overrides)
    return args


def _rejects(error, match, **overrides):
    with pytest.raises(error, match=match):
        validate_prefill_args(**_full_args(**overrides))


def _cpu(t: torch.Tensor) -> torch.Tensor:
    return torch.empty(t.shape, dtype=t.dtype)


def test_valid_call_passes():
    validate_prefill_args(**_full_args())
    validate_prefill_args(**valid_args())  # optional arguments absent


@pytest.mark.parametrize("name", TENSOR_ARGS)
def test_cpu_tensor_is_rejected_before_the_jit(name, no_compiler):
    args = _full_args()
    args[name] = _cpu(args[name])
    with pytest.raises(ValueError, match=f"^{name} must be a CUDA tensor, got cpu$"):
        sparse_mla_q8kv8_prefill_fwd(**args)


def test_all_cpu_tensors_name_q_first(no_compiler):
    args = {k: (_cpu(v) if isinstance(v, torch.Tensor) else v) for k, v in _full_args().items()}
    with pytest.raises(ValueError, match="^q must be a CUDA tensor, got cpu$"):
        sparse_mla_q8kv8_prefill_fwd(**args)


def test_meta_tensor_is_named_in_the_message(no_compiler):
    args = _full_args(kv=torch.empty((100, 1, 576), dtype=torch.float8_e4m3fn, device="meta"))
    with pytest.raises(ValueError, match="^kv must be a CUDA tensor, got meta$"):
        sparse_mla_q8kv8_prefill_fwd(**args)


@pytest.mark.parametrize("extra", [(), (None,), (None, None)], ids=["d_v", "d_v+attn_sink", "d_v+sink+length"])
def test_flashmla_style_positional_d_v_names_the_likely_mistake(extra, no_compiler):
    """FlashMLA's sparse prefill is called (q, kv, indices, sm_scale, d_v, attn_sink, topk_length)."""
    args = valid_args()
    with pytest.raises(TypeError) as raised:
        sparse_mla_q8kv8_prefill_fwd(args["q"], args["kv"], args["indices"], args["sm_scale"], 512, *extra)
    message = str(raised.value)
    assert message.startswith("q_scale must be a torch.Tensor, got int 512: this looks like a FlashMLA-style call")
    assert "pass it as d_v=512" in message


def test_missing_scales_are_named(no_compiler):
    args = valid_args()
    with pytest.raises(TypeError, match=r"^q_scale is required \(a one-element float32 CUDA tensor\), got nothing"):
        sparse_mla_q8kv8_prefill_fwd(args["q"], args["kv"], args["indices"], args["sm_scale"])
    with pytest.raises(TypeError, match=r"^kv_scale is required"):
        sparse_mla_q8kv8_prefill_fwd(args["q"], args["kv"], args["indices"], args["sm_scale"], args["q_scale"])


@pytest.mark.parametrize("value", [1.0, None, "1"])
def test_other_non_tensor_scales_get_no_flashmla_hint(value):
    with pytest.raises(TypeError) as raised:
        validate_prefill_args(**_full_args(q_scale=value))
    assert str(raised.value) == f"q_scale must be a torch.Tensor, got {type(value).__name__}"


@pytest.mark.parametrize("name", [n for n in TENSOR_ARGS if n != "q"])
def test_mixed_devices_are_rejected(name, no_compiler):
    args = _full_args()
    other = args[name]
    args[name] = fake_cuda(other.shape, other.dtype, index=1)
    with pytest.raises(ValueError, match=f"^{name} must be on q's device cuda:0, got cuda:1$"):
        sparse_mla_q8kv8_prefill_fwd(**args)


@pytest.mark.parametrize(
    "name, shape, dtype",
    [
        ("q", (4, 16, 576), torch.bfloat16),
        ("q", (4, 16, 576), torch.float8_e5m2),
        ("kv", (100, 1, 576), torch.bfloat16),
        ("indices", (4, 1, 64), torch.int64),
        ("q_scale", (1,), torch.float64),
        ("kv_scale", (1,), torch.bfloat16),
        ("attn_sink", (16,), torch.bfloat16),
        ("topk_length", (4,), torch.int64),
        ("out", (4, 16, 512), torch.float16),
        ("max_logits", (4, 16), torch.bfloat16),
        ("lse", (4, 16), torch.float64),
    ],
)
def test_wrong_dtype(name, shape, dtype, no_compiler):
    args = _full_args(**{name: fake_cuda(shape, dtype)})
    with pytest.raises(ValueError, match=f"^{name} must have dtype .*, got {dtype}$"):
        sparse_mla_q8kv8_prefill_fwd(**args)


@pytest.mark.parametrize("name", ["q", "kv", "indices", "q_scale", "kv_scale"])
@pytest.mark.parametrize("value", [None, 3, [1.0], "x"])
def test_non_tensor_is_a_type_error(name, value):
    _rejects(TypeError, f"^{name} must be a torch.Tensor, got", **{name: value})


@pytest.mark.parametrize("name", ["attn_sink", "topk_length", "out", "max_logits", "lse"])
def test_optional_non_tensor_is_a_type_error(name):
    _rejects(TypeError, f"^{name} must be a torch.Tensor, got list", **{name: [0.0]})


@pytest.mark.parametrize("value", ["0.1", None, True, torch.tensor(0.1)])
def test_sm_scale_must_be_a_python_float(value):
    _rejects(TypeError, "^sm_scale must be a Python float", sm_scale=value)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
def test_sm_scale_must_be_finite(value):
    _rejects(ValueError, "sm_scale must be finite", sm_scale=value)


@pytest.mark.parametrize("value", [2.0**99 * (1 + 2**-52), -1e30, 1e33])
def test_sm_scale_past_the_kernels_range_is_refused(value):
    _rejects(ValueError, r"sm_scale must be finite and at most 2\^99 = 6.34e\+29 in magnitude, got", sm_scale=value)


@pytest.mark.parametrize("value", [2.0**99, -(2.0**99), -0.04])
def test_sm_scale_at_the_limit_and_negative_is_accepted(value):
    validate_prefill_args(**_full_args(sm_scale=value))


def test_batch_invariant_must_be_a_bool_or_none():
    from sparse_mla import sparse_mla_q8kv8_prefill_fwd

    with pytest.raises(TypeError, match=r"^batch_invariant must be True, False or None, got 1$"):
        sparse_mla_q8kv8_prefill_fwd(**_full_args(), batch_invariant=1)


def test_integer_sm_scale_is_accepted():
    validate_prefill_args(**_full_args(sm_scale=1))


@pytest.mark.parametrize(
    "overrides, match",
    [
        (dict(q=fake_cuda((4, 16), torch.float8_e4m3fn)), r"q must have 3 dimensions \[s_q, h_q, d_qk\]"),
        (dict(kv=fake_cuda((100, 576), torch.float8_e4m3fn)), r"kv must have 3 dimensions"),
        (dict(indices=fake_cuda((4, 64), torch.int32)), r"indices must have 3 dimensions"),
        (dict(q=fake_cuda((4, 16, 320), torch.float8_e4m3fn)), r"d_qk\) must be one of \[512, 576\], got 320"),
        (dict(kv=fake_cuda((100, 2, 576), torch.float8_e4m3fn)), r"h_kv\) must be 1, got 2"),
        (dict(kv=fake_cuda((100, 1, 512), torch.float8_e4m3fn)), r"kv.shape\[2\] must equal q's d_qk 576, got 512"),
        (dict(indices=fake_cuda((5, 1, 64), torch.int32)), r"indices must have shape \[s_q, h_kv, topk\] = \[4, 1, topk\]"),
        (dict(indices=fake_cuda((4, 2, 64), torch.int32)), r"indices must have shape"),
        (dict(d_v=256), r"d_v must be 512, got 256"),
        (dict(q_scale=fake_cuda((2,), torch.float32)), r"q_scale must have exactly one element"),
        (dict(kv_scale=fake_cuda((0,), torch.float32)), r"kv_scale must have exactly one element"),
        (dict(attn_sink=fake_cuda((8,), torch.float32)), r"attn_sink must have shape \[h_q\] = \[16\], got \[8\]"),
        (dict(topk_length=fake_cuda((4, 1), torch.int32)), r"topk_length must have shape \[s_q\] = \[4\]"),
        (dict(out=fake_cuda((4, 16, 576), torch.bfloat16)), r"out must have shape \[s_q, h_q, d_v\] = \[4, 16, 512\]"),
        (dict(max_logits=fake_cuda((4, 8), torch.float32)), r"max_logits must have shape \[s_q, h_q\] = \[4, 16\]"),
        (dict(lse=fake_cuda((16, 4), torch.float32)), r"lse must have shape \[s_q, h_q\] = \[4, 16\]"),
    ],
)
def test_rank_and_shape(overrides, match):
    _rejects(ValueError, match, **overrides)


def test_d_v_must_be_an_int():
    _rejects(TypeError, "d_v must be an int", d_v=512.0)


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: valid_args(h_q=0), r"h_q \(q.shape\[1\]\) must be positive, got 0"),
        (lambda: valid_args(s_kv=0), r"s_kv \(kv.shape\[0\]\) must be positive, got 0"),
        (lambda: valid_args(topk=0), r"topk \(indices.shape\[2\]\) must be positive, got 0"),
    ],
)
def test_domain(make, match):
    with pytest.raises(ValueError, match=match):
        validate_prefill_args(**make())


@pytest.mark.parametrize("s_q, h_q, topk", [(0, 16, 64), (1, 1, 1), (3, 100, 7), (2, 128, 2048), (5, 24, 100)])
def test_domain_accepts_any_positive_h_q_and_topk_and_empty_s_q(s_q, h_q, topk):
    validate_prefill_args(**valid_args(s_q=s_q, h_q=h_q, topk=topk, sink=True, lengths=True, outputs=True))


def test_strided_q_and_kv_with_contiguous_last_dim_are_accepted():
    q = fake_cuda((4, 16, 640), torch.float8_e4m3fn, view=lambda t: t[:, :, :576])  # slice of a projection
    q_heads = fake_cuda((4, 32, 576), torch.float8_e4m3fn, view=lambda t: t[:, ::2])  # every other head
    kv = fake_cuda((100, 1, 1152), torch.float8_e4m3fn, view=lambda t: t[:, :, 576:])  # second half of a row
    validate_prefill_args(**_full_args(q=q, kv=kv))
    validate_prefill_args(**_full_args(q=q_heads))


@pytest.mark.parametrize(
    "name, make, match",
    [
        ("q", lambda: fake_cuda((4, 576, 16), torch.float8_e4m3fn, view=lambda t: t.transpose(1, 2)), "q must have a contiguous last dimension"),
        ("kv", lambda: fake_cuda((100, 1, 1152), torch.float8_e4m3fn, view=lambda t: t[:, :, ::2]), "kv must have a contiguous last dimension"),
        ("q", lambda: fake_cuda((4, 16, 584), torch.float8_e4m3fn, view=lambda t: t[:, :, :576]), "q's strides must be multiples of 16"),
        ("kv", lambda: fake_cuda((100, 1, 580), torch.float8_e4m3fn, view=lambda t: t[:, :, :576]), "kv's strides must be multiples of 16"),
        ("indices", lambda: fake_cuda((4, 1, 128), torch.int32, view=lambda t: t[:, :, ::2]), "indices must be contiguous"),
        ("attn_sink", lambda: fake_cuda((32,), torch.float32, view=lambda t: t[::2]), "attn_sink must be contiguous"),
        ("topk_length", lambda: fake_cuda((8,), torch.int32, view=lambda t: t[::2]), "topk_length must be contiguous"),
        ("out", lambda: fake_cuda((4, 16, 1024), torch.bfloat16, view=lambda t: t[:, :, ::2]), "out must have a contiguous last dimension"),
        ("lse", lambda: fake_cuda((16, 4), torch.float32, view=lambda t: t.t()), "lse must have a contiguous last dimension"),
    ],
)
def test_strides(name, make, match):
    _rejects(ValueError, match, **{name: make()})


@pytest.mark.parametrize(
    "name, make",
    [
        ("out", lambda: fake_cuda((4, 1, 512), torch.bfloat16, view=lambda t: t.expand(4, 16, 512))),
        ("max_logits", lambda: fake_cuda((1, 16), torch.float32, view=lambda t: t.expand(4, 16))),
        ("lse", lambda: fake_cuda((4, 16), torch.float32, view=lambda t: t.as_strided((4, 16), (8, 1)))),
    ],
)
def test_an_output_overlapping_itself_is_rejected(name, make):
    _rejects(ValueError, f"^{name} must not overlap itself, got shape", **{name: make()})


@pytest.mark.parametrize("s_q, h_q", [(MAX_WORK_ITEMS + 1, 64), (MAX_WORK_ITEMS // 2 + 1, 65), (2**20, 64 * 2**11 + 1)])
def test_more_work_items_than_the_kernel_counts_are_rejected(s_q, h_q):
    with pytest.raises(ValueError, match=rf"^s_q \* ceil\(h_q / 64\) \(the kernel's work items\) must not exceed {MAX_WORK_ITEMS}, got"):
        validate_prefill_args(**valid_args(s_q=s_q, h_q=h_q, topk=1))


def test_the_most_work_items_are_accepted():
    validate_prefill_args(**valid_args(s_q=MAX_WORK_ITEMS, h_q=64, topk=1))
    validate_prefill_args(**valid_args(s_q=MAX_WORK_ITEMS // 2, h_q=128, topk=1))


def test_the_work_item_limit_is_the_c_plus_plus_entrys():
    """validate.py and include/sparse_mla/entry.cuh state one rule; a change to one must reach both."""
    entry = (env.include_dir() / "sparse_mla" / "entry.cuh").read_text()
    assert f"constexpr int64_t kMaxItems = INT32_MAX - (1 << {(INT32_MAX - MAX_WORK_ITEMS).bit_length() - 1});" in entry
    assert f"s_q * ((h_q + {HEAD_BLOCK - 1}) / {HEAD_BLOCK})" in entry


def test_the_tiers_collect_together():
    """Each tier has a conftest.py; test modules import helpers from modules of their own names."""
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "tests/cpu", "tests/gpu"],
        capture_output=True, text=True, timeout=300, cwd=Path(__file__).resolve().parents[2],
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


def test_strided_outputs_with_contiguous_last_dim_are_accepted():
    out = fake_cuda((4, 32, 512), torch.bfloat16, view=lambda t: t[:, 16:])
    lse = fake_cuda((4, 32), torch.float32, view=lambda t: t[:, :16])
    validate_prefill_args(**_full_args(out=out, lse=lse))


def _real(shape, dtype=torch.float32):
    return torch.empty(shape, dtype=dtype)


def _pointer_inputs():
    return dict(
        q=_real((2, 4, 576), torch.float8_e4m3fn),
        kv=_real((8, 1, 576), torch.float8_e4m3fn),
        indices=_real((2, 1, 4), torch.int32),
        q_scale=_real((1,)),
        kv_scale=_real((1,)),
        attn_sink=None,
        topk_length=None,
    )


def test_disjoint_outputs_pass_the_pointer_checks():
    outputs = dict(out=_real((2, 4, 512), torch.bfloat16), max_logits=_real((2, 4)), lse=_real((2, 4)))
    check_pointers(_pointer_inputs(), outputs)


def test_outputs_aliasing_each_other_are_rejected():
    buffer = _real((2, 4))
    with pytest.raises(ValueError, match="^lse must not overlap max_logits in memory$"):
        check_pointers(_pointer_inputs(), dict(max_logits=buffer, lse=buffer))
    stacked = _real((2, 2, 4))
    check_pointers(_pointer_inputs(), dict(max_logits=stacked[0], lse=stacked[1]))  # adjacent, disjoint


def test_output_overlapping_an_input_is_rejected():
    inputs = _pointer_inputs()
    storage = _real((2 * 4 * 512,), torch.bfloat16)  # 8192 bytes
    inputs["q"] = storage.view(torch.float8_e4m3fn)[: 2 * 4 * 576].view(2, 4, 576)
    out = storage.view(2, 4, 512)
    with pytest.raises(ValueError, match="^out must not overlap q in memory$"):
        check_pointers(inputs, dict(out=out))


def test_misaligned_q_pointer_is_rejected():
    inputs = _pointer_inputs()
    inputs["q"] = _real((2 * 4 * 576 + 1,), torch.float8_e4m3fn)[1:].view(2, 4, 576)
    with pytest.raises(ValueError, match="q must start at a 16-byte aligned address"):
        check_pointers(inputs, {})


def test_cpu_call_without_any_compiler_on_path_raises_the_documented_message(tmp_path):
    """In a fresh process with no nvcc, CUDA_HOME or ninja reachable: the documented message (the words
    serving engines match on, and the device it got), nothing built."""
    script = textwrap.dedent(
        """
        import sys, torch
        from sparse_mla import sparse_mla_q8kv8_prefill_fwd
        q = torch.zeros(2, 16, 576, dtype=torch.float8_e4m3fn)
        kv = torch.zeros(8, 1, 576, dtype=torch.float8_e4m3fn)
        indices = torch.zeros(2, 1, 64, dtype=torch.int32)
        scale = torch.ones(1)
        try:
            sparse_mla_q8kv8_prefill_fwd(q, kv, indices, 0.04, scale, scale)
        except ValueError as error:
            print("ERROR:", error)
        print("tvm_ffi imported:", "tvm_ffi" in sys.modules)
        """
    )
    environment = {k: v for k, v in os.environ.items() if k not in ("CUDA_HOME", "CUDA_PATH")}
    environment["PATH"] = str(tmp_path)  # an empty directory: no nvcc, no ninja, no c++
    environment["SPARSE_MLA_JIT_CACHE_DIR"] = str(tmp_path / "cache")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=environment, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "ERROR: q must be a CUDA tensor, got cpu\n" in result.stdout
    assert "tvm_ffi imported: False" in result.stdout
    assert not (tmp_path / "cache").exists()


def test_a_gpu_that_is_not_hopper_is_refused_before_the_jit(monkeypatch):
    import sparse_mla.launch as launch
    from sparse_mla.errors import UnsupportedGPUError

    monkeypatch.setattr(launch, "_DEVICES", {})
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda index: SimpleNamespace(major=8, minor=0, multi_processor_count=108))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index: "NVIDIA A100-SXM4-80GB")
    monkeypatch.setattr(launch, "get_module", lambda key: pytest.fail("reached the JIT"))
    args = valid_args(outputs=True)
    call = PrefillArgs(args["q"], args["kv"], args["indices"], args["q_scale"], args["kv_scale"], None, None,
                       args["out"], args["max_logits"], args["lse"], 0.04)
    with pytest.raises(UnsupportedGPUError, match=r"needs an SM90 \(Hopper.*A100-SXM4-80GB, compute capability 8.0"):
        launch.launch(call)
