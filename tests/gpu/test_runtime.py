"""GPU tier: the kernel inside real runtimes: the caller's stream, CUDA graphs, torch.compile, repeated
launches (races show up as launch-to-launch differences), a second GPU, and two GPUs called at once."""

from __future__ import annotations

import math
import threading

import pytest
import torch

from sparse_mla.testing import PRESETS, error_model, make_inputs, poisoned_outputs, realistic_indices, reference_prefill

pytestmark = pytest.mark.gpu

SLEEP_CYCLES = 2**27  # torch.cuda._sleep: about 70 ms on an H200, far longer than a host-side launch


def describe(seed: int, **shape) -> str:
    fields = " ".join(f"{name}={value}" for name, value in shape.items())
    return f"seed={seed} (SPARSE_MLA_TEST_SEED={seed} replays) {fields}"


def poison(tensors) -> None:
    for tensor in tensors:
        tensor.fill_(math.nan)


def test_runs_on_the_callers_stream(prefill_fwd, accept, seed):
    """Queued behind a sleep on a side stream, the kernel must not have run yet when the default
    stream looks at its outputs; after a sync the results must be right."""
    shape = dict(s_q=256, s_kv=4096, h_q=64, d_qk=576, topk=64)
    inputs = make_inputs(**shape, seed=seed, topk_length="random", attn_sink="random")
    ref, model = reference_prefill(**inputs), error_model(**inputs)
    prefill_fwd(**inputs)  # compile and load before the timing-sensitive part
    buffers = poisoned_outputs(shape["s_q"], shape["h_q"], 512)
    torch.cuda.synchronize()

    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(SLEEP_CYCLES)
        preallocated = prefill_fwd(**inputs, **buffers)
        allocated = prefill_fwd(**inputs)
    lse_meanwhile = buffers["lse"].clone()  # on the default stream, which does not wait for `side`
    torch.cuda.synchronize()

    context = describe(seed, **shape)
    assert bool(lse_meanwhile.isnan().all()), f"{context}: the kernel did not run on the current stream"
    accept(preallocated, inputs, f"{context}, side stream, preallocated outputs", ref=ref, model=model)
    accept(allocated, inputs, f"{context}, side stream, library-allocated outputs", ref=ref, model=model)


# Whole work items, and a call short enough that its items are cut into parts (the tail split: a
# workspace and zeroed counters allocated inside the call, include/sparse_mla/sm90/prefill/split.cuh).
_GRAPH_SHAPES = {
    "whole items": dict(s_q=128, s_kv=4096, h_q=64, d_qk=576, topk=64),
    "tail split": dict(s_q=16, s_kv=4096, h_q=64, d_qk=576, topk=2048),
}


@pytest.mark.parametrize("preallocate", [True, False])
@pytest.mark.parametrize("kind", list(_GRAPH_SHAPES))
def test_cuda_graph_capture_and_replay(prefill_fwd, accept, seed, preallocate, kind):
    """Capture once, then replay with new values in every captured input (scales included)."""
    shape = _GRAPH_SHAPES[kind]
    options = dict(invalid="hostile", topk_length="random", attn_sink="random")
    static = make_inputs(**shape, seed=seed, **options)
    buffers = poisoned_outputs(shape["s_q"], shape["h_q"], 512) if preallocate else {}

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        prefill_fwd(**static, **buffers)  # warm-up: compile, load, first launch
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = prefill_fwd(**static, **buffers)
    if preallocate:
        assert all(got is want for got, want in zip(captured, buffers.values()))

    for replay in range(3):
        replay_seed = seed + 1 + replay
        fresh = make_inputs(**shape, seed=replay_seed, **options)
        for name in ("q", "kv", "indices", "q_scale", "kv_scale", "attn_sink", "topk_length"):
            static[name].copy_(fresh[name])
        poison(captured)
        graph.replay()
        accept(captured, fresh, describe(replay_seed, replay=replay, **shape))


@pytest.mark.parametrize("preallocate", [True, False])
@pytest.mark.parametrize("fullgraph", [True, False])
@pytest.mark.parametrize("kind", list(_GRAPH_SHAPES))
def test_torch_compile(prefill_fwd, accept, seed, fullgraph, preallocate, kind):
    shape = _GRAPH_SHAPES[kind]
    torch.compiler.reset()

    def attention(inputs: dict, buffers: dict):
        return prefill_fwd(**inputs, **buffers)

    compiled = torch.compile(attention, fullgraph=fullgraph)
    for call in range(2):
        call_seed = seed + call
        inputs = make_inputs(**shape, seed=call_seed, invalid="mixed", topk_length="random", attn_sink="random")
        buffers = poisoned_outputs(shape["s_q"], shape["h_q"], 512) if preallocate else {}
        result = compiled(inputs, buffers)
        context = describe(call_seed, fullgraph=fullgraph, preallocate=preallocate, call=call, **shape)
        ref, model = reference_prefill(**inputs), error_model(**inputs)
        accept(result, inputs, context, ref=ref, model=model)
        if preallocate:
            accept(tuple(buffers.values()), inputs, context, ref=ref, model=model)


LAUNCHES = 20


def _launch_repeatedly(prefill_fwd, inputs: dict, launches: int = LAUNCHES) -> list[dict]:
    """``launches`` back-to-back calls into as many NaN-poisoned output sets, then one sync."""
    s_q, h_q, _ = inputs["q"].shape
    prefill_fwd(**inputs)  # compile and load, so the launches below run back to back
    outputs = [poisoned_outputs(s_q, h_q, 512) for _ in range(launches)]
    torch.cuda.synchronize()
    for buffers in outputs:
        prefill_fwd(**inputs, **buffers)
    torch.cuda.synchronize()
    return outputs


def _assert_bitwise_identical(outputs: list[dict], context: str) -> None:
    first = list(outputs[0].values())
    for launch, buffers in enumerate(outputs[1:], start=1):
        for name, got, want in zip(buffers, buffers.values(), first):
            differing = int((_bits(got) != _bits(want)).sum())
            assert differing == 0, f"{context}: launch {launch} differs from launch 0 in {differing} {name} elements"


@pytest.mark.parametrize(
    "shape",
    [
        dict(s_q=512, s_kv=8192, h_q=128, d_qk=576, topk=2048),
        dict(s_q=1024, s_kv=8192, h_q=64, d_qk=512, topk=512),
    ],
    ids=["576x2048_h128", "512x512_h64"],
)
def test_repeated_launches_are_bitwise_identical(prefill_fwd, accept, seed, shape):
    """20 back-to-back launches into 20 poisoned output sets, with invalid slots, topk_length and
    sinks: a race shows up as a difference."""
    inputs = make_inputs(**shape, seed=seed, invalid="mixed", topk_length="random", attn_sink="random")
    outputs = _launch_repeatedly(prefill_fwd, inputs)
    context = describe(seed, **shape)
    accept(tuple(outputs[0].values()), inputs, context)
    _assert_bitwise_identical(outputs, context)


def test_repeated_launches_at_full_size_are_bitwise_identical(prefill_fwd, accept, seed):
    """The benchmark's anchor shape (s_q 4096, h_q 128, d_qk 576, topk 2048: thousands of CTAs, every
    SM busy for many waves), 20 launches back to back: out, lse and max_logits bitwise identical, and
    the first one right by the contract's rule (1.85e-2 norm-wise, every (row, head), lse 1e-4 and
    max_logits 1e-3 relative)."""
    shape = dict(s_q=4096, s_kv=32768, h_q=128, d_qk=576, topk=2048)
    inputs = make_inputs(**shape, seed=seed)
    outputs = _launch_repeatedly(prefill_fwd, inputs)
    context = describe(seed, **shape)
    accept(tuple(outputs[0].values()), inputs, context, benchmark=True)
    _assert_bitwise_identical(outputs, context)


def _bits(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.view(torch.int16 if tensor.element_size() == 2 else torch.int32)


# The calls of the multi-device tests: the wide tile with per-row lengths and sinks, a call whose last
# round is split (its workspace and counters), and a tensor-parallel rank's call through token groups
# (the pre-pass's lists), each of which allocates on the inputs' device and stream and launches there.
RANK_CASES = {
    "wide": (dict(s_q=128, s_kv=4096, h_q=64, d_qk=576, topk=64), None),
    "split": (dict(s_q=137, s_kv=4096, h_q=128, d_qk=576, topk=512), None),
    "token-groups": (dict(s_q=256, s_kv=8192, h_q=16, d_qk=576, topk=2048), "realistic-glm"),
}


def _rank_inputs(name: str, seed: int, device: str) -> tuple[dict, dict]:
    shape, pattern = RANK_CASES[name]
    if pattern is None:
        return shape, make_inputs(**shape, seed=seed, device=device, topk_length="random", attn_sink="random")
    inputs = make_inputs(**shape, seed=seed, device=device, attn_sink="random")
    inputs["indices"] = realistic_indices(shape["s_q"], shape["s_kv"], shape["topk"], **PRESETS[pattern], seed=seed,
                                          device=device)
    return shape, inputs


def _needs_two_gpus() -> None:
    if torch.cuda.device_count() < 2:
        pytest.skip(f"GPU tier: needs two GPUs, found {torch.cuda.device_count()}")


@pytest.mark.parametrize("case", RANK_CASES)
def test_inputs_on_a_second_gpu(check_prefill, seed, case):
    """Inputs on cuda:1 while cuda:0 is current: the kernel runs there and the current device stays."""
    _needs_two_gpus()
    with torch.cuda.device(0):
        shape, inputs = _rank_inputs(case, seed, "cuda:1")
        result = check_prefill(inputs, describe(seed, device="cuda:1", case=case, **shape))
        assert torch.cuda.current_device() == 0
    assert all(t.device == torch.device("cuda:1") for t in result)


def _calls_from_two_threads(prefill_fwd, seed: int, devices: tuple[int, int]) -> list[str]:
    """Thread k calls on cuda:devices[k], on a stream of its own, LAUNCHES rounds of every case at
    once with the other thread; returns every call whose outputs are not bitwise those of the same call
    made alone."""
    calls = {}
    for rank, device in enumerate(devices):
        for case in RANK_CASES:
            _, inputs = _rank_inputs(case, seed + rank, f"cuda:{device}")
            calls[rank, case] = (inputs, [t.clone() for t in prefill_fwd(**inputs)])  # alone
    for device in set(devices):
        torch.cuda.synchronize(device)

    def run_rank(rank: int, failures: list) -> None:
        try:
            with torch.cuda.device(devices[rank]), torch.cuda.stream(torch.cuda.Stream()):
                results = [(case, prefill_fwd(**calls[rank, case][0])) for _ in range(LAUNCHES)
                           for case in RANK_CASES]
                torch.cuda.current_stream().synchronize()
            for case, result in results:
                for name, got, alone in zip(("out", "max_logits", "lse"), result, calls[rank, case][1]):
                    if not torch.equal(_bits(got), _bits(alone)):
                        failures.append(f"rank {rank} on cuda:{devices[rank]}, {case}: {name} differs from alone")
        except Exception as error:  # reported by the main thread
            failures.append(f"rank {rank} on cuda:{devices[rank]}: {error!r}")

    failures: list[str] = []
    threads = [threading.Thread(target=run_rank, args=(rank, failures)) for rank in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sorted(set(failures))


def test_two_threads_calling_one_gpu_at_once(prefill_fwd, seed):
    """Two threads of one process calling on one GPU, each on its own stream (two models, or a
    pipeline's stages, served side by side): every call's outputs are those of the call made alone."""
    assert _calls_from_two_threads(prefill_fwd, seed, (0, 0)) == [], f"seed={seed}"


def test_two_gpus_called_at_once_from_two_threads(prefill_fwd, seed):
    """Two ranks in one process, as tensor parallelism runs them: a thread per GPU, each on its own
    stream, every call's outputs bitwise those of the same call made alone on that GPU."""
    _needs_two_gpus()
    assert _calls_from_two_threads(prefill_fwd, seed, (0, 1)) == [], f"seed={seed}"
