"""The launch order that makes a token-grouped call's lists visible to its narrow launch, read from the
headers. The narrow launch reads the pre-pass's lists (scheduler.cuh: num_launch_units, work_unit)
with no griddepcontrol.wait of its own; it may, because
- launch_token_groups_call (entry.cuh; both grouped entries) launches the pre-pass, then the grouped launch, then the narrow
  launch, on one stream;
- both prefill launches of such a call are programmatically serialized (launch.cuh, primitives.cuh'
  launch_kernel): the narrow grid starts only once every grouped CTA executed launch_dependents;
- the grouped kernel (kernel.cuh) executes griddepcontrol.wait, then launch_dependents, before it
  reads any list, and triggers nowhere else.
Each check takes a header's text, so that the mutation tests can show it fails on a changed copy.
No GPU, no compiler."""

from __future__ import annotations

import pathlib
import re

import pytest

from kernel_source import Function, closing_bracket, strip_comments

pytestmark = pytest.mark.cpu

INCLUDE = pathlib.Path(__file__).parents[2] / "include" / "sparse_mla"
PREFILL = INCLUDE / "sm90" / "prefill"
GROUPED_CALL = ("entry.cuh", "launch_token_groups_call")  # what both grouped entries (contiguous, paged) call


def body(text, name):
    """The function's body, comments blanked, whitespace collapsed."""
    return " ".join(Function(text, name).body_text.split())


def check_grouped_call_order(entry):
    """The pre-pass, the grouped launch, the narrow launch: in this order, once each, on one stream,
    the lists in the parameters before the first launch."""
    b = body(entry, GROUPED_CALL[1])
    launches = re.findall(r"\blaunch_\w+<[^>]*>\([^()]*\)", b)
    assert launches == ["launch_token_groups<TOPK>(groups, stream)",
                        "launch_prefill<D_QK, TOPK, LAYOUT>(params, true, stream)",
                        "launch_prefill<D_QK, TOPK, LAYOUT>(params, false, stream)"], launches
    assert len(re.findall(r"\bcudaStream_t stream =", b)) == 1
    for member in ("group_length", "group_units"):
        assigned = b.find(f"params.{member} =")
        assert 0 <= assigned < b.index(launches[0]), f"params.{member} is set after the first launch"


def check_programmatic_serialization(launch, primitives):
    """Every prefill launch of a call with lists (params.group_length set) asks launch_kernel for the
    programmatic serialization, which launch_kernel turns into that launch attribute."""
    b = body(launch, "launch_prefill")
    calls = re.findall(r"launch_kernel\((.*?)\);", b)
    assert len(calls) == 1, calls
    after_grid_ahead = calls[0].split(",")[-1]
    assert "params.group_length != nullptr" in [term.strip() for term in after_grid_ahead.split("||")], after_grid_ahead
    k = body(primitives, "launch_kernel")
    assert "overlap.id = cudaLaunchAttributeProgrammaticStreamSerialization;" in k
    assert "overlap.val.programmaticStreamSerializationAllowed = 1;" in k
    assert "config.numAttrs = after_grid_ahead ? 1 : 0;" in k


LIST_READS = r"num_launch_units|WorkScheduler|run_producer|run_narrow_consumers|params\.group_"


def check_grouped_kernel_waits_then_triggers(kernel):
    """In prefill_kernel, the grouped tile's griddepcontrol.wait, then its launch_dependents, both
    unconditional in the grouped kernel and before the first read of the lists; no other trigger."""
    b = body(kernel, "prefill_kernel")
    m = re.search(r"if constexpr \(Traits::kGroups\) \{ wait_for_grid_ahead\(\); allow_dependent_grid\(\); \}", b)
    assert m, "the grouped kernel's wait, then its trigger, are not one block of their own"
    first_read = re.search(LIST_READS, b)
    assert first_read and m.end() <= first_read.start(), f"{first_read.group()} comes before the wait"
    assert len(re.findall(r"\ballow_dependent_grid\(", b)) == 1
    assert not re.search(r"\breturn\b", b[:m.start()]), "a CTA may leave before its trigger"


def test_the_grouped_call_launches_the_pre_pass_then_the_grouped_then_the_narrow_kernel():
    check_grouped_call_order((INCLUDE / GROUPED_CALL[0]).read_text())


def test_both_prefill_launches_of_a_grouped_call_are_programmatically_serialized():
    check_programmatic_serialization((PREFILL / "launch.cuh").read_text(), (PREFILL / "primitives.cuh").read_text())


def test_the_grouped_kernel_waits_for_the_pre_pass_before_it_lets_the_narrow_launch_start():
    check_grouped_kernel_waits_then_triggers((PREFILL / "kernel.cuh").read_text())


def triggering_kernels(headers):
    """The kernels that call allow_dependent_grid, each the __global__ function around the call (a
    __device__ function around one is an error: it could be called from anywhere)."""
    kernels = set()
    for text in headers:
        text = strip_comments(text)
        for call in re.finditer(r"\ballow_dependent_grid\(\)\s*;", text):
            before = text[:call.start()]
            assert before.rfind("__global__") > before.rfind("__device__"), "a trigger in a __device__ function"
            declaration = before[before.rfind("__global__"):]
            bounds = re.search(r"__launch_bounds__\s*\(", declaration)
            if bounds:  # its arguments are no name of the kernel
                declaration = declaration[:bounds.start()] + declaration[closing_bracket(declaration, bounds.end() - 1) + 1:]
            kernels.add(re.search(r"\b(\w+)\s*\(", declaration.removeprefix("__global__")).group(1))
    return kernels


def test_the_prefill_kernel_triggers_only_after_its_wait():
    """The prefill kernel's only trigger is the grouped tile's, after its wait (above). The pre-pass
    kernels and the counts' zeroing trigger at their start: the kernel behind each waits for it."""
    assert triggering_kernels(path.read_text() for path in sorted(INCLUDE.rglob("*.cuh"))) == {
        "prefill_kernel", "prefill_kernel_token_groups", "prefill_kernel_token_groups_of_two", "prefill_kernel_zero_counts"}


def test_a_trigger_in_a_device_function_is_refused():
    text = (PREFILL / "producer.cuh").read_text()
    changed = text.replace("  const ProducerThread pt = producer_thread();", "  allow_dependent_grid();\n  const ProducerThread pt = producer_thread();")
    assert changed != text and triggering_kernels([text]) == set()
    with pytest.raises(AssertionError, match="__device__"):
        triggering_kernels([changed])


MUTATIONS = {
    "the narrow launch first": (GROUPED_CALL[0], check_grouped_call_order, lambda t: _swap_lines(
        t, "launch_prefill<D_QK, TOPK, LAYOUT>(params, true, stream)",
        "launch_prefill<D_QK, TOPK, LAYOUT>(params, false, stream)")),
    "the narrow launch on another stream": (GROUPED_CALL[0], check_grouped_call_order, lambda t: t.replace(
        "launch_prefill<D_QK, TOPK, LAYOUT>(params, false, stream)",
        "launch_prefill<D_QK, TOPK, LAYOUT>(params, false, nullptr)")),
    "the lists set after the pre-pass": (GROUPED_CALL[0], check_grouped_call_order, lambda t: _swap_lines(
        t, "params.group_units = lists.units", "launch_token_groups<TOPK>(groups, stream)")),
    "the trigger before the wait": ("sm90/prefill/kernel.cuh", check_grouped_kernel_waits_then_triggers,
                                    lambda t: _swap_lines(t, "    wait_for_grid_ahead();", "    allow_dependent_grid();")),
    "the lists read before the wait": ("sm90/prefill/kernel.cuh", check_grouped_kernel_waits_then_triggers,
                                       lambda t: _swap_lines(t, "using Traits = TileTraits<TILE>;",
                                                             "const int n_units = num_launch_units<TILE>(params);")),
}


def _swap_lines(text, first, second):
    lines = text.split("\n")
    i = next(k for k, line in enumerate(lines) if first in line)
    j = next(k for k, line in enumerate(lines) if second in line)
    lines[i], lines[j] = lines[j], lines[i]
    return "\n".join(lines)


@pytest.mark.parametrize("name", MUTATIONS)
def test_each_check_fails_on_a_changed_header(name):
    header, check, mutate = MUTATIONS[name]
    text = (INCLUDE / header).read_text()
    changed = mutate(text)
    assert changed != text
    check(text)
    with pytest.raises(AssertionError):
        check(changed)


def test_the_serialization_check_fails_without_the_attribute():
    launch, primitives = (PREFILL / "launch.cuh").read_text(), (PREFILL / "primitives.cuh").read_text()
    check_programmatic_serialization(launch, primitives)
    with pytest.raises(AssertionError):
        check_programmatic_serialization(launch.replace("params.group_length != nullptr || split", "split"), primitives)
    with pytest.raises(AssertionError):
        check_programmatic_serialization(launch, primitives.replace("after_grid_ahead ? 1 : 0", "0"))
