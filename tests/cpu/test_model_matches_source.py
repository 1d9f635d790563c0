"""The happens-before model (pair_loop_model.py) against the kernel's headers: for each role function,
the synchronization operations and shared-memory accesses that the source executes on one path
(kernel_source.py reads them from the function's body), in order, are the model's events for the same
function and path. Reordering, adding or removing such a statement in the kernel without the model
fails here; a failure prints both sequences, the source's with its header lines (`python3
tests/cpu/test_model_matches_source.py [CASE]` prints them for every case, or CASE). The mutation
tests prove that it fails. No GPU, no compiler."""

from __future__ import annotations

import pathlib
import re
from dataclasses import dataclass, field
from itertools import zip_longest

import pytest

import pair_loop_model as model
from kernel_source import Function, Op, sync_path
from pair_loop_model import GROUPED_ORDER, KERNEL_ORDER, NARROW_ORDER, Event, Unit

pytestmark = pytest.mark.cpu

PREFILL = pathlib.Path(__file__).parents[2] / "include" / "sparse_mla" / "sm90" / "prefill"
ORDERS = {"wide": KERNEL_ORDER, "grouped": GROUPED_ORDER, "narrow": NARROW_ORDER}


# ---- Both sides as one comparable sequence. ----
def normalized(ops):
    """(op, target) of each operation; a run of accesses of one kind (reads, or writes) is one entry,
    the set of its buffers: the model does not order a thread's accesses between two synchronizations,
    and the source touches a buffer once per element where the model has one event."""
    out = []
    for op in ops:
        if op.op in model.ACCESSES and out and out[-1][0][0] == op.op:
            out[-1][0] = (op.op, out[-1][0][1] | {op.target})
            out[-1][1].append(op)
        elif op.op in model.ACCESSES:
            out.append([(op.op, frozenset({op.target})), [op]])
        else:
            out.append([op.key(), [op]])
    return [(key, members) for key, members in out]


def model_ops(events):
    """The model's events as operations: the buffer's name without its stage and block indices (a
    wait_group: the groups it leaves in flight; cp.async.wait_all: a commit, then wait_group 0)."""
    ops = []
    for e in events:
        if e.op == "cp.async.wait_all":
            ops += [Op("cp.async.commit_group", name=e.name), Op("cp.async.wait_group", "0", name=e.name)]
        else:
            target = str(e.pending) if e.op.endswith("wait_group") else re.sub(r"\[.*", "", e.target)
            ops.append(Op(e.op, target, name=e.name))
    return ops


def mismatch(source_ops, events):
    """None where the two agree, else both sequences side by side (side_by_side)."""
    source, modelled = normalized(source_ops), normalized(model_ops(events))
    return None if [key for key, _ in source] == [key for key, _ in modelled] else side_by_side(source_ops, events)


def side_by_side(source_ops, events):
    """Row by row: the source's operation and its header lines, the model's event and the statement
    it names; "!!" marks where they differ."""
    source, modelled = normalized(source_ops), normalized(model_ops(events))
    rows = []
    for s, m in zip_longest(source, modelled):
        show = lambda entry: "-" if entry is None else f"{entry[0][0]} {_target(entry[0][1])}"
        mark = "  " if s is not None and m is not None and s[0] == m[0] else "!!"
        lines = "" if s is None else ",".join(dict.fromkeys(str(op.line) for op in s[1]))
        names = "" if m is None else "; ".join(dict.fromkeys(op.name for op in m[1]))
        rows.append(f"{mark} {show(s):<34} {lines:<8} {show(m):<34} {names}")
    return "   source, header line                     | model, statement\n" + "\n".join(rows)


def _target(t):
    return ",".join(sorted(t)) if isinstance(t, frozenset) else t


def trace(emit):
    """The events a model function emits into a fresh trace."""
    c = model._Trace()
    emit(c)
    return c.events


def marker(name, *events):
    """A stand-in for a model function that the compared function calls: the call, as the source's."""
    def emit(c, *args):
        c(*events, Event("call", name, name))
    return emit


# ---- What each compared function's path is, on both sides. ----
@dataclass
class Case:
    header: str
    function: str
    decide: dict  # the source's conditions around operations -> taken (a value, or of the env)
    model: object  # () -> the model's events for the same path
    loops: dict = field(default_factory=dict)
    env: dict = field(default_factory=dict)
    calls: tuple = ()
    not_modelled: tuple = ()
    definition: int = 0  # which definition of an overloaded name
    then: object = None  # a Case whose path follows (a tail call to an overload)

    def source_ops(self, text=None):
        header = text if text is not None else (PREFILL / self.header).read_text()
        ops = sync_path(Function(header, self.function, self.definition), self.decide, self.loops, self.env, self.calls,
                        self.not_modelled)
        return ops + (self.then.source_ops(text if self.then.header == self.header else None) if self.then else [])


def softmax_case(tile, exact):
    """softmax_to_probs (consumer.cuh): the tile's overload reads the valid bits (not the grouped tile,
    whose mask came from grouped_row_words) and ends in a call of the generic one, compared after it."""
    order = ORDERS[tile]
    generic = Case("consumer.cuh", "softmax_to_probs", definition=1, model=None, decide={
        "!named_barrier_sync_or<kProbsReady, NUM_CONSUMER_THREADS>(moved)": not exact,
        "c == 0": True,
        "Mask::kSharedByTokens": tile == "grouped",
        "SCALED": False,  # the model's kv rows are contiguous (paged rows: the same order, other arithmetic)
        "named_barrier_sync_or<kRowMaxReady, NUM_CONSUMER_THREADS>(nan)": True,  # the model clears on every exact pair
    })
    return Case("consumer.cuh", "softmax_to_probs", then=generic,
                decide={"TileTraits<TILE>::kGroups": tile == "grouped", "LAYOUT == KvLayout::kPaged": False},
                model=lambda: trace(lambda c: model._softmax_to_probs(c, order, exact, 0, 0, 0, [])))


def softmax_narrow_case(exact):
    """softmax_narrow (tiles/narrow.cuh): the model's first event, the valid bits' load, is the caller's
    argument (run_narrow_mainloop's ss.valid[..]), compared there."""
    return Case("tiles/narrow.cuh", "softmax_narrow", decide={
        "!named_barrier_sync_or<kProbsReady, NUM_CONSUMER_THREADS>(moved)": not exact,
        "g == 0": True,
        "fused": True,
        "SCALED": False,  # the model's kv rows are contiguous
    }, model=lambda: trace(lambda c: model._softmax_narrow(c, NARROW_ORDER, exact, 0, 0, 0, []))[1:])


def mainloop_case(tile, softmax, unit_count=1, pair_base=3, wg=0):
    """run_consumer_mainloop (consumer.cuh) for one unit, its softmax a call (compared above)."""
    order, unit = ORDERS[tile], Unit(softmax)

    def events(monkeypatch):
        monkeypatch.setattr(model, "_softmax_to_probs", marker("softmax_to_probs"))
        return trace(lambda c: model._run_consumer_mainloop(c, order, unit, unit_count, pair_base, wg))

    return Case("consumer.cuh", "run_consumer_mainloop", model=events, calls=("softmax_to_probs",),
                env={"n_pairs": unit.n_pairs, "softmax": softmax}, loops={
                    "int pair = 0; pair < n_pairs; ++pair": ("pair", unit.n_pairs)}, decide={
        "n_pairs == 0": lambda e: e["n_pairs"] == 0,
        "n_pairs == 1": lambda e: e["n_pairs"] == 1,
        "TileTraits<TILE>::kGroups": tile == "grouped",
        "!ONE_BLOCK || wg == 0": True,
        "ONE_BLOCK": False,
        # The model's data: an exact pair other than the unit's first rescales O.
        "rescale": lambda e: e["pair"] > 0 and e["softmax"][e["pair"]] == "E",
        "has_next": lambda e: e["pair"] + 1 < e["n_pairs"],
        "pair + 2 == n_pairs": lambda e: e["pair"] + 2 == e["n_pairs"],
    })


def narrow_mainloop_case(softmax, unit_count=1, pair_base=3, wg=0):
    """run_narrow_mainloop (tiles/narrow.cuh) for one unit, its softmax a call after its argument's load."""
    unit = Unit(softmax)

    def events(monkeypatch):
        argument = Event("ld.shared", "ss.valid (softmax_narrow's argument)", "valid")
        monkeypatch.setattr(model, "_softmax_narrow", marker("softmax_narrow", argument))
        return trace(lambda c: model._run_consumer_mainloop(c, NARROW_ORDER, unit, unit_count, pair_base, wg))

    return Case("tiles/narrow.cuh", "run_narrow_mainloop", model=events, calls=("softmax_narrow",),
                env={"n_pairs": unit.n_pairs}, loops={
                    "int pair = 0; pair + 1 < n_pairs; ++pair": ("pair", max(unit.n_pairs - 1, 0))}, decide={
        "n_pairs == 0": lambda e: e["n_pairs"] == 0,
        "!ONE_BLOCK": True,
        "!ONE_BLOCK || wg == 0": True,
    })


def producer_case(tile, n_pairs, unit_count=1, pair_base=1):
    """produce_unit (producer.cuh): the model's events of the CTA's unit `unit_count`, after units of
    `pair_base` pairs (so that its first pairs' stages are fresh, the later ones reused)."""
    order = ORDERS[tile]
    units = (Unit("E" * pair_base),) * (unit_count > 0) + (Unit("E" + "F" * (n_pairs - 1) if n_pairs else ""),)
    assert unit_count == len(units) - 1

    def events():
        return [e for e in model.producer_events(order, units)
                if e.where[0] == unit_count and e.op != "cp.async.wait_all"]  # run_producer's, after the units

    # Paged rows' warp syncs and requantization (not taken: PAGED is decided false) are not modelled.
    return Case("producer.cuh", "produce_unit", model=events, env={"n_pairs": n_pairs, "pair_base": pair_base},
                not_modelled=("__syncwarp", "requantize_block"), loops={
        "int pair = 0; pair < n_pairs; ++pair": ("pair", n_pairs),
        "int b = 0; b < 2; ++b": ("b", 2),
    }, decide={
        "TileTraits<TILE>::kGroups": tile == "grouped",
        "GROUPED": tile == "grouped",
        "PAGED": False,  # the model's kv rows are contiguous
        "lane == 0 && warp == 0": True,
        "q.reused()": unit_count > 0,
        "copies_arrive<TILE, LAYOUT>()": tile == "narrow",
        "!copies_arrive<TILE, LAYOUT>()": tile != "narrow",
        "n_pairs == 0": lambda e: e["n_pairs"] == 0,
        "stage.reused()": lambda e: e["pair_base"] + e["pair"] >= model.NUM_STAGES,
        "one_block_tile<TOPK, TILE>() && b == 1": False,
        "copies_mask": True,
        "lane == 0": True,
        "pair == 0": lambda e: e["pair"] == 0,
    })


def run_producer_case(tile, units=(Unit("EF"), Unit(""), Unit("E"))):
    """run_producer (producer.cuh): produce_unit for each unit (compared above), then, where the copies
    arrive by themselves, the wait that no copy outlives its thread."""
    def events():
        after_units = [e for e in model.producer_events(ORDERS[tile], units) if e.op == "cp.async.wait_all"]
        return [Event("call", "produce_unit", "produce_unit")] * len(units) + after_units

    return Case("producer.cuh", "run_producer", model=events, calls=("produce_unit",),
                loops={"; scheduler.has_work(); scheduler.advance()": ("unit", len(units))},
                decide={"copies_arrive<TILE, LAYOUT>()": tile == "narrow"})


def store_outputs_case(tile):
    """store_outputs (epilogue.cuh), by consumer 0 (which computes the output scales)."""
    return Case("epilogue.cuh", "store_outputs", model=lambda: trace(lambda c: model._store_outputs(c, 0)), decide={
        "c == 0": True,
        "wg == 0": True,
        "TileTraits<TILE>::kGroups": tile == "grouped",
        "params.out_stride_s != static_cast<int64_t>(params.h_q) * params.out_stride_h": False,
        "aligned": True,
        "decltype(aligned_pairs)::value": True,
        "decltype(rows_by_token)::value": False,
        "8 * j + 2 * c + e >= num_heads": False,
    })


MERGE = Case("split.cuh", "merge_split_parts", model=lambda: trace(lambda c: model._merge_split_parts(c, 0)), decide={
    "t == 0": True,
    "__shfl_sync(0xffffffffu, ss.split_last, 0) == 0": False,  # this CTA merges
})
STORE_NARROW = Case("tiles/narrow.cuh", "store_outputs_narrow",
                    model=lambda: trace(lambda c: model._store_outputs_narrow(c, 0)), decide={
    "g == 0": True,
    "wg == 0 && warp == 0": True,
    "t < NH": True,
    "head >= num_heads": False,
})

def unit_loop_case(tile, units):
    """The consumers' unit loop, each unit's mainloop, merge and epilogue a call (compared above):
    prefill_kernel's (kernel.cuh; the grouped tile first waits for q_full and takes the unit the
    producer wrote) or, for the narrow tile, run_narrow_consumers (tiles/narrow.cuh)."""
    order = ORDERS[tile]
    narrow = tile == "narrow"
    mainloop = "run_narrow_mainloop" if narrow else "run_consumer_mainloop"

    def events(monkeypatch):
        monkeypatch.setattr(model, "_run_consumer_mainloop", marker(mainloop))
        monkeypatch.setattr(model, "_merge_split_parts", marker("merge_split_parts"))
        monkeypatch.setattr(model, "_store_outputs", marker("store_outputs"))
        monkeypatch.setattr(model, "_store_outputs_narrow", marker("store_outputs_narrow"))
        return model.consumer_events(order, units, 0)

    return Case("tiles/narrow.cuh" if narrow else "kernel.cuh", "run_narrow_consumers" if narrow else "prefill_kernel",
                model=events, calls=(mainloop, "merge_split_parts", "store_outputs", "store_outputs_narrow"),
                not_modelled=("__syncthreads",),  # the barriers' initialisation, before the roles (not modelled)
                loops={"; scheduler.has_work(); scheduler.advance()": ("unit", len(units))}, decide={
        "threadIdx.x >= NUM_CONSUMER_THREADS": False,  # the consumers' role
        "Traits::kNarrow": narrow,
        "Traits::kGroups": tile == "grouped",
        "scheduler.is_split_part()": lambda e: units[e["unit"]].split is not None,
        "!merge_split_parts<D_QK>(params, ss, st, w)": lambda e: units[e["unit"]].split == "publishes",
    })


CASES = {
    **{f"softmax_to_probs {tile} {path}": softmax_case(tile, path == "exact")
       for tile in ("wide", "grouped") for path in ("exact", "fast")},
    **{f"softmax_narrow {path}": softmax_narrow_case(path == "exact") for path in ("exact", "fast")},
    **{f"run_consumer_mainloop {tile} {pairs}": mainloop_case(tile, pairs)
       for tile in ("wide", "grouped") for pairs in ("", "E", "EF", "EFEF")},
    **{f"run_narrow_mainloop {pairs}": narrow_mainloop_case(pairs) for pairs in ("", "E", "EF", "EFE")},
    **{f"produce_unit {tile} {n} pairs": producer_case(tile, n) for tile in ORDERS for n in (0, 1, 3)},
    "produce_unit wide, the first unit": producer_case("wide", 2, unit_count=0, pair_base=0),
    **{f"run_producer {tile}": run_producer_case(tile) for tile in ORDERS},
    **{f"store_outputs {tile}": store_outputs_case(tile) for tile in ("wide", "grouped")},
    "prefill_kernel wide": unit_loop_case("wide", (Unit("EFF", split="publishes"), Unit(""), Unit("E"),
                                                   Unit("EF", split="merges"))),
    "prefill_kernel grouped": unit_loop_case("grouped", (Unit("EF"), Unit(""), Unit("E"))),
    "run_narrow_consumers": unit_loop_case("narrow", (Unit("EF"), Unit(""), Unit("E"))),
    "merge_split_parts": MERGE,
    "store_outputs_narrow": STORE_NARROW,
}


def model_events(case, monkeypatch):
    return case.model(monkeypatch) if case.model.__code__.co_argcount else case.model()


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_the_model_follows_the_source(case, monkeypatch):
    diff = mismatch(case.source_ops(), model_events(case, monkeypatch))
    assert diff is None, f"{case.header} {case.function} and the model differ:\n{diff}"


# ---- The comparison fails where the source moves, adds or drops an operation. ----
def _swap(first, second, after=""):
    """The header with the first line containing `first` (from the first line containing `after` on)
    and the next line containing `second` swapped."""
    def mutate(text):
        lines = text.split("\n")
        start = next(k for k, line in enumerate(lines) if after in line)
        i = next(k for k in range(start, len(lines)) if first in lines[k])
        j = next(k for k in range(i + 1, len(lines)) if second in lines[k])
        lines[i], lines[j] = lines[j], lines[i]
        return "\n".join(lines)
    return mutate


def _replace(old, new):
    def mutate(text):
        assert text.count(old) == 1, old
        return text.replace(old, new)
    return mutate


MUTATIONS = {
    # Block 0 released before its V rows are in registers.
    "kv_empty arrival before the ldmatrix": ("run_consumer_mainloop wide EF", _swap(
        "load_v_fragments(smem_addr(ss.kv[stage.index][0])", "mbarrier_arrive(&ss.kv_empty[stage.index][0]);")),
    # The P.V wait after the softmax's first barrier (f7e0947's order).
    "P.V retired after kProbsReady": ("softmax_to_probs wide fast", _swap(
        "cute::warpgroup_wait<0>();", "if (!named_barrier_sync_or<kProbsReady", after="logits.write_probs(all_valid")),
    "no fence for the new references' P": ("softmax_to_probs wide exact", _replace(
        "  cutlass::arch::fence_view_async_shared();  // P: generic stores -> wgmma reads\n  return",
        "  return")),
    "the producer's fence of block 1 dropped": ("produce_unit wide 3 pairs", _replace(
        "      cutlass::arch::fence_view_async_shared();\n      mbarrier_arrive(&ss.kv_full[stage.index][1]);",
        "      mbarrier_arrive(&ss.kv_full[stage.index][1]);")),
    "q_full arrival before the copies landed": ("produce_unit wide 1 pairs", _swap(
        "cp_async_wait<1>();", "if (pair == 0) mbarrier_arrive(&ss.q_full);")),
    "a second kv_empty wait": ("produce_unit narrow 3 pairs", _replace(
        "if (stage.reused()) mbarrier_wait(&ss.kv_empty[stage.index][b], stage.empty_phase());",
        "if (stage.reused()) mbarrier_wait(&ss.kv_empty[stage.index][b], stage.empty_phase());\n"
        "      if (stage.reused()) mbarrier_wait(&ss.kv_empty[stage.index][b], stage.empty_phase());")),
    "the narrow tile's take_v before the softmax": ("run_narrow_mainloop EF", _swap(
        "rescale = softmax_narrow(ss, s, ss.valid[next.index][wg]", "take_v(next);")),
    "the output scales read before their barrier": ("store_outputs_narrow", _swap(
        "named_barrier_sync<kRowSumReady, NUM_CONSUMER_THREADS>();", "const float sc = ss.out_scale[head];",
        after="ss.out_scale[head] = r.scale;")),
    "split_last read before its barrier": ("merge_split_parts", _swap(
        "named_barrier_sync<kSplitMerge, NUM_CONSUMER_THREADS>();", "if (__shfl_sync(0xffffffffu, ss.split_last, 0) == 0)",
        after="ss.split_last = atomicAdd")),
    "the grouped unit taken before the q_full wait": ("prefill_kernel grouped", _swap(
        "mbarrier_wait(&ss.q_full, QStage(scheduler.unit_count()).phase);",
        "w = scheduler.current_from_producer(ss.group_unit[scheduler.unit_count() % 2]);")),
    "the grouped tile's row masks read after Q.K^T's issue": ("run_consumer_mainloop grouped EF", _swap(
        "if constexpr (TileTraits<TILE>::kGroups) row_words = grouped_row_words(ss, stage.next().index, wg);",
        "if (!ONE_BLOCK || wg == 0) issue_qk(ss, stage.next().index, wg, s);")),
}


@pytest.mark.parametrize("name", MUTATIONS)
def test_a_changed_source_fails_the_comparison(name, monkeypatch):
    case_name, mutate = MUTATIONS[name]
    case = CASES[case_name]
    header = (PREFILL / case.header).read_text()
    changed = mutate(header)
    assert changed != header
    events = model_events(case, monkeypatch)
    assert mismatch(case.source_ops(header), events) is None  # the unchanged header agrees
    assert mismatch(case.source_ops(changed), events) is not None, f"{name}: the changed header still matches the model"


def test_a_changed_model_fails_the_comparison():
    """The other direction: f7e0947's order (the P.V retired after the softmax's first barrier) is
    not the source's."""
    case = softmax_case("wide", exact=False)
    old = trace(lambda c: model._softmax_to_probs(c, model.F7E0947_ORDER, False, 0, 0, 0, []))
    assert mismatch(case.source_ops(), case.model()) is None
    assert mismatch(case.source_ops(), old) is not None


def test_a_new_branch_around_an_operation_must_be_decided():
    header = (PREFILL / "epilogue.cuh").read_text()
    changed = header.replace("  named_barrier_sync<kRowSumReady, NUM_CONSUMER_THREADS>();\n  if (wg == 0)",
                             "  if (num_heads > 1) named_barrier_sync<kRowSumReady, NUM_CONSUMER_THREADS>();\n  if (wg == 0)", 1)
    assert changed != header
    with pytest.raises(KeyError, match=r"undecided: if \(num_heads > 1\)"):
        store_outputs_case("wide").source_ops(changed)


def test_an_operation_the_extractor_does_not_know_is_an_error():
    header = (PREFILL / "split.cuh").read_text()
    changed = header.replace("  __threadfence();\n  named_barrier_sync<kSplitMerge",
                             "  __threadfence();\n  __syncthreads();\n  named_barrier_sync<kSplitMerge", 1)
    assert changed != header
    with pytest.raises(ValueError, match="__syncthreads: an operation kernel_source.py does not read"):
        MERGE.source_ops(changed)


if __name__ == "__main__":  # each case's operations beside the model's events, with the header lines
    import sys

    class _Patch:  # monkeypatch's setattr, for the cases whose model stands a call in for a function
        def setattr(self, owner, name, value):
            setattr(owner, name, value)

    for name, case in CASES.items():
        if sys.argv[1:] in ([], [name]):
            saved = dict(vars(model))
            print(f"{name} ({case.header} {case.function}):")
            print(side_by_side(case.source_ops(), model_events(case, _Patch())), end="\n\n")
            vars(model).update(saved)
