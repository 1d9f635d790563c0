"""A happens-before model of one CTA of the SM90 prefill kernel (include/sparse_mla/sm90/prefill/).

What it models. The events of the producer warpgroup (produce_unit, producer.cuh) and of the two
consumer warpgroups (run_consumer_mainloop, softmax_to_probs, merge_split_parts, store_outputs; or,
with the narrow-head tile, run_narrow_mainloop, softmax_narrow, store_outputs_narrow: tiles/narrow.cuh), both
in the roles' unit loops (run_producer; kernel.cuh, or run_narrow_consumers), for a sequence of work units
on one CTA, each event named after the kernel statement it stands for: cp.async issue, commit and
wait_group; mbarrier arrivals (plain, and the cp.async-tracking
cp_async_arrive_noinc) and parity waits; named barriers (bar.sync); wgmma issue, commit and
wait_group; st.shared, ld.shared and ldmatrix; fence.proxy.async. From them, check() builds the
happens-before graph:
- program order within each agent (a warpgroup is one agent);
- an mbarrier phase completes after all of its arrivals (the k-th arrival set of each arriving agent is
  phase k, as the hardware counts them) and before every wait on it;
- a named barrier instance (bar.sync instances match by id in order of occurrence) follows both
  consumers' arrivals and precedes both departures;
- a cp.async's write is its own node, after its issue and before the noinc arrival that tracks it and the
  wait_group that covers it; a wgmma's shared-memory read, after its issue and before the wait_group
  that retires it; a noinc arrival completes only after every earlier cp.async of its thread landed.
It then reports (as Finding) every shared buffer access pair of which one writes that no path orders
(write-after-read, read-after-write, write-after-write), every generic-proxy write (cp.async,
st.shared) read by wgmma (the async proxy) with no fence.proxy.async after the write's completion and
before the read in the writer or the reader, mbarrier phases whose parity waits or arrivals could see
the wrong phase, and deadlocks (a cycle, a phase nobody completes, bar.sync counts that differ).

A warpgroup is one agent, but its threads are not ordered by program order among themselves: when
an access reaches elements other threads of the same warpgroup write or read (alpha, the epilogue's
row statistics and out_scale, split_last, the narrow tile's per-warp head statistics and references,
and a wgmma reading the whole P tile), the pair must also
be ordered by a path through a barrier phase or a named barrier instance (every one of them joins all
threads of the consumers: every consumer thread arrives on kv_empty and q_empty). A wgmma's own reads
need no such path to the same warpgroup's later stores: every thread's wait_group retires the whole
wgmma.

The event lists are built by functions that follow the kernel statement by statement (each names the
kernel function it follows), for a KernelOrder and a sequence of Units; `python
tests/cpu/pair_loop_model.py` prints those of KERNEL_ORDER (`... narrow`: NARROW_ORDER's). Proxies:
cp.async (non-bulk) and st.shared write through the generic proxy, wgmma reads its shared operands
through the async proxy; a wgmma's reads followed by generic writes need no proxy fence (the
wait_group that retires it completes them).

What it does not model: global memory (the split workspace and counters with their __threadfence, the
outputs, the indices); registers and their wgmma fences (warpgroup_arrive, fence_operands); the
one-block tile (TOPK <= 64: block 1 neither gathered nor multiplied); what the compiler may move
(plain C++ shared accesses around an asm without a "memory" clobber: mbarrier_arrive has one); data: each
pair's softmax path is given (Unit.softmax), and an exact pair other than a unit's first rescales O.

The rule: a change to the consumer loop's (either tile's) or the producer's order changes this model in
the same commit. test_model_matches_source.py holds the model to it: for each role function it
compares the function's events here with the operations kernel_source.py reads from the header's
function body, on the same path.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, replace
from itertools import combinations

NUM_STAGES = 2  # traits.cuh
CONSUMERS = ("consumer 0", "consumer 1")


@dataclass(frozen=True)
class KernelOrder:
    """The orderings the kernel could use: f7e0947's, the shipped one, and the measured alternatives
    (docs/lab.md, Experiments 34 and 35)."""

    pv_wait_in_softmax: bool  # (a) softmax_to_probs retires the in-flight P.V before its first kProbsReady
    # Where the cp.async gathers are fenced for wgmma: "none"; "producer": per pair, both blocks
    # issued and committed, then wait_group 1 (block 0, and Q on a unit's first pair, landed), fence,
    # arrive on q_full and kv_full of block 0, then wait_group 0, fence, arrive on block 1 (a unit with
    # no pair: Q alone, wait_group 0, fence, arrive); "consumer": (c) a fence after each kv_full wait of the
    # consumer's own block, before its Q.K^T; "softmax": the kv_full wait of pair p + 1's own block
    # moved into softmax(p), before the fence its P needs anyway, which then serves both (the first
    # block of a unit: a fence after its wait, as in (c)).
    proxy_fence: str
    probs_buffers: int  # P rotates through probs[pair % probs_buffers]
    # The consumers' tile: "wide" (consumer.cuh, epilogue.cuh, split.cuh: 64 heads) or "narrow"
    # (tiles/narrow.cuh, h_q <= NARROW_HEADS, 32, 16 or 8 heads: the same pair loop, but the exact path exchanges per-warp head
    # maxima through head_max, alpha stays in registers, the epilogue reduces head_sum, head_max and
    # head_reference; whole items only, no split merge) or "grouped" (Tile::kGrouped: the wide tile's
    # order over a token group, the producer copying each tile row's valid bits (its token's mask from
    # the pre-pass) into row_valid with the block's rows and handing each unit (group, pairs)
    # to the consumers in group_unit, a slot per unit parity, before its q_empty wait; the consumers
    # read it after waiting for q_full; no split merge).
    tile: str = "wide"
    # The narrow tile's early release (tiles/narrow.cuh): a pair's V rows go into registers and the pair back
    # to the producer right after the pair's softmax; P.V of both blocks is one wgmma group, issued
    # after the next pair's Q.K^T, and the consumer retires the Q.K^T alone (wait_group 1) before the
    # next softmax.
    v_after_softmax: bool = False
    # With the producer-side fence: pairs the producer issues ahead of the one it hands over. With 1,
    # pair p + 1's copies are committed before pair p's handoff waits (wait_group 3, then 2): a
    # measured alternative (docs/lab.md, Experiment 57), where the copies' own arrival
    # (proxy_fence "consumer") needs no lookahead, the producer never waiting for a copy.
    producer_lookahead: int = 0

    def __post_init__(self):
        assert self.proxy_fence in ("none", "producer", "consumer", "softmax"), self.proxy_fence
        assert self.probs_buffers in (2, 3), self.probs_buffers
        assert self.tile in ("wide", "narrow", "grouped"), self.tile
        assert not self.v_after_softmax or (self.tile == "narrow" and self.pv_wait_in_softmax
                                            and self.proxy_fence in ("producer", "consumer")), "tiles/narrow.cuh's order only"
        assert self.producer_lookahead in (0, 1) and (self.producer_lookahead == 0 or self.proxy_fence == "producer")


# The kernel at f7e0947: P.V(p, block 1) retired after the softmax's barrier, the cp.async-tracking
# arrive and no proxy fence anywhere.
F7E0947_ORDER = KernelOrder(pv_wait_in_softmax=False, proxy_fence="none", probs_buffers=2)
# The order the kernel ships: the P.V wait before the softmax's first barrier and the producer-side
# proxy fence, per pair; consumer.cuh and producer.cuh point here. The one definition: change it with
# the kernel, in the same commit.
KERNEL_ORDER = KernelOrder(pv_wait_in_softmax=True, proxy_fence="producer", probs_buffers=2)
# The narrow-head tiles, of 32, 16 and 8 heads (kernel.cuh's narrow path, tiles/narrow.cuh: one order, NH a
# template parameter), as they ship: the early release, the copies' landing arriving on kv_full and
# q_full by itself (copies_arrive in pipeline.cuh) and each consumer's fence after its wait; tiles/narrow.cuh
# points here. Change it with the kernel, in the same commit.
NARROW_ORDER = replace(KERNEL_ORDER, tile="narrow", v_after_softmax=True, proxy_fence="consumer")
# The grouped tile (token_groups/) as it ships: KERNEL_ORDER with per-token valid bits.
GROUPED_ORDER = replace(KERNEL_ORDER, tile="grouped")


@dataclass(frozen=True)
class Unit:
    """One work unit of the CTA: the softmax path of each of its pairs ("E" exact, "F" fast; both
    consumers always take the same one), and for a split unit whether this CTA merges the item."""

    softmax: str
    split: str | None = None  # None, "publishes" (another CTA merges the item) or "merges"

    @property
    def n_pairs(self) -> int:
        return len(self.softmax)


@dataclass(frozen=True)
class Event:
    op: str  # the PTX-level operation, see Graph._add_agent
    name: str  # the kernel function or statement
    target: str = ""  # the shared buffer or barrier
    phase: int = 0  # mbarrier.wait: the phase index (the kernel waits for its parity)
    pending: int = 0  # wait_group: groups left in flight
    arrivals: int = 1  # mbarrier.arrive: how many of the agent's per-phase arrivals it stands for
    cross_thread: bool = False  # reaches elements other threads of the warpgroup access
    where: tuple = ()  # (unit, pair) the statement works on, to tell which access is meant first
    label: str = ""  # "unit 0 pair 2", "unit 1 epilogue"

    def __str__(self):
        return " ".join(filter(None, (self.name, self.target, f"({self.label})")))


# Constructors, one per kind of statement.
def cp_async_16(buffer):
    return Event("cp.async", "cp_async_16", buffer)


def cp_async_8(buffer):
    return Event("cp.async", "cp_async_8", buffer)


def cp_async_commit_group():
    return Event("cp.async.commit_group", "cp.async.commit_group")


def cp_async_wait_group(pending):
    return Event("cp.async.wait_group", f"cp.async.wait_group {pending}", pending=pending)


def cp_async_wait_all():
    return Event("cp.async.wait_all", "cp.async.wait_all")


def cp_async_arrive_noinc(barrier):
    """cp_async_arrive_noinc (primitives.cuh; f7e0947 called CUTLASS's cpasync_barrier_arrive_noinc)."""
    return Event("mbarrier.arrive.noinc", "cp_async_arrive_noinc", barrier)


def arrive(barrier, name="mbarrier_arrive", arrivals=1):
    return Event("mbarrier.arrive", name, barrier, arrivals=arrivals)


def mbarrier_wait(barrier, phase, name="mbarrier_wait"):
    return Event("mbarrier.wait", name, barrier, phase=phase)


def bar_sync(barrier_id, name):
    return Event("bar.sync", name, barrier_id)


def wgmma(name, buffer):
    """One wgmma batch's read of one shared operand (issue_qk reads two: one event each)."""
    return Event("wgmma", name, buffer, cross_thread=True)


def warpgroup_commit_batch():
    return Event("wgmma.commit_group", "warpgroup_commit_batch")


def warpgroup_wait(pending, name=None):
    return Event("wgmma.wait_group", name or f"warpgroup_wait<{pending}>", pending=pending)


def st_shared(buffer, name, cross_thread=False):
    return Event("st.shared", name, buffer, cross_thread=cross_thread)


def ld_shared(buffer, name, cross_thread=False):
    return Event("ld.shared", name, buffer, cross_thread=cross_thread)


def ldmatrix_x4_trans(buffer):
    return Event("ldmatrix", "ldmatrix_x4_trans", buffer)


def fence_proxy_async(name):
    return Event("fence.proxy.async", name)


class _Trace:
    """One agent's events in program order, each tagged with the unit and pair it works on."""

    def __init__(self):
        self.events = []
        self.where, self.label = (0, 0), ""

    def at(self, unit, step, part=None):
        self.where, self.label = (unit, step), f"unit {unit} {part or f'pair {step}'}"

    def __call__(self, *events):
        self.events += [replace(e, where=self.where, label=self.label) for e in events]


def kernel_roles(order: KernelOrder, units) -> dict[str, list[Event]]:
    """The event list of each role, in program order, for the CTA's work units `units`."""
    return {"producer": producer_events(order, units),
            "consumer 0": consumer_events(order, units, 0),
            "consumer 1": consumer_events(order, units, 1)}


# ---- The producer: run_producer's unit loop and produce_unit (producer.cuh). ----
def producer_events(order, units):
    p = _Trace()
    pair_base = 0  # pairs of earlier units: stages and phases continue across units
    for unit_count, unit in enumerate(units):
        p.at(unit_count, 0)
        if order.tile == "grouped":  # the unit for the consumers, in the slot of its parity
            p(st_shared(f"group_unit[{unit_count % 2}]", "the unit for the consumers (lane 0 of warp 0)"))
        if unit_count > 0:
            p(mbarrier_wait("q_empty", unit_count - 1))
        if order.proxy_fence == "producer":
            p(cp_async_16("q"), cp_async_commit_group())
            if unit.n_pairs == 0:
                p(*_landed_then_arrive(0, ["q_full"]))
        else:  # committed too, as in every order: produce_unit commits Q before it decides how Q arrives
            p(cp_async_16("q"), cp_async_commit_group(), cp_async_arrive_noinc("q_full"))
        ahead = order.producer_lookahead
        if ahead and unit.n_pairs > 0:
            _issue_pair(p, order, unit_count, pair_base, 0)
        for pair in range(unit.n_pairs):
            gp = pair_base + pair
            stage = gp % NUM_STAGES
            issues = pair + ahead < unit.n_pairs
            if issues:
                _issue_pair(p, order, unit_count, pair_base, pair + ahead)
            p.at(unit_count, pair)
            if order.proxy_fence == "producer":
                pending = 3 if ahead and issues else 1  # pair p + 1's two groups were committed after pair p's
                p(*_landed_then_arrive(pending, (["q_full"] if pair == 0 else []) + [f"kv_full[{stage}][0]"]),
                  *_landed_then_arrive(pending - 1, [f"kv_full[{stage}][1]"]))
        pair_base += unit.n_pairs
    if order.proxy_fence != "producer":
        p(cp_async_wait_all())
    return p.events


def _issue_pair(p, order, unit_count, pair_base, pair):
    """produce_unit's issue_pair: each block's copies once its stage is free, a commit group per block."""
    gp = pair_base + pair
    stage = gp % NUM_STAGES
    p.at(unit_count, pair)
    for b in (0, 1):
        if gp >= NUM_STAGES:
            p(mbarrier_wait(f"kv_empty[{stage}][{b}]", gp // NUM_STAGES - 1))
        if order.tile == "grouped":  # the masks travel with the rows, in the block's copy group
            p(cp_async_16(f"kv[{stage}][{b}]"), cp_async_8(f"row_valid[{stage}][{b}]"))
            valid = None
        else:
            p(cp_async_16(f"kv[{stage}][{b}]"))
            valid = st_shared(f"valid[{stage}][{b}]", "valid bits (lane 0 of each warp)")
        if order.proxy_fence == "producer":
            p(cp_async_commit_group(), *([valid] if valid else []))
        else:
            p(cp_async_arrive_noinc(f"kv_full[{stage}][{b}]"), *([valid] if valid else []),
              arrive(f"kv_full[{stage}][{b}]", "mbarrier_arrive (lane 0 of each warp, after the valid bits)"))


def _landed_then_arrive(pending, barriers):
    """The producer-side handoff: wait until `pending` groups are left in flight, fence for the async
    proxy, then arrive. On kv_full each thread's one arrival stands for both of the noinc order's (its
    copies, and lane 0's valid bits: kv_full_arrivals in pipeline.cuh, 128 there, 128 + 4 where the copies
    arrive by themselves)."""
    return [cp_async_wait_group(pending), fence_proxy_async("fence_view_async_shared (copies landed)"),
            *(arrive(barrier, "mbarrier_arrive (after the copies landed)", 2 if barrier.startswith("kv") else 1)
              for barrier in barriers)]


# ---- A consumer: kernel.cuh's unit loop (run_consumer_mainloop, merge_split_parts, store_outputs). ----
def consumer_events(order, units, wg):
    c = _Trace()
    pair_base = 0
    for unit_count, unit in enumerate(units):
        if order.tile == "grouped":  # kernel.cuh: the unit from the producer, after an early q_full wait
            c.at(unit_count, 0)
            c(mbarrier_wait("q_full", unit_count), ld_shared(f"group_unit[{unit_count % 2}]", "current_from_producer"))
        _run_consumer_mainloop(c, order, unit, unit_count, pair_base, wg)
        pair_base += unit.n_pairs
        if order.tile == "narrow":  # run_narrow_consumers: whole items, then store_outputs_narrow
            assert unit.split is None, "the narrow tile runs no split call (tiles/select.cuh)"
            c.at(unit_count, unit.n_pairs, "epilogue")
            _store_outputs_narrow(c, wg)
            continue
        if unit.split is not None:
            assert order.tile == "wide", "only the wide tile runs split calls (tiles/select.cuh)"
            c.at(unit_count, unit.n_pairs, "split merge")
            _merge_split_parts(c, wg)
        if unit.split != "publishes":
            c.at(unit_count, unit.n_pairs, "epilogue")
            _store_outputs(c, wg)
    return c.events


def _run_consumer_mainloop(c, order, unit, unit_count, pair_base, wg):
    """run_consumer_mainloop (consumer.cuh), or run_narrow_mainloop (tiles/narrow.cuh) without the early
    release, its order step for step: issue_qk_narrow, issue_pv_narrow and softmax_narrow in place of
    issue_qk, issue_pv and softmax_to_probs, and the rescale reads alpha from registers (NarrowState),
    not ss.alpha."""
    if order.v_after_softmax:
        return _run_narrow_mainloop(c, order, unit, unit_count, pair_base, wg)
    n_pairs = unit.n_pairs
    narrow = order.tile == "narrow"
    softmax = _softmax_narrow if narrow else _softmax_to_probs
    c.at(unit_count, 0)
    c(mbarrier_wait("q_full", unit_count))
    if n_pairs == 0:
        c(arrive("q_empty"))
        return
    stage = pair_base % NUM_STAGES
    c(mbarrier_wait(f"kv_full[{stage}][{wg}]", pair_base // NUM_STAGES))
    if order.proxy_fence in ("consumer", "softmax"):
        c(fence_proxy_async("fence.proxy.async (before Q.K^T)"))
    c(*_grouped_row_words(order, stage, wg), *_issue_qk(stage, wg, narrow), warpgroup_wait(0))
    # Q is released once the unit's last Q.K^T is retired.
    if n_pairs == 1:
        c(arrive("q_empty"))
    softmax(c, order, unit.softmax[0] == "E", stage, 0, wg, _acquire_in_softmax(order, unit, pair_base, 1, wg))

    for pair in range(n_pairs):
        gp = pair_base + pair
        stage, phase, buf = gp % NUM_STAGES, gp // NUM_STAGES, pair % order.probs_buffers
        has_next = pair + 1 < n_pairs
        next_stage = (gp + 1) % NUM_STAGES
        c.at(unit_count, pair)
        # rescale: an exact pair moves a finite reference (a unit's first starts from -inf).
        if pair > 0 and unit.softmax[pair] == "E" and not narrow:
            c(ld_shared(f"alpha[{wg}]", "rescale O by alpha", cross_thread=True))
        if has_next:
            c.at(unit_count, pair + 1)
            if order.proxy_fence != "softmax":  # there, the previous softmax acquired and fenced the block
                c(mbarrier_wait(f"kv_full[{next_stage}][{wg}]", (gp + 1) // NUM_STAGES))
            if order.proxy_fence == "consumer":
                c(fence_proxy_async("fence.proxy.async (before Q.K^T)"))
            c(*_grouped_row_words(order, next_stage, wg), *_issue_qk(next_stage, wg, narrow))
            c.at(unit_count, pair)
        c(mbarrier_wait(f"kv_full[{stage}][{1 - wg}]", phase, "mbarrier_wait (the other block)"),
          ldmatrix_x4_trans(f"kv[{stage}][0]"), arrive(f"kv_empty[{stage}][0]"), *_issue_pv(buf, 0, narrow),
          warpgroup_wait(0))
        if pair + 2 == n_pairs:
            c(arrive("q_empty"))  # that wait retired the unit's last Q.K^T, issued above
        c(ldmatrix_x4_trans(f"kv[{stage}][1]"), arrive(f"kv_empty[{stage}][1]"), *_issue_pv(buf, 1, narrow))
        if has_next:
            c.at(unit_count, pair + 1)
            next_buf = (pair + 1) % order.probs_buffers
            softmax(c, order, unit.softmax[pair + 1] == "E", next_stage, next_buf, wg,
                    _acquire_in_softmax(order, unit, pair_base, pair + 2, wg))
            c.at(unit_count, pair)
        c(warpgroup_wait(0))


def _run_narrow_mainloop(c, order, unit, unit_count, pair_base, wg):
    """run_narrow_mainloop (tiles/narrow.cuh): each pair's V rows into registers and the pair released right
    after its softmax (take_v); every pair but the last: Q.K^T(p + 1), P.V(p) of both blocks in one
    group, wait_group 1 (Q.K^T retired), softmax(p + 1), take_v(p + 1); then the last pair's P.V."""
    n_pairs = unit.n_pairs
    c.at(unit_count, 0)
    c(mbarrier_wait("q_full", unit_count))
    if n_pairs == 0:
        c(arrive("q_empty"))
        return

    def take_v(gp):
        stage, phase = gp % NUM_STAGES, gp // NUM_STAGES
        c(mbarrier_wait(f"kv_full[{stage}][{1 - wg}]", phase, "mbarrier_wait (the other block)"),
          ldmatrix_x4_trans(f"kv[{stage}][0]"), arrive(f"kv_empty[{stage}][0]"),
          ldmatrix_x4_trans(f"kv[{stage}][1]"), arrive(f"kv_empty[{stage}][1]"))

    def issue_pv(buf):
        return [wgmma("issue_pv_narrow", f"probs[{buf}][0]"), wgmma("issue_pv_narrow", f"probs[{buf}][1]"),
                warpgroup_commit_batch()]

    fence = [fence_proxy_async("fence.proxy.async (before Q.K^T)")] if order.proxy_fence == "consumer" else []
    stage = pair_base % NUM_STAGES
    c(mbarrier_wait(f"kv_full[{stage}][{wg}]", pair_base // NUM_STAGES), *fence, *_issue_qk(stage, wg, True),
      warpgroup_wait(0))
    _softmax_narrow(c, order, unit.softmax[0] == "E", stage, 0, wg, [])
    take_v(pair_base)
    for pair in range(n_pairs - 1):
        gp = pair_base + pair
        next_stage = (gp + 1) % NUM_STAGES
        c.at(unit_count, pair + 1)
        c(mbarrier_wait(f"kv_full[{next_stage}][{wg}]", (gp + 1) // NUM_STAGES), *fence, *_issue_qk(next_stage, wg, True))
        c.at(unit_count, pair)
        c(*issue_pv(pair % order.probs_buffers), warpgroup_wait(1, "warpgroup_wait<1> (Q.K^T of the next pair)"))
        c.at(unit_count, pair + 1)
        _softmax_narrow(c, order, unit.softmax[pair + 1] == "E", next_stage, (pair + 1) % order.probs_buffers, wg, [])
        take_v(gp + 1)
    c.at(unit_count, n_pairs - 1)
    c(arrive("q_empty"), *issue_pv((n_pairs - 1) % order.probs_buffers), warpgroup_wait(0))


def _acquire_in_softmax(order, unit, pair_base, pair, wg):
    """For "softmax": the kv_full wait of the unit's pair `pair` (if any), done in the softmax before."""
    if order.proxy_fence != "softmax" or pair >= unit.n_pairs:
        return []
    gp = pair_base + pair
    return [mbarrier_wait(f"kv_full[{gp % NUM_STAGES}][{wg}]", gp // NUM_STAGES, "mbarrier_wait (next_kv_full)")]


def _issue_qk(stage, wg, narrow=False):
    """issue_qk, or issue_qk_narrow (S^T = K . Q^T: the same two operands, swapped)."""
    name = "issue_qk_narrow" if narrow else "issue_qk"
    return [wgmma(name, "q"), wgmma(name, f"kv[{stage}][{wg}]"), warpgroup_commit_batch()]


def _grouped_row_words(order, stage, wg):
    """grouped_row_words (consumer.cuh), right before the pair's Q.K^T issue: the rows' valid bits that
    the pair's softmax masks with."""
    return [ld_shared(f"row_valid[{stage}][{wg}]", "the rows' valid bits (grouped_row_words)")] if order.tile == "grouped" else []


def _issue_pv(buf, block, narrow=False):
    return [wgmma("issue_pv_narrow" if narrow else "issue_pv", f"probs[{buf}][{block}]"), warpgroup_commit_batch()]


def _softmax_to_probs(c, order, exact, stage, buf, wg, acquire_next):
    """softmax_to_probs (consumer.cuh)."""
    probs = f"probs[{buf}][{wg}]"
    if order.tile != "grouped":  # the grouped tile's row_valid was read after the pair's Q.K^T issue
        c(ld_shared(f"valid[{stage}][{wg}]", "ss.valid (softmax_to_probs' argument)"))
    c(st_shared(probs, "write_probs"),
      *acquire_next,
      fence_proxy_async("fence_view_async_shared (P)"))
    if order.pv_wait_in_softmax:
        c(warpgroup_wait(0, "warpgroup_wait<0> (the previous pair's P.V of block 1)"))
    c(bar_sync("kProbsReady", "named_barrier_sync_or<kProbsReady>(moved)"))
    if exact:
        c(st_shared(f"row_max[{wg}]", "the pair's row maxima (c == 0)"),
          bar_sync("kRowMaxReady", "named_barrier_sync<kRowMaxReady>"))
        # clear_v_nans (tiles/grouped.cuh), here on every exact pair (it runs on a NaN only): each thread
        # rewrites the vectors it read, so its read is ordered with everything as the write is, and only
        # the write, which the other threads' ldmatrix reads, is an event.
        if order.tile == "grouped":
            c(st_shared(f"kv[{stage}][{wg}]", "clear_v_nans (the block's V)", cross_thread=True))
        c(ld_shared(f"row_max[{1 - wg}]", "the other consumer's row maxima"),
          st_shared(probs, "write_probs (new references)"),
          st_shared(f"alpha[{wg}]", "alpha (c == 0)"),
          fence_proxy_async("fence_view_async_shared (P, new references)"),
          bar_sync("kProbsReady", "named_barrier_sync_or<kProbsReady>(rescale)"))


def _softmax_narrow(c, order, exact, stage, buf, wg, acquire_next):
    """softmax_narrow (tiles/narrow.cuh). The exact path: lanes g == 0 of each warp store the column maxima
    of its heads into head_max[wg][warp]; after kRowMaxReady every thread reads all 8 warps' (both
    consumers', its own consumer's other warps' too). alpha stays in registers: no shared store."""
    probs = f"probs[{buf}][{wg}]"
    c(ld_shared(f"valid[{stage}][{wg}]", "ss.valid (softmax_narrow's argument)"),
      st_shared(probs, "write_probs_narrow"),
      *acquire_next,
      fence_proxy_async("fence_view_async_shared (P)"))
    if order.pv_wait_in_softmax:
        c(warpgroup_wait(0, "warpgroup_wait<0> (the previous pair's P.V of block 1)"))
    c(bar_sync("kProbsReady", "named_barrier_sync_or<kProbsReady>(moved)"))
    if exact:
        c(st_shared(f"head_max[{wg}]", "the pair's head maxima per warp (g == 0)"),
          bar_sync("kRowMaxReady", "named_barrier_sync<kRowMaxReady>"),
          *(ld_shared(f"head_max[{w}]", "every warp's head maxima", cross_thread=True) for w in (0, 1)),
          st_shared(probs, "write_probs_narrow (new references)"),
          fence_proxy_async("fence_view_async_shared (P, new references)"),
          bar_sync("kProbsReady", "named_barrier_sync_or<kProbsReady>(rescale)"))


def _merge_split_parts(c, wg):
    """merge_split_parts (split.cuh): its global stores and loads are out of scope."""
    c(bar_sync("kSplitMerge", "named_barrier_sync<kSplitMerge> (part published)"))
    if wg == 0:
        c(st_shared("split_last", "ss.split_last = atomicAdd(...) (t == 0)"))
    c(bar_sync("kSplitMerge", "named_barrier_sync<kSplitMerge> (split_last written)"),
      ld_shared("split_last", "__shfl_sync(ss.split_last)", cross_thread=True))


def _store_outputs(c, wg):
    """store_outputs (epilogue.cuh)."""
    c(st_shared(f"row_sum[{wg}]", "row sums (c == 0)"), st_shared(f"row_max[{wg}]", "row maxima (c == 0)"),
      bar_sync("kRowSumReady", "named_barrier_sync<kRowSumReady> (row sums)"))
    if wg == 0:
        c(*(ld_shared(f"{stat}[{w}]", "statistics of the row", cross_thread=True)
            for stat in ("row_sum", "row_max") for w in (0, 1)),
          st_shared("out_scale", "out_scale (c == 0)"))
    c(bar_sync("kRowSumReady", "named_barrier_sync<kRowSumReady> (output scales)"),
      ld_shared("out_scale", "store: the output scales", cross_thread=True))


def _store_outputs_narrow(c, wg):
    """store_outputs_narrow (tiles/narrow.cuh): lanes g == 0 of each warp store its heads' column sums and
    maxima into head_sum[wg][warp] and head_max[wg][warp], those of consumer 0's warp 0 also the
    references; threads t < NH (consumer 0's warp 0, one head each) reduce the 8 warps' and write
    out_scale, which every thread reads for its heads."""
    c(st_shared(f"head_sum[{wg}]", "head sums per warp (g == 0)"),
      st_shared(f"head_max[{wg}]", "head maxima per warp (g == 0)"))
    if wg == 0:
        c(st_shared("head_reference", "head references (warp 0, g == 0)"))
    c(bar_sync("kRowSumReady", "named_barrier_sync<kRowSumReady> (head sums)"))
    if wg == 0:
        c(*(ld_shared(f"{stat}[{w}]", "statistics of the head (t < NH)", cross_thread=True)
            for w in (0, 1) for stat in ("head_sum", "head_max")),
          ld_shared("head_reference", "the head's reference (t < NH)", cross_thread=True),
          st_shared("out_scale", "out_scale (t < NH)"))
    c(bar_sync("kRowSumReady", "named_barrier_sync<kRowSumReady> (output scales)"),
      ld_shared("out_scale", "store: the output scales", cross_thread=True))


# Arrival events that complete one phase, per agent (pipeline.cuh): kv_full, the producer's arrival
# for its copies (every thread) and its valid-bit arrival (lane 0 of each warp): kv_full_arrivals;
# q_full, every producer thread once; kv_empty and q_empty, every consumer thread once.
ARRIVALS_PER_PHASE = {
    "q_full": {"producer": 1},
    "kv_full": {"producer": 2},
    "kv_empty": {"consumer 0": 1, "consumer 1": 1},
    "q_empty": {"consumer 0": 1, "consumer 1": 1},
}
BLOCKING = ("bar.sync", "mbarrier.wait")
ACCESSES = {"cp.async": "W", "st.shared": "W", "ld.shared": "R", "ldmatrix": "R", "wgmma": "R"}


@dataclass(frozen=True)
class Finding:
    kind: str  # "write-after-read", "read-after-write", "write-after-write", "missing fence.proxy.async",
    #            "mbarrier phase", "deadlock"
    buffer: str  # the shared buffer, or the barrier
    first: str  # the event meant to come first
    second: str
    missing: str  # the ordering that is missing

    def __str__(self):
        return f"{self.buffer}: {self.kind}: {self.first} -> {self.second}: {self.missing}"


@dataclass(frozen=True)
class _Access:
    node: int
    agent: str
    event: Event
    mode: str

    def __str__(self):
        verb = "writes" if self.mode == "W" else "reads"
        return f"{self.agent} {self.event.name} {verb} {self.event.target} ({self.event.label})"


class _Groups:
    """cp.async or wgmma commit groups of one agent: nodes of issued, not yet retired operations."""

    def __init__(self):
        self.open, self.committed = [], []

    def commit(self):
        self.committed.append(self.open)
        self.open = []

    def retire(self, pending):
        """The nodes of every committed group but the `pending` most recent."""
        split = max(len(self.committed) - pending, 0)
        retired = [n for group in self.committed[:split] for n in group]
        self.committed = self.committed[split:]
        return retired


class Graph:
    def __init__(self, roles):
        self.succ, self.text, self.is_sync, self.event = [], [], [], []  # per node
        self.accesses, self.fences = [], []  # fences: (node, agent)
        self.arrivals = defaultdict(lambda: defaultdict(list))  # barrier -> agent -> [node]
        self.waits = []  # (barrier, phase, node)
        self.bar_syncs = defaultdict(lambda: defaultdict(list))  # id -> agent -> [(arrive node, depart node)]
        self.phase_done = {}  # (barrier, phase) -> node
        self.deadlocks = []
        for agent, events in roles.items():
            self._add_agent(agent, events)
        self._complete_phases()
        self._join_named_barriers()
        self.order = self._topological_order()

    def node(self, text, sync=False, event=None):
        self.succ.append(set())
        self.text.append(text)
        self.is_sync.append(sync)
        self.event.append(event)
        return len(self.succ) - 1

    def edge(self, a, b):
        self.succ[a].add(b)

    def _add_agent(self, agent, events):
        groups = {"cp.async": _Groups(), "wgmma": _Groups()}
        copies = []  # every cp.async write so far: what a noinc arrival waits for
        prev = None
        for e in events:
            text = f"{agent} {e}"
            first = n = self.node(text, event=e)
            if e.op == "bar.sync":  # arrive, then depart once the instance completes
                n = self.node(text)
                self.edge(first, n)
                self.bar_syncs[e.target][agent].append((first, n))
            if prev is not None:
                self.edge(prev, first)
            prev = n
            family = "cp.async" if e.op.startswith("cp.async") else "wgmma"
            if e.op in ("cp.async", "wgmma"):  # the access itself is asynchronous
                access = self.node(f"{text}: {'lands' if e.op == 'cp.async' else 'reads'}")
                self.edge(n, access)
                groups[family].open.append(access)
                if e.op == "cp.async":
                    copies.append(access)
                self.accesses.append(_Access(access, agent, e, ACCESSES[e.op]))
            elif e.op in ACCESSES:
                self.accesses.append(_Access(n, agent, e, ACCESSES[e.op]))
            elif e.op.endswith(".commit_group"):
                groups[family].commit()
            elif e.op.endswith(".wait_group") or e.op == "cp.async.wait_all":
                if e.op == "cp.async.wait_all":
                    groups[family].commit()
                for done in groups[family].retire(e.pending):
                    self.edge(done, n)
            elif e.op == "mbarrier.arrive.noinc":  # completes once this thread's copies landed
                completes = self.node(f"{text}: completes")
                self.edge(n, completes)
                for copy in copies:
                    self.edge(copy, completes)
                self.arrivals[e.target][agent].append(completes)
            elif e.op == "mbarrier.arrive":
                self.arrivals[e.target][agent] += [n] * e.arrivals
            elif e.op == "mbarrier.wait":
                self.waits.append((e.target, e.phase, n))
            elif e.op == "fence.proxy.async":
                self.fences.append((n, agent))
            else:
                assert e.op == "bar.sync", e.op

    def _arrival_phases(self, barrier):
        """(phase, arrival node) of every arrival on barrier, as the hardware counts them."""
        per_phase = ARRIVALS_PER_PHASE[barrier.split("[")[0]]
        by_agent = self.arrivals[barrier]
        assert set(by_agent) <= set(per_phase), (barrier, set(by_agent))
        return [(i // count, node) for agent, count in per_phase.items() for i, node in enumerate(by_agent[agent])]

    def _complete_phases(self):
        for barrier in list(self.arrivals):
            per_phase = ARRIVALS_PER_PHASE[barrier.split("[")[0]]
            phases = min(len(self.arrivals[barrier][agent]) // count for agent, count in per_phase.items())
            for k in range(phases):
                self.phase_done[barrier, k] = self.node(f"{barrier} phase {k} completes", sync=True)
            for k, arrival in self._arrival_phases(barrier):
                if k < phases:
                    self.edge(arrival, self.phase_done[barrier, k])
        for barrier, phase, wait in self.waits:
            if (barrier, phase) in self.phase_done:
                self.edge(self.phase_done[barrier, phase], wait)
            else:
                self.deadlocks.append(Finding("deadlock", barrier, self.text[wait], f"phase {phase}",
                                              "waits for a phase whose arrivals never all happen"))

    def _join_named_barriers(self):
        for bar_id, by_agent in self.bar_syncs.items():
            counts = [len(by_agent[agent]) for agent in CONSUMERS]
            if len(set(counts)) > 1:
                self.deadlocks.append(Finding("deadlock", bar_id, f"consumer 0 passes it {counts[0]} times",
                                              f"consumer 1 {counts[1]} times", "every bar.sync needs both consumers"))
            for k, instance in enumerate(zip(*(by_agent[agent] for agent in CONSUMERS))):
                joined = self.node(f"bar.sync {bar_id} #{k}", sync=True)
                for arrive_node, depart_node in instance:
                    self.edge(arrive_node, joined)
                    self.edge(joined, depart_node)

    def _topological_order(self):
        indegree = [0] * len(self.succ)
        for targets in self.succ:
            for m in targets:
                indegree[m] += 1
        order = [n for n, d in enumerate(indegree) if d == 0]
        for n in order:  # grows while it is walked
            for m in self.succ[n]:
                indegree[m] -= 1
                if indegree[m] == 0:
                    order.append(m)
        if len(order) < len(self.succ):
            self.deadlocks.append(self._a_cycle(set(range(len(self.succ))) - set(order)))
        return order

    def _a_cycle(self, stuck):
        """Every node Kahn's walk left has a predecessor that it left too: walking back finds a cycle."""
        pred = defaultdict(list)
        for n in stuck:
            for m in self.succ[n] & stuck:
                pred[m].append(n)
        path, n = [], min(stuck)
        while n not in path:
            path.append(n)
            n = pred[n][0]
        cycle = reversed(path[path.index(n):])
        waits = [self.text[m] for m in cycle if self.event[m] is not None and self.event[m].op in BLOCKING]
        return Finding("deadlock", "happens-before cycle", waits[0], waits[-1],
                       "each of these waits for the next: " + " -> ".join(waits))

    def findings(self):
        if self.deadlocks:
            return self.deadlocks  # the other checks assume every wait returns
        self._close()
        return self._phase_findings() + self._access_findings() + self._proxy_findings()

    def _close(self):
        """reach[n]: the nodes n happens before (and n); through[n]: those reached through a barrier."""
        self.reach, self.through = [0] * len(self.succ), [0] * len(self.succ)
        for n in reversed(self.order):
            reach, through = 1 << n, 0
            for m in self.succ[n]:
                reach |= self.reach[m]
                through |= self.through[m]
            self.reach[n], self.through[n] = reach, through | (reach if self.is_sync[n] else 0)

    def hb(self, a, b):
        return a != b and (self.reach[a] >> b) & 1 == 1

    def _phase_findings(self):
        """mbarrier_wait(bar, parity) returns while the barrier's current phase has the other parity, so
        a wait for phase k must not run before phase k - 1 completes (it would return at once) nor after
        phase k + 1 completes (it would wait through phase k + 2); and the hardware counts an arrival
        towards the current phase, so the arrivals for phase k must follow phase k - 1's completion."""
        found = []
        for barrier in self.arrivals:
            for k, arrival in self._arrival_phases(barrier):
                previous = self.phase_done.get((barrier, k - 1))
                if k > 0 and (previous is None or not self.hb(previous, arrival)):
                    found.append(Finding("mbarrier phase", barrier, f"phase {k - 1} completes", self.text[arrival],
                                         f"the arrival for phase {k} may count towards phase {k - 1}"))
        for barrier, k, wait in self.waits:
            if k > 0 and not self.hb(self.phase_done[barrier, k - 1], wait):
                found.append(Finding("mbarrier phase", barrier, f"phase {k - 1} completes", self.text[wait],
                                     f"the wait for phase {k} may pass on phase {k - 1}'s parity"))
            later = self.phase_done.get((barrier, k + 1))
            if later is not None and not self.hb(wait, later):
                found.append(Finding("mbarrier phase", barrier, self.text[wait], f"phase {k + 1} completes",
                                     f"phase {k + 1} may complete before the wait for phase {k}, which then misses it"))
        return found

    def _access_findings(self):
        by_buffer = defaultdict(list)
        for access in self.accesses:
            by_buffer[access.event.target].append(access)
        found = []
        for buffer, accesses in by_buffer.items():
            for a, b in combinations(accesses, 2):
                if a.mode == b.mode == "R":
                    continue
                if self.hb(b.node, a.node):
                    a, b = b, a
                if not self.hb(a.node, b.node):
                    a, b = sorted((a, b), key=lambda x: (x.event.where, x.mode != "W"))  # as meant
                    found.append(Finding(_kind(a, b), buffer, str(a), str(b), "no happens-before path"))
                elif a.agent == b.agent and _needs_barrier(a, b) and not (self.through[a.node] >> b.node) & 1:
                    found.append(Finding(_kind(a, b), buffer, str(a), str(b),
                                         f"different threads of {a.agent}, ordered by no barrier"))
        return found

    def _proxy_findings(self):
        writes = defaultdict(list)
        for access in self.accesses:
            if access.mode == "W":
                writes[access.event.target].append(access)
        found = []
        for read in (a for a in self.accesses if a.event.op == "wgmma"):
            seen = [w for w in writes[read.event.target] if self.hb(w.node, read.node)]
            for w in seen:
                if any(self.hb(w.node, later.node) and self.hb(later.node, read.node) for later in seen):
                    continue  # overwritten before the read
                if not any(agent in (w.agent, read.agent) and self.hb(w.node, fence) and self.hb(fence, read.node)
                           for fence, agent in self.fences):
                    found.append(Finding("missing fence.proxy.async", read.event.target, str(w), str(read),
                                         "no fence.proxy.async in the writer or the reader after the write "
                                         "completes and before the wgmma"))
        return found


def _kind(first, second):
    return {"RW": "write-after-read", "WR": "read-after-write", "WW": "write-after-write"}[first.mode + second.mode]


def _needs_barrier(first, second):
    """Program order orders one thread's accesses; a wgmma's reads are retired by every thread's wait."""
    return second.event.cross_thread or (first.event.cross_thread and first.event.op != "wgmma")


def check(roles: dict[str, list[Event]]) -> list[Finding]:
    return Graph(roles).findings()


if __name__ == "__main__":  # the kernel order's event lists (`narrow`: the narrow tile's), to read by the source
    import sys

    shown = NARROW_ORDER if sys.argv[1:] == ["narrow"] else KERNEL_ORDER
    for role, events in kernel_roles(shown, (Unit("EFF"), Unit("EF"))).items():
        print(f"{role}:")
        print("\n".join(f"    {e.op:<22} {e}" for e in events))
