"""The content-addressed kernel cache: in-process memo -> read-only lookup -> locked build -> publish.

An entry (layout, integrity and trust rules: :mod:`sparse_mla.jit.store`) is published by renaming a
finished staging folder whose ``key.json`` is written last, so a folder with a valid ``key.json`` is a
complete entry, and a module whose bytes no longer match the recorded sha256 is detected and rebuilt.

Protocol:
1. memo: a dict per process, one lock per key, so concurrent threads build once;
2. lookup: every cache root in order (the writable root, then ``SPARSE_MLA_PREBUILT_DIRS``), no lock,
   no subprocess; the first intact, trusted entry is loaded. Other entries are logged and skipped;
3. miss: in the writable root, take the entry's file lock (concurrent processes, e.g. the 8 ranks of
   a tensor-parallel server, queue here), look again, else build into a staging folder, keep the
   published files only, write key.json and publish with a rename. Where a lock did not exclude (some
   network file systems), a rename onto an entry another process published meanwhile is no error: that
   entry is checked and loaded.

An intact entry whose module fails to load (a host without a library the module links) raises
:class:`~sparse_mla.errors.KernelLoadError`: rebuilding would not help, so the entry stays.

A compile, and a wait for another process's compile, are announced on the ``sparse_mla`` logger
(:mod:`sparse_mla.jit.log`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import errno
import json
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path
from collections.abc import Callable, Iterator
from typing import Any

from sparse_mla.errors import (
    CacheError,
    JITDisabledError,
    KernelBuildError,
    KernelLaunchError,
    KernelLoadError,
    SparseMLAError,
)
from sparse_mla.jit import env, interrupt, store
from sparse_mla.jit.build import (
    BuildResult,
    BuildSpec,
    build_spec,
    compile_module,
    describe_failure,
    file_sha256,
)
from sparse_mla.jit.key import KEY_FUNCTION, LAUNCH_ERROR_KIND, KernelKey
from sparse_mla.jit.log import logger


def load_tvm_module(so_path: Path) -> Any:
    """The tvm-ffi module at ``so_path``, its refused launches raising KernelLaunchError."""
    import tvm_ffi

    tvm_ffi.register_error(LAUNCH_ERROR_KIND, KernelLaunchError)
    return tvm_ffi.load_module(str(so_path))


class KernelCache:
    """Finds, builds and loads kernel modules. ``builder``, ``loader`` and ``spec_for`` are replaceable
    for tests."""

    def __init__(
        self,
        builder: Callable[[BuildSpec, Path], BuildResult] = compile_module,
        loader: Callable[[Path], Any] = load_tvm_module,
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
        env.check_switches()
        spec = self._spec_for(key)
        for root in env.lookup_dirs():
            for entry_dir in store.candidates(spec, root):
                found = store.inspect(spec, root, entry_dir)
                if found.state == "ok":
                    module = self._load(spec, root, entry_dir, found)
                    if module is not None:
                        return module
                elif found.state != "absent":
                    logger.warning("sparse_mla: not loading cache entry %s: %s (%s)", entry_dir, found.state, found.reason)
        stale = [sentence for root in env.lookup_dirs() for sentence in store.near_misses(spec, root)]
        if env.jit_disabled():
            roots = ", ".join(str(r) for r in env.lookup_dirs())
            raise JITDisabledError(
                f"kernel {key.name} has no usable entry in the cache ({roots}) and SPARSE_MLA_DISABLE_JIT=1 forbids "
                f"compiling it; prebuild it with: {key.prebuild_command} --cache-dir <one of those roots>"
                + (f". The cache holds only other builds of it: {'; '.join(stale)}" if stale else ""),
                key_name=key.name,
                prebuild_command=key.prebuild_command,
            )
        writable = env.cache_dir()
        if writable is None:
            raise CacheError(
                f"kernel {key.name} is in no cache root and there is no writable one to compile it into: the "
                "default lives in the home directory, which this process has none of (HOME is unset and its uid "
                "has no passwd entry); set SPARSE_MLA_JIT_CACHE_DIR to a writable directory"
            )
        return self.build(spec, writable, stale=stale)[2]

    def _load(self, spec: BuildSpec, root: Path, entry_dir: Path, found: store.Inspection) -> Any:
        """The module of an intact entry; None (logged) when it holds another kernel, or changed while
        it was being loaded. Raises KernelLoadError when an entry that is still intact does not load."""
        so_path = entry_dir / found.key_json["so_file"]
        try:
            module = self._loader(so_path)
            loaded_key = str(getattr(module, KEY_FUNCTION)())
        except Exception as error:  # a broken shared object surfaces as many exception types
            again = store.inspect(spec, root, entry_dir)
            if again.state != "ok":
                logger.warning("sparse_mla: cache entry %s changed while loading: %s (%s)", entry_dir, again.state, again.reason)
                return None
            raise KernelLoadError(
                f"cache entry {entry_dir} is intact (its key and checksum match) but its module does not load on "
                f"this host: {error}. Rebuilding would not help; check that the libraries it links (the CUDA "
                "runtime, tvm-ffi) are installed",
                path=str(so_path),
                reason=str(error),
            ) from error
        if loaded_key != spec.key.name:
            logger.warning("sparse_mla: cache entry %s holds %s, not %s", entry_dir, loaded_key, spec.key.name)
            return None
        return module

    # ---- building (also the prebuild command) --------------------------------------------------

    def build(
        self, spec: BuildSpec, root: Path, advice: str | None = None, *, stale: list[str] | None = None, ahead_of_time: bool = False
    ) -> tuple[Path, float | None, Any]:
        """Make sure ``root`` holds a loadable entry for ``spec``. Returns (entry, compile seconds or
        None when another process or an earlier run had built it, the loaded module). ``advice`` ends
        the message of a CacheError (default: how to point the JIT at another directory). ``stale``: what
        :func:`~sparse_mla.jit.store.near_misses` says of the entries of the kernel in the roots looked
        at (default: those in ``root``), for the compile's log line, which tells how to compile ahead of
        time unless this build is already (``ahead_of_time``)."""
        entry_dir = spec.entry_dir(root)
        if advice is None:
            advice = (
                f"set SPARSE_MLA_JIT_CACHE_DIR to a writable directory with a few MB free, or prebuild there "
                f"with: {spec.key.prebuild_command} --cache-dir DIR"
            )
        with _cache_errors(root, advice):
            store.make_dirs(root, entry_dir.parent)
            problem = store.trust_problem(root, entry_dir.parent)
            if problem:
                raise CacheError(
                    f"the kernel cache directory {root} is not trusted: {problem}, and sparse_mla loads no module "
                    "that another user could have written. Make it writable by its owner only, or list it in "
                    f"SPARSE_MLA_TRUSTED_DIRS if everyone who can write it is trusted; or {advice}"
                )
            with store.entry_lock(entry_dir, spec.key.name):
                found = store.inspect(spec, root, entry_dir)
                if found.state == "ok":
                    module = self._load(spec, root, entry_dir, found)
                    if module is not None:
                        return entry_dir, None, module
                    found = store.Inspection("corrupt", "its module holds another kernel", owner=found.owner)
                if found.state in ("unreadable", "untrusted") or found.owner not in (None, os.getuid()):
                    raise CacheError(
                        f"cache entry {entry_dir} is {found.state} ({found.reason or 'it belongs to another user'}), "
                        f"and sparse_mla never replaces an entry that is not this user's; {advice}"
                    )
                store.reap_leftovers(entry_dir.parent, entry_dir.name)
                if found.state == "corrupt":
                    logger.warning("sparse_mla: rebuilding unusable cache entry %s (%s)", entry_dir, found.reason)
                    store.remove(entry_dir)
                if stale is None:
                    stale = store.near_misses(spec, root)
                seconds = self._build_and_publish(spec, entry_dir, _compile_line(spec, stale, ahead_of_time))
            found = store.inspect(spec, root, entry_dir)
            module = self._load(spec, root, entry_dir, found) if found.state == "ok" else None
        if module is None:
            raise CacheError(f"cache entry {entry_dir} is not usable right after it was built: {found.state} ({found.reason})")
        return entry_dir, seconds, module

    def _build_and_publish(self, spec: BuildSpec, entry_dir: Path, announcement: str) -> float | None:
        """Compiles ``spec`` (logging ``announcement`` first) and publishes it at ``entry_dir``; returns the
        compile seconds, or None when another process published the entry meanwhile. An interrupted build
        (KeyboardInterrupt) leaves nothing: no entry, and no failure log, since the compiler did not fail."""
        interrupt.raise_if_stopped(spec.key.name)
        staging = Path(
            tempfile.mkdtemp(prefix=f"{store.STAGING}{entry_dir.name}-{store.owner_tag()}-", dir=entry_dir.parent)
        )
        failed_log = entry_dir.parent / f"{entry_dir.name}.failed.log"
        try:
            logger.info("%s", announcement)
            start = time.perf_counter()
            try:
                result = self._builder(spec, staging)
            except (SparseMLAError, OSError):
                raise  # typed already, or a file-system failure that _cache_errors reports
            except Exception as error:  # tvm-ffi reports a failed compile as RuntimeError
                command, log = describe_failure(error, staging)
                (staging / failed_log.name).write_text(f"$ {command}\n{log}\n")
                os.replace(staging / failed_log.name, failed_log)  # replaces a link there, never writes through it
                raise KernelBuildError(
                    f"compiling {spec.key.name} failed; command: {command}; full log: {failed_log}",
                    key_name=spec.key.name,
                    command=command,
                    log_path=str(failed_log),
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
            (staging / store.KEY_FILE).write_text(json.dumps(meta, indent=2, sort_keys=True))
            store.set_published_modes(staging)
            try:
                os.rename(staging, entry_dir)  # atomic publish
            except OSError as error:
                if error.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                    raise
                logger.info("sparse_mla: %s was published meanwhile by a process the lock did not hold back; using it", entry_dir)
                return None
            with contextlib.suppress(FileNotFoundError):
                failed_log.unlink()  # an earlier failure of this entry is history now
            logger.info("sparse_mla: compiled %s in %.1f s -> %s", spec.key.name, seconds, entry_dir)
            return seconds
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def prebuild(self, key: KernelKey, root: Path, advice: str | None = None) -> tuple[Path, float | None]:
        """Build ``key`` into ``root`` (loading it once proves the entry); for the prebuild command."""
        entry_dir, seconds, _ = self.build(self._spec_for(key), root, advice, ahead_of_time=True)
        return entry_dir, seconds


def _compile_line(spec: BuildSpec, stale: list[str], ahead_of_time: bool) -> str:
    """The log line that announces a compile: why it is needed, and (on first use) how to avoid it."""
    why = f"the cache holds only other builds of it: {'; '.join(stale)}" if stale else "not in the cache yet"
    if ahead_of_time:
        return f"sparse_mla: compiling {spec.key.name} ({why}) ..."
    return (
        f"sparse_mla: compiling {spec.key.name} ({why}; this takes a while, `{spec.key.prebuild_command}` does it "
        "ahead of time) ..."
    )


def _keep_only(build_dir: Path, names: set[str]) -> None:
    """Removes the compiler's by-products (the object file, ninja's files) before publishing."""
    for path in build_dir.iterdir():
        if path.name in names:
            continue
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()


@contextlib.contextmanager
def _cache_errors(root: Path, advice: str) -> Iterator[None]:
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
