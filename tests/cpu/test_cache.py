"""The kernel cache with a fake builder: one build under concurrency, atomic publish of exactly the
documented files, corrupt, killed and interrupted builds, typed errors for unusable cache directories,
the disabled-JIT switch, misses that name the entries built for another host, compiles and waits
announced on stderr, the public warm-up, and a build (with a fake toolchain) that leaves the process's
environment alone."""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import multiprocessing
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
import types
from pathlib import Path

import pytest

import fake_jit
import sparse_mla
import sparse_mla.jit
from sparse_mla.errors import CacheError, JITDisabledError, KernelBuildError, ToolchainError
from sparse_mla.jit import build as build_module
from sparse_mla.jit import store
from sparse_mla.jit.cache import KernelCache
from sparse_mla.jit.store import KEY_FILE, read_intact
from sparse_mla.jit.key import KernelKey

KEY = KernelKey(576, 2048)
TESTS_CPU = str(Path(__file__).parent)


@pytest.fixture
def cache_root(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setenv("SPARSE_MLA_JIT_CACHE_DIR", str(root))
    monkeypatch.delenv("SPARSE_MLA_PREBUILT_DIRS", raising=False)
    monkeypatch.delenv("SPARSE_MLA_DISABLE_JIT", raising=False)
    monkeypatch.setenv("FAKE_JIT_BUILD_LOG", str(tmp_path / "builds.log"))
    monkeypatch.delenv("SPARSE_MLA_LOG_LEVEL", raising=False)
    return root


def builds(cache_root: Path) -> list[str]:
    log = cache_root.parent / "builds.log"
    return log.read_text().splitlines() if log.exists() else []


def entry_of(root: Path, key: KernelKey = KEY) -> Path:
    return fake_jit.fake_spec(key).entry_dir(root)


def test_build_publishes_a_complete_entry_then_hits(cache_root):
    module = fake_jit.fake_cache().get(KEY)
    assert module.kernel_key() == KEY.name
    entry = entry_of(cache_root)
    assert entry == cache_root / "sm90a" / KEY.name / entry.name and len(entry.name) == 16
    meta = json.loads((entry / KEY_FILE).read_text())
    assert meta["key"]["name"] == KEY.name and meta["so_file"] == "fake.so"
    # The module, its key.json and build log only: no object file, ninja files or lock (see fake_build).
    assert sorted(p.name for p in entry.iterdir()) == sorted(["fake.so", "build.log", KEY_FILE])
    assert not list(entry.parent.glob(".staging-*"))
    # A new process (a new cache object) loads it without building.
    assert fake_jit.fake_cache().get(KEY).kernel_key() == KEY.name
    assert len(builds(cache_root)) == 1


def test_cache_hit_starts_no_subprocess(cache_root, monkeypatch):
    fake_jit.fake_cache().get(KEY)

    def no_subprocess(*args, **kwargs):
        raise AssertionError("a cache hit started a subprocess")

    monkeypatch.setattr(subprocess, "Popen", no_subprocess)
    monkeypatch.setattr(subprocess, "run", no_subprocess)
    assert fake_jit.fake_cache().get(KEY).kernel_key() == KEY.name


def test_memo_returns_the_same_module(cache_root):
    cache = fake_jit.fake_cache()
    assert cache.get(KEY) is cache.get(KEY)


def test_distinct_keys_get_distinct_entries(cache_root):
    cache = fake_jit.fake_cache()
    for key in (KernelKey(512, 512), KernelKey(576, 2048), KernelKey(576, 7)):
        assert cache.get(key).kernel_key() == key.name
    assert len(builds(cache_root)) == 3


def test_threads_asking_for_one_new_key_build_once(cache_root, monkeypatch):
    monkeypatch.setenv("FAKE_JIT_BUILD_SECONDS", "0.5")
    cache = fake_jit.fake_cache()
    barrier = threading.Barrier(8)
    results = []

    def worker():
        barrier.wait()
        results.append(cache.get(KEY))

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 8 and all(m is results[0] for m in results)
    assert len(builds(cache_root)) == 1


def test_eight_processes_sharing_an_empty_cache_build_once(cache_root, monkeypatch):
    monkeypatch.setenv("FAKE_JIT_BUILD_SECONDS", "1")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([TESTS_CPU, *sys.path]))
    context = multiprocessing.get_context("spawn")
    barrier = context.Manager().Barrier(8)
    with context.Pool(8) as pool:
        names = pool.starmap(fake_jit.get_in_child, [(KEY.d_qk, KEY.topk, barrier)] * 8)
    assert names == [KEY.name] * 8
    assert len(builds(cache_root)) == 1


def test_failed_build_leaves_no_entry_and_reports_key_command_and_log(cache_root):
    def broken(spec, build_dir):
        (build_dir / "partial.o").write_bytes(b"half")
        raise RuntimeError("ninja exited with status 1\nstdout:\n[1/2] /cuda/bin/nvcc -c x.cu -o x.o\nerror: oops")

    cache = KernelCache(builder=broken, loader=fake_jit.fake_load, spec_for=fake_jit.fake_spec)
    with pytest.raises(KernelBuildError) as raised:
        cache.get(KEY)
    error = raised.value
    assert error.key_name == KEY.name and KEY.name in str(error)
    assert error.command == "/cuda/bin/nvcc -c x.cu -o x.o" and error.command in str(error)
    assert "error: oops" in Path(error.log_path).read_text() and error.log_path in str(error)
    assert not entry_of(cache_root).exists()
    assert not list(entry_of(cache_root).parent.glob(".staging-*"))
    # The next call (with a working compiler) builds it.
    assert fake_jit.fake_cache().get(KEY).kernel_key() == KEY.name


@pytest.mark.parametrize("damage", ["truncate", "garbage", "empty", "delete_key_json", "wrong_key"])
def test_corrupt_entry_is_detected_logged_and_rebuilt(cache_root, caplog, damage):
    fake_jit.fake_cache().get(KEY)
    entry = entry_of(cache_root)
    so = entry / "fake.so"
    if damage == "truncate":
        so.write_bytes(so.read_bytes()[:10])
    elif damage == "garbage":
        so.write_bytes(bytes(range(200)))  # no FAKE: header: garbage to the loader
    elif damage == "empty":
        so.write_bytes(b"")
    elif damage == "delete_key_json":
        (entry / KEY_FILE).unlink()
    else:  # a well-formed module of another key, with a matching checksum
        so.write_bytes(b"FAKE:another_kernel\n")
        meta = json.loads((entry / KEY_FILE).read_text())
        meta["so_sha256"] = build_module.file_sha256(so)
        (entry / KEY_FILE).write_text(json.dumps(meta))
    assert read_intact(cache_root, entry).state == ("ok" if damage == "wrong_key" else "corrupt")
    with caplog.at_level(logging.WARNING, logger="sparse_mla"):
        module = fake_jit.fake_cache().get(KEY)
    assert module.kernel_key() == KEY.name
    assert len(builds(cache_root)) == 2
    assert read_intact(cache_root, entry).state == "ok"
    if damage != "delete_key_json":
        assert any(str(entry) in r.getMessage() for r in caplog.records)


def test_build_killed_by_sigkill_leaves_nothing_loadable(cache_root, tmp_path):
    """A process killed mid-build (SIGKILL: no cleanup runs) leaves only a staging directory, which
    is never loaded; the lock dies with the process and the next call rebuilds."""
    script = textwrap.dedent(
        f"""
        import sys; sys.path.insert(0, {TESTS_CPU!r})
        import fake_jit
        from sparse_mla.jit.key import KernelKey
        fake_jit.fake_cache().get(KernelKey({KEY.d_qk}, {KEY.topk}))
        """
    )
    gate = fake_jit.make_gate(tmp_path / "gate")
    child = subprocess.Popen([sys.executable, "-c", script], env=dict(os.environ, FAKE_JIT_BUILD_GATE=str(gate)),
                             start_new_session=True)
    parent = entry_of(cache_root).parent
    with fake_jit.open_gate(gate):  # the child's compiler runs, so its build is under way
        assert list(parent.glob(".staging-*")) and builds(cache_root), "the child's build is not under way"
        os.killpg(child.pid, signal.SIGKILL)  # the process and its fake compiler
        child.wait()
    assert not entry_of(cache_root).exists()
    assert fake_jit.fake_cache().get(KEY).kernel_key() == KEY.name
    assert len(builds(cache_root)) == 2
    assert not list(parent.glob(".staging-*")), "the killed build's staging directory was not cleaned"


def test_disabled_jit_names_the_exact_prebuild_command(cache_root, monkeypatch):
    monkeypatch.setenv("SPARSE_MLA_DISABLE_JIT", "1")
    with pytest.raises(JITDisabledError) as raised:
        fake_jit.fake_cache().get(KEY)
    assert "python -m sparse_mla prebuild --d-qk 576 --topk 2048" in str(raised.value)
    assert raised.value.prebuild_command == "python -m sparse_mla prebuild --d-qk 576 --topk 2048"
    assert builds(cache_root) == []


def test_disabled_jit_loads_what_is_prebuilt(cache_root, monkeypatch, tmp_path):
    prebuilt = tmp_path / "prebuilt"
    fake_jit.fake_cache().prebuild(KEY, prebuilt)
    monkeypatch.setenv("SPARSE_MLA_DISABLE_JIT", "1")
    monkeypatch.setenv("SPARSE_MLA_PREBUILT_DIRS", str(prebuilt))
    assert fake_jit.fake_cache().get(KEY).kernel_key() == KEY.name
    assert len(builds(cache_root)) == 1
    assert not cache_root.exists()  # the hit wrote nothing into the writable root


def test_moved_cache_root_still_hits(cache_root, monkeypatch, tmp_path):
    fake_jit.fake_cache().get(KEY)
    moved = tmp_path / "moved"
    cache_root.rename(moved)
    monkeypatch.setenv("SPARSE_MLA_JIT_CACHE_DIR", str(moved))
    assert fake_jit.fake_cache().get(KEY).kernel_key() == KEY.name
    assert len(builds(cache_root)) == 1


def test_host_without_cuda_toolkit_loads_an_entry_built_from_the_same_sources(cache_root):
    fake_jit.fake_cache().get(KEY)
    no_toolkit = KernelCache(
        builder=fake_jit.fake_build,
        loader=fake_jit.fake_load,
        spec_for=lambda key: fake_jit.fake_spec(key, cuda_version=None),
    )
    assert no_toolkit.get(KEY).kernel_key() == KEY.name
    assert len(builds(cache_root)) == 1


@pytest.mark.parametrize(
    "error_number, words",
    [(errno.EROFS, "is not writable"), (errno.EACCES, "is not writable"), (errno.ENOSPC, "is out of space")],
)
def test_unusable_cache_directory_is_one_typed_actionable_error(cache_root, monkeypatch, error_number, words):
    real_mkdir = os.mkdir

    def failing_mkdir(path, *args, **kwargs):
        if str(path).startswith(str(cache_root)):
            raise OSError(error_number, os.strerror(error_number), str(path))
        return real_mkdir(path, *args, **kwargs)

    monkeypatch.setattr(os, "mkdir", failing_mkdir)
    with pytest.raises(CacheError, match=words) as raised:
        fake_jit.fake_cache().get(KEY)
    assert "SPARSE_MLA_JIT_CACHE_DIR" in str(raised.value)
    assert "python -m sparse_mla prebuild --d-qk 576 --topk 2048" in str(raised.value)


def test_disk_full_during_the_build_is_a_cache_error_and_leaves_nothing(cache_root):
    def disk_full(spec, build_dir):
        (build_dir / "partial.o").write_bytes(b"x")
        raise OSError(errno.ENOSPC, "No space left on device")

    cache = KernelCache(builder=disk_full, loader=fake_jit.fake_load, spec_for=fake_jit.fake_spec)
    with pytest.raises(CacheError, match="is out of space"):
        cache.get(KEY)
    parent = entry_of(cache_root).parent
    assert not entry_of(cache_root).exists() and not list(parent.glob(".staging-*"))


def test_cache_root_that_is_a_file_is_a_cache_error(tmp_path, monkeypatch, cache_root):
    cache_root.write_text("not a directory")
    with pytest.raises(CacheError, match="cannot be used"):
        fake_jit.fake_cache().get(KEY)


def test_missing_nvcc_is_a_toolchain_error(tmp_path, monkeypatch):
    monkeypatch.setattr(build_module.env, "cuda_home", lambda: None)
    with pytest.raises(ToolchainError, match="nvcc was not found.*CUDA_HOME"):
        build_module.compile_module(fake_jit.fake_spec(KEY), tmp_path)


def test_missing_cutlass_is_a_toolchain_error(monkeypatch):
    monkeypatch.setattr("importlib.util.find_spec", lambda name: None)
    with pytest.raises(ToolchainError, match="pip install nvidia-cutlass"):
        build_module.build_spec(KEY)


def test_missing_headers_is_a_toolchain_error(monkeypatch, tmp_path):
    monkeypatch.setattr(build_module.env, "_PACKAGE_DIR", tmp_path / "python" / "sparse_mla")
    with pytest.raises(ToolchainError, match="kernel headers are missing"):
        build_module.build_spec(KEY)


def test_missing_ninja_is_a_toolchain_error(tmp_path, monkeypatch):
    monkeypatch.setattr(build_module.shutil, "which", lambda name: None)
    monkeypatch.setattr(build_module.sys, "executable", str(tmp_path / "python3"))  # no ninja beside it
    with pytest.raises(ToolchainError, match="pip install ninja"):
        build_module.compile_module(fake_jit.fake_spec(KEY), tmp_path)


# ---- compiles and waits are visible -------------------------------------------------------------

CHILD = """
import sys; sys.path.insert(0, {tests!r})
import logging, fake_jit
from sparse_mla.jit.key import KernelKey
{setup}
fake_jit.fake_cache().get(KernelKey({d_qk}, {topk}))
"""


def run_child(setup: str = "", **environment: str) -> subprocess.CompletedProcess:
    script = CHILD.format(tests=TESTS_CPU, setup=setup, d_qk=KEY.d_qk, topk=KEY.topk)
    return subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=dict(os.environ, **environment), timeout=60
    )


COMPILING = f"sparse_mla: compiling {KEY.name} (not in the cache yet; this takes a while, `{KEY.prebuild_command}` does it ahead of time) ..."
COMPILED = rf"sparse_mla: compiled {KEY.name} in \d+\.\d s -> "


def test_a_compile_is_announced_on_stderr_with_no_logging_configured(cache_root):
    result = run_child()
    assert result.returncode == 0, result.stderr
    lines = result.stderr.splitlines()
    assert lines[0] == COMPILING and re.match(COMPILED, lines[1]) and len(lines) == 2, result.stderr


@pytest.mark.parametrize(
    "setup, environment",
    [
        ('logging.getLogger("sparse_mla").setLevel(logging.WARNING)', {}),
        ("", {"SPARSE_MLA_LOG_LEVEL": "warning"}),
    ],
    ids=["logging-api", "variable"],
)
def test_the_announcements_can_be_silenced(cache_root, setup, environment):
    result = run_child(setup, **environment)
    assert result.returncode == 0 and result.stderr == "", result.stderr
    assert len(builds(cache_root)) == 1


def test_an_application_that_configured_logging_gets_each_line_once_through_its_own_handler(cache_root):
    result = run_child('logging.basicConfig(level=logging.WARNING, format="APP %(name)s %(message)s")')
    assert result.returncode == 0, result.stderr
    lines = result.stderr.splitlines()
    assert lines[0] == f"APP sparse_mla {COMPILING}" and len(lines) == 2, result.stderr


def test_an_unknown_log_level_is_reported_and_ignored(cache_root):
    result = run_child(SPARSE_MLA_LOG_LEVEL="LOUD")
    lines = result.stderr.splitlines()
    assert lines[0].startswith("sparse_mla: ignoring SPARSE_MLA_LOG_LEVEL=LOUD (not one of DEBUG, INFO"), result.stderr
    assert lines[1] == COMPILING, result.stderr


def test_a_process_waiting_for_another_ones_build_says_whose_and_how_long(cache_root, tmp_path):
    script = CHILD.format(tests=TESTS_CPU, setup="", d_qk=KEY.d_qk, topk=KEY.topk)
    gate = fake_jit.make_gate(tmp_path / "gate")
    builder = subprocess.Popen(
        [sys.executable, "-c", script], stderr=subprocess.PIPE, text=True, env=dict(os.environ, FAKE_JIT_BUILD_GATE=str(gate))
    )
    with fake_jit.open_gate(gate):  # the builder holds the entry's lock while its compiler runs
        waiter = subprocess.Popen([sys.executable, "-c", script], stderr=subprocess.PIPE, text=True)
        announced = waiter.stderr.readline()  # the waiter reached the lock: only now may the build end
    waiter_stderr = announced + waiter.communicate(timeout=60)[1]
    builder_stderr = builder.communicate(timeout=60)[1]
    assert builder.returncode == 0 and waiter.returncode == 0, builder_stderr + waiter_stderr
    lines = waiter_stderr.splitlines()
    holder = f"pid {builder.pid} on {socket.gethostname()}"
    assert lines[0].startswith(f"sparse_mla: waiting for the build of {KEY.name} held by {holder} (lock "), lines
    assert re.fullmatch(rf"sparse_mla: waited \d+\.\d s for the build of {KEY.name}", lines[1]) and len(lines) == 2, lines
    assert builder_stderr.startswith(COMPILING) and len(builds(cache_root)) == 1


def test_a_waiter_that_arrives_before_the_holder_wrote_its_name_still_names_it(tmp_path, caplog, monkeypatch):
    # The holder takes the lock, then writes its name: a waiter in between finds the file empty. Events
    # force that order: the holder writes only once the waiter has read the file empty (its first pause
    # before reading again), and releases the lock only once the waiter has announced whom it waits for.
    entry = tmp_path / "sparse_mla_prefill_dqk576_topk2048_sm90a" / "0123456789abcdef"
    entry.parent.mkdir()
    holder_file = open(store.lock_path(entry), "a+")
    fcntl.flock(holder_file.fileno(), fcntl.LOCK_EX)
    read_empty, announced = threading.Event(), threading.Event()

    def pause(seconds):
        read_empty.set()
        time.sleep(seconds)

    clock = {name: getattr(time, name) for name in dir(time) if not name.startswith("_")}
    monkeypatch.setattr(store, "time", types.SimpleNamespace(**dict(clock, sleep=pause)))
    monkeypatch.setattr(store, "HOLDER_WAIT_SECONDS", 600)  # so that the holder's name is what ends the reads

    class Announcement(logging.Handler):
        def emit(self, record):
            if record.getMessage().startswith("sparse_mla: waiting for"):
                announced.set()

    def name_then_release():
        try:
            if read_empty.wait(60):  # else the waiter never read the file, and its message says so below
                holder_file.write("pid 4242 on builder-host")
                holder_file.flush()
                announced.wait(60)
        finally:
            holder_file.truncate(0)
            holder_file.close()  # releases the lock

    handler = Announcement()
    logging.getLogger("sparse_mla").addHandler(handler)
    holder = threading.Thread(target=name_then_release)
    holder.start()
    try:
        with caplog.at_level(logging.INFO, logger="sparse_mla"), store.entry_lock(entry, "the key"):
            pass
    finally:
        logging.getLogger("sparse_mla").removeHandler(handler)
        holder.join()
    messages = [record.getMessage() for record in caplog.records]
    assert messages[0].startswith("sparse_mla: waiting for the build of the key held by pid 4242 on builder-host (lock "), messages


# ---- the public warm-up -------------------------------------------------------------------------


def test_warmup_loads_every_combination_side_by_side_and_the_calls_then_find_them(cache_root, monkeypatch):
    both_building = threading.Barrier(2, timeout=30)  # each build waits for the other: they overlap

    def builder(spec, build_dir):
        both_building.wait()
        return fake_jit.fake_build(spec, build_dir)

    cache = KernelCache(builder=builder, loader=fake_jit.fake_load, spec_for=fake_jit.fake_spec)
    monkeypatch.setattr(sparse_mla.jit, "_CACHE", cache)
    assert sparse_mla.warmup(d_qk=576, topk=[64, 2048, 64]) is None
    assert sorted(line.split()[1] for line in builds(cache_root)) == sorted([KernelKey(576, 64).name, KEY.name])
    for key in (KernelKey(576, 64), KEY):
        assert sparse_mla.jit.get_module(key).kernel_key() == key.name
    assert len(builds(cache_root)) == 2


@pytest.mark.parametrize(
    "d_qk, topk, match",
    [(320, 2048, "d_qk must be one of"), (576, 0, "topk must be a positive int"), (576, [], "topk must be an int or a non-empty list")],
)
def test_warmup_rejects_unsupported_keys(cache_root, monkeypatch, d_qk, topk, match):
    monkeypatch.setattr(sparse_mla.jit, "_CACHE", fake_jit.fake_cache())
    with pytest.raises(ValueError, match=match):
        sparse_mla.warmup(d_qk=d_qk, topk=topk)
    assert builds(cache_root) == []


@pytest.mark.parametrize(
    "d_qk, topk, words",
    [
        ("576", 2048, "d_qk must be an int or a non-empty list of ints, got '576' (a str)"),
        (576, 2048.0, "topk must be an int or a non-empty list of ints, got 2048.0 (a float)"),
        (576, [64, 2048.0], "topk must be an int or a non-empty list of ints, got [64, 2048.0] (holding 2048.0, a float)"),
        (None, 2048, "d_qk must be an int or a non-empty list of ints, got None (a NoneType)"),
    ],
)
def test_warmup_rejects_arguments_of_another_type_naming_them(cache_root, monkeypatch, d_qk, topk, words):
    monkeypatch.setattr(sparse_mla.jit, "_CACHE", fake_jit.fake_cache())
    with pytest.raises(TypeError) as raised:
        sparse_mla.warmup(d_qk=d_qk, topk=topk)
    assert str(raised.value) == words
    assert builds(cache_root) == []


def test_warmup_compiles_no_more_keys_at_once_than_there_are_cores(cache_root, monkeypatch):
    active, most = [0], [0]
    condition = threading.Condition()

    def builder(spec, build_dir):
        with condition:
            active[0] += 1
            most[0] = max(most[0], active[0])
            condition.notify_all()
            condition.wait_for(lambda: active[0] > 2, timeout=0.5)  # a third build, if one can start, starts now
            active[0] -= 1
        return fake_jit.fake_build(spec, build_dir)

    monkeypatch.setattr(sparse_mla.jit, "_cpu_count", lambda: 2)
    monkeypatch.setattr(sparse_mla.jit, "_CACHE", KernelCache(builder=builder, loader=fake_jit.fake_load, spec_for=fake_jit.fake_spec))
    sparse_mla.warmup(d_qk=576, topk=[1, 2, 3, 4, 5])
    assert most[0] == 2 and len(builds(cache_root)) == 5


# ---- a miss names the entries of the kernel that another host built -------------------------------


def digest16(root: Path, **inputs) -> str:
    return fake_jit.fake_spec(KEY, **inputs).entry_dir(root).name


@pytest.mark.parametrize(
    "built_with, host, sentence",
    [
        ({}, {"cuda_version": "12090"}, "was built with CUDA 13.0; this host has CUDA 12.9"),
        (
            {},
            {"cuda_version": "12090", "cutlass": "4.3.0"},
            "was built with CUDA 13.0 and nvidia-cutlass 4.2.0.0; this host has CUDA 12.9 and nvidia-cutlass 4.3.0",
        ),
        ({"tvm_ffi": "0.1.9"}, {}, "was built with apache-tvm-ffi 0.1.9; this host has apache-tvm-ffi 0.1.15"),
        ({"arch": "sm_90"}, {}, "was built with arch sm_90; this host has arch sm_90a"),
        ({"flags": ["-O2", "-G"]}, {}, "was built with flags -G; this host has flags -fake"),
        (
            {"headers": {"sparse_mla/entry.cuh": "entry-v1", "sparse_mla/sm90/consumer.cuh": "consumer-v0"}},
            {},
            "was built from other kernel sources (1 header differs: sparse_mla/sm90/consumer.cuh)",
        ),
        (
            {"source_sha256": "an older template"},
            {"cuda_version": "12090"},
            "was built from other kernel sources (another generated source) and with CUDA 13.0; this host has CUDA 12.9",
        ),
    ],
    ids=["toolkit", "toolkit-and-cutlass", "tvm-ffi", "arch", "flags", "headers", "source-and-toolkit"],
)
def test_a_disabled_jit_names_each_entry_built_otherwise_and_what_differs(cache_root, monkeypatch, tmp_path, built_with, host, sentence):
    prebuilt = tmp_path / "prebuilt"
    fake_jit.fake_cache(**built_with).prebuild(KEY, prebuilt)
    monkeypatch.setenv("SPARSE_MLA_PREBUILT_DIRS", str(prebuilt))
    monkeypatch.setenv("SPARSE_MLA_DISABLE_JIT", "1")
    with pytest.raises(JITDisabledError) as raised:
        fake_jit.fake_cache(**host).get(KEY)
    message = str(raised.value)
    assert message.startswith(f"kernel {KEY.name} has no usable entry in the cache ({cache_root}, {prebuilt})"), message
    assert message.endswith(f"The cache holds only other builds of it: entry {digest16(prebuilt, **built_with)} {sentence} (in {prebuilt})"), message


def test_a_miss_with_several_entries_built_otherwise_names_each(cache_root, monkeypatch):
    fake_jit.fake_cache().prebuild(KEY, cache_root)
    fake_jit.fake_cache(cutlass="4.1.0").prebuild(KEY, cache_root)
    monkeypatch.setenv("SPARSE_MLA_DISABLE_JIT", "1")
    with pytest.raises(JITDisabledError) as raised:
        fake_jit.fake_cache(cuda_version="12090").get(KEY)
    message = str(raised.value)
    assert f"entry {digest16(cache_root)} was built with CUDA 13.0; this host has CUDA 12.9 (in {cache_root})" in message
    assert (
        f"entry {digest16(cache_root, cutlass='4.1.0')} was built with CUDA 13.0 and nvidia-cutlass 4.1.0; this host has "
        f"CUDA 12.9 and nvidia-cutlass 4.2.0.0 (in {cache_root})"
    ) in message


def test_a_miss_without_other_builds_says_nothing_of_them(cache_root, monkeypatch):
    fake_jit.fake_cache().prebuild(KernelKey(576, 64), cache_root)  # another kernel's entry is no near miss
    monkeypatch.setenv("SPARSE_MLA_DISABLE_JIT", "1")
    with pytest.raises(JITDisabledError) as raised:
        fake_jit.fake_cache().get(KEY)
    assert "other builds" not in str(raised.value) and str(raised.value).endswith("--cache-dir <one of those roots>")


def test_a_host_without_a_toolkit_names_an_entry_its_driver_cannot_run(cache_root, monkeypatch):
    fake_jit.fake_cache().prebuild(KEY, cache_root)  # CUDA 13.0
    monkeypatch.setattr(store.env, "driver_cuda_version", lambda: "12080")
    monkeypatch.setenv("SPARSE_MLA_DISABLE_JIT", "1")
    with pytest.raises(JITDisabledError) as raised:
        fake_jit.fake_cache(cuda_version=None).get(KEY)
    assert f"entry {digest16(cache_root)} was built with CUDA 13.0; this host has a driver that runs CUDA 12.8 at most" in str(raised.value)


def test_the_compile_line_names_the_entries_built_otherwise(cache_root, caplog):
    fake_jit.fake_cache().prebuild(KEY, cache_root)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="sparse_mla"):
        fake_jit.fake_cache(cuda_version="12090").get(KEY)
    assert caplog.records[0].getMessage() == (
        f"sparse_mla: compiling {KEY.name} (the cache holds only other builds of it: entry {digest16(cache_root)} was "
        f"built with CUDA 13.0; this host has CUDA 12.9 (in {cache_root}); this takes a while, "
        f"`{KEY.prebuild_command}` does it ahead of time) ..."
    )
    assert len(builds(cache_root)) == 2


# ---- an interrupt stops builds ------------------------------------------------------------------


@pytest.fixture
def interrupts():
    """The process-wide interrupt state, reset after the test."""
    yield build_module.interrupt
    build_module.interrupt.resume()


def test_after_an_interrupt_no_compiler_starts_and_nothing_is_left(cache_root, monkeypatch, interrupts, tmp_path):
    compilers = tmp_path / "compilers.log"
    monkeypatch.setenv("FAKE_JIT_COMPILER_LOG", str(compilers))
    monkeypatch.setenv("FAKE_JIT_BUILD_SECONDS", "60")
    interrupts.stop()
    with pytest.raises(KeyboardInterrupt):
        fake_jit.fake_cache().get(KEY)
    assert not compilers.exists() and not fake_jit.compilers_of(os.getpid()), "a compiler started after the interrupt"
    parent = entry_of(cache_root).parent
    assert sorted(p.name for p in parent.iterdir()) == [f".{entry_of(cache_root).name}.lock"], "a failed.log, entry or staging folder"
    interrupts.resume()
    monkeypatch.delenv("FAKE_JIT_BUILD_SECONDS")
    assert fake_jit.fake_cache().get(KEY).kernel_key() == KEY.name


def test_an_interrupt_ends_a_running_compiler_the_signal_did_not_reach(cache_root, monkeypatch, interrupts, tmp_path):
    # The fake compiler blocks on the gate until the test closes it, so a build that waited for its
    # compiler would still be running when the test gives up on it (a bound for a hang, not a timing).
    monkeypatch.setenv("FAKE_JIT_BUILD_GATE", str(fake_jit.make_gate(tmp_path / "gate")))
    raised = []

    def build():
        try:
            fake_jit.fake_cache().get(KEY)
        except BaseException as error:
            raised.append(error)

    builder = threading.Thread(target=build)
    builder.start()
    with fake_jit.open_gate(tmp_path / "gate"):  # the fake compiler runs
        interrupts.stop()  # what the command line does on Ctrl-C; no signal reached the compiler
        builder.join(120)
        waited = builder.is_alive()
    builder.join()
    assert not waited, "the build waited for its compiler"
    assert [type(error) for error in raised] == [KeyboardInterrupt]
    assert not (entry_of(cache_root).parent / f"{entry_of(cache_root).name}.failed.log").exists()
    assert not entry_of(cache_root).exists() and not list(entry_of(cache_root).parent.glob(".staging-*"))


def test_a_compiler_ended_by_sigint_is_an_interrupt_and_leaves_no_failure_log(cache_root):
    def builder(spec, build_dir):
        return build_module.interrupt.run(["sh", "-c", "kill -INT $$"], build_dir)

    with pytest.raises(KeyboardInterrupt):
        KernelCache(builder=builder, loader=fake_jit.fake_load, spec_for=fake_jit.fake_spec).get(KEY)
    assert not list(entry_of(cache_root).parent.glob("*.failed.log")) and not entry_of(cache_root).exists()


# ---- a build leaves the process's environment alone ---------------------------------------------

FAKE_NVCC = """#!{python}
import pathlib, sys
if sys.argv[1:] == ["--version"]:
    print("fake nvcc")
    sys.exit(0)
pathlib.Path({argv!r}).write_text("\\n".join(sys.argv[1:]))
open({gate!r}).read()  # compiling, until the test closes the gate
pathlib.Path(sys.argv[sys.argv.index("-o") + 1]).write_text("object")
print("ptxas info    : fake")
"""

FAKE_LINKER = """#!{python}
import pathlib, sys
pathlib.Path(sys.argv[sys.argv.index("-o") + 1]).write_text("module")
"""


def test_a_build_changes_nothing_in_the_environment_other_threads_read(tmp_path, monkeypatch):
    """Another thread reads os.environ while the (fake) compiler runs: it is what it was before."""
    home, build_dir = tmp_path / "cuda", tmp_path / "build"
    for folder in (home / "bin", home / "include", build_dir):
        folder.mkdir(parents=True)
    (home / "include" / "cuda.h").write_text("#define CUDA_VERSION 13000\n")
    argv, gate = str(tmp_path / "argv"), fake_jit.make_gate(tmp_path / "gate")
    for path, script in ((home / "bin" / "nvcc", FAKE_NVCC), (tmp_path / "linker", FAKE_LINKER)):
        path.write_text(script.format(python=sys.executable, argv=argv, gate=str(gate)))
        path.chmod(0o755)
    monkeypatch.setenv("CUDA_HOME", str(home))
    monkeypatch.setenv("CXX", str(tmp_path / "linker"))
    before, seen = dict(os.environ), []

    def read_while_compiling():
        with fake_jit.open_gate(gate):  # the fake compiler runs until this closes
            seen.append(dict(os.environ))

    reader = threading.Thread(target=read_while_compiling)
    reader.start()
    spec = build_module.build_spec(KEY)
    try:
        result = build_module.compile_module(spec, build_dir)
    finally:
        reader.join()
    assert os.path.exists(argv), "the fake compiler never ran"
    assert seen == [before] and dict(os.environ) == before
    # The arch is pinned to sm_90a in the compiler's arguments, never left to a default or plain sm_90.
    arguments = Path(argv).read_text().splitlines()
    assert [a for a in arguments if "arch" in a] == ["-gencode=arch=compute_90a,code=sm_90a"]
    assert all(flag in arguments for flag in spec.flags)
    assert result.so_name == f"{KEY.name}.so" and (build_dir / result.so_name).read_text() == "module"
    assert "-gencode=arch=compute_90a,code=sm_90a" in result.command and "ptxas info    : fake" in result.log


def test_an_interrupted_warmup_starts_no_further_compile_and_a_later_one_builds(cache_root, monkeypatch, tmp_path, interrupts):
    compilers = tmp_path / "compilers.log"
    monkeypatch.setenv("FAKE_JIT_COMPILER_LOG", str(compilers))
    monkeypatch.setenv("FAKE_JIT_BUILD_SECONDS", "0.1")

    def builder(spec, build_dir):
        if spec.key.topk == 1:  # its compiler dies of a Ctrl-C
            return build_module.interrupt.run(["sh", "-c", "kill -INT $$"], build_dir)
        return fake_jit.fake_build(spec, build_dir)

    monkeypatch.setattr(sparse_mla.jit, "_cpu_count", lambda: 1)
    monkeypatch.setattr(sparse_mla.jit, "_CACHE", KernelCache(builder=builder, loader=fake_jit.fake_load, spec_for=fake_jit.fake_spec))
    with pytest.raises(KeyboardInterrupt):
        sparse_mla.warmup(d_qk=576, topk=[1, 2, 3])
    assert not compilers.exists(), "a compiler started after the interrupt"
    sparse_mla.warmup(d_qk=576, topk=[2, 3])  # the process went on: it compiles again
    assert len(compilers.read_text().split()) == 2
