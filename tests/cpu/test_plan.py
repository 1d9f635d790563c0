"""The launch plan: which module entry and tiles a call gets, that the batch-invariant mode never plans
token groups or a tail split, that a shape is planned once, that the grouped tile is reachable only
behind its own pre-pass, and that a refused launch raises KernelLaunchError."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from fake_tensors import fake_cuda
from sparse_mla import launch
from sparse_mla.args import PrefillArgs
from sparse_mla.errors import KernelLaunchError, SparseMLAError
from sparse_mla.jit.cache import load_tvm_module
from sparse_mla.jit.key import ENTRY_FUNCTION, GROUPED_CALL_FUNCTION, LAUNCH_ERROR_KIND, SPLIT_CALL_FUNCTION
from sparse_mla.testing import token_group_lists

ENTRY = (Path(__file__).resolve().parents[2] / "include" / "sparse_mla" / "entry.cuh").read_text()
H100_SMS = 132


@pytest.mark.parametrize(
    "s_q, h_q, topk, mode, entry, tiles",
    [
        (4000, 128, 2048, "auto", ENTRY_FUNCTION, ("wide",)),  # 61 rounds, the last more than half full
        (64, 128, 2048, "auto", ENTRY_FUNCTION, ("wide",)),
        (437, 64, 2048, "auto", SPLIT_CALL_FUNCTION, ("wide",)),  # 41 items in the 4th round: 3 parts each
        (4096, 128, 2048, "auto", SPLIT_CALL_FUNCTION, ("wide",)),
        (16, 32, 2048, "never", SPLIT_CALL_FUNCTION, ("wide",)),  # a split call runs the wide tile
        (1024, 32, 2048, "never", ENTRY_FUNCTION, ("narrow32",)),
        (1024, 16, 2048, "never", ENTRY_FUNCTION, ("narrow16",)),
        (100, 8, 2048, "never", ENTRY_FUNCTION, ("narrow8",)),
        (4096, 16, 2048, "auto", GROUPED_CALL_FUNCTION, ("grouped", "narrow16")),
        (16, 32, 2048, "always", GROUPED_CALL_FUNCTION, ("grouped", "narrow32")),
        (1024, 8, 2048, "auto", GROUPED_CALL_FUNCTION, ("grouped", "narrow8")),
        (133, 16, 2048, "auto", GROUPED_CALL_FUNCTION, ("grouped", "narrow16")),  # past one token an SM
        (132, 16, 2048, "auto", ENTRY_FUNCTION, ("narrow16",)),  # a token an SM: no groups
        (64, 8, 2048, "auto", SPLIT_CALL_FUNCTION, ("wide",)),  # ... and split where split_plan cuts it
        (64, 8, 2048, "always", GROUPED_CALL_FUNCTION, ("grouped", "narrow8")),
        (1024, 16, 16384, "auto", ENTRY_FUNCTION, ("narrow16",)),  # no group of two fits the pre-pass's table
    ],
)
def test_examples(s_q, h_q, topk, mode, entry, tiles):
    plan = launch.plan(s_q, h_q, topk, H100_SMS, False, mode)
    assert (plan.entry, plan.tiles) == (entry, tiles), plan
    assert (plan.split_parts > 1) == (entry == SPLIT_CALL_FUNCTION)
    assert (plan.group_size > 1) == (entry == GROUPED_CALL_FUNCTION)


def test_the_plan_carries_the_split_and_group_decisions():
    split = launch.plan(437, 64, 2048, H100_SMS, False)
    assert (split.split_begin, split.split_parts) == launch.split_plan(437, H100_SMS, 2048) == (396, 3)
    grouped = launch.plan(4096, 16, 2048, H100_SMS, False, "auto")
    assert (grouped.group_size, grouped.max_union_ratio) == (launch.group_size(16, 2048), launch.MAX_UNION_RATIO_16)
    assert launch.plan(4096, 16, 2048, H100_SMS, False, "always").max_union_ratio == float("inf")


@pytest.mark.parametrize("mode", ["auto", "always", "never"])
def test_the_batch_invariant_mode_never_plans_token_groups_or_a_split(mode):
    """A row's group and its split depend on its position in the call and on how many rows the call
    has: neither may ever be planned in the batch-invariant mode, at any head count, length or GPU."""
    for num_sms in (78, 114, 132):
        for topk in (64, 512, 2048, 8192):
            for h_q in range(1, 130):
                for s_q in (1, 2, 3, 7, 16, 64, 100, 437, 1000, 4096):
                    plan = launch.plan(s_q, h_q, topk, num_sms, True, mode)
                    context = f"s_q {s_q}, h_q {h_q}, topk {topk}, {num_sms} SMs, {mode}: {plan}"
                    assert plan.entry == ENTRY_FUNCTION and plan.group_size == 1 and plan.split_parts == 1, context


def test_the_overhead_benchmark_measures_the_paths_it_names(overhead):
    for row in overhead.ROWS:
        plan = launch.plan(row.s_q, row.h_q, overhead.TOPK, H100_SMS, row.batch_invariant, row.token_groups)
        entry = {"wide": ENTRY_FUNCTION, "narrow": ENTRY_FUNCTION, "split": SPLIT_CALL_FUNCTION,
                 "grouped": GROUPED_CALL_FUNCTION}[row.path.split()[-1]]
        assert plan.entry == entry and (row.path.split()[-1] != "narrow" or plan.tiles[0].startswith("narrow")), (row, plan)


def test_a_shape_is_planned_on_its_first_call_only(monkeypatch):
    """The Hopper check, the module lookup and the plan run once per (device, shape, mode); later calls
    look them up and go straight to the module entry."""
    steps, entries = [], []

    class Module:
        def __getattr__(self, name):
            return lambda *args: entries.append((name, len(args)))

    monkeypatch.setattr(launch, "check_hopper", lambda index: steps.append("check_hopper") or index)
    monkeypatch.setattr(launch, "num_sms", lambda index: H100_SMS)
    monkeypatch.setattr(launch, "get_module", lambda key: steps.append("get_module") or Module())
    monkeypatch.setenv("SPARSE_MLA_TOKEN_GROUPS", "auto")
    launch._planned_entry.cache_clear()
    try:
        for s_q, h_q in ((300, 64), (200, 64), (300, 64), (200, 64), (300, 64)):
            q = fake_cuda((s_q, h_q, 576), torch.float8_e4m3fn)
            scale = fake_cuda((1,), torch.float32)
            launch.launch(PrefillArgs(q, fake_cuda((64, 1, 576), torch.float8_e4m3fn),
                                      fake_cuda((s_q, 1, 2048), torch.int32), scale, scale, None, None,
                                      fake_cuda((s_q, h_q, 512), torch.bfloat16), fake_cuda((s_q, h_q), torch.float32),
                                      fake_cuda((s_q, h_q), torch.float32), 0.04))
    finally:
        launch._planned_entry.cache_clear()
    assert steps == ["check_hopper", "get_module"] * 2  # the two shapes' first calls
    split, whole = (SPLIT_CALL_FUNCTION, 14), (ENTRY_FUNCTION, 11)  # 300 x 64 heads splits on 132 SMs
    assert entries == [split, whole, split, whole, split]


def _function_body(name: str) -> str:
    start = re.search(rf"\nvoid {name}\(", ENTRY)
    assert start, name
    return ENTRY[start.start():ENTRY.index("\n}\n", start.start())]


def test_the_grouped_tile_runs_only_behind_its_own_pre_pass():
    """The grouped launch reads the lists the token groups' pre-pass writes: only the grouped call's
    entry launches it, right after launching that pre-pass on the same stream; no other entry takes a
    list or a flag that would let a caller launch it on lists not yet written."""
    grouped_launches = [m.start() for m in re.finditer(r"launch_prefill<D_QK, TOPK, LAYOUT>\(params, true", ENTRY)]
    body = _function_body("launch_token_groups_call")
    assert len(grouped_launches) == 1 and ENTRY.index(body) < grouped_launches[0] < ENTRY.index(body) + len(body)
    assert body.index("launch_token_groups<TOPK>(groups, stream)") < body.index("launch_prefill<D_QK, TOPK, LAYOUT>(params, true")
    callers = re.findall(r"void (\w+)\([^)]*\)[^{]*\{[^}]*launch_token_groups_call", ENTRY)
    assert sorted(callers) == ["prefill_paged_token_groups_fwd", "prefill_token_groups_fwd"], callers
    assert "launch_prefill<D_QK, TOPK>(params, true" not in ENTRY
    for name in ("prefill_fwd", "prefill_split_fwd", "prefill_paged_fwd", "prefill_paged_split_fwd"):
        signature = _function_body(name).split("{")[0]
        assert "group" not in signature and "bool" not in signature, signature


def test_a_refused_launch_raises_kernel_launch_error(tmp_path):
    """Every launch of an entry goes through check_launch, which throws the error kind that the module
    loader maps to KernelLaunchError (a SparseMLAError, not tvm-ffi's bare RuntimeError)."""
    assert len(re.findall(r"check_launch\(", ENTRY)) - 1 == len(re.findall(r"launch_(?:prefill|token_groups)<", ENTRY))
    assert f"TVM_FFI_THROW({LAUNCH_ERROR_KIND})" in ENTRY
    import tvm_ffi

    with pytest.raises(Exception):
        load_tvm_module(tmp_path / "missing.so")  # registers the error kind before it loads
    raise_error = tvm_ffi.get_global_func("testing.test_raise_error")
    with pytest.raises(KernelLaunchError, match="launch failed: too many resources requested") as raised:
        raise_error(LAUNCH_ERROR_KIND, "sparse_mla prefill kernel launch failed: too many resources requested")
    assert isinstance(raised.value, SparseMLAError)


@pytest.mark.parametrize("s_q, h_q, token_groups", [(437, 64, "auto"), (16, 16, "auto"), (4096, 16, "auto"),
                                                  (300, 8, "always")])
def test_a_call_takes_its_scratch_in_one_allocation(s_q, h_q, token_groups):
    """A split or grouped call passes its entry one uint8 tensor of the plan's scratch_bytes, at a
    16-byte boundary, after the plan's two scalars; an ordinary call passes none."""
    calls = []
    q = torch.empty((s_q, h_q, 576), dtype=torch.float8_e4m3fn)
    args = PrefillArgs(q, *([None] * 9), 0.04, False)
    call_plan = launch.plan(s_q, h_q, 2048, H100_SMS, False, token_groups)
    launch.execute(call_plan, lambda *entry_args: calls.append(entry_args), args)
    (entry_args,) = calls
    assert call_plan.entry in (SPLIT_CALL_FUNCTION, GROUPED_CALL_FUNCTION)
    scalars = (call_plan.group_size, call_plan.max_union_ratio) if call_plan.entry == GROUPED_CALL_FUNCTION else \
        (call_plan.split_begin, call_plan.split_parts)
    scratch = entry_args[-1]
    assert entry_args[-3:-1] == scalars
    assert (scratch.shape, scratch.dtype) == ((call_plan.scratch_bytes,), torch.uint8)
    assert scratch.data_ptr() % 16 == 0 and call_plan.scratch_bytes > 0


def test_the_split_scratch_holds_every_part_and_counter():
    call_plan = launch.plan(437, 64, 2048, H100_SMS, False)
    split_items = 437 - call_plan.split_begin
    assert call_plan.scratch_bytes == split_items * call_plan.split_parts * launch.SPLIT_PART_FLOATS * 4 + split_items * 4
    assert launch.plan(437, 64, 2048, H100_SMS, True).scratch_bytes == 0  # batch-invariant: no split


@pytest.mark.parametrize("s_q, group, topk", [(16, 4, 2048), (4096, 8, 2048), (21, 5, 7), (19, 8, 2048), (1, 2, 100)])
def test_the_token_group_scratch_holds_the_lists_at_16_byte_boundaries(s_q, group, topk):
    """token_group_bytes covers the four lists that token_groups_fwd takes as tensors, each padded to
    16 bytes (the layout itself is entry.cuh's; the GPU tier checks that the entry asks for exactly
    these bytes)."""
    lists = token_group_lists(torch.device("cpu"), s_q, group, topk)
    sizes = [t.numel() * t.element_size() for t in lists]
    padded = sum((n + 15) // 16 * 16 for n in sizes[:3]) + sizes[3]
    assert launch.token_group_bytes(s_q, group, topk) == padded
