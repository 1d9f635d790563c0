"""Typed exceptions of sparse_mla.

Bad arguments raise the built-in ``ValueError`` / ``TypeError``; so does a ``SPARSE_MLA_*`` environment
switch with a value it does not accept (:class:`ConfigurationError`, a ``ValueError`` too). Everything that goes wrong
around the kernel itself raises a subclass of :class:`SparseMLAError`, so that serving code can catch
the library's failures in one place and tell them apart by type.
"""

from __future__ import annotations


class SparseMLAError(RuntimeError):
    """Base class of the errors sparse_mla raises for reasons other than a bad argument."""


class ConfigurationError(SparseMLAError, ValueError):
    """A ``SPARSE_MLA_*`` environment switch holds a value it does not accept; the message names the
    variable, its value and the values it accepts."""


class UnsupportedGPUError(SparseMLAError):
    """The tensors sit on a GPU the kernels were not written for (sparse_mla needs SM90, Hopper)."""


class ToolchainError(SparseMLAError):
    """A JIT compile was needed but a build tool or header set is missing (nvcc, CUTLASS, ninja)."""


class CacheError(SparseMLAError):
    """The kernel cache directory cannot be used (not writable, disk full, ...)."""


class JITDisabledError(SparseMLAError):
    """``SPARSE_MLA_DISABLE_JIT=1`` is set and the kernel needed is not in any cache directory."""

    def __init__(self, message: str, *, key_name: str, prebuild_command: str) -> None:
        super().__init__(message)
        self.key_name = key_name
        self.prebuild_command = prebuild_command


class KernelBuildError(SparseMLAError):
    """The compiler failed. Carries the kernel key, the command that failed and the full log's path."""

    def __init__(self, message: str, *, key_name: str, command: str, log_path: str) -> None:
        super().__init__(message)
        self.key_name = key_name
        self.command = command
        self.log_path = log_path


class KernelLoadError(SparseMLAError):
    """A cache entry is intact (its key and checksum match) but its module does not load on this host,
    e.g. for want of a library it links. Rebuilding would not help, so the entry is kept. Carries the
    module's path and the loader's message."""

    def __init__(self, message: str, *, path: str, reason: str) -> None:
        super().__init__(message)
        self.path = path
        self.reason = reason


class KernelLaunchError(SparseMLAError):
    """The CUDA runtime refused to launch a kernel of a call whose arguments were valid (a context broken
    by an earlier fault, an out-of-resources launch, ...): the outputs were not written."""
