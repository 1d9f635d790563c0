"""The JIT: kernel key -> generated source -> tvm-ffi build (sm_90a) -> content-addressed cache -> module.

``get_module`` is what the call path uses; ``KernelCache`` and ``build_spec`` are what the prebuild
command and the tests use. Nothing here imports tvm-ffi until a module is built or loaded.
"""

from __future__ import annotations

from typing import Any

from sparse_mla.jit.build import BuildSpec, build_spec
from sparse_mla.jit.cache import KernelCache, scan
from sparse_mla.jit.key import ENTRY_FUNCTION, KernelKey

__all__ = ["ENTRY_FUNCTION", "BuildSpec", "KernelCache", "KernelKey", "build_spec", "get_module", "scan"]

# One cache per process, shared by all devices and threads: a loaded module serves every GPU.
_CACHE = KernelCache()


def get_module(key: KernelKey) -> Any:
    """The loaded tvm-ffi module for ``key``, compiling it on first use."""
    return _CACHE.get(key)
