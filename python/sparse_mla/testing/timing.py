"""GPU timing for examples and benchmarks: the benchmark protocol (L2 flushed, CUDA events, median).

Touches CUDA only when `median_time_ms` is called.
"""

from __future__ import annotations

import random
import statistics
import time
from typing import Any, Callable

import torch

__all__ = ["L2_FLUSH_BYTES", "interleaved_median_ms", "interleaved_waiting_median_ms", "median_time_ms", "prefill_flops"]

L2_FLUSH_BYTES = 256 * 2**20  # written before every timed call: several times the H200's 60 MiB L2


def prefill_flops(s_q: int, h_q: int, topk: int, d_qk: int, d_v: int = 512) -> int:
    """FLOP count of one prefill call: ``2 * s_q * h_q * topk * (d_qk + d_v)``."""
    return 2 * s_q * h_q * topk * (d_qk + d_v)


def median_time_ms(
    fn: Callable[[], object],
    *,
    iters: int = 30,
    warmup: int = 3,
    flush_bytes: int = L2_FLUSH_BYTES,
    device: str | torch.device = "cuda",
) -> float:
    """Median milliseconds of ``fn()`` on the current CUDA stream over ``iters`` timed calls.

    ``warmup`` untimed calls come first (they also absorb a JIT compile). Before every timed call a
    ``flush_bytes`` buffer is zeroed so the call starts with a cold L2; CUDA events bracket only
    ``fn()``.
    """
    flush = torch.empty(flush_bytes, dtype=torch.uint8, device=device)
    for _ in range(warmup):
        fn()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    for start, end in zip(starts, ends):
        flush.zero_()
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize(device)
    return statistics.median(start.elapsed_time(end) for start, end in zip(starts, ends))


def interleaved_median_ms(
    calls: dict[str, Callable[[], object]],
    *,
    iters: int = 60,
    warmup: int = 3,
    flush_bytes: int = L2_FLUSH_BYTES,
    device: str | torch.device = "cuda",
) -> dict[str, float]:
    """Median milliseconds of each of ``calls``, timed one call of each in turn.

    To compare kernels, time them side by side this way rather than one block of calls after the
    other (blocks of 20-30 calls, one kernel after the other, measured the first kernel up to 3% faster
    than the same kernel timed after another on an H200). Each turn runs the calls in a new random
    order (seeded: the same sequence every run), so that no call always follows the same neighbour: in
    a fixed rotation, a call that followed itself timed 1-1.5% faster than one that followed another
    kernel, at 0.4 ms. ``warmup`` untimed turns come first; an L2 flush precedes every timed call, as in
    `median_time_ms`.
    """

    def events(call: Callable[[], object]) -> tuple:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        call()
        end.record()
        return start, end

    pairs = _interleaved(calls, events, iters=iters, warmup=warmup, flush_bytes=flush_bytes, device=device)
    return {name: statistics.median(s.elapsed_time(e) for s, e in timed) for name, timed in pairs.items()}


def interleaved_waiting_median_ms(
    calls: dict[str, Callable[[], object]],
    *,
    iters: int = 30,
    warmup: int = 3,
    flush_bytes: int = L2_FLUSH_BYTES,
    device: str | torch.device = "cuda",
) -> dict[str, float]:
    """Median milliseconds of each of ``calls`` as an eager serving loop pays it when each call waits
    for the one before: from the host's call with the GPU idle to the end of the call's GPU work, host
    path and launches included (synchronize, time the call, synchronize, on the host's clock).

    `interleaved_median_ms` times the GPU alone, with the host running ahead of it: there a host path
    slower than the kernel does not show. Here it does. The calls are interleaved in a new random order
    every turn as there, and the L2 flush (and its completion) precedes every timed call, outside the
    timed span.
    """

    def waiting(call: Callable[[], object]) -> float:
        torch.cuda.synchronize(device)
        start = time.perf_counter()
        call()
        torch.cuda.synchronize(device)
        return (time.perf_counter() - start) * 1e3

    times = _interleaved(calls, waiting, iters=iters, warmup=warmup, flush_bytes=flush_bytes, device=device)
    return {name: statistics.median(values) for name, values in times.items()}


def _interleaved(calls: dict[str, Callable[[], object]], time_call: Callable[[Callable[[], object]], Any], *,
                 iters: int, warmup: int, flush_bytes: int, device: str | torch.device) -> dict[str, list]:
    """``time_call(call)`` of each of ``calls``, ``iters`` times, one of each in turn in a new random
    order every turn (seeded), an L2 flush before each, after ``warmup`` untimed turns; returns each
    call's results once the device is idle."""
    flush = torch.empty(flush_bytes, dtype=torch.uint8, device=device)
    names = list(calls)
    order = random.Random(0)
    for _ in range(warmup):
        for call in calls.values():
            call()
    results: dict[str, list] = {name: [] for name in names}
    for _ in range(iters):
        for name in order.sample(names, len(names)):
            flush.zero_()
            results[name].append(time_call(calls[name]))
    torch.cuda.synchronize(device)
    return results
