"""Compile the real kernel for sm_90a with no GPU, through the prebuild command (the JIT's own code):
two kernels compiled side by side each get their own build log, ptxas reports no spills and no stack
frame (the grouped tile: a bounded few bytes), an entry holds the documented files only, a second prebuild compiles nothing, a fresh
process with the JIT disabled and no compiler on PATH loads the prebuilt module, and every launch plan
calls the built entries with the arguments they take."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from sparse_mla.jit import env
from sparse_mla.jit.build import build_spec
from sparse_mla.jit.key import KernelKey

if env.cuda_home() is None:
    pytest.skip("nvcc not found: the nvcc tier needs the CUDA toolkit (set CUDA_HOME)", allow_module_level=True)

# The production shapes, and a ragged topk that exercises the masked tail.
KEYS = [KernelKey(576, 2048), KernelKey(512, 512), KernelKey(576, 100)]
GROUPED_TILE_SPILL_BYTES = 8  # stack frame, spill stores and loads of the grouped tile, each at most
# The grouped tile over paged rows, at a ragged topk (7, 100): its producer (40 registers) keeps two
# 64-bit pointers in local memory, reloaded twice a pair (docs/lab.md, Experiment 136).
PAGED_GROUPED_TILE_SPILL_BYTES = 16


def prebuild(cache_dir, *args):
    return subprocess.run(
        [sys.executable, "-m", "sparse_mla", "prebuild", *args, "--cache-dir", str(cache_dir)],
        capture_output=True,
        text=True,
        timeout=1800,
    )


@pytest.fixture(scope="module")
def prebuilt(tmp_path_factory):
    cache_dir = tmp_path_factory.mktemp("prebuilt")
    first = prebuild(cache_dir, "--d-qk", "576", "--topk", "2048", "100", "-j", "2")  # side by side
    rest = prebuild(cache_dir, "--d-qk", "512", "--topk", "512")
    for result in (first, rest):
        assert result.returncode == 0, result.stdout + result.stderr
    return cache_dir, first


@pytest.mark.parametrize("key", KEYS, ids=lambda k: k.name)
def test_kernel_compiles_for_sm90a_without_spills(prebuilt, key):
    cache_dir, _ = prebuilt
    log = (build_spec(key).entry_dir(cache_dir) / "build.log").read_text()
    assert "-gencode=arch=compute_90a,code=sm_90a" in log
    kernels = re.findall(r"Compiling entry function '(\w+)' for 'sm_90a'", log)
    assert kernels, log
    # Only this key's instantiation (the template arguments are mangled as Li<value>E; the token
    # groups' pre-pass depends on topk alone, the counters' zeroing on neither).
    assert all((f"Li{key.d_qk}E" in k or "token_groups" in k) and f"Li{key.topk}E" in k
               for k in kernels if "zero_counts" not in k), kernels
    assert sum("zero_counts" in k for k in kernels) == 1, kernels
    assert f"{key.name}.cu" in log and all(other.name not in log for other in KEYS if other != key)
    # ptxas reports each kernel's frame right after its "Compiling entry function" line.
    frames = dict(zip(kernels, re.findall(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", log)))
    assert len(frames) == len(kernels), log
    for kernel, values in frames.items():
        # The grouped tile (Tile::kGrouped, mangled TileE2) spills a register or two (reloaded once a pair)
        # (docs/lab.md, Experiments 38 and 46), bounded here so that it cannot grow.
        limit = 0
        if "TileE2ELNS1_8KvLayoutE1E" in kernel:  # KvLayout::kPaged
            limit = PAGED_GROUPED_TILE_SPILL_BYTES
        elif "TileE2E" in kernel:
            limit = GROUPED_TILE_SPILL_BYTES
        assert all(int(v) <= limit for v in values), (kernel, values)


@pytest.mark.parametrize("key", KEYS, ids=lambda k: k.name)
def test_an_entry_holds_the_module_its_source_key_and_build_log_only(prebuilt, key):
    cache_dir, _ = prebuilt
    entry = build_spec(key).entry_dir(cache_dir)
    assert sorted(p.name for p in entry.iterdir()) == sorted([f"{key.name}.so", f"{key.name}.cu", "build.log", "key.json"])


def test_prebuild_prints_a_summary_and_a_second_run_compiles_nothing(prebuilt):
    cache_dir, first = prebuilt
    assert "sparse_mla_prefill_dqk576_topk2048_sm90a" in first.stdout and "built" in first.stdout
    again = prebuild(cache_dir, "--d-qk", "576", "--topk", "2048")
    assert again.returncode == 0
    assert "cached" in again.stdout and "compiling" not in again.stderr


def test_a_fresh_process_warms_up_from_the_prebuilt_modules_without_a_compiler_or_cuda(prebuilt, tmp_path):
    cache_dir, _ = prebuilt
    script = (
        "import sparse_mla, torch\n"
        "sparse_mla.warmup(d_qk=576, topk=[2048, 100])\n"
        "sparse_mla.warmup(d_qk=512, topk=512)\n"
        "from sparse_mla.jit import get_module, KernelKey\n"
        "for d_qk, topk in ((576, 2048), (512, 512), (576, 100)):\n"
        "    print(get_module(KernelKey(d_qk, topk)).kernel_key())\n"
        "print('CUDA initialized:', torch.cuda.is_initialized())\n"
    )
    environment = {k: v for k, v in os.environ.items() if k not in ("CUDA_HOME", "CUDA_PATH")}
    environment.update(
        PATH=str(tmp_path),  # no nvcc, no ninja, no c++
        SPARSE_MLA_DISABLE_JIT="1",
        SPARSE_MLA_JIT_CACHE_DIR=str(tmp_path / "empty"),
        SPARSE_MLA_PREBUILT_DIRS=str(cache_dir),
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=environment, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [k.name for k in KEYS] + ["CUDA initialized: False"], result.stdout


# Every entry call of the launch plan, made on the real module with CPU tensors: the module checks its
# arity before anything else (a TypeError names the signature) and then refuses the tensors (a
# ValueError), so a plan that passes an entry the wrong arguments fails here, with no GPU. The GPU
# tier calls the same plans, but the CPU tier's launch tests run on a stand-in module. Then the
# grouped tile's reach: only the grouped call's entry takes the token groups' lists (which its own
# pre-pass writes), so an ordinary or split entry called with lists and a grouped flag, as the
# entry of earlier builds took them, is refused by its arity.
_ENTRY_CALLS_SCRIPT = """
import torch
from sparse_mla import launch
from sparse_mla.args import PrefillArgs
from sparse_mla.jit import get_module, KernelKey
from sparse_mla.testing import launch_with_module

class Recorder:
    def __init__(self, module):
        self.module, self.calls = module, []
    def __getattr__(self, name):
        function = getattr(self.module, name)
        def call(*args):
            try:
                function(*args)
            except ValueError as refused:  # past the arity check: the entry's own first check
                self.calls.append(f"{name}: {refused}")
        return call

launch.check_hopper = lambda index: 0
launch.num_sms = lambda index: 132
module = get_module(KernelKey(576, 2048))
kv = torch.zeros(4096, 1, 576).to(torch.float8_e4m3fn)
scale = torch.ones(1)
for h_q, s_q, mode in ((64, 200, "never"), (64, 300, "never"), (128, 8, "never"), (16, 300, "auto"),
                       (16, 300, "always")):
    q = torch.zeros(s_q, h_q, 576).to(torch.float8_e4m3fn)
    indices = torch.zeros(s_q, 1, 2048, dtype=torch.int32)
    out = torch.empty(s_q, h_q, 512, dtype=torch.bfloat16)
    max_logits, lse = torch.empty(s_q, h_q), torch.empty(s_q, h_q)
    recorder = Recorder(module)
    launch_with_module(recorder, PrefillArgs(q, kv, indices, scale, scale, None, None, out, max_logits, lse, 0.04),
                       token_groups=mode)
    print(h_q, s_q, mode, "|".join(recorder.calls))
scratch = torch.empty(launch.token_group_bytes(s_q, 4, 2048), dtype=torch.uint8)
for name, extra in (("prefill_fwd", (s_q, 1, scratch)), ("prefill_split_fwd", (0, 2, scratch))):
    try:
        getattr(module, name)(q, kv, indices, scale, scale, None, None, out, max_logits, lse, 0.04, *extra, 4, 0.75,
                              scratch)
    except TypeError:
        print(name, "refuses the token groups' arguments")
"""


def test_the_launch_plans_call_the_real_entries_with_their_arity(prebuilt):
    cache_dir, _ = prebuilt
    environment = dict(os.environ, SPARSE_MLA_DISABLE_JIT="1", SPARSE_MLA_PREBUILT_DIRS=str(cache_dir),
                       SPARSE_MLA_JIT_CACHE_DIR=str(cache_dir))
    result = subprocess.run([sys.executable, "-c", _ENTRY_CALLS_SCRIPT], capture_output=True, text=True,
                            env=environment, timeout=300)
    assert result.returncode == 0, result.stderr
    prefill = "prefill_fwd: q must be a CUDA tensor"
    split = "prefill_split_fwd: q must be a CUDA tensor"
    grouped = "prefill_token_groups_fwd: q must be a CUDA tensor"  # the pre-pass and both launches, in one call
    assert result.stdout.splitlines() == [
        f"64 200 never {prefill}", f"64 300 never {split}", f"128 8 never {split}", f"16 300 auto {grouped}",
        f"16 300 always {grouped}", "prefill_fwd refuses the token groups' arguments",
        "prefill_split_fwd refuses the token groups' arguments"], result.stdout
