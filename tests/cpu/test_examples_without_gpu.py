"""The examples on a host without a GPU: each says why it stops, with no traceback, and exits 0 where
nothing failed (no GPU to run on) or 1 where something did (no kernel to load)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def run_example(name, *args, **variables):
    environment = {k: v for k, v in os.environ.items() if not k.startswith("SPARSE_MLA_")}
    environment.update(CUDA_VISIBLE_DEVICES="", **variables)  # no GPU, even on a GPU host
    return subprocess.run([sys.executable, str(EXAMPLES / name), *args], capture_output=True, text=True,
                          env=environment, timeout=300)


@pytest.mark.parametrize("name", ["deepseek_v32_prefill.py", "cuda_graph_prefill.py"])
def test_a_gpu_example_without_a_gpu_says_so_and_exits_0(name):
    result = run_example(name)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout == "skipped: no CUDA device is visible (sparse_mla runs on SM90 GPUs: H100, H200, H800, H20)\n"
    assert "Traceback" not in result.stderr, result.stderr


def test_the_serving_example_without_a_kernel_to_load_prints_the_library_s_message(tmp_path):
    result = run_example("serving_integration.py", SPARSE_MLA_DISABLE_JIT="1", SPARSE_MLA_JIT_CACHE_DIR=str(tmp_path))
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stderr.startswith("step 2 failed: JITDisabledError: kernel sparse_mla_prefill_dqk576_topk2048_sm90a "
                                    "has no usable entry in the cache"), result.stderr
    assert "Traceback" not in result.stderr, result.stderr


def test_every_example_is_covered():
    """A new example gets a case here; the prebuild script needs nvcc: tests/nvcc runs it, and the
    serving example after it, on the cache it built."""
    assert sorted(p.name for p in EXAMPLES.iterdir()) == [
        "cuda_graph_prefill.py", "deepseek_v32_prefill.py", "offline_prebuild.sh", "serving_integration.py"]
