"""Hostile input on the GPU (issue 3 items 4 and 6): compute-sanitizer finds no invalid access, race
or barrier misuse under hostile indices; extreme values give finite outputs where the math is finite
and the SPEC values where it is not."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from sparse_mla.testing import FP8_E4M3_MAX, make_inputs


def _compute_sanitizer() -> str | None:
    found = shutil.which("compute-sanitizer")
    home = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    candidate = Path(home) / "bin" / "compute-sanitizer"
    return found or (str(candidate) if candidate.is_file() else None)


@pytest.mark.parametrize("tool", ["memcheck", "racecheck", "synccheck"])
def test_compute_sanitizer_finds_nothing_under_hostile_input(tool, seed):
    sanitizer = _compute_sanitizer()
    if sanitizer is None:
        pytest.skip("compute-sanitizer not found (looked on PATH and in $CUDA_HOME/bin)")
    command = [
        sanitizer, "--tool", tool, "--error-exitcode", "86", "--kernel-name", "kns=prefill_kernel",
        sys.executable, str(Path(__file__).with_name("sanitize_case.py")), str(seed),
    ]
    # Without the caching allocator every tensor is its own allocation, so memcheck sees any
    # access past a tensor's end instead of landing in a neighbouring cached block.
    environment = dict(os.environ, PYTORCH_NO_CUDA_MEMORY_CACHING="1")
    result = subprocess.run(command, capture_output=True, text=True, env=environment, timeout=600)
    report = result.stdout + result.stderr
    assert result.returncode == 0, f"seed {seed}, {tool}:\n{report[-6000:]}"
    assert "SANITIZE-CASE-OK" in report and "ERROR SUMMARY: 0 errors" in report, report[-6000:]


def _near_max_fp8(shape, generator) -> torch.Tensor:
    """Entries of magnitude 240..448 (the top of e4m3) with random signs."""
    magnitude = torch.empty(shape, device="cuda").uniform_(240.0, FP8_E4M3_MAX, generator=generator)
    sign = torch.randint(0, 2, shape, device="cuda", generator=generator) * 2 - 1
    return (magnitude * sign).to(torch.float8_e4m3fn)


@pytest.mark.parametrize("d_qk, topk", [(576, 512), (512, 64)])
def test_fp8_maximum_entries_with_logits_far_past_80(check_prefill, seed, d_qk, topk):
    inputs = make_inputs(s_q=64, s_kv=4096, h_q=64, d_qk=d_qk, topk=topk, seed=seed, invalid="mixed", attn_sink="special")
    generator = torch.Generator(device="cuda").manual_seed(seed)
    inputs["q"] = _near_max_fp8(inputs["q"].shape, generator)
    inputs["kv"] = _near_max_fp8(inputs["kv"].shape, generator)
    inputs["q_scale"] = torch.ones(1, device="cuda")
    inputs["kv_scale"] = torch.ones(1, device="cuda")
    inputs["sm_scale"] = 2e-5  # logits of a few hundred
    out, max_logits, lse = check_prefill(inputs, f"seed {seed}: e4m3-maximum entries, d_qk {d_qk}, topk {topk}")
    finite = torch.isfinite(max_logits)
    assert max_logits[finite].abs().max() > 80, "the case did not reach logits past 80"


@pytest.mark.parametrize("sm_scale", [1e-30, 1e-8, 1e3, 1e30])
def test_large_and_tiny_sm_scale(check_prefill, seed, sm_scale):
    inputs = make_inputs(s_q=64, s_kv=4096, h_q=32, d_qk=576, topk=512, seed=seed, invalid="mixed", topk_length="random")
    inputs["sm_scale"] = sm_scale
    check_prefill(inputs, f"seed {seed}: sm_scale {sm_scale}")


def test_scales_whose_product_is_representable_but_whose_factors_are_extreme(check_prefill, seed):
    """q_scale 1e-30 and kv_scale 1e30: a kernel that multiplies sm_scale * kv_scale first in fp32
    overflows; the folded multiplier is about 1 and the result finite."""
    inputs = make_inputs(s_q=32, s_kv=2048, h_q=16, d_qk=576, topk=64, seed=seed)
    inputs["q_scale"] = inputs["q_scale"] * 1e-30
    inputs["kv_scale"] = inputs["kv_scale"] * 1e30
    inputs["sm_scale"] = 1e8
    check_prefill(inputs, f"seed {seed}: extreme scale factors")


@pytest.mark.parametrize("sink", [float("inf"), -float("inf"), 1e30, -1e30])
def test_uniform_special_sink(check_prefill, seed, sink):
    inputs = make_inputs(s_q=32, s_kv=4096, h_q=16, d_qk=576, topk=64, seed=seed, all_invalid_rows=4)
    inputs["attn_sink"] = torch.full((16,), sink, device="cuda")
    out, _, _ = check_prefill(inputs, f"seed {seed}: attn_sink {sink}")
    if sink > 0:
        assert (out == 0).all(), "a sink of +inf or +1e30 must zero the output"
