"""sparse_mla: FP8 sparse MLA prefill attention for NVIDIA Hopper, JIT-compiled per (d_qk, topk).

    import sparse_mla
    sparse_mla.warmup(d_qk=576, topk=2048)  # at startup: load (or compile) the kernel
    out, max_logits, lse = sparse_mla.sparse_mla_q8kv8_prefill_fwd(q, kv, indices, sm_scale, q_scale, kv_scale)

Importing this package is cheap: it imports neither torch (until the function is first looked up) nor
tvm-ffi, starts no compiler and does not initialize CUDA, so the CLI (``python -m sparse_mla``) starts
fast.
"""

from typing import TYPE_CHECKING

from sparse_mla.errors import (
    CacheError,
    ConfigurationError,
    JITDisabledError,
    KernelBuildError,
    KernelLaunchError,
    KernelLoadError,
    SparseMLAError,
    ToolchainError,
    UnsupportedGPUError,
)

__version__ = "0.1.0"  # the only place the version is written (pyproject.toml reads it from here)

__all__ = [
    "CacheError",
    "ConfigurationError",
    "JITDisabledError",
    "KernelBuildError",
    "KernelLaunchError",
    "KernelLoadError",
    "SparseMLAError",
    "ToolchainError",
    "UnsupportedGPUError",
    "sparse_mla_q8kv8_paged_prefill_fwd",
    "sparse_mla_q8kv8_prefill_fwd",
    "warmup",
]


if TYPE_CHECKING:
    # What a type checker sees: the lazy names with their real signatures.
    from sparse_mla.api import sparse_mla_q8kv8_paged_prefill_fwd, sparse_mla_q8kv8_prefill_fwd
    from sparse_mla.jit import warmup


def __getattr__(name: str) -> object:
    # The API module imports torch; load it on first use (PEP 562).
    if name in ("sparse_mla_q8kv8_prefill_fwd", "sparse_mla_q8kv8_paged_prefill_fwd"):
        from sparse_mla import api

        return getattr(api, name)
    if name == "warmup":
        from sparse_mla.jit import warmup

        return warmup
    raise AttributeError(f"module 'sparse_mla' has no attribute {name!r}")


def __dir__() -> list[str]:
    # The lazy names are listed before they are first looked up (PEP 562).
    return sorted(set(globals()) | set(__all__))
