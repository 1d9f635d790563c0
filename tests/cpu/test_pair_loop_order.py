"""The happens-before model of the kernel's pair loop (pair_loop_model.py): the
kernel's order, of every tile (wide, narrow-head, grouped), has no unordered shared-memory access, f7e0947's
has exactly the two known hazards, and each mutation of the kernel's order that breaks one ordering is
found. No GPU, no compiler, no torch."""

from __future__ import annotations

import pathlib
import re
from dataclasses import replace

import pytest

from pair_loop_model import (
    CONSUMERS,
    F7E0947_ORDER,
    KERNEL_ORDER,
    GROUPED_ORDER,
    NARROW_ORDER,
    NUM_STAGES,
    Unit,
    check,
    kernel_roles,
)

pytestmark = pytest.mark.cpu

TRAITS = pathlib.Path(__file__).parents[2] / "include" / "sparse_mla" / "sm90" / "prefill" / "traits.cuh"

# Work units of one CTA, one letter per pair: its softmax path, "E" exact or "F" fast. A unit's first
# pair is always exact (its references start at -inf).
FIRST_EXACT = (Unit("EFF"), Unit("EF"))
ALL_EXACT = (Unit("EEE"), Unit("EE"))
FOUR_PAIRS = (Unit("EFEF"), Unit("EF"))  # three P buffers are reused within a unit too
SPLIT_AND_EMPTY = (Unit("EFF", split="publishes"), Unit(""), Unit("E"), Unit("EF", split="merges"))
SCENARIOS = {"first pair exact": FIRST_EXACT, "all exact": ALL_EXACT, "four pairs": FOUR_PAIRS,
             "split parts, an empty unit, one pair": SPLIT_AND_EMPTY}

# The narrow tile runs whole items only: no split units.
WITH_AN_EMPTY_UNIT = (Unit("EFF"), Unit(""), Unit("E"), Unit("EF"))
NARROW_SCENARIOS = {"first pair exact": FIRST_EXACT, "all exact": ALL_EXACT, "four pairs": FOUR_PAIRS,
                    "an empty unit, one pair": WITH_AN_EMPTY_UNIT}

# The narrow tile's early release with the producer-side handoff, one pair ahead (the alternative
# measured in docs/lab.md, Experiment 57).
LANDED_LOOKAHEAD = replace(NARROW_ORDER, proxy_fence="producer", producer_lookahead=1)

PASSING_ORDERS = {
    "kernel order": KERNEL_ORDER,
    "consumer-side proxy fence": replace(KERNEL_ORDER, proxy_fence="consumer"),
    "three P buffers": replace(KERNEL_ORDER, pv_wait_in_softmax=False, probs_buffers=3),
    "three P buffers, consumer-side proxy fence": replace(KERNEL_ORDER, pv_wait_in_softmax=False, probs_buffers=3,
                                                          proxy_fence="consumer"),
    "proxy fence shared with the softmax's": replace(KERNEL_ORDER, proxy_fence="softmax"),
}


def report(findings):
    return "\n".join(map(str, findings))


@pytest.mark.parametrize("units", SCENARIOS.values(), ids=SCENARIOS.keys())
@pytest.mark.parametrize("order", PASSING_ORDERS.values(), ids=PASSING_ORDERS.keys())
def test_the_kernel_order_has_no_unordered_access(order, units):
    findings = check(kernel_roles(order, units))
    assert not findings, report(findings)


@pytest.mark.parametrize("units", NARROW_SCENARIOS.values(), ids=NARROW_SCENARIOS.keys())
def test_the_narrow_order_has_no_unordered_access(units):
    findings = check(kernel_roles(NARROW_ORDER, units))
    assert not findings, report(findings)


@pytest.mark.parametrize("units", NARROW_SCENARIOS.values(), ids=NARROW_SCENARIOS.keys())
@pytest.mark.parametrize("order", [LANDED_LOOKAHEAD, replace(LANDED_LOOKAHEAD, producer_lookahead=0)],
                         ids=["landed, one pair ahead", "landed"])
def test_the_narrow_early_release_is_ordered_with_the_producer_side_fence_too(order, units):
    """tiles/narrow.cuh's early release with the wide tile's handoff (each producer thread waits for its
    copies, fences and arrives), with and without issuing one pair ahead: the alternative measured in
    docs/lab.md, Experiment 57."""
    findings = check(kernel_roles(order, units))
    assert not findings, report(findings)


@pytest.mark.parametrize("order", [KERNEL_ORDER, GROUPED_ORDER, replace(LANDED_LOOKAHEAD, v_after_softmax=False)],
                         ids=["wide", "grouped", "narrow without the early release"])
def test_the_lookahead_deadlocks_where_a_pair_is_released_after_the_next_one_arrived(order):
    """A consumer that releases pair p only after its Q.K^T on pair p + 1 waits for a handoff that a
    producer one pair ahead makes only after refilling pair p's stage."""
    findings = check(kernel_roles(replace(order, producer_lookahead=1), FIRST_EXACT))
    assert [f.kind for f in findings] == ["deadlock"], report(findings)


@pytest.mark.parametrize("units", NARROW_SCENARIOS.values(), ids=NARROW_SCENARIOS.keys())
def test_the_grouped_order_has_no_unordered_access(units):
    findings = check(kernel_roles(GROUPED_ORDER, units))
    assert not findings, report(findings)


def test_the_grouped_valid_bits_are_ordered_like_the_wide_ones():
    """Per-token valid bits copied after the block's kv_full arrival would race with the softmax."""
    roles = kernel_roles(GROUPED_ORDER, FIRST_EXACT)
    events = list(roles["producer"])
    copy = next(i for i, e in enumerate(events) if e.op == "cp.async" and e.target == "row_valid[0][1]")
    moved = events.pop(copy)
    arrival = next(i for i, e in enumerate(events) if e.op == "mbarrier.arrive" and e.target == "kv_full[0][1]")
    events.insert(arrival + 1, moved)
    findings = check({**roles, "producer": events})
    assert any("row_valid[0][1]: read-after-write" in str(f) for f in findings), report(findings)


def test_the_grouped_units_handoff_needs_its_two_slots():
    """The producer writes a unit's (group, pairs) for the consumers before it waits for the previous
    unit's q_empty: in one slot, that write would race with the consumers' read of the previous unit
    (units of one pair: nothing else orders the read before it)."""
    def one_slot(events):
        return [replace(e, target="group_unit[0]") if e.target.startswith("group_unit") else e for e in events]

    roles = kernel_roles(GROUPED_ORDER, (Unit("E"), Unit("F"), Unit("F")))
    findings = check({name: one_slot(events) for name, events in roles.items()})
    assert any("group_unit[0]: write-after-read" in str(f) for f in findings), report(findings)


def test_the_narrow_tile_keeps_alpha_in_registers():
    """tiles/narrow.cuh's rescale factors and references live in NarrowState: no alpha, no row statistics in
    shared memory; the exact path and the epilogue use head_max, head_sum and head_reference instead."""
    roles = kernel_roles(NARROW_ORDER, ALL_EXACT)
    targets = {e.target.split("[")[0] for events in roles.values() for e in events
               if e.op in ("st.shared", "ld.shared")}
    assert targets == {"valid", "probs", "head_max", "head_sum", "head_reference", "out_scale"}


def p_buffer_of_block_1(units):
    """Consumer 0's P.V(p, block 1) reads probs[p % 2][1] until consumer 0 waits for it, after the
    softmax's barrier; past that barrier consumer 1 runs pair p + 1 and writes pair p + 2's P into the
    same buffer. Its rewrite on the exact path follows consumer 0's next kProbsReady: ordered."""
    return {("write-after-read", f"probs[{p % 2}][1]",
             f"consumer 0 issue_pv reads probs[{p % 2}][1] (unit {u} pair {p})",
             f"consumer 1 write_probs writes probs[{p % 2}][1] (unit {u} pair {p + 2})")
            for u, unit in enumerate(units) for p in range(unit.n_pairs - 2)}


def gathers_read_by_wgmma_without_fence(units):
    """Every K operand of Q.K^T, and Q for each unit's first Q.K^T: the later ones follow the reader's
    fence_view_async_shared of its first P, which comes after its q_full wait and so orders Q too."""
    found, gp = set(), 0
    for u, unit in enumerate(units):
        for p in range(unit.n_pairs):
            for wg in (0, 1):
                for tile in [f"kv[{gp % NUM_STAGES}][{wg}]"] + (["q"] if p == 0 else []):
                    found.add((tile, f"producer cp_async_16 writes {tile} (unit {u} pair {p})",
                               f"consumer {wg} issue_qk reads {tile} (unit {u} pair {p})"))
            gp += 1
    return found


@pytest.mark.parametrize("units", [FIRST_EXACT, ALL_EXACT, FOUR_PAIRS],
                         ids=["first pair exact", "all exact", "four pairs"])
def test_the_f7e0947_order_is_rejected(units):
    findings = check(kernel_roles(F7E0947_ORDER, units))
    proxy = {(f.buffer, f.first, f.second) for f in findings if f.kind == "missing fence.proxy.async"}
    others = {(f.kind, f.buffer, f.first, f.second) for f in findings if f.kind != "missing fence.proxy.async"}
    assert others == p_buffer_of_block_1(units), report(findings)
    assert proxy == gathers_read_by_wgmma_without_fence(units), report(findings)


def mutate(roles, agents, match, change=lambda event: []):
    """The roles with each event of `agents` that `match`es replaced by change(event): dropped by default."""
    mutated, hits = dict(roles), 0
    for agent in agents:
        mutated[agent] = []
        for event in roles[agent]:
            hits += match(event)
            mutated[agent] += change(event) if match(event) else [event]
    assert hits, "the mutation matched no event: it tests nothing"
    return mutated


def swap_with_next(roles, agent, match):
    """The roles with each event of `agent` that `match`es moved after the event that follows it."""
    events = list(roles[agent])
    moved = [i for i, event in enumerate(events) if match(event)]
    assert moved, "the mutation matched no event: it tests nothing"
    for i in moved:
        events[i], events[i + 1] = events[i + 1], events[i]
    return {**roles, agent: events}


def swap_with_previous(roles, agents, match):
    """The roles with each event of `agents` that `match`es moved before the event that precedes it."""
    mutated = dict(roles)
    for agent in agents:
        events = list(roles[agent])
        moved = [i for i, event in enumerate(events) if match(event)]
        assert moved, "the mutation matched no event: it tests nothing"
        for i in moved:
            events[i - 1], events[i] = events[i], events[i - 1]
        mutated[agent] = events
    return mutated


def sink_past(roles, agent, match, until):
    """The roles with each event of `agent` that `match`es moved after the first later event e with
    until(moved event, e)."""
    events = list(roles[agent])
    moved = [event for event in events if match(event)]
    assert moved, "the mutation matched no event: it tests nothing"
    for event in moved:
        i = events.index(event)
        j = next(k for k in range(i + 1, len(events)) if until(event, events[k]))
        events.insert(j, events.pop(i))
    return {**roles, agent: events}


def is_wait(target):
    return lambda e: e.op == "mbarrier.wait" and e.target.startswith(target)


def is_second_row_sum_barrier(e):
    return e.name == "named_barrier_sync<kRowSumReady> (output scales)" and e.label == "unit 0 epilogue"


def is_next_units_first_probs_barrier(e):
    return e.name == "named_barrier_sync_or<kProbsReady>(moved)" and e.label == "unit 1 pair 0"


def drops_both_barriers_after_the_epilogue(e):
    return is_second_row_sum_barrier(e) or is_next_units_first_probs_barrier(e)


CONSUMER_FENCE = replace(KERNEL_ORDER, proxy_fence="consumer")
SOFTMAX_FENCE = replace(KERNEL_ORDER, proxy_fence="softmax")
MUTATIONS = [
    pytest.param(
        KERNEL_ORDER, FIRST_EXACT, lambda r: mutate(r, ["producer"], is_wait("kv_empty")),
        [("write-after-read", "kv[0][0]",
          "consumer 0 issue_qk reads kv[0][0] (unit 0 pair 0)",
          "producer cp_async_16 writes kv[0][0] (unit 0 pair 2)"),
         ("write-after-read", "valid[0][1]",
          "consumer 1 ss.valid (softmax_to_probs' argument) reads valid[0][1] (unit 0 pair 0)",
          "producer valid bits (lane 0 of each warp) writes valid[0][1] (unit 0 pair 2)"),
         ("mbarrier phase", "kv_full[0][0]",
          "phase 0 completes",
          "producer mbarrier_arrive (after the copies landed) kv_full[0][0] (unit 0 pair 2)")],
        id="no kv_empty wait"),
    pytest.param(
        KERNEL_ORDER, FIRST_EXACT, lambda r: mutate(r, ["producer"], is_wait("q_empty")),
        [("write-after-read", "q",
          "consumer 0 issue_qk reads q (unit 0 pair 2)",
          "producer cp_async_16 writes q (unit 1 pair 0)")],
        id="no q_empty wait"),
    pytest.param(
        # Q released before the wait that retires the unit's last Q.K^T, not after it.
        KERNEL_ORDER, FIRST_EXACT,
        lambda r: swap_with_previous(r, CONSUMERS, lambda e: e.op == "mbarrier.arrive" and e.target == "q_empty"),
        [("write-after-read", "q",
          "consumer 0 issue_qk reads q (unit 0 pair 2)",
          "producer cp_async_16 writes q (unit 1 pair 0)")],
        id="q_empty before the last Q.K^T's wait"),
    pytest.param(
        KERNEL_ORDER, FIRST_EXACT,
        lambda r: mutate(r, CONSUMERS, lambda e: is_wait("kv_full")(e) and e.name == "mbarrier_wait"),
        # (A unit's first block 0 is still ordered: Q arrives on q_full with it.)
        [("read-after-write", "kv[1][0]",
          "producer cp_async_16 writes kv[1][0] (unit 0 pair 1)",
          "consumer 0 issue_qk reads kv[1][0] (unit 0 pair 1)")],
        id="no kv_full wait before Q.K^T"),
    pytest.param(
        # What the compiler may do to plain stores before an asm without a "memory" clobber.
        KERNEL_ORDER, FIRST_EXACT,
        lambda r: sink_past(r, "producer", lambda e: e.target.startswith("valid"),
                            lambda moved, e: e.op == "mbarrier.arrive" and e.target == "kv_full" + moved.target[5:]),
        [("read-after-write", "valid[0][0]",
          "producer valid bits (lane 0 of each warp) writes valid[0][0] (unit 0 pair 0)",
          "consumer 0 ss.valid (softmax_to_probs' argument) reads valid[0][0] (unit 0 pair 0)")],
        id="valid bits stored after their arrive"),
    pytest.param(
        KERNEL_ORDER, FIRST_EXACT,
        lambda r: mutate(r, CONSUMERS, lambda e: e.target == "kProbsReady" and e.label == "unit 0 pair 1"),
        [("read-after-write", "probs[1][1]",
          "consumer 1 write_probs writes probs[1][1] (unit 0 pair 1)",
          "consumer 0 issue_pv reads probs[1][1] (unit 0 pair 1)"),
         ("read-after-write", "probs[1][1]",  # its own P, written by all four of its warps
          "consumer 1 write_probs writes probs[1][1] (unit 0 pair 1)",
          "consumer 1 issue_pv reads probs[1][1] (unit 0 pair 1)")],
        id="no kProbsReady on the fast path"),
    pytest.param(
        KERNEL_ORDER, FIRST_EXACT,
        lambda r: mutate(r, CONSUMERS, lambda e: e.name == "fence_view_async_shared (P)"),
        [("missing fence.proxy.async", "probs[1][1]",
          "consumer 1 write_probs writes probs[1][1] (unit 0 pair 1)",
          "consumer 0 issue_pv reads probs[1][1] (unit 0 pair 1)")],
        id="no fence.proxy.async before kProbsReady"),
    pytest.param(
        KERNEL_ORDER, FIRST_EXACT,
        lambda r: mutate(r, CONSUMERS, lambda e: e.name.startswith("warpgroup_wait<0> (the previous pair's P.V")),
        sorted(p_buffer_of_block_1(FIRST_EXACT)),
        id="no P.V wait in the softmax"),
    pytest.param(
        KERNEL_ORDER, ALL_EXACT, lambda r: mutate(r, CONSUMERS, lambda e: e.target == "kRowMaxReady"),
        [("read-after-write", "row_max[0]",
          "consumer 0 the pair's row maxima (c == 0) writes row_max[0] (unit 0 pair 0)",
          "consumer 1 the other consumer's row maxima reads row_max[0] (unit 0 pair 0)")],
        id="no kRowMaxReady"),
    pytest.param(
        KERNEL_ORDER, ALL_EXACT,
        lambda r: mutate(r, CONSUMERS, lambda e: e.name == "named_barrier_sync_or<kProbsReady>(rescale)"),
        [("read-after-write", "alpha[0]",  # written by lanes c == 0, read by every thread
          "consumer 0 alpha (c == 0) writes alpha[0] (unit 0 pair 1)",
          "consumer 0 rescale O by alpha reads alpha[0] (unit 0 pair 1)"),
         ("read-after-write", "probs[0][0]",
          "consumer 0 write_probs (new references) writes probs[0][0] (unit 0 pair 0)",
          "consumer 1 issue_pv reads probs[0][0] (unit 0 pair 0)")],
        id="no kProbsReady on the exact path"),
    pytest.param(
        KERNEL_ORDER, FIRST_EXACT,
        lambda r: mutate(r, CONSUMERS, lambda e: e.name == "named_barrier_sync<kRowSumReady> (output scales)"),
        [("read-after-write", "out_scale",
          "consumer 0 out_scale (c == 0) writes out_scale (unit 0 epilogue)",
          "consumer 1 store: the output scales reads out_scale (unit 0 epilogue)")],
        id="no kRowSumReady before the output scales are read"),
    pytest.param(
        KERNEL_ORDER, SPLIT_AND_EMPTY,
        lambda r: mutate(r, CONSUMERS, lambda e: e.name == "named_barrier_sync<kSplitMerge> (split_last written)"),
        [("read-after-write", "split_last",
          "consumer 0 ss.split_last = atomicAdd(...) (t == 0) writes split_last (unit 0 split merge)",
          "consumer 1 __shfl_sync(ss.split_last) reads split_last (unit 0 split merge)")],
        id="no kSplitMerge before split_last is read"),
    pytest.param(
        # The producer's fence before its copies landed orders nothing.
        KERNEL_ORDER, FIRST_EXACT, lambda r: swap_with_next(r, "producer", lambda e: e.op == "cp.async.wait_group"),
        [("missing fence.proxy.async", "kv[0][0]",
          "producer cp_async_16 writes kv[0][0] (unit 0 pair 0)",
          "consumer 0 issue_qk reads kv[0][0] (unit 0 pair 0)")],
        id="producer fence before cp.async.wait_group"),
    pytest.param(
        CONSUMER_FENCE, FIRST_EXACT,
        lambda r: mutate(r, CONSUMERS, lambda e: e.op == "fence.proxy.async" and e.label == "unit 1 pair 0"
                         and e.name == "fence.proxy.async (before Q.K^T)"),
        [("missing fence.proxy.async", "q",
          "producer cp_async_16 writes q (unit 1 pair 0)",
          "consumer 0 issue_qk reads q (unit 1 pair 0)"),
         ("missing fence.proxy.async", "kv[1][1]",
          "producer cp_async_16 writes kv[1][1] (unit 1 pair 0)",
          "consumer 1 issue_qk reads kv[1][1] (unit 1 pair 0)")],
        id="consumer-side fence missing before a unit's first Q.K^T"),
    pytest.param(
        # The next block acquired after the softmax's fence: only an exact path's second fence follows.
        SOFTMAX_FENCE, FIRST_EXACT,
        lambda r: swap_with_next(r, "consumer 0", lambda e: e.name == "mbarrier_wait (next_kv_full)"),
        [("missing fence.proxy.async", "kv[0][0]",
          "producer cp_async_16 writes kv[0][0] (unit 0 pair 2)",
          "consumer 0 issue_qk reads kv[0][0] (unit 0 pair 2)")],
        id="softmax's fence before the next block's acquire"),
    pytest.param(
        NARROW_ORDER, ALL_EXACT, lambda r: mutate(r, CONSUMERS, lambda e: e.target == "kRowMaxReady"),
        [("read-after-write", "head_max[0]",
          "consumer 0 the pair's head maxima per warp (g == 0) writes head_max[0] (unit 0 pair 0)",
          "consumer 1 every warp's head maxima reads head_max[0] (unit 0 pair 0)"),
         ("read-after-write", "head_max[1]",  # its own consumer's other warps' maxima
          "consumer 1 the pair's head maxima per warp (g == 0) writes head_max[1] (unit 0 pair 0)",
          "consumer 1 every warp's head maxima reads head_max[1] (unit 0 pair 0)")],
        id="narrow: no kRowMaxReady"),
    pytest.param(
        NARROW_ORDER, FIRST_EXACT,
        lambda r: swap_with_next(r, "consumer 0", lambda e: e.name == "the pair's head maxima per warp (g == 0)"),
        [("read-after-write", "head_max[0]",
          "consumer 0 the pair's head maxima per warp (g == 0) writes head_max[0] (unit 0 pair 0)",
          "consumer 1 every warp's head maxima reads head_max[0] (unit 0 pair 0)"),
         ("read-after-write", "head_max[0]",
          "consumer 0 the pair's head maxima per warp (g == 0) writes head_max[0] (unit 1 pair 0)",
          "consumer 0 every warp's head maxima reads head_max[0] (unit 1 pair 0)")],
        id="narrow: head maxima stored after kRowMaxReady"),
    pytest.param(
        NARROW_ORDER, FIRST_EXACT,
        lambda r: mutate(r, CONSUMERS, lambda e: e.name == "named_barrier_sync<kRowSumReady> (head sums)"),
        [("read-after-write", "head_sum[1]",
          "consumer 1 head sums per warp (g == 0) writes head_sum[1] (unit 0 epilogue)",
          "consumer 0 statistics of the head (t < NH) reads head_sum[1] (unit 0 epilogue)"),
         ("read-after-write", "head_max[1]",
          "consumer 1 head maxima per warp (g == 0) writes head_max[1] (unit 0 epilogue)",
          "consumer 0 statistics of the head (t < NH) reads head_max[1] (unit 0 epilogue)"),
         ("read-after-write", "head_reference",  # lanes g == 0 of warp 0 write, its 32 lanes read
          "consumer 0 head references (warp 0, g == 0) writes head_reference (unit 0 epilogue)",
          "consumer 0 the head's reference (t < NH) reads head_reference (unit 0 epilogue)")],
        id="narrow: no kRowSumReady before the head statistics are read"),
    pytest.param(
        # After an empty unit, the next epilogue's stores follow no other barrier.
        NARROW_ORDER, WITH_AN_EMPTY_UNIT,
        lambda r: mutate(r, CONSUMERS, lambda e: e.name == "named_barrier_sync<kRowSumReady> (output scales)"),
        [("read-after-write", "out_scale",
          "consumer 0 out_scale (t < NH) writes out_scale (unit 0 epilogue)",
          "consumer 1 store: the output scales reads out_scale (unit 0 epilogue)"),
         ("write-after-read", "head_max[1]",
          "consumer 0 statistics of the head (t < NH) reads head_max[1] (unit 0 epilogue)",
          "consumer 1 head maxima per warp (g == 0) writes head_max[1] (unit 1 epilogue)"),
         ("write-after-read", "head_reference",
          "consumer 0 the head's reference (t < NH) reads head_reference (unit 0 epilogue)",
          "consumer 0 head references (warp 0, g == 0) writes head_reference (unit 1 epilogue)")],
        id="narrow: no kRowSumReady after the epilogue's reads"),
    pytest.param(
        # Both barriers between the epilogue's head_max reads and the next unit's exact-path stores:
        # either alone orders them (test_the_narrow_epilogue_reads_are_ordered_twice).
        NARROW_ORDER, FIRST_EXACT, lambda r: mutate(r, CONSUMERS, drops_both_barriers_after_the_epilogue),
        [("write-after-read", "head_max[1]",
          "consumer 0 statistics of the head (t < NH) reads head_max[1] (unit 0 epilogue)",
          "consumer 1 the pair's head maxima per warp (g == 0) writes head_max[1] (unit 1 pair 0)"),
         ("write-after-read", "head_max[0]",
          "consumer 0 statistics of the head (t < NH) reads head_max[0] (unit 0 epilogue)",
          "consumer 0 the pair's head maxima per warp (g == 0) writes head_max[0] (unit 1 pair 0)")],
        id="narrow: no barrier between the epilogue's head maxima and the next unit's"),
    pytest.param(
        # take_v releasing a block before its V rows are in registers: the producer refills
        # the stage two pairs later.
        NARROW_ORDER, FOUR_PAIRS,
        lambda r: swap_with_next(r, "consumer 0", lambda e: e.op == "ldmatrix" and e.target == "kv[0][0]"
                                 and e.label == "unit 0 pair 0"),
        [("write-after-read", "kv[0][0]",
          "consumer 0 ldmatrix_x4_trans reads kv[0][0] (unit 0 pair 0)",
          "producer cp_async_16 writes kv[0][0] (unit 0 pair 2)")],
        id="narrow: a block released before its V loads"),
    pytest.param(
        # The lookahead's handoff waiting as if pair p + 1 were not committed yet: block 0 is handed
        # over before it landed.
        LANDED_LOOKAHEAD, FIRST_EXACT,
        lambda r: mutate(r, ["producer"], lambda e: e.op == "cp.async.wait_group" and e.pending == 3,
                         lambda e: [replace(e, pending=4)]),
        [("read-after-write", "kv[0][0]",
          "producer cp_async_16 writes kv[0][0] (unit 0 pair 0)",
          "consumer 0 issue_qk_narrow reads kv[0][0] (unit 0 pair 0)")],
        id="narrow, landed lookahead: a block handed over before it landed"),
    pytest.param(
        # The copies' arrival made before the copies: it tracks none of them.
        NARROW_ORDER, FIRST_EXACT,
        lambda r: swap_with_next(r, "producer", lambda e: e.op == "cp.async" and e.target == "kv[1][0]"
                                 and e.label == "unit 0 pair 1"),
        [("read-after-write", "kv[1][0]",
          "producer cp_async_16 writes kv[1][0] (unit 0 pair 1)",
          "consumer 0 issue_qk_narrow reads kv[1][0] (unit 0 pair 1)")],
        id="narrow: a block's arrival before its copies"),
    pytest.param(
        NARROW_ORDER, FIRST_EXACT,
        lambda r: mutate(r, CONSUMERS, lambda e: e.op == "fence.proxy.async" and e.label == "unit 0 pair 1"
                         and e.name == "fence.proxy.async (before Q.K^T)"),
        [("missing fence.proxy.async", "kv[1][0]",
          "producer cp_async_16 writes kv[1][0] (unit 0 pair 1)",
          "consumer 0 issue_qk_narrow reads kv[1][0] (unit 0 pair 1)"),
         ("missing fence.proxy.async", "kv[1][1]",
          "producer cp_async_16 writes kv[1][1] (unit 0 pair 1)",
          "consumer 1 issue_qk_narrow reads kv[1][1] (unit 0 pair 1)")],
        id="narrow: no fence after a block's wait"),
    pytest.param(
        KERNEL_ORDER, FIRST_EXACT, lambda r: mutate(r, ["consumer 1"], lambda e: e.target == "kv_empty[0][0]"),
        [("deadlock", "kv_empty[0][0]", "producer mbarrier_wait kv_empty[0][0] (unit 0 pair 2)", "phase 0")],
        id="a consumer never releases a block"),
    pytest.param(
        KERNEL_ORDER, FIRST_EXACT,
        lambda r: mutate(r, ["consumer 1"], lambda e: e.target == "kv_empty[0][0]" and e.label == "unit 0 pair 0"),
        [("deadlock", "happens-before cycle")],  # its next arrival completes the phase, after the refill it waits for
        id="a consumer misses one release"),
    pytest.param(
        KERNEL_ORDER, FIRST_EXACT,
        lambda r: mutate(r, ["consumer 1"], lambda e: e.name == "named_barrier_sync<kRowSumReady> (output scales)"),
        [("deadlock", "kRowSumReady", "consumer 0 passes it 4 times", "consumer 1 2 times")],
        id="one consumer skips a bar.sync"),
    pytest.param(
        KERNEL_ORDER, FIRST_EXACT,
        lambda r: mutate(r, ["producer"], is_wait("kv_empty[0][0]"), lambda e: [replace(e, phase=e.phase + 1)]),
        [("deadlock", "happens-before cycle")],
        id="producer waits for a stage's next release"),
]


@pytest.mark.parametrize("order, units, mutation, expected", MUTATIONS)
def test_each_broken_ordering_is_found(order, units, mutation, expected):
    """Each expected finding as (kind, buffer, first event, second event), or its first fields only
    (which wait a cycle is reported from is arbitrary)."""
    findings = check(mutation(kernel_roles(order, units)))
    found = [(f.kind, f.buffer, f.first, f.second) for f in findings]
    missing = [e for e in expected if not any(f[: len(e)] == e for f in found)]
    assert not missing, f"not found: {missing}\nfound:\n{report(findings)}"


@pytest.mark.parametrize("dropped", [is_second_row_sum_barrier, is_next_units_first_probs_barrier],
                         ids=["kRowSumReady (output scales)", "the next unit's first kProbsReady"])
def test_the_narrow_epilogue_reads_are_ordered_twice(dropped):
    """The epilogue's head_max reads (consumer 0's warp 0) come before the next unit's exact-path
    stores through the epilogue's second kRowSumReady and through the next unit's first kProbsReady:
    without either one alone, head_max stays ordered (the mutation without both is found above)."""
    findings = check(mutate(kernel_roles(NARROW_ORDER, FIRST_EXACT), CONSUMERS, dropped))
    assert not [f for f in findings if f.buffer.startswith("head_")], report(findings)


def test_the_model_names_every_member_of_shared_storage():
    """A buffer or barrier added to the kernel's shared memory must be added to the model too: the
    wide tile's order (with the split merge), the narrow tile's and the grouped one's name them all between them."""
    traits = TRAITS.read_text()
    # SharedStorage's parts: traits.cuh's Shared* structs, which every tile has, and each tile's own
    # members (the SharedMembers of its file under tiles/), whose free bytes (`unused`) are no buffer.
    parts = [(traits, name) for name in re.findall(r"^struct (Shared\w+)\b", traits, re.M)]
    for header in sorted((TRAITS.parent / "tiles").glob("*.cuh")):
        text = header.read_text()
        parts += [(text, name) for name in sorted(set(re.findall(r"using SharedMembers = (\w+)<", text)))]
    members = set()
    for text, name in parts:
        storage = re.search(rf"^struct {name}\b[^;{{]*\{{(.*?)\n\}};", text, re.S | re.M).group(1)
        members |= set(re.findall(r"^\s*(?:alignas\(\d+\)\s+)?\w+\s+(\w+)\s*[\[;]", storage, re.M))
    members.discard("unused")
    named_barriers = set(re.findall(r"^\s*(k\w+) = \d+,", traits, re.M))
    roles = [kernel_roles(KERNEL_ORDER, SPLIT_AND_EMPTY), kernel_roles(NARROW_ORDER, WITH_AN_EMPTY_UNIT),
             kernel_roles(GROUPED_ORDER, WITH_AN_EMPTY_UNIT)]
    targets = {e.target.split("[")[0] for r in roles for events in r.values() for e in events if e.target}
    assert members and named_barriers, "traits.cuh's layout changed: update the patterns above"
    assert targets == members | named_barriers
