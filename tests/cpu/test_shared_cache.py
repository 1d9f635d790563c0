"""Cache roots shared between users and hosts, and roots that must not be trusted, with the fake
compiler: permissions of published entries, the trust rule, locks that do not exclude, load failures
of intact entries, leftovers of dead builds, planted links, a missing home directory, and the choice
of entry on a host without a CUDA toolkit. A second user is played by uid 65534 through ``setpriv``
where the tests run as root."""

from __future__ import annotations

import errno
import json
import logging
import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

import fake_jit
from sparse_mla.errors import CacheError, JITDisabledError, KernelBuildError, KernelLoadError
from sparse_mla.jit import build as build_module
from sparse_mla.jit import env, store
from sparse_mla.jit.cache import KernelCache
from sparse_mla.jit.key import KernelKey

KEY = KernelKey(576, 2048)
TESTS_CPU = str(Path(__file__).parent)
SOURCE_TREE = str(Path(__file__).resolve().parents[2] / "python")
NOBODY = 65534


@pytest.fixture
def cache_root(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    for name in ("SPARSE_MLA_PREBUILT_DIRS", "SPARSE_MLA_DISABLE_JIT", "SPARSE_MLA_TRUSTED_DIRS", "SPARSE_MLA_LOG_LEVEL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SPARSE_MLA_JIT_CACHE_DIR", str(root))
    monkeypatch.setenv("FAKE_JIT_BUILD_LOG", str(tmp_path / "builds.log"))
    return root


def builds(tmp_path: Path) -> list[str]:
    log = tmp_path / "builds.log"
    return log.read_text().splitlines() if log.exists() else []


def entry_of(root: Path, key: KernelKey = KEY) -> Path:
    return fake_jit.fake_spec(key).entry_dir(root)


def mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


class RecordingLoader:
    """The fake loader, recording every path it is asked to load."""

    def __init__(self, error: Exception | None = None) -> None:
        self.paths: list[Path] = []
        self.error = error

    def __call__(self, so_path: Path):
        self.paths.append(Path(so_path))
        if self.error is not None:
            raise self.error
        return fake_jit.fake_load(so_path)


def cache_with(loader) -> KernelCache:
    return KernelCache(builder=fake_jit.fake_build, loader=loader, spec_for=fake_jit.fake_spec)


# ---- permissions ----------------------------------------------------------------------------------


@pytest.mark.parametrize("umask, folders, files", [(0o022, 0o755, 0o644), (0o002, 0o755, 0o644), (0o027, 0o750, 0o640), (0o077, 0o700, 0o600)])
def test_published_entries_are_readable_as_the_umask_allows_and_writable_by_the_owner_only(cache_root, umask, folders, files):
    previous = os.umask(umask)
    try:
        fake_jit.fake_cache().get(KEY)
    finally:
        os.umask(previous)
    entry = entry_of(cache_root)
    assert [mode(p) for p in (cache_root, cache_root / "sm90a", entry.parent, entry)] == [folders] * 4
    assert {p.name: mode(p) for p in entry.iterdir()} == {"fake.so": files, "build.log": files, "key.json": files}


# ---- the trust rule ---------------------------------------------------------------------------------


def test_a_prebuilt_root_other_users_can_write_is_not_loaded_unless_trusted(cache_root, tmp_path, monkeypatch, caplog):
    prebuilt = tmp_path / "prebuilt"
    fake_jit.fake_cache().prebuild(KEY, prebuilt)
    prebuilt.chmod(0o777)
    monkeypatch.setenv("SPARSE_MLA_PREBUILT_DIRS", str(prebuilt))
    monkeypatch.setenv("SPARSE_MLA_DISABLE_JIT", "1")
    loader = RecordingLoader()
    with caplog.at_level(logging.WARNING, logger="sparse_mla"), pytest.raises(JITDisabledError):
        cache_with(loader).get(KEY)
    assert loader.paths == []
    assert f"not loading cache entry {entry_of(prebuilt)}: untrusted ({prebuilt} is writable by other users (mode 777))" in caplog.text
    monkeypatch.setenv("SPARSE_MLA_TRUSTED_DIRS", str(prebuilt))
    assert cache_with(loader).get(KEY).kernel_key() == KEY.name


@pytest.mark.parametrize("what", ["arch", "key", "entry", "module", "key.json"])
def test_anything_below_the_root_that_others_can_write_makes_the_entry_untrusted(cache_root, what):
    fake_jit.fake_cache().get(KEY)
    entry = entry_of(cache_root)
    target = {"arch": cache_root / "sm90a", "key": entry.parent, "entry": entry, "module": entry / "fake.so",
              "key.json": entry / "key.json"}[what]
    target.chmod(target.stat().st_mode | 0o002)
    found = store.inspect(fake_jit.fake_spec(KEY), cache_root, entry)
    assert found.state == "untrusted" and found.reason == f"{target} is writable by other users (mode {mode(target):o})"


@pytest.mark.parametrize("link", ["entry", "module"])
def test_a_symbolic_link_below_the_root_is_not_loaded(cache_root, tmp_path, link):
    fake_jit.fake_cache().get(KEY)
    entry = entry_of(cache_root)
    elsewhere = tmp_path / "elsewhere"
    if link == "entry":
        entry.rename(elsewhere)
        entry.symlink_to(elsewhere)
        target = entry
    else:
        (entry / "fake.so").rename(elsewhere)
        (entry / "fake.so").symlink_to(elsewhere)
        target = entry / "fake.so"
    found = store.inspect(fake_jit.fake_spec(KEY), cache_root, entry)
    assert found.state == "untrusted" and found.reason == f"{target} is a symbolic link"


def test_a_module_path_outside_the_entry_is_never_loaded(cache_root, tmp_path):
    """A planted key.json naming another file, with that file's checksum: corrupt, rebuilt."""
    fake_jit.fake_cache().get(KEY)
    entry = entry_of(cache_root)
    planted = tmp_path / "planted.so"
    planted.write_bytes(b"FAKE:" + KEY.name.encode() + b"\nplanted")
    meta = json.loads((entry / "key.json").read_text())
    meta.update(so_file=str(planted), so_sha256=build_module.file_sha256(planted))
    (entry / "key.json").write_text(json.dumps(meta))
    loader = RecordingLoader()
    assert cache_with(loader).get(KEY).kernel_key() == KEY.name
    assert planted not in loader.paths and loader.paths == [entry / "fake.so"]
    assert len(builds(tmp_path)) == 2


@pytest.mark.parametrize("field, value", [("digest", "0" * 64), ("key", {"d_qk": 576, "topk": 64, "arch": "sm90a",
                                                                         "name": "sparse_mla_prefill_dqk576_topk64_sm90a"})])
def test_a_key_json_for_another_kernel_or_digest_is_not_loaded(cache_root, tmp_path, field, value):
    fake_jit.fake_cache().get(KEY)
    entry = entry_of(cache_root)
    meta = json.loads((entry / "key.json").read_text())
    meta[field] = value
    (entry / "key.json").write_text(json.dumps(meta))
    assert store.inspect(fake_jit.fake_spec(KEY), cache_root, entry).state == "corrupt"
    loader = RecordingLoader()
    assert cache_with(loader).get(KEY).kernel_key() == KEY.name
    assert len(builds(tmp_path)) == 2  # rebuilt, the module was loaded only once rebuilt
    assert store.inspect(fake_jit.fake_spec(KEY), cache_root, entry).state == "ok"


def test_a_writable_root_that_others_can_write_is_refused_with_what_to_do(cache_root):
    cache_root.mkdir(mode=0o777)
    cache_root.chmod(0o777)
    with pytest.raises(CacheError) as raised:
        fake_jit.fake_cache().get(KEY)
    message = str(raised.value)
    assert f"the kernel cache directory {cache_root} is not trusted: {cache_root} is writable by other users" in message
    assert "SPARSE_MLA_TRUSTED_DIRS" in message and "SPARSE_MLA_JIT_CACHE_DIR" in message


@pytest.mark.skipif(not store._group_is_private(os.getgid()), reason="this user's group is shared with other users")
def test_a_root_writable_by_the_users_private_group_is_trusted(cache_root):
    """Distributions that give each user a group of their own use umask 002: such roots are fine."""
    cache_root.mkdir()
    cache_root.chmod(0o775)
    assert fake_jit.fake_cache().get(KEY).kernel_key() == KEY.name


@pytest.mark.skipif(os.getuid() != 0, reason="chown to another user needs root")
def test_an_entry_of_another_non_root_user_is_neither_loaded_nor_replaced(cache_root, tmp_path):
    fake_jit.fake_cache().get(KEY)
    entry = entry_of(cache_root)
    os.chown(entry, NOBODY, NOBODY)
    found = store.inspect(fake_jit.fake_spec(KEY), cache_root, entry)
    assert found.state == "untrusted" and found.reason == f"{entry} belongs to another user (uid {NOBODY})"
    loader = RecordingLoader()
    with pytest.raises(CacheError, match="never replaces an entry that is not this user's"):
        cache_with(loader).get(KEY)
    assert loader.paths == [] and entry.is_dir() and len(builds(tmp_path)) == 1


def test_an_unreadable_entry_is_reported_as_such_and_kept(cache_root, tmp_path, monkeypatch, caplog):
    fake_jit.fake_cache().get(KEY)
    entry = entry_of(cache_root)

    def denied(path):
        raise PermissionError(errno.EACCES, "Permission denied", str(path))

    monkeypatch.setattr(store, "file_sha256", denied)
    with caplog.at_level(logging.WARNING, logger="sparse_mla"), pytest.raises(CacheError, match="is unreadable"):
        fake_jit.fake_cache().get(KEY)
    assert "unreadable" in caplog.text and "corrupt" not in caplog.text
    assert entry.is_dir() and len(builds(tmp_path)) == 1


# ---- a second user (root's prebuilt cache, read by uid 65534) ----------------------------------------

CHILD = """
import sys; sys.path.insert(0, {tests!r})
import fake_jit
from sparse_mla.jit.key import KernelKey
try:
    print("LOADED", fake_jit.fake_cache().get(KernelKey({d_qk}, {topk})).kernel_key())
except Exception as error:
    print("ERROR", type(error).__name__, error)
"""


@pytest.fixture
def shared_dir():
    """A folder every user can reach (pytest's tmp_path is private to root)."""
    folder = Path(tempfile.mkdtemp(prefix="sparse_mla-shared-"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def as_nobody(script: str, **variables: str) -> subprocess.CompletedProcess:
    argv = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", sys.executable, "-c", script]
    environment = {k: v for k, v in os.environ.items() if not k.startswith(("SPARSE_MLA_", "FAKE_JIT_"))}
    # The package from the checkout: the interpreter's own site-packages may lie in a home folder this
    # user cannot enter (a pyenv under /root), where the installed copy is out of its reach.
    environment.update(variables, HOME="/nonexistent", PYTHONPATH=SOURCE_TREE)
    return subprocess.run(argv, capture_output=True, text=True, env=environment, timeout=120)


@pytest.fixture
def second_user():
    if os.getuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("playing a second user needs root and setpriv")
    probe = as_nobody(f"import sys; sys.path.insert(0, {TESTS_CPU!r}); import fake_jit, sparse_mla.jit.cache")
    if probe.returncode != 0:
        pytest.skip(f"uid {NOBODY} cannot run this Python and package: {probe.stderr.strip()[-300:]}")
    return as_nobody


def test_another_user_loads_a_cache_root_prebuilt_by_root(second_user, shared_dir):
    prebuilt, own = shared_dir / "prebuilt", shared_dir / "own"
    fake_jit.fake_cache().prebuild(KEY, prebuilt)
    own.mkdir()
    os.chown(own, NOBODY, NOBODY)
    log = shared_dir / "builds.log"
    log.touch(mode=0o666)
    log.chmod(0o666)
    result = second_user(CHILD.format(tests=TESTS_CPU, d_qk=KEY.d_qk, topk=KEY.topk), SPARSE_MLA_PREBUILT_DIRS=str(prebuilt),
                         SPARSE_MLA_JIT_CACHE_DIR=str(own), FAKE_JIT_BUILD_LOG=str(log))
    assert result.stdout == f"LOADED {KEY.name}\n", result.stdout + result.stderr
    assert log.read_text() == "" and not list(own.rglob("key.json"))


def test_another_users_unreadable_entry_in_a_shared_root_is_kept(second_user, shared_dir, monkeypatch):
    """Root built with umask 077 into a root both use for building (trusted by both): the other user
    cannot read the entry, says so, and leaves it alone instead of replacing it."""
    shared = shared_dir / "shared"
    previous = os.umask(0o077)
    try:
        fake_jit.fake_cache().prebuild(KEY, shared)
    finally:
        os.umask(previous)
    shared.chmod(0o777)
    (shared / "sm90a").chmod(0o777)
    entry_of(shared).parent.chmod(0o777)
    store.lock_path(entry_of(shared)).chmod(0o644)  # readable, which is all a lock needs
    before = sorted(p.name for p in entry_of(shared).iterdir())
    result = second_user(CHILD.format(tests=TESTS_CPU, d_qk=KEY.d_qk, topk=KEY.topk), SPARSE_MLA_JIT_CACHE_DIR=str(shared),
                         SPARSE_MLA_TRUSTED_DIRS=str(shared))
    assert result.stdout.startswith("ERROR CacheError cache entry") and "is unreadable" in result.stdout, result.stdout + result.stderr
    assert "unreadable" in result.stderr and "corrupt" not in result.stderr
    assert sorted(p.name for p in entry_of(shared).iterdir()) == before
    monkeypatch.setenv("SPARSE_MLA_TRUSTED_DIRS", str(shared))
    assert store.read_intact(shared, entry_of(shared)).state == "ok"


# ---- locks that do not exclude ------------------------------------------------------------------------

HOST_CHILD = """
import sys; sys.path.insert(0, {tests!r})
import socket, fake_jit
from sparse_mla.jit import store
from sparse_mla.jit.key import KernelKey
socket.gethostname = lambda: {host!r}           # another host sharing the cache folder
store.fcntl.flock = lambda *args: None         # whose lock does not exclude this one (NFS)
print("LOADED", fake_jit.fake_cache().get(KernelKey({d_qk}, {topk})).kernel_key())
"""


def test_builders_on_hosts_whose_locks_do_not_exclude_each_other_all_succeed(cache_root, tmp_path):
    gates = [fake_jit.make_gate(tmp_path / f"gate-{i}") for i in range(3)]
    children = [
        subprocess.Popen([sys.executable, "-c", HOST_CHILD.format(tests=TESTS_CPU, host=f"host-{i}", d_qk=KEY.d_qk, topk=KEY.topk)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=dict(os.environ, FAKE_JIT_BUILD_GATE=str(gates[i])))
        for i in range(3)
    ]
    # Every child's compiler runs before any may finish: the three builds overlap.
    running = []
    try:
        running.extend(fake_jit.open_gate(gate) for gate in gates)
    except AssertionError:
        for child in children:
            child.kill()
        raise
    finally:
        for gate in running:
            gate.close()
    outputs = [child.communicate(timeout=120) for child in children]
    report = "\n".join(out + err for out, err in outputs)
    assert [child.returncode for child in children] == [0, 0, 0], report
    assert all(out == f"LOADED {KEY.name}\n" for out, _ in outputs), report
    assert len(builds(tmp_path)) == 3, "the three builds did not overlap, so this proves nothing"
    assert sum("was published meanwhile" in err for _, err in outputs) == 2, report
    assert store.read_intact(cache_root, entry_of(cache_root)).state == "ok"
    assert not [p.name for p in entry_of(cache_root).parent.iterdir() if p.name.startswith((".staging-", ".trash-"))]


def test_a_file_system_without_locks_warns_once_and_builds(cache_root, tmp_path, monkeypatch, caplog):
    def no_locks(*args):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(store.fcntl, "flock", no_locks)
    monkeypatch.setattr(store, "_UNLOCKED_WARNING", store.threading.Event())
    cache = fake_jit.fake_cache()
    with caplog.at_level(logging.WARNING, logger="sparse_mla"):
        for key in (KEY, KernelKey(512, 512)):
            assert cache.get(key).kernel_key() == key.name
    assert caplog.text.count("has no file locks") == 1 and len(builds(tmp_path)) == 2


def _leftover(key_dir: Path, digest16: str, owner: str, age: float = 0) -> Path:
    folder = key_dir / f"{store.STAGING}{digest16}-{owner}-abcd1234"
    folder.mkdir(parents=True)
    if age:
        os.utime(folder, (time.time() - age, time.time() - age))
    return folder


def test_only_leftovers_of_dead_or_stale_builds_are_reaped(tmp_path):
    digest16, host = "0123456789abcdef", socket.gethostname()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True).stdout.strip()
    reaped = [_leftover(tmp_path, digest16, f"{dead}@{host}"), _leftover(tmp_path, digest16, f"{os.getpid()}@other-host", age=7200)]
    kept = [
        _leftover(tmp_path, digest16, f"{os.getpid()}@{host}"),  # this process: alive
        _leftover(tmp_path, digest16, f"{dead}@other-host"),  # another host: only its age tells, and it is fresh
        _leftover(tmp_path, "fedcba9876543210", f"{dead}@{host}"),  # another entry's
    ]
    store.reap_leftovers(tmp_path, digest16)
    assert [p.exists() for p in reaped] == [False, False] and all(p.exists() for p in kept)


# ---- load failures of intact entries --------------------------------------------------------------------


def test_an_intact_entry_that_does_not_load_is_a_typed_error_and_is_kept(cache_root, tmp_path):
    fake_jit.fake_cache().get(KEY)
    entry = entry_of(cache_root)
    loader = RecordingLoader(OSError("libcudart.so.13: cannot open shared object file: No such file or directory"))
    with pytest.raises(KernelLoadError) as raised:
        cache_with(loader).get(KEY)
    assert raised.value.path == str(entry / "fake.so") and raised.value.reason.startswith("libcudart.so.13: cannot open")
    assert "Rebuilding would not help" in str(raised.value)
    assert store.read_intact(cache_root, entry).state == "ok" and len(builds(tmp_path)) == 1


# ---- smaller ones ---------------------------------------------------------------------------------------


def test_a_failed_build_log_replaces_a_planted_link_instead_of_writing_through_it(cache_root, tmp_path):
    target = tmp_path / "victim"
    target.write_text("precious")
    entry = entry_of(cache_root)
    entry.parent.mkdir(parents=True)
    failed_log = entry.parent / f"{entry.name}.failed.log"
    failed_log.symlink_to(target)

    def broken(spec, build_dir):
        raise RuntimeError("ninja exited with status 1")

    with pytest.raises(KernelBuildError):
        KernelCache(builder=broken, loader=fake_jit.fake_load, spec_for=fake_jit.fake_spec).get(KEY)
    assert target.read_text() == "precious"
    assert not failed_log.is_symlink() and "ninja exited with status 1" in failed_log.read_text()


def _homeless(monkeypatch):
    for name in ("HOME", "XDG_CACHE_HOME", "SPARSE_MLA_JIT_CACHE_DIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(env, "source_checkout_root", lambda: None)

    def no_entry(uid):
        raise KeyError(f"getpwuid(): uid not found: {uid}")

    monkeypatch.setattr(pwd, "getpwuid", no_entry)


def test_a_process_without_a_home_directory_loads_prebuilt_kernels(cache_root, tmp_path, monkeypatch):
    prebuilt = tmp_path / "prebuilt"
    fake_jit.fake_cache().prebuild(KEY, prebuilt)
    _homeless(monkeypatch)
    monkeypatch.setenv("SPARSE_MLA_PREBUILT_DIRS", str(prebuilt))
    assert env.cache_dir() is None
    assert fake_jit.fake_cache().get(KEY).kernel_key() == KEY.name


def test_a_process_without_a_home_directory_gets_a_typed_error_on_a_miss(cache_root, monkeypatch):
    _homeless(monkeypatch)
    with pytest.raises(CacheError, match="there is no writable one to compile it into.*set SPARSE_MLA_JIT_CACHE_DIR"):
        fake_jit.fake_cache().get(KEY)


def _entry_built_by(root: Path, cuda_version: str) -> Path:
    cache = KernelCache(builder=fake_jit.fake_build, loader=fake_jit.fake_load,
                        spec_for=lambda key: fake_jit.fake_spec(key, cuda_version=cuda_version))
    return cache.prebuild(KEY, root)[0]


@pytest.mark.parametrize("driver, chosen", [("13000", "13000"), ("12090", "12080"), (None, "13020")])
def test_a_host_without_a_toolkit_takes_the_newest_entry_its_driver_runs(cache_root, tmp_path, monkeypatch, driver, chosen):
    entries = {version: _entry_built_by(cache_root, version) for version in ("12080", "13000", "13020")}
    monkeypatch.setattr(env, "driver_cuda_version", lambda: driver)
    loader = RecordingLoader()
    no_toolkit = KernelCache(builder=fake_jit.fake_build, loader=loader, spec_for=lambda key: fake_jit.fake_spec(key, cuda_version=None))
    assert no_toolkit.get(KEY).kernel_key() == KEY.name
    assert loader.paths == [entries[chosen] / "fake.so"]


def test_cuda_home_finds_the_toolkit_behind_a_link_but_not_behind_a_wrapper_script(tmp_path, monkeypatch):
    toolkit = tmp_path / "toolkit"
    (toolkit / "bin").mkdir(parents=True)
    (toolkit / "include").mkdir()
    (toolkit / "bin" / "nvcc").write_text("#!/bin/sh\n")
    (toolkit / "bin" / "nvcc").chmod(0o755)
    (toolkit / "include" / "cuda.h").write_text("#define CUDA_VERSION 13000\n")
    linked, wrapper = tmp_path / "linked" / "bin", tmp_path / "wrapper" / "bin"
    linked.mkdir(parents=True)
    (linked / "nvcc").symlink_to(toolkit / "bin" / "nvcc")
    wrapper.mkdir(parents=True)
    (wrapper / "nvcc").write_text(f"#!/bin/sh\nexec {toolkit}/bin/nvcc \"$@\"\n")
    (wrapper / "nvcc").chmod(0o755)
    for name in ("CUDA_HOME", "CUDA_PATH"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(env, "DEFAULT_CUDA_HOME", str(tmp_path / "no-default-toolkit"))
    monkeypatch.setenv("PATH", str(linked))
    assert env.cuda_home() == toolkit
    monkeypatch.setenv("PATH", str(wrapper))  # its folder's parent holds no include/cuda.h
    assert env.cuda_home() is None
