"""Fixtures of the CPU tier (the fake tensors the validation tests use are in fake_tensors.py)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def _benchmark_script(name: str):
    """benchmarks/<name>.py imported by path (benchmarks/ is no package)."""
    spec = importlib.util.spec_from_file_location(f"sparse_mla_{name}", BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def bench():
    return _benchmark_script("bench")


@pytest.fixture(scope="session")
def tp():
    return _benchmark_script("tp")


@pytest.fixture(scope="session")
def ab():
    return _benchmark_script("ab")


@pytest.fixture(scope="session")
def common():
    return _benchmark_script("common")


@pytest.fixture(scope="session")
def overhead():
    return _benchmark_script("overhead")


@pytest.fixture
def no_compiler(monkeypatch):
    """Fails the test if anything reaches the JIT (key building, cache lookup, compile)."""
    import sparse_mla.jit.cache
    import sparse_mla.launch

    def forbidden(*args, **kwargs):
        raise AssertionError("a rejected call reached the JIT")

    monkeypatch.setattr(sparse_mla.launch, "get_module", forbidden)
    monkeypatch.setattr(sparse_mla.launch, "check_hopper", forbidden)
    monkeypatch.setattr(sparse_mla.jit.cache.KernelCache, "get", forbidden)
