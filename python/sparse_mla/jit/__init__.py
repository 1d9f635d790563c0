"""The JIT: kernel key -> generated source -> nvcc for sm_90a (through ninja) -> content-addressed cache -> module.

``get_module`` is what the call path uses and ``warmup`` what serving code calls at startup;
``KernelCache`` and ``build_spec`` are what the prebuild command and the tests use. Nothing here imports
tvm-ffi until a module is built or loaded.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import os
from collections.abc import Iterable
from typing import Any

from sparse_mla.jit import interrupt
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
    """``value`` as a list of ints; TypeError naming ``name`` for anything else (a str is not a list of
    digits, and a float is no int even when it is whole)."""
    expected = f"{name} must be an int or a non-empty list of ints"
    if isinstance(value, int):
        return [value]
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise TypeError(f"{expected}, got {value!r} (a {type(value).__name__})")
    values = list(value)
    if not values:
        raise ValueError(f"{expected}, got {value!r}")
    for item in values:
        if not isinstance(item, int):
            raise TypeError(f"{expected}, got {value!r} (holding {item!r}, a {type(item).__name__})")
    return values


def _cpu_count() -> int:
    return len(os.sched_getaffinity(0))


def warmup(d_qk: int | Iterable[int] = 576, topk: int | Iterable[int] = 2048) -> None:
    """Load the kernels for every (d_qk, topk) combination now, compiling those no cache holds.

    Call it at startup, before capturing CUDA graphs, so that no prefill call compiles or loads:
    ``sparse_mla.warmup(d_qk=576, topk=2048)``, or ``sparse_mla.warmup(d_qk=576, topk=[512, 2048])``
    for several kernels (missing ones compile side by side, as many at once as this process has CPU
    cores). It touches no GPU and no tensor, so it works before CUDA is initialized and on a host without
    a GPU. Raises what the first call would: ``TypeError`` for a d_qk or topk that is not an int or a
    list of ints, ``ValueError`` for one the library does not support, ``JITDisabledError``,
    ``ToolchainError``, ``CacheError`` or ``KernelBuildError`` when a kernel can be neither loaded nor
    compiled. A ``KeyboardInterrupt`` stops its compiles and starts no other.
    """
    keys = [KernelKey(d, t) for d, t in itertools.product(_values("d_qk", d_qk), _values("topk", topk))]
    unique = list(dict.fromkeys(keys))
    # A compile keeps a core busy: more at once than there are cores only makes each slower.
    with concurrent.futures.ThreadPoolExecutor(max_workers=min(len(unique), _cpu_count())) as pool:
        try:
            # The compilers the signal did not reach, and those about to start, stop too.
            with interrupt.stopping_at_interrupt():
                for _ in pool.map(_CACHE.get, unique):
                    pass
        except KeyboardInterrupt:
            try:
                pool.shutdown(wait=True, cancel_futures=True)
            finally:
                interrupt.resume()  # this process may go on (a notebook): its next call may compile
            raise
