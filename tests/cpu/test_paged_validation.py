"""Argument checks and launch plan of sparse_mla_q8kv8_paged_prefill_fwd, on fake CUDA tensors (metadata
only, no GPU): the paged cache's own checks come first, then the contiguous call's for everything else;
the plan launches what the contiguous call's does, through the module's paged entries."""

from __future__ import annotations

import pytest
import torch

from fake_tensors import fake_cuda, valid_args
from sparse_mla import launch
from sparse_mla.jit.key import (ENTRY_FUNCTION, GROUPED_CALL_FUNCTION, PAGED_CALL_FUNCTION, PAGED_GROUPED_CALL_FUNCTION,
                                PAGED_SPLIT_CALL_FUNCTION, SPLIT_CALL_FUNCTION, KernelKey, generated_source)
from sparse_mla.validate import INT32_MAX, MISSING, check_pointers, validate_paged_prefill_args

H100_SMS = 132


def paged_args(num_blocks=8, block_size=64, **overrides):
    args = valid_args(sink=True, lengths=True, outputs=True)
    del args["kv"], args["kv_scale"]
    args["kv_cache"] = fake_cuda((num_blocks, block_size, 1, 656), torch.uint8)
    args.update(overrides)
    return args


def test_valid_paged_calls_pass():
    validate_paged_prefill_args(**paged_args())
    validate_paged_prefill_args(**paged_args(kv_cache=fake_cuda((3, 64, 1, 656), torch.float8_e4m3fn)))
    # a free block stride: blocks of 64 rows 65 rows apart
    validate_paged_prefill_args(**paged_args(kv_cache=fake_cuda((3, 65, 1, 656), torch.uint8, view=lambda t: t[:, :64])))


@pytest.mark.parametrize("cache, message", [
    (torch.empty((2, 64, 1, 656), dtype=torch.uint8), "kv_cache must be a CUDA tensor"),
    (fake_cuda((2, 64, 1, 656), torch.uint8, index=1), "kv_cache must be on q's device cuda:0"),
    (fake_cuda((2, 64, 1, 328), torch.int16), "1-byte elements"),
    (fake_cuda((2, 64, 1, 656), torch.bool), "1-byte elements"),
    (fake_cuda((2, 64, 656), torch.uint8), r"must have shape \[num_blocks, block_size, 1, 656\]"),
    (fake_cuda((2, 64, 2, 656), torch.uint8), r"must have shape"),
    (fake_cuda((2, 64, 1, 576), torch.uint8), r"must have shape"),
    (fake_cuda((64, 2, 1, 656), torch.uint8, view=lambda t: t.transpose(0, 1)), "rows must be contiguous within a block"),
    (fake_cuda((2, 64, 1, 1312), torch.uint8, view=lambda t: t[..., :656]), "rows must be contiguous within a block"),
    (fake_cuda((2 * 64 * 656 + 8,), torch.uint8, view=lambda t: t[:2 * 64 * 656].as_strided((2, 64, 1, 656), (64 * 656 + 8, 656, 656, 1))),
     "block stride must be a multiple of 16"),
    (fake_cuda((0, 64, 1, 656), torch.uint8), "must hold 1 to"),
])
def test_bad_caches_are_refused(cache, message):
    with pytest.raises(ValueError, match=message):
        validate_paged_prefill_args(**paged_args(kv_cache=cache))


def test_a_cache_of_more_than_int32_rows_is_refused():
    with pytest.raises(ValueError, match=f"1 to {INT32_MAX} rows"):
        validate_paged_prefill_args(**paged_args(kv_cache=fake_cuda((2**25, 64, 1, 656), torch.uint8)))


def test_the_other_arguments_are_checked_as_the_contiguous_calls_are():
    with pytest.raises(TypeError, match="kv_cache must be a torch.Tensor"):
        validate_paged_prefill_args(**paged_args(kv_cache=None))
    with pytest.raises(TypeError, match="q_scale is required"):
        validate_paged_prefill_args(**paged_args(q_scale=MISSING))
    with pytest.raises(ValueError, match="indices must have dtype torch.int32"):
        validate_paged_prefill_args(**paged_args(indices=fake_cuda((4, 1, 64), torch.int64)))
    with pytest.raises(ValueError, match=r"q.shape\[2\] \(d_qk\) must be one of"):
        validate_paged_prefill_args(**paged_args(q=fake_cuda((4, 16, 320), torch.float8_e4m3fn)))
    with pytest.raises(ValueError, match=r"out must have shape"):
        validate_paged_prefill_args(**paged_args(out=fake_cuda((4, 16, 256), torch.bfloat16)))


@pytest.mark.parametrize("s_q, h_q", [(16, 16), (4000, 128), (437, 64), (1024, 8), (4096, 16), (100, 32)])
@pytest.mark.parametrize("batch_invariant", [False, True])
def test_a_paged_call_launches_as_the_contiguous_call_does(s_q, h_q, batch_invariant):
    plan = launch.plan(s_q, h_q, 2048, H100_SMS, batch_invariant)
    paged = launch.paged_plan(s_q, h_q, 2048, H100_SMS, batch_invariant)
    entries = {ENTRY_FUNCTION: PAGED_CALL_FUNCTION, SPLIT_CALL_FUNCTION: PAGED_SPLIT_CALL_FUNCTION,
               GROUPED_CALL_FUNCTION: PAGED_GROUPED_CALL_FUNCTION}
    assert paged == plan._replace(entry=entries[plan.entry])


def test_the_module_exports_the_paged_entries():
    source = generated_source(KernelKey(576, 2048))
    for name in (PAGED_CALL_FUNCTION, PAGED_SPLIT_CALL_FUNCTION, PAGED_GROUPED_CALL_FUNCTION):
        assert f"TVM_FFI_DLL_EXPORT_TYPED_FUNC({name}, {name});" in source


def test_a_misaligned_cache_is_named_as_the_cache():
    q = torch.empty((4, 16, 576), dtype=torch.float8_e4m3fn)
    cache = torch.empty(2 * 64 * 656 + 8, dtype=torch.uint8)[8:].view(2, 64, 1, 656)
    assert cache.data_ptr() % 16 == 8 and q.data_ptr() % 16 == 0
    with pytest.raises(ValueError, match="kv_cache must start at a 16-byte aligned address"):
        check_pointers({"q": q, "kv_cache": cache, "kv_scale": None}, {})
