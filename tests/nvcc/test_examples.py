"""The examples run as a user runs them, each in a fresh process.

Without a GPU: ``offline_prebuild.sh`` prebuilds into a new cache and loads from it with the JIT
disabled, and ``serving_integration.py`` warms up from that cache and reports its GPU steps skipped.
On an SM90 GPU host the serving example runs every step (the first-call timing compiles, so nvcc is
needed there too), and the two GPU-only examples run on small shapes; without one they are skipped,
with the reason shown by ``pytest -rs``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from sparse_mla.jit import env
from sparse_mla.testing import missing_sm90_gpu

if env.cuda_home() is None:
    pytest.skip("nvcc not found: the nvcc tier needs the CUDA toolkit (set CUDA_HOME)", allow_module_level=True)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
HAS_SM90 = missing_sm90_gpu() is None
needs_sm90 = pytest.mark.skipif(not HAS_SM90, reason="needs an SM90 (Hopper) GPU")


def run(argv: list[str], **variables: str) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("SPARSE_MLA_")}
    environment.update(variables)
    result = subprocess.run(argv, capture_output=True, text=True, env=environment, timeout=1800)
    assert result.returncode == 0, f"{' '.join(argv)} exited {result.returncode}\n{result.stdout}\n{result.stderr}"
    return result


@pytest.fixture(scope="module")
def offline_cache(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    cache = tmp_path_factory.mktemp("offline") / "cache"
    return cache, run(["bash", str(EXAMPLES / "offline_prebuild.sh"), str(cache)])


def test_offline_prebuild_builds_then_loads_with_the_jit_disabled(offline_cache):
    cache, result = offline_cache
    assert re.search(r"^sparse_mla_prefill_dqk576_topk2048_sm90a\s+built\s", result.stdout, re.MULTILINE), result.stdout
    assert result.stdout.rstrip().endswith(f"loaded from {cache}"), result.stdout


def test_serving_integration(offline_cache):
    cache, _ = offline_cache
    result = run([sys.executable, str(EXAMPLES / "serving_integration.py")], SPARSE_MLA_PREBUILT_DIRS=str(cache),
                 SPARSE_MLA_JIT_CACHE_DIR=str(cache.parent / "empty"), SPARSE_MLA_DISABLE_JIT="1")
    assert result.stdout.startswith("1-2. imported sparse_mla and warmed up d_qk 576, topk 2048 in "), result.stdout
    if HAS_SM90:
        for step in ("3. eager", "4. CUDA graph", "5. torch.compile", "6. h_q 16", "7. first call of a fresh process, empty cache",
                     "7. first call of a fresh process, prebuilt cache"):
            assert f"\n{step}" in result.stdout, (step, result.stdout)
        assert result.stdout.endswith("serving example: every step passed\n"), result.stdout
    else:
        last = result.stdout.splitlines()[-1]
        assert last.startswith("skipped the GPU steps 3-7: no CUDA device is visible"), result.stdout


@needs_sm90
def test_deepseek_v32_prefill():
    result = run([sys.executable, str(EXAMPLES / "deepseek_v32_prefill.py"), "--s-q", "512", "--s-kv", "8192", "--iters", "5"])
    assert "TFLOPS" in result.stdout, result.stdout


@needs_sm90
def test_cuda_graph_prefill():
    result = run([sys.executable, str(EXAMPLES / "cuda_graph_prefill.py"), "--s-q", "128", "--steps", "2"])
    assert result.stdout.count("replay matches the reference") == 2, result.stdout
