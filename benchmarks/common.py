"""What the benchmark scripts share: the table of shapes, the index patterns, the incumbent's call, the commit.

bench.py, tp.py and ab.py import this file from beside them (benchmarks/ is no package); it needs a
GPU only for the calls it builds, not to be imported.
"""

from __future__ import annotations

import os
import pathlib
import subprocess

import torch

from sparse_mla.testing import PRESETS, poisoned_outputs, realistic_indices

BENCHMARKS_DIR = pathlib.Path(__file__).resolve().parent
RESULTS_DIR = BENCHMARKS_DIR / "results"

# The benchmark table (bench.py's rows, ab.py's default shapes), with the incumbents as measured on one
# H200 in their own runs (2026-11-30; `--incumbent` measures side by side) and the target, in TFLOPS.
SHAPES = [
    dict(s_q=4096, s_kv=8192, h_q=128, d_qk=576, topk=2048, sglang=716, flashmla=589, target=1070),
    dict(s_q=4096, s_kv=32768, h_q=128, d_qk=576, topk=2048, sglang=654, flashmla=626, target=980),
    dict(s_q=4096, s_kv=65536, h_q=128, d_qk=576, topk=2048, sglang=634, flashmla=546, target=950),
    dict(s_q=4096, s_kv=131072, h_q=128, d_qk=576, topk=2048, sglang=625, flashmla=488, target=940),
    dict(s_q=4096, s_kv=32768, h_q=64, d_qk=576, topk=2048, sglang=603, flashmla=607, target=900),
    dict(s_q=437, s_kv=8192, h_q=64, d_qk=576, topk=2048, sglang=470, flashmla=438, target=700),
    dict(s_q=4096, s_kv=8192, h_q=64, d_qk=512, topk=512, sglang=511, flashmla=518, target=770),
    dict(s_q=4096, s_kv=32768, h_q=64, d_qk=512, topk=512, sglang=499, flashmla=488, target=750),
    dict(s_q=1024, s_kv=65536, h_q=128, d_qk=576, topk=2048, sglang=614, flashmla=591, target=920),
]

# Each pattern also with "-sorted": every token's rows in ascending kv-row order (invalid slots last)
# instead of the indexer's score order, as an engine that sorts its indices passes them; neighbouring
# tokens then list their shared rows in the same order.
INDEX_PATTERNS = tuple(p + s for p in ("uniform", "realistic-glm", "realistic-dsv4") for s in ("", "-sorted"))


def pattern_indices(pattern: str, s_q: int, s_kv: int, topk: int, seed: int, indices: torch.Tensor) -> torch.Tensor:
    """The indices of an ``--indices`` pattern; ``indices`` are make_inputs' own (the uniform ones)."""
    base = pattern.removesuffix("-sorted")
    if base != "uniform":
        indices = realistic_indices(s_q, s_kv, topk, **PRESETS[base], seed=seed, device=indices.device)
    return sorted_rows(indices, s_kv) if pattern.endswith("-sorted") else indices


def sorted_rows(indices: torch.Tensor, s_kv: int) -> torch.Tensor:
    """Each token's valid rows in ascending order, its invalid slots (kept as they were) after them."""
    invalid = (indices < 0) | (indices >= s_kv)
    key = torch.where(invalid, torch.iinfo(torch.int64).max, indices.long())
    return torch.gather(indices, -1, key.argsort(dim=-1, stable=True))


def incumbent_call(dispatch, inputs: dict, shape: dict):
    """A no-argument call of the incumbent's ``dispatch`` on ``inputs``, with its own outputs."""
    s_q, s_kv, h_q, d_qk, topk = (shape[name] for name in ("s_q", "s_kv", "h_q", "d_qk", "topk"))
    outputs = poisoned_outputs(s_q, h_q, inputs["d_v"])
    stream = torch.cuda.current_stream().cuda_stream
    q, kv, indices = inputs["q"].contiguous(), inputs["kv"].contiguous(), inputs["indices"].contiguous()

    def call():
        dispatch(q, kv, indices, inputs["q_scale"], inputs["kv_scale"], outputs["out"], outputs["max_logits"],
                 outputs["lse"], s_q, s_kv, h_q, 1, d_qk, inputs["d_v"], topk, inputs["sm_scale"], stream)
    return call, outputs


PADDED_HEADS = 64  # the incumbent's head block: q is padded to a multiple of it


def padded_heads(h_q: int) -> int:
    return -(-h_q // PADDED_HEADS) * PADDED_HEADS


def padded_incumbent_call(dispatch, inputs: dict, s_kv: int):
    """The incumbent (incumbent_call) on q padded with zero heads to a multiple of 64, as serving
    engines call it."""
    q = inputs["q"]
    s_q, h_q, d_qk = q.shape
    padded = torch.zeros(s_q, padded_heads(h_q), d_qk, dtype=q.dtype, device=q.device)
    padded[:, :h_q] = q
    shape = dict(s_q=s_q, s_kv=s_kv, h_q=padded.shape[1], d_qk=d_qk, topk=inputs["indices"].shape[2])
    return incumbent_call(dispatch, dict(inputs, q=padded), shape)[0]


def git_commit() -> str:
    """HEAD of the checkout, or $SPARSE_MLA_COMMIT where the tree was copied without .git (GPU hosts)."""
    if os.environ.get("SPARSE_MLA_COMMIT"):
        return os.environ["SPARSE_MLA_COMMIT"]
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True,
                                cwd=BENCHMARKS_DIR).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True, check=True, cwd=BENCHMARKS_DIR).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return f"{commit}-dirty" if dirty else commit


def waiting_columns(row: dict, side: bool) -> str:
    """The each-call-waits columns (ms, and the ratio against the incumbent); dashes in runs made
    before they existed."""
    if "waiting_ms" not in row:
        return f"{'-':>7} " + (f"{'-':>5} " if side else "")
    return f"{row['waiting_ms']:>7.3f} " + (f"{row['waiting_ratio_vs_incumbent']:>5.2f} " if side else "")
