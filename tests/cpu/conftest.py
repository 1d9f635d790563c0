"""Fixtures of the CPU tier (the fake tensors the validation tests use are in fake_tensors.py)."""

from __future__ import annotations

import pytest


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
