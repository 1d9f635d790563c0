"""The cache on disk: what makes an entry intact and trusted, locks, publishing, listing and cleaning.

Layout of a root: ``<root>/<arch>/<name>/<digest16>/`` is an entry, holding ``<name>.cu``, the module
(``so_file``), ``build.log`` and ``key.json``. Beside the entries of a key: ``.<digest16>.lock`` (the file
lock of a build, naming its holder while held), ``<digest16>.failed.log`` (the last failed build) and,
while a build runs, ``.staging-<digest16>-<pid>@<host>-<random>``. A root the library has built into
holds a ``CACHEDIR.TAG``; ``clean`` touches no other root.

Integrity: an entry is intact when key.json parses, its fields have their types, its key and digest
agree with the folders it sits in (and with what the caller expects), its ``so_file`` is a plain file
name inside the entry, and that file's sha256 is the recorded one. A damaged entry is rebuilt.

Trust: a checksum proves integrity, not origin. Whoever can write a cache root can plant a module whose
checksum matches, and loading a module runs its code. So an entry is loaded only when the root and
everything below it on the way to the module (the arch, key and entry folders, key.json, the module)
belong to this user or to root and are writable by no other user, and nothing below the root is a
symbolic link. ``SPARSE_MLA_TRUSTED_DIRS`` lists roots exempt from this rule (a cache shared by a group
of users); integrity is checked in every root. An entry that is untrusted or unreadable is reported,
never loaded, and never removed; nor is an entry of another user.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import grp
import json
import os
import pwd
import re
import secrets
import shutil
import socket
import stat
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

from sparse_mla.errors import SparseMLAError
from sparse_mla.jit import env
from sparse_mla.jit.build import BuildSpec, file_sha256
from sparse_mla.jit.key import SUPPORTED_ARCHS, KernelKey
from sparse_mla.jit.log import logger

KEY_FILE = "key.json"
TAG_FILE = "CACHEDIR.TAG"
# The signature line of the Cache Directory Tagging Specification (backup tools skip such folders).
TAG_SIGNATURE = "Signature: 8a477f597d28d172789f06886806bc55"
STAGING = ".staging-"
TRASH = ".trash-"
# A build never takes an hour: a staging folder untouched that long belongs to no live build.
STALE_SECONDS = 3600


@dataclasses.dataclass(frozen=True)
class Inspection:
    """What is found at an entry's path."""

    state: str  # "absent", "ok", "corrupt", "unreadable" or "untrusted"
    reason: str = ""
    meta: dict[str, Any] | None = None  # key.json of an intact entry
    owner: int | None = None  # uid of the entry folder, when there is one

    @property
    def key_json(self) -> dict[str, Any]:
        """key.json of an intact entry (state "ok")."""
        if self.meta is None:
            raise ValueError(f"an entry that is {self.state} has no key.json to read")
        return self.meta


# ---- trust ------------------------------------------------------------------------------------------


def _group_is_private(gid: int) -> bool:
    """Whether group ``gid`` is this user's own (a user private group: its name, no other member)."""
    try:
        group, user = grp.getgrgid(gid), pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return False
    return gid == os.getgid() and group.gr_name == user and set(group.gr_mem) <= {user}


def _trusted_root(root: Path) -> bool:
    resolved = root.resolve()
    return any(resolved == trusted.resolve() for trusted in env.trusted_dirs())


def trust_problem(root: Path, path: Path) -> str | None:
    """Why ``path`` (``root`` or a folder or file below it) must not be loaded from, or None.
    Raises OSError when a component cannot be examined."""
    if _trusted_root(root):
        return None
    parts = path.relative_to(root).parts
    components = [root, *(root.joinpath(*parts[: i + 1]) for i in range(len(parts)))]
    for index, component in enumerate(components):
        status = os.stat(component) if index == 0 else os.lstat(component)  # the root itself may be a link
        if stat.S_ISLNK(status.st_mode):
            return f"{component} is a symbolic link"
        if status.st_uid not in (os.getuid(), 0):
            return f"{component} belongs to another user (uid {status.st_uid})"
        mode = stat.S_IMODE(status.st_mode)
        if mode & 0o002 or (mode & 0o020 and not _group_is_private(status.st_gid)):
            return f"{component} is writable by other users (mode {mode:o})"
    return None


# ---- reading an entry -------------------------------------------------------------------------------

_FIELDS = {"key": dict, "digest": str, "source_digest": str, "so_file": str, "so_sha256": str}


def _field_problem(meta: Any) -> str | None:
    if not isinstance(meta, dict):
        return "key.json does not hold an object"
    for name, kind in _FIELDS.items():
        if not isinstance(meta.get(name), kind):
            return f"key.json's {name!r} is missing or not a {kind.__name__}"
    if not isinstance(meta.get("cuda_version"), (str, type(None))):
        return "key.json's 'cuda_version' is not a string"
    seconds = meta.get("compile_seconds")
    if seconds is not None and (isinstance(seconds, bool) or not isinstance(seconds, (int, float))):
        return "key.json's 'compile_seconds' is not a number"
    so_file = meta["so_file"]
    if so_file in ("", ".", "..") or Path(so_file).name != so_file:
        return f"key.json's so_file {so_file!r} is not a file name inside the entry"
    try:
        key = KernelKey(**{name: meta["key"].get(name) for name in ("d_qk", "topk", "arch")})
    except (TypeError, ValueError) as error:
        return f"key.json's key is not a kernel key ({error})"
    if meta["key"].get("name") != key.name:
        return f"key.json's key name {meta['key'].get('name')!r} is not {key.name}"
    return None


def read_intact(root: Path, entry_dir: Path) -> Inspection:
    """Inspects ``entry_dir`` (``<root>/<arch>/<name>/<digest16>``): trust, then integrity."""
    try:
        owner = os.lstat(entry_dir).st_uid
    except (FileNotFoundError, NotADirectoryError):
        return Inspection("absent")
    except PermissionError as error:
        return Inspection("unreadable", str(error))
    try:
        problem = trust_problem(root, entry_dir / KEY_FILE)  # FileNotFoundError when key.json is missing
        if problem:
            return Inspection("untrusted", problem, owner=owner)
        meta = json.loads((entry_dir / KEY_FILE).read_text())
    except PermissionError as error:
        return Inspection("unreadable", str(error), owner=owner)
    except FileNotFoundError:
        return Inspection("corrupt", "no key.json: an incomplete entry", owner=owner)
    except (OSError, ValueError) as error:
        return Inspection("corrupt", f"key.json does not parse ({error})", owner=owner)
    problem = _field_problem(meta)
    if problem is None and (entry_dir.parent.name != meta["key"]["name"] or entry_dir.name != meta["digest"][:16]):
        problem = f"key.json describes {meta['key']['name']}/{meta['digest'][:16]}, not the folder it is in"
    if problem:
        return Inspection("corrupt", problem, owner=owner)
    so_path = entry_dir / meta["so_file"]
    try:
        problem = trust_problem(root, so_path)
        if problem:
            return Inspection("untrusted", problem, owner=owner)
        if file_sha256(so_path) != meta["so_sha256"]:
            return Inspection("corrupt", f"{meta['so_file']} does not match its checksum", owner=owner)
    except PermissionError as error:
        return Inspection("unreadable", str(error), owner=owner)
    except FileNotFoundError:
        return Inspection("corrupt", f"{meta['so_file']} is missing", owner=owner)
    return Inspection("ok", meta=meta, owner=owner)


def expected_digest(spec: BuildSpec, meta: dict[str, Any]) -> str:
    """The digest an entry of ``spec`` has; on a host without a CUDA toolkit, the one of the
    toolkit the entry records."""
    if spec.cuda_version is not None:
        return spec.digest
    return dataclasses.replace(spec, cuda_version=meta.get("cuda_version")).digest


def inspect(spec: BuildSpec, root: Path, entry_dir: Path) -> Inspection:
    """``read_intact``, and the entry holds ``spec``'s key and digest."""
    found = read_intact(root, entry_dir)
    if found.state != "ok":
        return found
    meta = found.key_json
    if meta["key"]["name"] != spec.key.name or meta["digest"] != expected_digest(spec, meta):
        return Inspection("corrupt", f"key.json holds {meta['key']['name']} with digest {meta['digest'][:16]}, "
                          f"not {spec.key.name} with digest {expected_digest(spec, meta)[:16]}", owner=found.owner)
    return found


# ---- why an entry of the same kernel does not fit ---------------------------------------------------

def cuda_release(version: object) -> str:
    """cuda.h's ``CUDA_VERSION`` (``13000``) as a release (``13.0``)."""
    try:
        number = int(str(version))
    except ValueError:
        return f"{version} (not a CUDA version)" if version is not None else "(not recorded)"
    return f"{number // 1000}.{number % 1000 // 10}"


@dataclasses.dataclass(frozen=True)
class Difference:
    """One build input in which an entry differs from what this host would build. For the sources,
    ``built`` is a phrase ("from other kernel sources (...)") and ``here`` is empty; for the others both
    are what they name with its value ("CUDA 13.0", "CUDA 12.9")."""

    field: str  # sources, CUDA toolkit, nvidia-cutlass, apache-tvm-ffi, arch, flags, or another input
    built: str
    here: str


def _as_list(value: object) -> list[str]:
    return [str(item) for item in value] if isinstance(value, list) else []


def _headers_phrase(built: object, here: dict[str, str]) -> str:
    recorded = built if isinstance(built, dict) else {}
    names = sorted(name for name in recorded.keys() | here.keys() if recorded.get(name) != here.get(name))
    shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    return f"{len(names)} header{' differs' if len(names) == 1 else 's differ'}: {shown}"


def _flags_phrase(flags: list[str], others: list[str]) -> str:
    own = [flag for flag in flags if flag not in others]
    return f"flags {' '.join(own)}" if own else "fewer flags"


# Inputs of the digest (BuildSpec.inputs) that differences() phrases itself.
_SOURCES, _FLAGS = ("headers", "source_sha256"), ("flags", "link_flags")
_VERSIONS = {"cutlass": "nvidia-cutlass", "tvm_ffi": "apache-tvm-ffi", "arch": "arch"}


def differences(spec: BuildSpec, meta: dict[str, Any]) -> list[Difference]:
    """What makes an intact entry of ``spec``'s kernel another build than ``spec``'s; empty when it is
    ``spec``'s. On a host without a CUDA toolkit, an entry of any toolkit its driver runs is
    (see :func:`candidates`)."""
    toolkit = _toolkit_difference(spec, meta.get("cuda_version"))
    if meta["source_digest"] == spec.source_digest:
        return toolkit
    found = []
    built = meta["inputs"] if isinstance(meta.get("inputs"), dict) else {}
    changed = sorted(name for name in built.keys() | spec.inputs.keys() if built.get(name) != spec.inputs.get(name))
    sources = [_headers_phrase(built.get("headers"), spec.inputs.get("headers", {}))] if "headers" in changed else []
    sources += ["another generated source"] if "source_sha256" in changed else []
    if sources:
        found.append(Difference("sources", f"from other kernel sources ({'; '.join(sources)})", ""))
    for name in changed:
        if name not in _SOURCES + _FLAGS:
            label = _VERSIONS.get(name, name)
            found.append(Difference(label, f"{label} {built.get(name, '(not recorded)')}", f"{label} {spec.inputs.get(name)}"))
    if any(name in _FLAGS for name in changed):
        entry_flags = [*_as_list(built.get("flags")), *_as_list(built.get("link_flags"))]
        host_flags = [*_as_list(spec.inputs.get("flags")), *_as_list(spec.inputs.get("link_flags"))]
        found.append(Difference("flags", _flags_phrase(entry_flags, host_flags), _flags_phrase(host_flags, entry_flags)))
    if not found:  # the recorded inputs are this host's, so they are not what the entry's digest was made of
        found.append(Difference("inputs", "from inputs other than its key.json records", ""))
    return toolkit + found


def _toolkit_difference(spec: BuildSpec, entry_cuda: object) -> list[Difference]:
    built = f"CUDA {cuda_release(entry_cuda)}"
    if spec.cuda_version is not None:
        return [] if entry_cuda == spec.cuda_version else [Difference("CUDA toolkit", built, f"CUDA {cuda_release(spec.cuda_version)}")]
    driver = env.driver_cuda_version()
    with contextlib.suppress(TypeError, ValueError):
        if driver is not None and int(str(entry_cuda)) > int(driver):
            return [Difference("CUDA toolkit", built, f"a driver that runs CUDA {cuda_release(driver)} at most")]
    return []


def describe(entry_dir: Path, found: list[Difference]) -> str:
    """One sentence, e.g. ``entry 84c5d2e1a0b3f4c6 was built with CUDA 13.0 and nvidia-cutlass 4.2.0.0;
    this host has CUDA 12.9 and nvidia-cutlass 4.3.0``."""
    origins = [d.built for d in found if not d.here]
    versions = [d for d in found if d.here]
    parts = origins + (["with " + " and ".join(d.built for d in versions)] if versions else [])
    sentence = f"entry {entry_dir.name} was built " + " and ".join(parts)
    return sentence + (f"; this host has {' and '.join(d.here for d in versions)}" if versions else "")


def near_misses(spec: BuildSpec, root: Path) -> list[str]:
    """A sentence for each intact entry of ``spec``'s kernel in ``root`` that is not ``spec``'s build,
    saying what differs: why a lookup found nothing although the kernel is there."""
    sentences = []
    for entry_dir in _real_subdirs(root / spec.key.arch / spec.key.name):
        if not re.fullmatch(r"[0-9a-f]{16}", entry_dir.name):
            continue
        found = read_intact(root, entry_dir)
        if found.state == "ok" and found.key_json["key"]["name"] == spec.key.name:
            different = differences(spec, found.key_json)
            if different:
                sentences.append(f"{describe(entry_dir, different)} (in {root})")
    return sentences


def candidates(spec: BuildSpec, root: Path) -> list[Path]:
    """The entry folders of ``spec`` in ``root``, best first. With a CUDA toolkit there is one: its digest
    covers the toolkit's version. Without one, entries built from the same sources by any toolkit,
    newest first among those the driver runs (all of them, newest first, when there is no driver)."""
    if spec.cuda_version is not None:
        return [spec.entry_dir(root)]
    driver = env.driver_cuda_version()
    found = []
    for key_file in (root / spec.key.arch / spec.key.name).glob(f"*/{KEY_FILE}"):
        with contextlib.suppress(OSError, ValueError, TypeError, AttributeError):
            meta = json.loads(key_file.read_text())
            version = int(meta["cuda_version"])
            if meta["source_digest"] == spec.source_digest and (driver is None or version <= int(driver)):
                found.append((version, key_file.parent))
    return [entry_dir for _, entry_dir in sorted(found, reverse=True)]


# ---- writing ----------------------------------------------------------------------------------------


def _umask() -> int:
    with open("/proc/self/status") as status:  # reading it, unlike os.umask, changes nothing
        for line in status:
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    raise OSError(errno.ENOENT, "no Umask line in /proc/self/status")


def make_dirs(root: Path, key_dir: Path) -> None:
    """Creates ``key_dir`` and the folders above it that are missing, the root and those below it
    writable by their owner only, and tags ``root`` as a sparse_mla cache."""
    os.makedirs(root, mode=0o755, exist_ok=True)
    for path in reversed([path for path in (key_dir, *key_dir.parents) if root in path.parents]):
        with contextlib.suppress(FileExistsError):
            os.mkdir(path, 0o755)
    tag = root / TAG_FILE
    if not tag.exists():
        temporary = root / f".{TAG_FILE}-{owner_tag()}-{secrets.token_hex(4)}"
        temporary.write_text(
            f"{TAG_SIGNATURE}\n# This file is a cache directory tag created by sparse_mla: `python -m sparse_mla clean`\n"
            "# removes the kernels it built here, and backup tools that follow the tag skip this folder.\n"
        )
        os.replace(temporary, tag)


def set_published_modes(entry_dir: Path) -> None:
    """Readable as the umask allows, writable by the owner only: an entry is never changed after it is
    published, and one that other users could write would not be trusted."""
    mask = _umask() | 0o022
    for path in entry_dir.iterdir():
        executable = path.stat().st_mode & 0o111
        os.chmod(path, (0o755 if executable else 0o644) & ~mask)
    os.chmod(entry_dir, 0o755 & ~mask)


def owner_tag() -> str:
    """``<pid>@<host>``: names a staging or trash folder after the process that made it."""
    return f"{os.getpid()}@{socket.gethostname()}"


def remove(entry_dir: Path) -> None:
    """Moves an entry aside before deleting it, so that no reader sees it half deleted."""
    trash = entry_dir.with_name(f"{TRASH}{entry_dir.name}-{owner_tag()}-{secrets.token_hex(4)}")
    os.rename(entry_dir, trash)
    shutil.rmtree(trash, ignore_errors=True)


def _owner_is_gone(path: Path, prefix: str) -> bool:
    try:
        status = os.lstat(path)
    except FileNotFoundError:
        return False
    if status.st_uid != os.getuid() or not stat.S_ISDIR(status.st_mode):
        return False  # not this user's to remove
    if time.time() - status.st_mtime > STALE_SECONDS:
        return True
    pid, _, rest = path.name[len(prefix) :].partition("@")
    if rest.rsplit("-", 1)[0] != socket.gethostname() or not pid.isdigit():
        return False  # a build on another host sharing this folder: only its age tells
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def reap_leftovers(key_dir: Path, digest16: str) -> None:
    """Removes the staging and trash folders of an entry whose process is gone: dead on this host, or
    untouched for STALE_SECONDS. Those of live builds, on this host or another, stay."""
    for prefix in (f"{STAGING}{digest16}-", f"{TRASH}{digest16}-"):
        for path in key_dir.glob(f"{prefix}*"):
            if _owner_is_gone(path, prefix):
                shutil.rmtree(path, ignore_errors=True)


# ---- locks --------------------------------------------------------------------------------------------

HOLDER_WAIT_SECONDS = 0.5  # far longer than a holder takes from its lock to its name
_UNLOCKED_WARNING = threading.Event()  # set once the process warned that locks are unavailable


def lock_path(entry_dir: Path) -> Path:
    return entry_dir.parent / f".{entry_dir.name}.lock"


def _read_holder(handle: IO[str]) -> str:
    """The name the lock's holder wrote in the lock file. The holder writes it just after taking the
    lock, so a waiter that arrives in between finds the file empty: it reads again for up to
    HOLDER_WAIT_SECONDS before it settles for "another process" (a holder that cannot write the file)."""
    deadline = time.monotonic() + HOLDER_WAIT_SECONDS
    while True:
        handle.seek(0)
        holder = handle.read().strip()
        if holder or time.monotonic() > deadline:
            return holder or "another process"
        time.sleep(0.01)


@contextlib.contextmanager
def entry_lock(entry_dir: Path, what: str) -> Iterator[None]:
    """An exclusive lock on the entry's lock file, which names its holder while held; waiting for it
    is announced. Where the file system has no locks (ENOLCK), warns once and goes on without."""
    path = lock_path(entry_dir)
    try:
        handle, holder_written = open(path, "a+"), True
    except PermissionError:
        handle, holder_written = open(path), False  # another user's lock file: locking needs no write access
    with handle:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(handle)
            logger.info("sparse_mla: waiting for the build of %s held by %s (lock %s) ...", what, holder, path)
            start = time.perf_counter()
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)  # released when the file closes, also on a crash
            logger.info("sparse_mla: waited %.1f s for the build of %s", time.perf_counter() - start, what)
        except OSError as error:
            if error.errno not in (errno.ENOLCK, errno.EOPNOTSUPP):
                raise
            if not _UNLOCKED_WARNING.is_set():
                _UNLOCKED_WARNING.set()
                logger.warning(
                    "sparse_mla: the file system of %s has no file locks (%s): building without them, so "
                    "processes asking for one new kernel at once may each compile it", path.parent, error
                )
            yield
            return
        if holder_written:
            handle.truncate(0)
            handle.write(f"pid {os.getpid()} on {socket.gethostname()}")
            handle.flush()
        try:
            yield
        finally:
            if holder_written:
                handle.truncate(0)
                handle.flush()
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


# ---- listing and cleaning -----------------------------------------------------------------------------


def _real_subdirs(folder: Path) -> list[Path]:
    """The folders in ``folder``, symbolic links to folders left out (never followed)."""
    with contextlib.suppress(FileNotFoundError, NotADirectoryError):
        with os.scandir(folder) as entries:
            return sorted(Path(e.path) for e in entries if e.is_dir(follow_symlinks=False))
    return []


def entry_dirs(root: Path) -> Iterator[Path]:
    """Every entry folder of ``root``, without following a symbolic link."""
    for arch_dir in (root / arch for arch in SUPPORTED_ARCHS):
        if arch_dir.is_symlink():
            continue
        for key_dir in _real_subdirs(arch_dir):
            for entry_dir in _real_subdirs(key_dir):
                if re.fullmatch(r"[0-9a-f]{16}", entry_dir.name):
                    yield entry_dir


@dataclasses.dataclass
class EntryStatus:
    """What ``list`` reports of one entry."""

    path: Path
    name: str
    state: str  # "ok", "stale" (an intact entry this host would not build so: see differences), "corrupt", "unreadable", "untrusted"
    detail: str = ""
    compile_seconds: float | None = None


def scan(root: Path, spec_for: Callable[[KernelKey], BuildSpec]) -> list[EntryStatus]:
    """Every entry under ``root`` with its state, for ``python -m sparse_mla list``."""
    statuses = []
    for entry_dir in entry_dirs(root):
        found = read_intact(root, entry_dir)
        if found.state != "ok":
            statuses.append(EntryStatus(entry_dir, entry_dir.parent.name, found.state, found.reason))
            continue
        meta = found.key_json
        key = KernelKey(meta["key"]["d_qk"], meta["key"]["topk"], meta["key"]["arch"])
        state, detail = "ok", ""
        try:
            different = differences(spec_for(key), meta)
            if different:
                state, detail = "stale", describe(entry_dir, different)
        except SparseMLAError as error:  # a missing toolchain only means freshness is unknown
            detail = f"cannot check freshness: {error}"
        statuses.append(EntryStatus(entry_dir, key.name, state, detail, meta.get("compile_seconds")))
    return statuses


def is_tagged(root: Path) -> bool:
    """Whether sparse_mla has built into ``root`` (it holds the CACHEDIR.TAG the library writes)."""
    try:
        with open(root / TAG_FILE) as tag:
            return tag.readline().rstrip("\n") == TAG_SIGNATURE
    except OSError:
        return False


def clean(root: Path, *, older_than_days: float | None, dry_run: bool) -> list[tuple[Path, str]]:
    """Removes (or, with ``dry_run``, lists) the entries of ``root`` that hold a key.json and belong to
    this user, each under its lock, never following a symbolic link; with ``older_than_days``, only
    those built longer ago. Returns (entry, what happened) for every entry examined."""
    report = []
    for entry_dir in entry_dirs(root):
        key_file = entry_dir / KEY_FILE
        try:
            status = os.lstat(entry_dir)
            built = os.lstat(key_file).st_mtime
        except FileNotFoundError:
            continue  # no key.json: not an entry (a build's leftovers are reaped by the next build)
        if status.st_uid != os.getuid():
            report.append((entry_dir, f"kept: belongs to another user (uid {status.st_uid})"))
            continue
        if older_than_days is not None and time.time() - built < older_than_days * 86400:
            report.append((entry_dir, f"kept: built less than {older_than_days:g} days ago"))
            continue
        if dry_run:
            report.append((entry_dir, "would be removed"))
            continue
        with entry_lock(entry_dir, entry_dir.parent.name):
            if key_file.exists():
                remove(entry_dir)
                report.append((entry_dir, "removed"))
    return report
