"""Hostile input on the GPU: compute-sanitizer finds no invalid access, race or barrier misuse under
hostile indices, on small shapes and on the whole pipeline (topk 2048, two head blocks); extreme
values give finite outputs where the math is finite and the specified values (empty rows, infinite
sinks) where it is not.

Extreme inputs are not the benchmark distribution: there the logit bound is large (logits of hundreds
or more, each allowed 2^-9 of sum |Q K|), lse and max_logits are held to that bound, and out is
compared on the (row, head) pairs whose attention is not a near-tie between two KV rows (where the
bound lets either win)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sparse_mla.jit.env import header_kernels
from sparse_mla.testing import FP8_E4M3_MAX, make_inputs

# compute-sanitizer checks only the kernels whose name contains this (torch's own kernels are left
# alone); test_sanitizer_coverage.py (cpu tier) checks that it names every kernel in the headers.
SANITIZER_KERNEL_FILTER = "prefill_kernel"


def _compute_sanitizer() -> str | None:
    found = shutil.which("compute-sanitizer")
    home = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    candidate = Path(home) / "bin" / "compute-sanitizer"
    return found or (str(candidate) if candidate.is_file() else None)


@pytest.mark.parametrize("case", ["small", "pipeline", "units", "narrow", "groups", "paged"])
@pytest.mark.parametrize("tool", ["memcheck", "racecheck", "synccheck"])
def test_compute_sanitizer_finds_nothing_under_hostile_input(tool, case, seed):
    """``small``: three kernel keys on tiny shapes with every corner; ``pipeline``: topk 2048, h_q 72,
    hostile indices, topk_length 0 / negative / past topk, infinite sinks, s_q 6; ``units``: more work
    units than CTAs, units of 0, 1 and 4 pairs and split parts in turn on each CTA; ``narrow``: the same
    with the narrow tiles at h_q 8, 16 and 24, no split; ``groups``: token
    groups, more than CTAs, grouped and narrow units in turn, the owner map at 8, 4 and 2 bits a row,
    the pre-pass in CTAs of 512 and 1024 threads; ``paged``: several of these over the engines' paged
    cache (sanitize_case.py)."""
    sanitizer = _compute_sanitizer()
    if sanitizer is None:
        pytest.skip("compute-sanitizer not found (looked on PATH and in $CUDA_HOME/bin)")
    kernels = header_kernels()
    assert kernels and all(SANITIZER_KERNEL_FILTER in name for name in kernels), (
        f"the sanitizer would skip kernels: filter {SANITIZER_KERNEL_FILTER!r}, kernels {kernels}"
    )
    command = [
        sanitizer, "--tool", tool, "--error-exitcode", "86", "--kernel-name", f"kns={SANITIZER_KERNEL_FILTER}",
        sys.executable, str(Path(__file__).with_name("sanitize_case.py")), str(seed), case,
    ]
    # Without the caching allocator every tensor is its own allocation, so memcheck sees any
    # access past a tensor's end instead of landing in a neighbouring cached block.
    environment = dict(os.environ, PYTORCH_NO_CUDA_MEMORY_CACHING="1")
    result = subprocess.run(command, capture_output=True, text=True, env=environment, timeout=600)
    report = result.stdout + result.stderr
    assert result.returncode == 0, f"seed {seed}, {tool}, {case}:\n{report[-6000:]}"
    assert "SANITIZE-CASE-OK" in report, report[-6000:]
    # memcheck and synccheck end with an ERROR SUMMARY, racecheck with a RACECHECK SUMMARY.
    assert re.search(r"ERROR SUMMARY: 0 errors|RACECHECK SUMMARY: 0 hazards displayed \(0 errors, 0 warnings\)", report), report[-6000:]


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
    inputs["sm_scale"] = 2e-5  # logits of a few hundred, each allowed an error of about 2.7
    out, max_logits, lse = check_prefill(inputs, f"seed {seed}: e4m3-maximum entries, d_qk {d_qk}, topk {topk}",
                                         skip_near_ties=True)
    finite = torch.isfinite(max_logits)
    assert max_logits[finite].abs().max() > 80, "the case did not reach logits past 80"


@pytest.mark.parametrize("sm_scale", [1e-30, 1e-8, 1e3, 2.0**99, -1 / 24, -1e3, -(2.0**99)])
def test_large_tiny_and_negative_sm_scale(check_prefill, seed, sm_scale):
    """Up to the largest accepted magnitude (2^99), and negative: the softmax of -logits."""
    inputs = make_inputs(s_q=64, s_kv=4096, h_q=32, d_qk=576, topk=512, seed=seed, invalid="mixed", topk_length="random")
    inputs["sm_scale"] = sm_scale
    check_prefill(inputs, f"seed {seed}: sm_scale {sm_scale}", skip_near_ties=True)


def test_scales_whose_product_is_representable_but_whose_factors_are_extreme(check_prefill, seed):
    """q_scale 1e-30 and kv_scale 1e30: a kernel that multiplies sm_scale * kv_scale first in fp32
    overflows; the folded multiplier is about 1 and the result finite."""
    inputs = make_inputs(s_q=32, s_kv=2048, h_q=16, d_qk=576, topk=64, seed=seed)
    inputs["q_scale"] = inputs["q_scale"] * 1e-30
    inputs["kv_scale"] = inputs["kv_scale"] * 1e30
    inputs["sm_scale"] = 1e8
    check_prefill(inputs, f"seed {seed}: extreme scale factors", skip_near_ties=True)


def test_a_folded_scale_past_the_kernels_clamp_gives_finite_outputs(prefill_fwd, seed):
    """sm_scale * q_scale * kv_scale of about 1e38 (q_scale lives on the device: the host cannot refuse
    it without a sync): the kernel clamps the folded multiplier at 2^100, so no logit overflows and
    no inf - inf turns into NaN; out is the softmax at that temperature, a weighted pick of the
    row's largest logits."""
    inputs = make_inputs(s_q=64, s_kv=4096, h_q=64, d_qk=576, topk=512, seed=seed, invalid="mixed")
    inputs["q_scale"] = torch.full((1,), 1e30, device="cuda")
    inputs["sm_scale"] = 1e8
    out, max_logits, lse = prefill_fwd(**inputs)
    for name, tensor in (("out", out), ("max_logits", max_logits), ("lse", lse)):
        assert torch.isfinite(tensor.float()).all(), f"seed {seed}: {name} is not finite"


@pytest.mark.parametrize("s_q", [1, 300])  # one row (split into 4 parts and merged), and unsplit rows
def test_a_nan_in_a_valid_slot_makes_out_lse_and_max_logits_nan_together(prefill_fwd, seed, s_q):
    inputs = make_inputs(s_q=s_q, s_kv=4096, h_q=64, d_qk=576, topk=2048, seed=seed)
    indices = inputs["indices"]
    row = s_q // 2
    poisoned = int(indices[row, 0, 7])
    others = torch.ones(s_q, dtype=torch.bool, device="cuda")
    others[row] = False
    indices[others] = torch.where(indices[others] == poisoned, -1, indices[others])  # only `row` reads it
    inputs["kv"].view(torch.uint8)[poisoned, 0, 100] = 0x7F  # one e4m3 NaN in a nope column
    out, max_logits, lse = prefill_fwd(**inputs)
    context = f"seed {seed}, s_q {s_q}, KV row {poisoned} NaN in a valid slot of row {row}"
    for name, tensor in (("out", out[row]), ("max_logits", max_logits[row]), ("lse", lse[row])):
        assert tensor.float().isnan().all(), f"{context}: {name} of that row is not all NaN"
    for name, tensor in (("out", out[others]), ("max_logits", max_logits[others]), ("lse", lse[others])):
        assert torch.isfinite(tensor.float()).all(), f"{context}: {name} of another row is not finite"


@pytest.mark.parametrize("sink", [float("inf"), -float("inf"), 1e30, -1e30])
def test_uniform_special_sink(check_prefill, seed, sink):
    inputs = make_inputs(s_q=32, s_kv=4096, h_q=16, d_qk=576, topk=64, seed=seed, all_invalid_rows=4)
    inputs["attn_sink"] = torch.full((16,), sink, device="cuda")
    out, _, _ = check_prefill(inputs, f"seed {seed}: attn_sink {sink}")
    if sink > 0:
        assert (out == 0).all(), "a sink of +inf or +1e30 must zero the output"


def test_entry_repeats_the_checks_the_kernel_relies_on(seed):
    """A module called directly (bypassing Python validation) refuses tensors it was not built for,
    with typed errors and without launching (defence in depth)."""
    from sparse_mla.jit import KernelKey, get_module

    module = get_module(KernelKey(576, 64))
    inputs = make_inputs(s_q=8, s_kv=256, h_q=16, d_qk=576, topk=100, seed=seed)
    out = torch.empty(8, 16, 512, dtype=torch.bfloat16, device="cuda")
    stats = [torch.empty(8, 16, device="cuda") for _ in range(2)]

    base = dict(q=inputs["q"], kv=inputs["kv"], indices=inputs["indices"], q_scale=inputs["q_scale"],
                kv_scale=inputs["kv_scale"], attn_sink=None, topk_length=None, out=out, max_logits=stats[0],
                lse=stats[1], sm_scale=0.04)

    def call(**changes):
        module.prefill_fwd(*dict(base, **changes).values())

    with pytest.raises(ValueError, match=r"indices.shape\[2\] must be 64, got 100"):
        call()  # the topk-64 module fed topk-100 indices
    indices = inputs["indices"][:, :, :64].contiguous()
    call(indices=indices)  # the right topk passes
    with pytest.raises(ValueError, match="q must be a CUDA tensor"):
        call(q=inputs["q"].cpu(), indices=indices)
    with pytest.raises(ValueError, match="kv has the wrong dtype"):
        call(kv=inputs["kv"].view(torch.int8), indices=indices)
    with pytest.raises(ValueError, match=r"out.shape\[2\] must be 512"):
        call(out=out[:, :, :256], indices=indices)
    with pytest.raises(ValueError, match="indices must be contiguous"):
        call(indices=inputs["indices"][:, :, :64])
    with pytest.raises(ValueError, match="q_scale must have exactly one element"):
        call(indices=indices, q_scale=torch.ones(2, device="cuda"))
    # The tail split (8 work items here): consistent fields and a scratch of at least the bytes its
    # layout needs, exactly the plan's (launch.py), at a 16-byte boundary.
    from sparse_mla.launch import SPLIT_PART_FLOATS, token_group_bytes
    from sparse_mla.testing import token_group_lists

    split_bytes = 4 * 8 * (2 * SPLIT_PART_FLOATS + 1)
    scratch = torch.zeros(split_bytes + 16, dtype=torch.uint8, device="cuda")

    def split(split_begin, split_parts, scratch):
        module.prefill_split_fwd(*dict(base, indices=indices).values(), split_begin, split_parts, scratch)

    with pytest.raises(ValueError, match="inconsistent tail split"):
        split(0, 1, scratch)  # one part is no split
    with pytest.raises(ValueError, match="inconsistent tail split"):
        split(8, 2, scratch)  # no item to split
    with pytest.raises(ValueError, match=rf"scratch holds {split_bytes - 1} bytes; this call needs {split_bytes}(?!\d)"):
        split(0, 2, scratch[:split_bytes - 1])
    with pytest.raises(ValueError, match="scratch must start at a 16-byte boundary"):
        split(0, 2, scratch[4:])
    with pytest.raises(ValueError, match="scratch has the wrong dtype"):
        split(0, 2, scratch.view(torch.int32))
    # Token groups (groups of 4 here): the group size, and a scratch of exactly the plan's bytes.
    group_bytes = token_group_bytes(8, 4, 64)

    def grouped(group_size=4, scratch=scratch):
        module.prefill_token_groups_fwd(*dict(base, indices=indices).values(), group_size, 0.75, scratch)

    with pytest.raises(ValueError, match="inconsistent token groups: group_size 5 with h_q 16"):
        grouped(group_size=5)  # 5 x 16 rows do not fit a tile
    with pytest.raises(ValueError, match=rf"scratch holds {group_bytes - 1} bytes; this call needs {group_bytes}(?!\d)"):
        grouped(scratch=scratch[:group_bytes - 1])
    # The pre-pass alone takes its lists as tensors of the pre-pass's shapes.
    lists = token_group_lists(inputs["q"].device, 8, 4, 64)

    def pre_pass(*lists):
        module.token_groups_fwd(indices, None, inputs["kv"].shape[0], 16, 4, 0.75, *lists)

    pre_pass(*lists)
    with pytest.raises(ValueError, match=r"group_indices.shape\[1\] must be 256, got 128"):
        pre_pass(lists[0][:, :128].contiguous(), *lists[1:])
    with pytest.raises(ValueError, match="group_masks has the wrong dtype"):
        pre_pass(lists[0], lists[0].view(2, 4, 64), *lists[2:])
    with pytest.raises(ValueError, match=r"group_units.shape\[0\] must be 12, got 11"):
        pre_pass(*lists[:3], lists[3][:11])
    with pytest.raises(TypeError):
        module.prefill_fwd(*dict(base, indices=indices).values(), 4, 0.75, scratch)  # no scratch but the others'
    torch.cuda.synchronize()  # nothing was launched with bad arguments, the context is healthy


_RANK_SCRIPT = """
import hashlib, logging, sys, torch
logging.basicConfig(level=logging.INFO)  # the compile is announced on the sparse_mla logger
from sparse_mla import sparse_mla_q8kv8_prefill_fwd
from sparse_mla.testing import make_inputs
inputs = make_inputs(s_q=64, s_kv=2048, h_q=24, d_qk=576, topk=48, seed=int(sys.argv[1]), invalid="mixed",
                     topk_length="random", attn_sink="random")
out, max_logits, lse = sparse_mla_q8kv8_prefill_fwd(**inputs)
digest = hashlib.sha256()
for tensor in (out, max_logits, lse):
    digest.update(tensor.cpu().view(torch.uint8).numpy().tobytes())
print("RESULT", digest.hexdigest())
"""


def test_eight_ranks_sharing_an_empty_cache_compile_once_and_agree(tmp_path, seed):
    """Eight processes (the ranks of a tensor-parallel server) ask for the same new kernel at once
    with one empty cache directory: one compile, eight working modules, identical results."""
    import subprocess

    environment = dict(os.environ, SPARSE_MLA_JIT_CACHE_DIR=str(tmp_path / "cache"), SPARSE_MLA_PREBUILT_DIRS="")
    ranks = [
        subprocess.Popen([sys.executable, "-c", _RANK_SCRIPT, str(seed)], env=environment, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
        for _ in range(8)
    ]
    outputs = [rank.communicate(timeout=600) for rank in ranks]
    assert all(rank.returncode == 0 for rank in ranks), [err[-3000:] for _, err in outputs]
    results = {line for out, _ in outputs for line in out.splitlines() if line.startswith("RESULT")}
    assert len(results) == 1, results
    compiles = sum(err.count("compiled sparse_mla_prefill_dqk576_topk48_sm90a") for _, err in outputs)
    assert compiles == 1, [err[-2000:] for _, err in outputs]


# Keys the GPU tier prebuilds (see conftest.py), so random calls compile nothing.
_PREBUILT_TOPK = {576: (1, 7, 64, 100, 512, 2048), 512: (64, 512)}


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_random_valid_calls_match_the_reference(accept, data):
    """Property-based on the GPU: random shapes, head counts, strides, optional
    arguments and preallocation give outputs that match the reference."""
    d_qk = data.draw(st.sampled_from([576, 512]))
    topk = data.draw(st.sampled_from(_PREBUILT_TOPK[d_qk]))
    shape = dict(
        s_q=data.draw(st.integers(0, 40)), s_kv=data.draw(st.integers(1, 3000)), h_q=data.draw(st.integers(1, 140)),
        d_qk=d_qk, topk=topk,
    )
    options = dict(
        invalid=data.draw(st.sampled_from(["none", "mixed", "hostile"])),
        duplicates=data.draw(st.booleans()),
        topk_length=data.draw(st.sampled_from([None, "random"])),
        attn_sink=data.draw(st.sampled_from([None, "random", "special"])),
        q_strided=data.draw(st.booleans()),
        kv_strided=data.draw(st.booleans()),
    )
    seed = data.draw(st.integers(0, 2**31 - 1))
    inputs = make_inputs(**shape, seed=seed, **options)
    context = f"seed {seed}, {shape}, {options}"
    from sparse_mla import sparse_mla_q8kv8_prefill_fwd
    from sparse_mla.testing import poisoned_outputs

    buffers = poisoned_outputs(shape["s_q"], shape["h_q"], device="cuda") if data.draw(st.booleans()) else {}
    result = sparse_mla_q8kv8_prefill_fwd(**inputs, **buffers)
    accept(result, inputs, context)
