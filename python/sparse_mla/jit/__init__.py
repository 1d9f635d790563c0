"""The JIT: kernel key -> generated source -> tvm-ffi build (sm_90a) -> content-addressed cache -> module.

``get_module`` is what the call path uses and ``warmup`` what serving code calls at startup;
``KernelCache`` and ``build_spec`` are what the prebuild command and the tests use. Nothing here imports
tvm-ffi until a module is built or loaded.
"""

from __future__ import annotations

import concurrent.futures
import itertools
from collections.abc import Iterable
from typing import Any

from sparse_mla.jit.build import BuildSpec, build_spec
from sparse_mla.jit.cache import KernelCache
from sparse_mla.jit.key import ENTRY_FUNCTION, KernelKey

__all__ = [
    "ENTRY_FUNCTION",
    "BuildSpec",
    "KernelCache",
    "KernelKey",
    "build_spec",
    "get_module",
    "warmup",
]

# One cache per process, shared by all devices and threads: a loaded module serves every GPU.
_CACHE = KernelCache()


def get_module(key: KernelKey) -> Any:
    """The loaded tvm-ffi module for ``key``, compiling it on first use."""
    return _CACHE.get(key)


def _values(name: str, value: int | Iterable[int]) -> list[int]:
    values = [value] if isinstance(value, int) else list(value)
    if not values:
        raise ValueError(f"{name} must be an int or a non-empty list of ints, got {value!r}")
    return values


def warmup(d_qk: int | Iterable[int] = 576, topk: int | Iterable[int] = 2048) -> None:
    """Load the kernels for every (d_qk, topk) combination now, compiling those no cache holds.

    Call it at startup, before capturing CUDA graphs, so that no prefill call compiles or loads:
    ``sparse_mla.warmup(d_qk=576, topk=2048)``, or ``sparse_mla.warmup(d_qk=576, topk=[512, 2048])``
    for several kernels (missing ones compile side by side). It touches no GPU and no tensor, so it
    works before CUDA is initialized and on a host without a GPU. Raises what the first call would:
    ``ValueError`` for a d_qk or topk the library does not support, ``JITDisabledError``,
    ``ToolchainError``, ``CacheError`` or ``KernelBuildError`` when a kernel can be neither loaded nor
    compiled.
    """
    keys = [KernelKey(d, t) for d, t in itertools.product(_values("d_qk", d_qk), _values("topk", topk))]
    unique = list(dict.fromkeys(keys))
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(unique)) as pool:
        for _ in pool.map(_CACHE.get, unique):
            pass
