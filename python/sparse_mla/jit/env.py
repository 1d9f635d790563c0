"""Environment: where the cache lives, which switches are set, where the toolchain and headers are.

Read when a kernel is looked up (a miss in the in-process memo), never with a subprocess: a cache hit
must not start one. The switches read on every call are ``SPARSE_MLA_BATCH_INVARIANT`` and ``SPARSE_MLA_TOKEN_GROUPS`` (dict lookups).
Each switch is checked where it is read: a value it does not accept raises
:class:`~sparse_mla.errors.ConfigurationError` naming the variable and the accepted values, and a kernel
lookup checks them all (:func:`check_switches`) before it loads or compiles anything. A set ``CUDA_HOME``
or ``CUDA_PATH`` that is not a toolkit is never replaced by another toolkit: a compile raises
:class:`~sparse_mla.errors.ToolchainError` naming it, and a lookup matches entries as on a host without a
toolkit.

| variable | meaning |
| --- | --- |
| ``SPARSE_MLA_JIT_CACHE_DIR`` | the writable cache root (default: ``jit_cache/`` in a source checkout, else ``~/.cache/sparse_mla``) |
| ``SPARSE_MLA_PREBUILT_DIRS`` | extra read-only cache roots searched after it, separated by ``os.pathsep`` |
| ``SPARSE_MLA_TRUSTED_DIRS`` | cache roots trusted although other users may write them (see :mod:`sparse_mla.jit.entry`) |
| ``SPARSE_MLA_DISABLE_JIT=1`` | a cache miss raises :class:`~sparse_mla.errors.JITDisabledError` instead of compiling |
| ``SPARSE_MLA_JIT_VERBOSE=1`` | log the compiler commands and their full output |
| ``SPARSE_MLA_BATCH_INVARIANT=1`` | every call runs in the batch-invariant mode (``batch_invariant=True``, see :mod:`sparse_mla.api`) unless it passes ``batch_invariant=False`` |
| ``SPARSE_MLA_TOKEN_GROUPS`` | ``auto`` (default), ``always`` or ``never``: whether calls with at most 32 heads run adjacent tokens together over the union of their selections (see :mod:`sparse_mla.launch`); ``always`` and ``never`` are for tests and benchmarks |
| ``SPARSE_MLA_LOG_LEVEL`` | level of the ``sparse_mla`` logger, read by :mod:`sparse_mla.jit.log` (default ``INFO``); an unknown level is reported on stderr and ignored, since a logging setting is no reason to stop a process |
| ``CUDA_HOME`` / ``CUDA_PATH`` | the CUDA toolkit to compile with (unset: ``/usr/local/cuda``, then ``nvcc`` on PATH) |

The flags (``DISABLE_JIT``, ``JIT_VERBOSE``, ``BATCH_INVARIANT``) accept ``1``, ``true``, ``yes``, ``on``
(set) and ``0``, ``false``, ``no``, ``off`` or empty (unset), in any case.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import importlib.util
import os
import re
import shutil
from pathlib import Path

from sparse_mla.errors import ConfigurationError, ToolchainError

_PACKAGE_DIR = Path(__file__).resolve().parent.parent


FLAG_ON = ("1", "true", "yes", "on")
FLAG_OFF = ("0", "false", "no", "off", "")


def _flag(name: str) -> bool:
    value = os.environ.get(name, "")
    word = value.strip().lower()
    if word in FLAG_ON:
        return True
    if word in FLAG_OFF:
        return False
    raise ConfigurationError(
        f"{name}={value!r} is neither on ({', '.join(FLAG_ON)}) nor off ({', '.join(FLAG_OFF[:-1])} or empty); "
        f"set one of those, or unset it"
    )


def jit_disabled() -> bool:
    return _flag("SPARSE_MLA_DISABLE_JIT")


def verbose() -> bool:
    return _flag("SPARSE_MLA_JIT_VERBOSE")


def batch_invariant() -> bool:
    """The default of ``batch_invariant`` for calls that do not pass it."""
    return _flag("SPARSE_MLA_BATCH_INVARIANT")


TOKEN_GROUP_MODES = ("auto", "always", "never")


def token_groups() -> str:
    """``SPARSE_MLA_TOKEN_GROUPS``: one of TOKEN_GROUP_MODES (default ``auto``)."""
    mode = os.environ.get("SPARSE_MLA_TOKEN_GROUPS", "auto").strip().lower() or "auto"
    if mode not in TOKEN_GROUP_MODES:
        raise ConfigurationError(
            f"SPARSE_MLA_TOKEN_GROUPS must be one of {', '.join(TOKEN_GROUP_MODES)}, got {mode!r} (unset: auto)"
        )
    return mode


def check_switches() -> None:
    """Reads every switch that changes what a call does, raising ConfigurationError at the first bad
    value: a lookup runs this before it loads or compiles, so that a misspelt switch fails the first
    call (or ``warmup``) at once rather than after a compile."""
    jit_disabled()
    verbose()
    batch_invariant()
    token_groups()


def source_checkout_root() -> Path | None:
    """The repository root when the package runs from a source checkout (``python/sparse_mla``)."""
    root = _PACKAGE_DIR.parent.parent
    if (root / "pyproject.toml").is_file() and (root / "include" / "sparse_mla").is_dir():
        return root
    return None


def _expanded(text: str) -> Path | None:
    """``text`` as a path with ``~`` expanded; None when it needs a home directory this process lacks
    (HOME unset and no passwd entry for its uid)."""
    try:
        return Path(text).expanduser()
    except RuntimeError:
        return None


def default_cache_dir() -> Path | None:
    """``jit_cache/`` in a source checkout, else ``$XDG_CACHE_HOME/sparse_mla`` or ``~/.cache/sparse_mla``;
    None when there is no home directory to put it in."""
    checkout = source_checkout_root()
    if checkout is not None:
        return checkout / "jit_cache"
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg else _expanded("~/.cache")
    return base / "sparse_mla" if base is not None else None


def cache_dir() -> Path | None:
    """The writable cache root; None when none is configured and there is no home directory."""
    configured = os.environ.get("SPARSE_MLA_JIT_CACHE_DIR")
    return _expanded(configured) if configured else default_cache_dir()


def _path_list(variable: str) -> list[Path]:
    entries = (_expanded(entry.strip()) for entry in os.environ.get(variable, "").split(os.pathsep) if entry.strip())
    return [path for path in entries if path is not None]


def prebuilt_dirs() -> list[Path]:
    """The read-only cache roots of ``SPARSE_MLA_PREBUILT_DIRS``, in order."""
    return _path_list("SPARSE_MLA_PREBUILT_DIRS")


def trusted_dirs() -> list[Path]:
    """The cache roots of ``SPARSE_MLA_TRUSTED_DIRS``: exempt from the ownership and permission rule."""
    return _path_list("SPARSE_MLA_TRUSTED_DIRS")


def lookup_dirs() -> list[Path]:
    """Cache roots searched for a built module, in order: the writable root, then the prebuilt roots."""
    writable = cache_dir()
    return list(dict.fromkeys([*([writable] if writable is not None else []), *prebuilt_dirs()]))


def include_dir() -> Path:
    """The directory holding ``sparse_mla/entry.cuh``: inside the installed package, or the checkout's."""
    for candidate in (_PACKAGE_DIR / "include", _PACKAGE_DIR.parent.parent / "include"):
        if (candidate / "sparse_mla" / "entry.cuh").is_file():
            return candidate
    raise ToolchainError(
        f"the sparse_mla kernel headers are missing (looked for sparse_mla/entry.cuh under "
        f"{_PACKAGE_DIR / 'include'}); reinstall the package"
    )


def header_files() -> list[Path]:
    """Every header that can change the compiled kernel, in a stable order."""
    root = include_dir() / "sparse_mla"
    return sorted(p for p in root.rglob("*") if p.is_file() and p.suffix in (".cuh", ".h", ".hpp"))


# A __global__ function's name, after an optional __launch_bounds__(...) whose arguments may hold one
# level of parentheses (a template argument list with a comma).
_GLOBAL_FUNCTION = re.compile(r"__global__\s+(?:void\s+)?(?:__launch_bounds__\s*\((?:[^()]|\([^()]*\))*\)\s*)?"
                              r"(?:void\s+)?(\w+)\s*\(")


def header_kernels() -> list[str]:
    """The names of the kernels (__global__ functions) the headers define: what the sanitizer tests'
    kernel-name filter must cover."""
    return [name for path in header_files() for name in _GLOBAL_FUNCTION.findall(path.read_text())]


@dataclasses.dataclass(frozen=True)
class Cutlass:
    version: str
    include_dirs: tuple[str, ...]


def cutlass() -> Cutlass:
    """CUTLASS/CuTe headers from the ``nvidia-cutlass`` wheel, found without importing it."""
    spec = importlib.util.find_spec("cutlass_library")
    locations = list(spec.submodule_search_locations or []) if spec else []
    for location in locations:
        include = Path(location) / "source" / "include"
        if (include / "cute" / "tensor.hpp").is_file():
            try:
                version = importlib.metadata.version("nvidia-cutlass")
            except importlib.metadata.PackageNotFoundError:
                version = _cutlass_header_version(include)
            util = Path(location) / "source" / "tools" / "util" / "include"
            dirs = (str(include),) + ((str(util),) if util.is_dir() else ())
            return Cutlass(version=version, include_dirs=dirs)
    raise ToolchainError(
        "the CUTLASS/CuTe headers are missing: `pip install nvidia-cutlass` "
        "(sparse_mla looks for cutlass_library/source/include/cute/tensor.hpp)"
    )


def _cutlass_header_version(include: Path) -> str:
    text = (include / "cutlass" / "version.h").read_text()
    parts = [re.search(rf"#define CUTLASS_{p}\s+(\d+)", text) for p in ("MAJOR", "MINOR", "PATCH")]
    return ".".join(m.group(1) if m else "?" for m in parts)


DEFAULT_CUDA_HOME = "/usr/local/cuda"


def _is_toolkit(path: Path) -> bool:
    return (path / "bin" / "nvcc").is_file() and (path / "include" / "cuda.h").is_file()


def cuda_home() -> Path | None:
    """The CUDA toolkit: CUDA_HOME (else CUDA_PATH) when set, else /usr/local/cuda or where the real
    ``nvcc`` on PATH lives; None when there is none.

    A toolkit holds both ``bin/nvcc`` and ``include/cuda.h`` (``nvcc`` on PATH may be a wrapper script,
    ``/usr/local/bin/nvcc`` on some hosts). A variable that is set names the toolkit the user chose: when
    it holds none, that is a ToolchainError, not a reason to compile with another toolkit.
    """
    for variable in ("CUDA_HOME", "CUDA_PATH"):
        chosen = os.environ.get(variable, "").strip()
        if chosen:
            if _is_toolkit(Path(chosen)):
                return Path(chosen)
            raise ToolchainError(
                f"{variable}={chosen} is not a CUDA toolkit (it needs bin/nvcc and include/cuda.h): point it at "
                f"one (e.g. /usr/local/cuda-13.0), or unset it to use {DEFAULT_CUDA_HOME} or the nvcc on PATH; "
                f"a host that only loads prebuilt kernels needs no toolkit"
            )
    candidates = [Path(DEFAULT_CUDA_HOME)]
    nvcc = shutil.which("nvcc")
    if nvcc:
        candidates.append(Path(nvcc).resolve().parent.parent)
    return next((candidate for candidate in candidates if _is_toolkit(candidate)), None)


def lookup_cuda_home() -> Path | None:
    """The toolkit whose CUDA version cache entries must match: ``cuda_home()``, or None where CUDA_HOME
    or CUDA_PATH holds no toolkit. A node that only loads prebuilt kernels needs no toolkit, so a stale
    variable there must not stop it; a compile asks ``cuda_home()``, which reports the variable."""
    try:
        return cuda_home()
    except ToolchainError:
        return None


def cuda_version(home: Path | None) -> str | None:
    """``CUDA_VERSION`` from the toolkit's cuda.h (e.g. ``13000``): a version read with no subprocess."""
    if home is None:
        return None
    match = re.search(r"#define CUDA_VERSION\s+(\d+)", (home / "include" / "cuda.h").read_text())
    return match.group(1) if match else None


def driver_cuda_version() -> str | None:
    """The newest CUDA version the installed driver runs (``13000`` for 13.0), read from libcuda
    without initializing CUDA; None without a driver."""
    import ctypes

    try:
        libcuda = ctypes.CDLL("libcuda.so.1")
        version = ctypes.c_int()
        if libcuda.cuDriverGetVersion(ctypes.byref(version)) != 0:
            return None
    except (OSError, AttributeError):
        return None
    return str(version.value)


def tvm_ffi_version() -> str:
    try:
        return importlib.metadata.version("apache-tvm-ffi")
    except importlib.metadata.PackageNotFoundError as error:
        raise ToolchainError("apache-tvm-ffi is not installed: `pip install apache-tvm-ffi`") from error
