"""The content-addressed kernel cache: in-process memo -> read-only lookup -> locked build -> publish.

Layout of one entry: ``<root>/sm90a/<name>/<digest16>/`` holding the generated source, the ``.so``,
``build.log`` and ``key.json`` (the key, the digest and its inputs, flags, toolchain, compile seconds,
and the sha256 of the ``.so``). ``key.json`` is written last and an entry is published by renaming a
finished staging directory, so a directory with a valid ``key.json`` is a complete entry, and a
``.so`` whose bytes no longer match the recorded sha256 is detected as corrupt and rebuilt.

Protocol:
1. memo: a dict per process, one lock per key, so concurrent threads build once;
2. lookup: every cache root in order, no lock, no subprocess; an intact entry is loaded;
3. miss: take an exclusive file lock next to the entry in the writable root (concurrent processes,
   e.g. 8 tensor-parallel ranks, queue here), look again, else build into a staging directory,
   load-check it, write key.json, and publish with an atomic rename.

A compile, and a wait for another process's compile, are announced on the ``sparse_mla`` logger
(:mod:`sparse_mla.jit.log`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import errno
import fcntl
import json
import os
import shutil
import socket
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

from sparse_mla.errors import CacheError, JITDisabledError, KernelBuildError, SparseMLAError
from sparse_mla.jit import env
from sparse_mla.jit.build import (
    BuildResult,
    BuildSpec,
    build_spec,
    compile_module,
    describe_failure,
    file_sha256,
)
from sparse_mla.jit.key import KEY_FUNCTION, KernelKey
from sparse_mla.jit.log import logger

KEY_FILE = "key.json"
_STAGING_PREFIX = ".staging-"


def _load_tvm_module(so_path: Path) -> Any:
    import tvm_ffi

    return tvm_ffi.load_module(str(so_path))


@dataclasses.dataclass
class EntryStatus:
    """What ``list`` reports of one directory in a cache root."""

    path: Path
    name: str
    state: str  # "ok", "stale" (built from other headers/toolchain), "corrupt"
    detail: str = ""
    compile_seconds: float | None = None


def read_entry(entry_dir: Path) -> dict | None:
    """key.json of an intact entry, or None when the entry is missing, incomplete or corrupt."""
    try:
        meta = json.loads((entry_dir / KEY_FILE).read_text())
        so_path = entry_dir / meta["so_file"]
        if file_sha256(so_path) != meta["so_sha256"]:
            return None
        return meta
    except (OSError, ValueError, KeyError, TypeError):
        return None


class KernelCache:
    """Finds, builds and loads kernel modules. ``builder`` and ``loader`` are replaceable for tests."""

    def __init__(
        self,
        builder: Callable[[BuildSpec, Path], BuildResult] = compile_module,
        loader: Callable[[Path], Any] = _load_tvm_module,
        spec_for: Callable[[KernelKey], BuildSpec] = build_spec,
    ) -> None:
        self._builder = builder
        self._loader = loader
        self._spec_for = spec_for
        self._modules: dict[KernelKey, Any] = {}
        self._key_locks: dict[KernelKey, threading.Lock] = {}
        self._guard = threading.Lock()

    # ---- the call path -------------------------------------------------------------------------

    def get(self, key: KernelKey) -> Any:
        """The loaded module of ``key``: from memory, a cache root, or a fresh build."""
        module = self._modules.get(key)
        if module is not None:
            return module
        with self._guard:
            lock = self._key_locks.setdefault(key, threading.Lock())
        with lock:
            module = self._modules.get(key)
            if module is None:
                module = self._find_or_build(key)
                self._modules[key] = module
        return module

    def _find_or_build(self, key: KernelKey) -> Any:
        spec = self._spec_for(key)
        for root in env.lookup_dirs():
            for entry_dir in self._candidates(spec, root):
                module = self._try_load(spec, entry_dir)
                if module is not None:
                    return module
        if env.jit_disabled():
            roots = ", ".join(str(r) for r in env.lookup_dirs())
            raise JITDisabledError(
                f"kernel {key.name} has no usable entry in the cache ({roots}) and SPARSE_MLA_DISABLE_JIT=1 forbids "
                f"compiling it; prebuild it with: {key.prebuild_command} --cache-dir <one of those roots>",
                key_name=key.name,
                prebuild_command=key.prebuild_command,
            )
        return self.build(spec, env.cache_dir())[2]

    @staticmethod
    def _candidates(spec: BuildSpec, root: Path) -> list[Path]:
        if spec.cuda_version is not None:
            return [spec.entry_dir(root)]
        # No CUDA toolkit on this host: accept an entry built from the same sources by any toolkit.
        matches = []
        for key_file in sorted((root / spec.key.arch / spec.key.name).glob(f"*/{KEY_FILE}")):
            with contextlib.suppress(OSError, ValueError):
                if json.loads(key_file.read_text()).get("source_digest") == spec.source_digest:
                    matches.append(key_file.parent)
        return matches

    def _load_checked(self, spec: BuildSpec, entry_dir: Path) -> Any:
        meta = read_entry(entry_dir)
        if meta is None:
            raise CacheError(f"cache entry {entry_dir} is incomplete or corrupt")
        try:
            module = self._loader(entry_dir / meta["so_file"])
            loaded_key = str(getattr(module, KEY_FUNCTION)())
        except Exception as error:  # a broken shared object surfaces as many exception types
            raise CacheError(f"cache entry {entry_dir} does not load: {error}") from error
        if loaded_key != spec.key.name:
            raise CacheError(f"cache entry {entry_dir} holds {loaded_key}, not {spec.key.name}")
        return module

    def _try_load(self, spec: BuildSpec, entry_dir: Path) -> Any:
        """The module of an intact, loadable entry; None (logged unless simply absent) otherwise."""
        if not entry_dir.exists():
            return None
        try:
            return self._load_checked(spec, entry_dir)
        except CacheError as error:
            logger.warning("sparse_mla: unusable cache entry %s (%s)", entry_dir, error)
            return None

    # ---- building (also the prebuild command) --------------------------------------------------

    def build(self, spec: BuildSpec, root: Path, advice: str | None = None) -> tuple[Path, float | None, Any]:
        """Make sure ``root`` holds a loadable entry for ``spec``. Returns (entry, compile seconds or
        None when another process or an earlier run had built it, the loaded module). ``advice`` ends
        the message of a CacheError (default: how to point the JIT at another directory)."""
        entry_dir = spec.entry_dir(root)
        if advice is None:
            advice = (
                f"set SPARSE_MLA_JIT_CACHE_DIR to a writable directory with a few MB free, or prebuild there "
                f"with: {spec.key.prebuild_command} --cache-dir DIR"
            )
        with _cache_errors(root, advice):
            entry_dir.parent.mkdir(parents=True, exist_ok=True)
            with _file_lock(entry_dir.parent / f".{entry_dir.name}.lock", spec.key.name):
                module = self._try_load(spec, entry_dir)
                if module is not None:
                    return entry_dir, None, module
                # Holding the lock, any staging directory of this entry belongs to a killed build.
                for leftover in entry_dir.parent.glob(f"{_STAGING_PREFIX}{entry_dir.name}-*"):
                    shutil.rmtree(leftover, ignore_errors=True)
                if entry_dir.exists():
                    logger.warning("sparse_mla: rebuilding unusable cache entry %s", entry_dir)
                    _remove(entry_dir)
                seconds = self._build_and_publish(spec, entry_dir)
        return entry_dir, seconds, self._load_checked(spec, entry_dir)

    def _build_and_publish(self, spec: BuildSpec, entry_dir: Path) -> float:
        staging = Path(tempfile.mkdtemp(prefix=f"{_STAGING_PREFIX}{entry_dir.name}-", dir=entry_dir.parent))
        try:
            logger.info(
                "sparse_mla: compiling %s (not in the cache yet; this takes a while, `%s` does it ahead "
                "of time) ...",
                spec.key.name,
                spec.key.prebuild_command,
            )
            start = time.perf_counter()
            try:
                result = self._builder(spec, staging)
            except (SparseMLAError, OSError):
                raise  # typed already, or a file-system failure that _cache_errors reports
            except Exception as error:  # tvm-ffi reports a failed compile as RuntimeError
                command, log = describe_failure(error, staging)
                log_path = entry_dir.parent / f"{entry_dir.name}.failed.log"
                log_path.write_text(f"$ {command}\n{log}\n")
                raise KernelBuildError(
                    f"compiling {spec.key.name} failed; command: {command}; full log: {log_path}",
                    key_name=spec.key.name,
                    command=command,
                    log_path=str(log_path),
                ) from error
            seconds = time.perf_counter() - start
            (staging / "build.log").write_text(f"$ {result.command}\n{result.log}\n")
            _keep_only(staging, {f"{spec.key.name}.cu", result.so_name, "build.log"})
            if env.verbose():
                logger.info("sparse_mla: %s\n%s", result.command, result.log)
            meta = {
                "key": dataclasses.asdict(spec.key) | {"name": spec.key.name},
                "digest": spec.digest,
                "source_digest": spec.source_digest,
                "inputs": spec.inputs,
                "cuda_version": spec.cuda_version,
                "toolchain": result.toolchain,
                "compile_seconds": round(seconds, 2),
                "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                "so_file": result.so_name,
                "so_sha256": file_sha256(staging / result.so_name),
            }
            # key.json last: its presence (with a matching sha256) is what makes an entry complete.
            (staging / KEY_FILE).write_text(json.dumps(meta, indent=2, sort_keys=True))
            os.rename(staging, entry_dir)  # atomic publish; the lock keeps entry_dir absent till now
            failed_log = entry_dir.parent / f"{entry_dir.name}.failed.log"
            if failed_log.exists():
                failed_log.unlink()  # an earlier failure of this entry is history now
            logger.info("sparse_mla: compiled %s in %.1f s -> %s", spec.key.name, seconds, entry_dir)
            return seconds
        finally:
            if staging.exists():
                _remove(staging)

    def prebuild(self, key: KernelKey, root: Path, advice: str | None = None) -> tuple[Path, float | None]:
        """Build ``key`` into ``root`` (loading it once proves the entry); for the prebuild command."""
        entry_dir, seconds, _ = self.build(self._spec_for(key), root, advice)
        return entry_dir, seconds


def _keep_only(build_dir: Path, names: set[str]) -> None:
    """Removes the compiler's by-products (object files, ninja files, tvm-ffi's lock) before publishing."""
    for path in build_dir.iterdir():
        if path.name in names:
            continue
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()


@contextlib.contextmanager
def _file_lock(path: Path, what: str):
    """An exclusive lock on ``path``, which names its holder while held; waiting for it is announced."""
    with open(path, "a+") as handle:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            logger.info("sparse_mla: waiting for the build of %s held by %s (lock %s) ...", what, holder, path)
            start = time.perf_counter()
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)  # released when the file closes, also on a crash
            logger.info("sparse_mla: waited %.1f s for the build of %s", time.perf_counter() - start, what)
        handle.truncate(0)
        handle.write(f"pid {os.getpid()} on {socket.gethostname()}")
        handle.flush()
        try:
            yield
        finally:
            handle.truncate(0)
            handle.flush()
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


@contextlib.contextmanager
def _cache_errors(root: Path, advice: str):
    """Turns file-system failures in a cache root into one actionable CacheError."""
    try:
        yield
    except OSError as error:
        if error.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            reason = "is not writable"
        elif error.errno in (errno.ENOSPC, errno.EDQUOT):
            reason = "is out of space"
        else:
            reason = f"cannot be used ({error.strerror or error})"
        raise CacheError(f"the kernel cache directory {root} {reason} ({error}); {advice}") from error


def _remove(path: Path) -> None:
    """Moves a directory aside before deleting it, so that no reader sees it half deleted."""
    trash = path.with_name(f".trash-{path.name}-{os.getpid()}-{threading.get_ident()}")
    os.rename(path, trash)
    shutil.rmtree(trash, ignore_errors=True)


def scan(root: Path) -> list[EntryStatus]:
    """Every entry under ``root`` with its state, for ``python -m sparse_mla list``."""
    statuses = []
    for entry_dir in sorted(root.glob("*/*/*")):
        if not entry_dir.is_dir() or entry_dir.name.startswith("."):
            continue
        meta = read_entry(entry_dir)
        if meta is None:
            statuses.append(EntryStatus(entry_dir, entry_dir.parent.name, "corrupt", "no intact key.json/.so"))
            continue
        key = KernelKey(**{k: meta["key"][k] for k in ("d_qk", "topk", "arch")})
        state, detail = "ok", ""
        try:
            current = build_spec(key)
            if current.source_digest != meta["source_digest"] or current.cuda_version not in (
                None,
                meta["cuda_version"],
            ):
                state = "stale"
        except SparseMLAError as error:
            detail = f"cannot check freshness: {error}"
        statuses.append(EntryStatus(entry_dir, key.name, state, detail, meta.get("compile_seconds")))
    return statuses
