"""The kernel cache survives faults, proven with the real compiler through the prebuild command.

Every scenario runs ``python -m sparse_mla prebuild ... --cache-dir DIR`` in subprocesses (the JIT's own
code) with nvcc for sm_90a, each test in its own cache directory, on kernel keys no other test compiles:

1. two processes asking for the same new key at once compile it once: the second, started while the
   first compiles (its compiler paused until then), waits on the entry's file lock (seen in
   /proc/locks), then reports it ``cached``; the entry is ``ok``;
2. a compiler process killed with SIGKILL mid-build fails the prebuild with a FAILED row for the key
   and leaves no entry (no staging folder either); the next prebuild builds it and it is ``ok``;
3. the building Python process killed with SIGKILL mid-build releases the entry's lock at once (the
   compiler it started, which ninja puts in process groups of its own, still runs then) and leaves no
   loadable entry, only a ``.staging-*`` folder; the next prebuild builds the key and removes it;
4. a built ``.so`` truncated, or overwritten with garbage of the same size, is ``corrupt`` in ``list``,
   and the next prebuild rebuilds it (``built``) and ``list`` shows it ``ok`` again;
5. a fresh process with the JIT disabled, pointed at a cache whose entry is corrupt (a ``.so`` that
   would still load, but no longer matches its checksum), never loads it: it raises
   ``JITDisabledError`` naming the prebuild command, and the process carries on.

Five full compiles and two killed ones, about 90 s on two cores: the compile is single threaded, so
the two damaged copies of test 4 rebuild side by side, and checks that only read the cache overlap the
startup of the next process.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sparse_mla.jit import env

if env.cuda_home() is None:
    pytest.skip(
        "nvcc not found: the nvcc tier needs the CUDA toolkit (set CUDA_HOME)", allow_module_level=True
    )

from sparse_mla.jit.build import build_spec  # noqa: E402
from sparse_mla.jit.store import read_intact  # noqa: E402
from sparse_mla.jit.key import KernelKey  # noqa: E402

# Keys that no other test compiles, so no cache entry or build is shared with them.
KEY_SHARED = KernelKey(576, 33)  # built concurrently (test 1), then damaged in copies (tests 4 and 5)
KEY_COMPILER_KILLED = KernelKey(512, 17)  # test 2
KEY_PYTHON_KILLED = KernelKey(576, 5)  # test 3

BUILD_TIMEOUT = 600  # one compile takes ~15 s on 2 cores; this only stops a hung run
QUICK_TIMEOUT = 120  # list, a cache hit, a killed run

# The processes of a compile (`nvcc --version`, a probe run before it, does not count).
COMPILERS = ("nvcc", "cudafe++", "cicc", "ptxas", "gcc", "cc1plus")
# Those that run for seconds, so that killing one lands mid-build and never on one that just ended
# (each host preprocessor pass, gcc -E, lasts a few hundredths of a second): nvcc's C++ front end,
# its device compiler and its assembler, the victims an out-of-memory killer would pick.
LONG_RUNNING_COMPILERS = ("cudafe++", "cicc", "ptxas")


# ---- subprocesses ----------------------------------------------------------------------------------


def _child_env(**extra: str) -> dict[str, str]:
    """The environment with no SPARSE_MLA_* setting of the caller's leaking into the scenario."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith("SPARSE_MLA_")}
    environment.update(extra)
    return environment


def spawn(argv: list[str], **extra_env: str) -> subprocess.Popen:
    """``argv`` in a session of its own, so that killing it never reaches this process's group."""
    return subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_child_env(**extra_env),
        start_new_session=True,
    )


def start(*args: str, cache_dir: Path) -> subprocess.Popen:
    """``python -m sparse_mla ARGS --cache-dir DIR``."""
    return spawn([sys.executable, "-m", "sparse_mla", *args, "--cache-dir", str(cache_dir)])


def finish(proc: subprocess.Popen, timeout: float) -> subprocess.CompletedProcess:
    """Waits for ``proc``; past ``timeout`` kills it and every compiler it started, and fails."""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_groups(process_groups_of(proc.pid))
        out, err = proc.communicate()
        pytest.fail(f"`{' '.join(proc.args)}` did not finish in {timeout} s\n{_output(out, err)}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def cli(*args: str, cache_dir: Path, timeout: float = QUICK_TIMEOUT) -> subprocess.CompletedProcess:
    return finish(start(*args, cache_dir=cache_dir), timeout)


def prebuild_args(key: KernelKey) -> tuple[str, ...]:
    return ("prebuild", "--d-qk", str(key.d_qk), "--topk", str(key.topk))


def _output(stdout: str, stderr: str) -> str:
    return f"--- stdout ---\n{stdout}--- stderr ---\n{stderr}"


def show(result: subprocess.CompletedProcess) -> str:
    command = " ".join(result.args[1:])
    return f"`{command}` exited {result.returncode}\n{_output(result.stdout, result.stderr)}"


def summary_statuses(result: subprocess.CompletedProcess, key: KernelKey) -> list[str]:
    """The status column of ``key``'s rows in prebuild's summary table (stdout)."""
    return re.findall(rf"^{re.escape(key.name)}\s+(\S+)\s", result.stdout, re.MULTILINE)


def list_states(result: subprocess.CompletedProcess, key: KernelKey) -> list[str]:
    """The state column of ``key``'s rows in ``list``'s output."""
    return re.findall(rf"^\s+(\S+)\s+{re.escape(key.name)}\s", result.stdout, re.MULTILINE)


# ---- /proc -----------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Process:
    pid: int
    ppid: int
    pgrp: int
    comm: str
    state: str


def process_table() -> dict[int, Process]:
    """Every process, from /proc/<pid>/stat."""
    table = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
        except OSError:  # it ended meanwhile
            continue
        comm = stat[stat.index("(") + 1 : stat.rindex(")")]  # comm may hold spaces and parentheses
        state, ppid, pgrp = stat[stat.rindex(")") + 2 :].split()[:3]
        table[int(name)] = Process(int(name), int(ppid), int(pgrp), comm, state)
    return table


def descendants(root: int) -> dict[int, Process]:
    """Every process below ``root`` (by parent pid)."""
    table = process_table()
    children: dict[int, list[int]] = {}
    for process in table.values():
        children.setdefault(process.ppid, []).append(process.pid)
    found, todo = {}, list(children.get(root, []))
    while todo:
        pid = todo.pop()
        found[pid] = table[pid]
        todo.extend(children.get(pid, []))
    return found


def process_groups_of(pid: int) -> set[int]:
    """The process groups of ``pid`` and of everything below it. ninja starts each command in a group
    of its own, so the compiler is not in the prebuild's group."""
    return {pid} | {process.pgrp for process in descendants(pid).values()}


def kill_groups(groups: set[int]) -> None:
    for group in groups - {os.getpgrp()}:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(group, signal.SIGKILL)


def wait_until_gone(processes: dict[int, Process], timeout: float) -> None:
    """Waits until none of ``processes`` runs any more (ended, or a zombie)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(
        p.pid in processes and p.comm == processes[p.pid].comm and p.state != "Z"
        for p in process_table().values()
    ):
        time.sleep(0.05)


def _cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().decode(errors="replace").split("\0")
    except OSError:
        return []


def kill_when_compiling(
    proc: subprocess.Popen, key: KernelKey, compilers: tuple[str, ...], *, kill_prebuild: bool,
    sig: signal.Signals = signal.SIGKILL,
) -> tuple[str, dict[int, Process]]:
    """Waits until one of ``compilers`` compiles below ``proc``, then SIGKILLs (or sends ``sig`` to) that
    compiler, or the prebuild itself when ``kill_prebuild``. Returns (what was signalled, the processes
    below ``proc`` just before the signal); fails if the build ends first."""
    deadline = time.monotonic() + BUILD_TIMEOUT
    while proc.poll() is None and time.monotonic() < deadline:
        below = descendants(proc.pid)
        for process in sorted(below.values(), key=lambda p: p.pid):
            if process.comm not in compilers or process.state == "Z" or "--version" in _cmdline(process.pid):
                continue
            victim = proc.pid if kill_prebuild else process.pid
            try:
                os.kill(victim, sig)
            except ProcessLookupError:  # it ended between the scan and the kill: look again
                break
            what = f"the prebuild (pid {victim})" if kill_prebuild else f"{process.comm} (pid {victim})"
            return f"{what} while {process.comm} compiled {key.name}", below
        time.sleep(0.02)
    if proc.poll() is None:
        kill_groups(process_groups_of(proc.pid))
    result = finish(proc, QUICK_TIMEOUT)
    pytest.fail(
        f"no {'/'.join(compilers)} process was seen compiling {key.name} under the prebuild before it ended, "
        f"so nothing could be killed mid-build and this run proves nothing\n{show(result)}"
    )


# ---- the cache on disk -----------------------------------------------------------------------------


def entry_dir(root: Path, key: KernelKey) -> Path:
    return build_spec(key).entry_dir(root)


def lock_file(root: Path, key: KernelKey) -> Path:
    entry = entry_dir(root, key)
    return entry.parent / f".{entry.name}.lock"


def key_dir_contents(root: Path, key: KernelKey) -> list[str]:
    key_dir = entry_dir(root, key).parent
    return sorted(p.name for p in key_dir.iterdir()) if key_dir.is_dir() else []


def blocked_lock_waiters(lock: Path) -> set[int]:
    """Pids blocked in flock() on ``lock``, from /proc/locks (a waiter's line reads ``N: -> FLOCK ...``)."""
    try:
        stat = os.stat(lock)
        with open("/proc/locks") as f:
            lines = f.read().splitlines()
    except OSError:
        return set()
    device_inode = f"{os.major(stat.st_dev):02x}:{os.minor(stat.st_dev):02x}:{stat.st_ino}"
    waiters = set()
    for line in lines:
        fields = line.split()
        if len(fields) > 6 and fields[1] == "->" and fields[2] == "FLOCK" and fields[6] == device_inode:
            waiters.add(int(fields[5]))
    return waiters


# ---- test 1: concurrent first builds ---------------------------------------------------------------


@pytest.fixture(scope="module")
def concurrent_build(tmp_path_factory):
    """Two prebuilds of KEY_SHARED into one new cache, the second started while the first compiles:
    (cache dir, {pid: result}, the pids seen blocked on the entry's lock). The first's compiler is
    stopped (SIGSTOP) from the moment it is seen until the second is seen waiting on the lock, so the
    two overlap however slowly the second starts. Tests 4 and 5 copy the entry it leaves (an entry holds
    no absolute path, so a copied cache root stays valid)."""
    cache_dir = tmp_path_factory.mktemp("concurrent")
    first = start(*prebuild_args(KEY_SHARED), cache_dir=cache_dir)
    procs = [first]
    lock, waiters = lock_file(cache_dir, KEY_SHARED), set()
    try:
        kill_when_compiling(first, KEY_SHARED, LONG_RUNNING_COMPILERS, kill_prebuild=False, sig=signal.SIGSTOP)
        procs.append(start(*prebuild_args(KEY_SHARED), cache_dir=cache_dir))
        deadline = time.monotonic() + BUILD_TIMEOUT
        while not waiters and procs[1].poll() is None and time.monotonic() < deadline:
            waiters = blocked_lock_waiters(lock) & {p.pid for p in procs}
            time.sleep(0.05)
    finally:
        for pid in descendants(first.pid):  # the stopped compiler goes on
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        results = {p.pid: finish(p, BUILD_TIMEOUT) for p in procs}
    return cache_dir, results, waiters


def built_entry(concurrent_build) -> Path:
    """The cache root test 1 built, after checking it holds an intact entry of KEY_SHARED."""
    cache_dir, results, _ = concurrent_build
    entry = entry_dir(cache_dir, KEY_SHARED)
    assert read_intact(cache_dir, entry).state == "ok", "test 1's concurrent build left no intact entry:\n" + "\n".join(
        show(r) for r in results.values()
    )
    return cache_dir


def test_two_processes_building_one_new_key_at_once_compile_it_once(concurrent_build):
    cache_dir, results, waiters = concurrent_build
    report = "\n".join(show(r) for r in results.values())
    assert all(r.returncode == 0 for r in results.values()), report
    statuses = {pid: summary_statuses(r, KEY_SHARED) for pid, r in results.items()}
    assert sorted(statuses.values()) == [["built"], ["cached"]], f"not one built, one cached\n{report}"
    builder = next(pid for pid, status in statuses.items() if status == ["built"])
    waiter = next(pid for pid, status in statuses.items() if status == ["cached"])
    assert "compiling" in results[builder].stderr and "compiled" in results[builder].stderr, report
    assert "compil" not in results[waiter].stderr, f"the `cached` process logged a compile\n{report}"
    assert f"waiting for the build of {KEY_SHARED.name} held by pid {builder} on " in results[waiter].stderr, report
    # Concurrency, not just a second run: the process that reported `cached` was seen blocked on the
    # entry's lock while the other held it to compile.
    assert waiters == {waiter}, (
        f"the `cached` prebuild (pid {waiter}) was never seen in /proc/locks waiting on "
        f"{lock_file(cache_dir, KEY_SHARED)} (waiters seen: {waiters}), so the two did not overlap\n{report}"
    )
    listing = cli("list", cache_dir=cache_dir)
    assert list_states(listing, KEY_SHARED) == ["ok"], show(listing)


# ---- test 2: the compiler killed mid-build ---------------------------------------------------------


def test_a_compiler_killed_mid_build_leaves_no_entry_and_the_next_prebuild_builds_it(tmp_path):
    key = KEY_COMPILER_KILLED
    proc = start(*prebuild_args(key), cache_dir=tmp_path)
    killed, _ = kill_when_compiling(proc, key, LONG_RUNNING_COMPILERS, kill_prebuild=False)
    failed = finish(proc, BUILD_TIMEOUT)
    assert failed.returncode != 0, f"the prebuild succeeded although {killed} was killed\n{show(failed)}"
    assert summary_statuses(failed, key) == ["FAILED"], f"no FAILED row for the key\n{show(failed)}"

    digest16 = entry_dir(tmp_path, key).name
    left = set(key_dir_contents(tmp_path, key))
    allowed = {f".{digest16}.lock", f"{digest16}.failed.log"}  # no entry, no staging folder
    assert left <= allowed, f"killing {killed} left {sorted(left - allowed)} in the cache\n{show(failed)}"
    # `list` looks at the failed state while the next prebuild starts up (3 s of imports): holding the
    # entry's lock keeps that prebuild from building before `list` is done.
    with open(lock_file(tmp_path, key), "a+") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        rebuild = start(*prebuild_args(key), cache_dir=tmp_path)
        try:
            listing = cli("list", cache_dir=tmp_path)
        except BaseException:
            kill_groups(process_groups_of(rebuild.pid))
            raise
    rebuilt = finish(rebuild, BUILD_TIMEOUT)
    assert "ok" not in list_states(listing, key), show(listing)
    assert rebuilt.returncode == 0 and summary_statuses(rebuilt, key) == ["built"], show(rebuilt)
    left = key_dir_contents(tmp_path, key)
    assert not [n for n in left if n.startswith(".staging-")], f"the rebuild left {left}\n{show(rebuilt)}"
    listing = cli("list", cache_dir=tmp_path)
    assert list_states(listing, key) == ["ok"], show(listing)


# ---- test 3: the building Python process killed mid-build ------------------------------------------


def test_a_prebuild_killed_mid_build_leaves_only_staging_and_the_next_prebuild_cleans_it(tmp_path):
    key = KEY_PYTHON_KILLED
    proc = start(*prebuild_args(key), cache_dir=tmp_path)
    killed, below = kill_when_compiling(proc, key, COMPILERS, kill_prebuild=True)
    try:
        assert proc.wait(timeout=QUICK_TIMEOUT) == -signal.SIGKILL, killed
        running = sorted(p.comm for p in process_table().values() if p.pid in below and p.state != "Z")

        # The lock went with the process, although the compiler it started (in process groups of
        # ninja's, which the kill does not reach) still runs: the next build need not wait for it.
        with open(lock_file(tmp_path, key), "a+") as handle:
            try:
                fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                pytest.fail(f"the lock is still held after killing {killed} (still running: {running})")
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)

        left = key_dir_contents(tmp_path, key)
        staging = [n for n in left if n.startswith(".staging-")]
        unexpected = set(left) - set(staging) - {lock_file(tmp_path, key).name}
        assert not unexpected, f"killing {killed} left {sorted(unexpected)} besides staging folders"
        assert staging, f"killing {killed} left no staging folder, so its cleanup is not tested: {left}"
    finally:
        # Then what it started dies too (as when a job or container stops), so that the orphaned
        # compiler neither competes with the next build for the two cores nor outlives the test.
        kill_groups({p.pgrp for p in below.values()})
        finish(proc, QUICK_TIMEOUT)
        wait_until_gone(below, QUICK_TIMEOUT)

    rebuilt = cli(*prebuild_args(key), cache_dir=tmp_path, timeout=BUILD_TIMEOUT)
    assert rebuilt.returncode == 0 and summary_statuses(rebuilt, key) == ["built"], show(rebuilt)
    remaining = [n for n in key_dir_contents(tmp_path, key) if n.startswith(".staging-")]
    assert not remaining, f"after the rebuild, staging folders {remaining} remain (leftovers were {staging})"
    assert read_intact(tmp_path, entry_dir(tmp_path, key)).state == "ok", f"no intact entry\n{show(rebuilt)}"


# ---- test 4: a damaged .so ---------------------------------------------------------------------------


def _truncate(so: Path) -> None:
    os.truncate(so, so.stat().st_size // 2)


def _garbage(so: Path) -> None:
    so.write_bytes(random.Random(0).randbytes(so.stat().st_size))  # same size: only the checksum tells


def test_a_truncated_or_garbage_so_is_corrupt_and_the_next_prebuild_rebuilds_it(concurrent_build, tmp_path):
    source = built_entry(concurrent_build)
    # Each damage in a copy of test 1's cache (one build for both); the copies rebuild side by side.
    roots = {damage: tmp_path / damage.__name__.strip("_") for damage in (_truncate, _garbage)}
    for damage, root in roots.items():
        shutil.copytree(source, root)
        damage(entry_dir(root, KEY_SHARED) / f"{KEY_SHARED.name}.so")

    def in_parallel(*args: str, timeout: float = QUICK_TIMEOUT) -> dict[str, subprocess.CompletedProcess]:
        procs = {root.name: start(*args, cache_dir=root) for root in roots.values()}
        return {name: finish(proc, timeout) for name, proc in procs.items()}

    for name, listing in in_parallel("list").items():
        assert list_states(listing, KEY_SHARED) == ["corrupt"], f"{name}: {show(listing)}"
    for name, rebuilt in in_parallel(*prebuild_args(KEY_SHARED), timeout=BUILD_TIMEOUT).items():
        report = f"{name}: {show(rebuilt)}"
        assert rebuilt.returncode == 0 and summary_statuses(rebuilt, KEY_SHARED) == ["built"], report
        assert "rebuilding unusable cache entry" in rebuilt.stderr, report
    for name, listing in in_parallel("list").items():
        assert list_states(listing, KEY_SHARED) == ["ok"], f"{name}: {show(listing)}"
    for root in roots.values():
        trash = [n for n in key_dir_contents(root, KEY_SHARED) if n.startswith((".trash-", ".staging-"))]
        assert not trash, f"{root.name}: the rebuild left {trash}"


# ---- test 5: a fresh process with the JIT disabled meets a corrupt entry -----------------------------

LOAD_SCRIPT = """
import sys
from sparse_mla.errors import JITDisabledError
from sparse_mla.jit import get_module, KernelKey

cache_dir, so = sys.argv[1], sys.argv[2]
try:
    print("LOADED", get_module(KernelKey({d_qk}, {topk})).kernel_key())
except JITDisabledError as error:
    print("JITDisabledError:", error)
    print("prebuild_command:", error.prebuild_command)
with open("/proc/self/maps") as maps:
    print("mapped from the cache:", sorted({{line.split()[-1] for line in maps if cache_dir in line}}))
# The control: the damaged file is a loadable module of the right kernel; only its checksum is wrong.
import tvm_ffi
print("control:", tvm_ffi.load_module(so).kernel_key())
"""


def test_a_process_with_the_jit_disabled_never_loads_a_corrupt_entry(concurrent_build, tmp_path):
    key, root = KEY_SHARED, tmp_path / "cache"
    shutil.copytree(built_entry(concurrent_build), root)
    so = entry_dir(root, key) / f"{key.name}.so"
    with open(so, "ab") as f:  # the module still loads (see the control below); its checksum differs
        f.write(b"\0sparse_mla test: bytes appended after the ELF image\0")
    # `list` and the fresh process only read the cache: they run side by side.
    listing = start("list", cache_dir=root)
    script = LOAD_SCRIPT.format(d_qk=key.d_qk, topk=key.topk)
    loader = spawn(
        [sys.executable, "-c", script, str(root), str(so)],
        SPARSE_MLA_JIT_CACHE_DIR=str(root),
        SPARSE_MLA_DISABLE_JIT="1",
    )
    listing, result = finish(listing, QUICK_TIMEOUT), finish(loader, QUICK_TIMEOUT)
    assert list_states(listing, key) == ["corrupt"], show(listing)

    report = f"the fresh process exited {result.returncode}\n{_output(result.stdout, result.stderr)}"
    assert result.returncode == 0, report
    assert "LOADED" not in result.stdout, f"the corrupt entry was loaded\n{report}"
    command = f"python -m sparse_mla prebuild --d-qk {key.d_qk} --topk {key.topk}"
    assert re.search(rf"^JITDisabledError: .*{re.escape(command)}(?!\d)", result.stdout, re.MULTILINE), report
    assert f"prebuild_command: {command}\n" in result.stdout, report
    assert "mapped from the cache: []" in result.stdout, f"a file of the cache was mapped\n{report}"
    warning = f"not loading cache entry {entry_dir(root, key)}: corrupt ({key.name}.so does not match its checksum)"
    assert warning in result.stderr, f"the corrupt entry was not reported\n{report}"
    control = f"control: {key.name}"
    assert control in result.stdout, f"the damaged module does not load, so this proves less\n{report}"
