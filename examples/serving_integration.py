"""How a serving engine's attention backend uses sparse_mla, step by step, each step checked.

1. The backend imports sparse_mla lazily, on the path that uses it.
2. ``sparse_mla.warmup`` at startup loads (or compiles) the kernel before the first request and before
   any CUDA-graph capture. It needs no GPU.
3. The backend owns preallocated ``out``, ``max_logits`` and ``lse`` for its largest batch and passes
   views of them.
4. The prefill step is captured in a CUDA graph and replayed with new inputs.
5. ``torch.compile(fullgraph=True)`` of a step that calls the backend (the library's custom op keeps
   the graph whole).
6. The time per head at tensor-parallel head counts: h_q 16 and 32 against 64.
7. The first call of a fresh process, timed with an empty cache (it compiles) and with a prebuilt
   cache shared through ``SPARSE_MLA_PREBUILT_DIRS`` with the JIT disabled (it only loads), as the
   ranks of a tensor-parallel server would share it.

Steps 3-5 are compared with the float32 reference. Without an SM90 GPU, steps 1-2 run and the rest is
skipped with the reason printed; the script then exits 0. Where step 2 can neither load nor compile the
kernel (no nvcc and no prebuilt cache), it prints the library's message and exits 1.

    python examples/serving_integration.py                      # an SM90 GPU host with nvcc
    python examples/serving_integration.py --no-first-call      # a host without nvcc: skip step 7
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

import torch

from sparse_mla.testing import (
    assert_close_to_reference,
    make_inputs,
    median_time_ms,
    missing_sm90_gpu,
    reference_prefill,
)

D_QK, D_V = 576, 512


class SparsePrefillBackend:
    """The sparse MLA prefill of one tensor-parallel rank, as an engine's attention backend holds it."""

    def __init__(self, h_q: int, topk: int, max_tokens: int, device: torch.device) -> None:
        import sparse_mla  # lazy: only processes that run sparse prefill import it

        sparse_mla.warmup(d_qk=D_QK, topk=topk)  # a no-op when main() already did it
        self._prefill = sparse_mla.sparse_mla_q8kv8_prefill_fwd
        self.out = torch.empty(max_tokens, h_q, D_V, dtype=torch.bfloat16, device=device)
        self.max_logits = torch.empty(max_tokens, h_q, dtype=torch.float32, device=device)
        self.lse = torch.empty(max_tokens, h_q, dtype=torch.float32, device=device)

    def buffers(self, s_q: int) -> dict:
        """Views of the preallocated outputs for s_q tokens: no allocation, stable addresses."""
        return dict(out=self.out[:s_q], max_logits=self.max_logits[:s_q], lse=self.lse[:s_q])

    def forward(self, q, kv, indices, sm_scale, q_scale, kv_scale, d_v=D_V, attn_sink=None, topk_length=None):
        return self._prefill(
            q, kv, indices, sm_scale, q_scale, kv_scale, d_v, attn_sink, topk_length, **self.buffers(q.shape[0])
        )


def check_eager(backend: SparsePrefillBackend, shape: dict) -> None:
    inputs = make_inputs(**shape, topk_length="random", attn_sink="random")
    result = backend.forward(**inputs)
    assert result[0].data_ptr() == backend.out.data_ptr(), "the output is not the preallocated buffer"
    assert_close_to_reference(*result, reference_prefill(**inputs), inputs=inputs, context="eager call")
    print("3. eager call into preallocated outputs matches the reference")


def check_cuda_graph(backend: SparsePrefillBackend, shape: dict) -> None:
    static = make_inputs(**shape, topk_length="random", attn_sink="random")
    backend.forward(**static)  # once outside the capture, on the static buffers
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        result = backend.forward(**static)
    for replay in (1, 2):
        fresh = make_inputs(**shape, topk_length="random", attn_sink="random")
        for name, value in fresh.items():
            if isinstance(value, torch.Tensor):
                static[name].copy_(value)  # new values, same addresses
        graph.replay()
        assert_close_to_reference(*result, reference_prefill(**fresh), inputs=fresh, context=f"graph replay {replay}")
    print("4. CUDA graph: 2 replays with new inputs match the reference")


def check_torch_compile(backend: SparsePrefillBackend, shape: dict) -> None:
    prefill = backend._prefill  # the function itself, resolved outside the compiled region

    @torch.compile(fullgraph=True)  # fails rather than break the graph
    def step(inputs: dict, buffers: dict):
        return prefill(**inputs, **buffers)

    for call in (1, 2):
        inputs = make_inputs(**shape, topk_length="random", attn_sink="random")
        result = step(inputs, backend.buffers(shape["s_q"]))
        assert_close_to_reference(*result, reference_prefill(**inputs), inputs=inputs, context=f"torch.compile call {call}")
    print("5. torch.compile(fullgraph=True): 2 calls match the reference")


def per_head_cost(topk: int, s_kv: int) -> None:
    s_q = 1024
    per_head = {}
    for h_q in (64, 32, 16):
        backend = SparsePrefillBackend(h_q, topk, s_q, torch.device("cuda"))
        inputs = make_inputs(s_q=s_q, s_kv=s_kv, h_q=h_q, d_qk=D_QK, topk=topk, seed=0)
        ms = median_time_ms(lambda: backend.forward(**inputs), iters=20)
        per_head[h_q] = ms / h_q
        print(f"6. h_q {h_q:2d}: {ms:.3f} ms for s_q {s_q}, topk {topk}: "
              f"{per_head[h_q] / per_head[64]:.1f}x the time per head of h_q 64")


FIRST_CALL = "FIRST CALL SECONDS"


def first_call(topk: int) -> None:
    """Step 7's child: a fresh process timing its first call, from before sparse_mla is imported."""
    inputs = make_inputs(s_q=128, s_kv=8192, h_q=64, d_qk=D_QK, topk=topk, seed=0)
    torch.cuda.synchronize()  # CUDA is initialized before the clock starts
    start = time.perf_counter()
    from sparse_mla import sparse_mla_q8kv8_prefill_fwd

    sparse_mla_q8kv8_prefill_fwd(**inputs)
    torch.cuda.synchronize()
    print(f"{FIRST_CALL} {time.perf_counter() - start:.3f}")


def time_first_calls(topk: int) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        shared = os.path.join(scratch, "prebuilt")  # filled by the first child, as a prebuild would
        runs = (  # (name, variables, whether it must compile)
            ("empty cache", {"SPARSE_MLA_JIT_CACHE_DIR": shared, "SPARSE_MLA_PREBUILT_DIRS": "", "SPARSE_MLA_DISABLE_JIT": "0"}, True),
            ("prebuilt cache", {"SPARSE_MLA_JIT_CACHE_DIR": os.path.join(scratch, "own"),
                                "SPARSE_MLA_PREBUILT_DIRS": shared, "SPARSE_MLA_DISABLE_JIT": "1"}, False),
        )
        for name, variables, compiles in runs:
            child = subprocess.run(
                [sys.executable, __file__, "--first-call", "--topk", str(topk)],
                capture_output=True, text=True, env=dict(os.environ, SPARSE_MLA_LOG_LEVEL="INFO", **variables),
                timeout=1200,
            )
            assert child.returncode == 0, child.stdout + child.stderr
            seconds = float(child.stdout.split(FIRST_CALL)[1].split()[0])
            assert ("sparse_mla: compiled " in child.stderr) == compiles, f"{name}: {child.stderr}"
            print(f"7. first call of a fresh process, {name}: {seconds:.2f} s ({'compiled' if compiles else 'loaded'})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--h-q", type=int, default=64, help="query heads on this rank (default 64: 128 heads over 2 ranks)")
    parser.add_argument("--topk", type=int, default=2048)
    parser.add_argument("--s-q", type=int, default=128, help="query tokens of the checked calls")
    parser.add_argument("--s-kv", type=int, default=8192)
    parser.add_argument("--no-first-call", action="store_true", help="skip step 7 (it compiles, so it needs nvcc)")
    parser.add_argument("--first-call", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.first_call:
        first_call(args.topk)
        return

    start = time.perf_counter()
    import sparse_mla

    try:
        sparse_mla.warmup(d_qk=D_QK, topk=args.topk)
    except sparse_mla.SparseMLAError as error:  # e.g. no nvcc and no prebuilt kernel: its message says what to do
        sys.exit(f"step 2 failed: {type(error).__name__}: {error}")
    print(f"1-2. imported sparse_mla and warmed up d_qk {D_QK}, topk {args.topk} in {time.perf_counter() - start:.2f} s")
    reason = missing_sm90_gpu()
    if reason is not None:
        print(f"skipped the GPU steps 3-7: {reason}")
        return

    shape = dict(s_q=args.s_q, s_kv=args.s_kv, h_q=args.h_q, d_qk=D_QK, topk=args.topk)
    backend = SparsePrefillBackend(args.h_q, args.topk, max_tokens=4 * args.s_q, device=torch.device("cuda"))
    check_eager(backend, shape)
    check_cuda_graph(backend, shape)
    check_torch_compile(backend, shape)
    per_head_cost(args.topk, args.s_kv)
    if args.no_first_call:
        print("7. skipped (--no-first-call)")
    else:
        time_first_calls(args.topk)
    print("serving example: every step passed")


if __name__ == "__main__":
    main()
