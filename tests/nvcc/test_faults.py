"""The kernel cache survives faults, proven with the real compiler through the prebuild command.

Every scenario runs ``python -m sparse_mla prebuild ... --cache-dir DIR`` in subprocesses (the JIT's own
code) with nvcc for sm_90a, each test in its own cache directory, on kernel keys no other test compiles:

1. two processes asking for the same new key at once compile it once: one waits on the entry's file
   lock while the other compiles (seen in /proc/locks), then reports it ``cached``; the entry is ``ok``;
2. a compiler process killed with SIGKILL mid-build fails the prebuild with a FAILED row for the key
   and leaves no entry (no staging folder either); the next prebuild builds it and it is ``ok``;
3. the building Python process killed with SIGKILL mid-build releases the lock at once (even while the
   compiler processes it started still run) and leaves no loadable entry, only a ``.staging-*``
   folder; the next prebuild builds the key and removes that folder;
4. a built ``.so`` truncated, or overwritten with garbage of the same size, is ``corrupt`` in ``list``,
   and the next prebuild rebuilds it (``built``) and ``list`` shows it ``ok`` again;
5. a fresh process with the JIT disabled, pointed at a cache whose entry is corrupt (a ``.so`` that
   would still load, but no longer matches its checksum), never loads it: it raises
   ``JITDisabledError`` naming the prebuild command, and the process carries on.

The whole file compiles five kernels; builds that do not depend on each other run two at a time (the
compile is single threaded and CI has two cores).
"""

from __future__ import annotations

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
    pytest.skip("nvcc not found: the nvcc tier needs the CUDA toolkit (set CUDA_HOME)", allow_module_level=True)

from sparse_mla.jit.build import build_spec  # noqa: E402
from sparse_mla.jit.cache import read_entry  # noqa: E402
from sparse_mla.jit.key import KernelKey  # noqa: E402

# Keys that no other test compiles, so no cache entry or build is shared with them.
KEY_SHARED = KernelKey(576, 33)  # built concurrently (test 1), then damaged in copies (tests 4 and 5)
KEY_COMPILER_KILLED = KernelKey(512, 17)  # test 2
KEY_PYTHON_KILLED = KernelKey(576, 5)  # test 3

BUILD_TIMEOUT = 600  # one compile takes ~15 s on 2 cores; this only stops a hung run
QUICK_TIMEOUT = 120  # list, a cache hit, a killed run

# Compiler processes that run for seconds (so a SIGKILL lands mid-build, never on one that just ended):
# nvcc's C++ front end, its device compiler and its assembler. The host preprocessor passes (gcc -E)
# last a few hundredths of a second, and `nvcc --version` is a probe, not the build.
LONG_RUNNING_COMPILERS = ("cudafe++", "cicc", "ptxas")


# ---- subprocesses ----------------------------------------------------------------------------------


def _child_env(**extra: str) -> dict[str, str]:
    """The environment with no SPARSE_MLA_* setting of the caller's leaking into the scenario."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith("SPARSE_MLA_")}
    environment.update(extra)
    return environment


def start(*args: str, cache_dir: Path) -> subprocess.Popen:
    """``python -m sparse_mla ARGS --cache-dir DIR`` in its own process group (so it and every
    compiler it starts can be killed together)."""
    return subprocess.Popen(
        [sys.executable, "-m", "sparse_mla", *args, "--cache-dir", str(cache_dir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_child_env(),
        start_new_session=True,
    )


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def finish(proc: subprocess.Popen, timeout: float) -> subprocess.CompletedProcess:
    """Waits for ``proc``; on timeout kills its group and fails. Leftover processes of its group (a
    compiler orphaned by a kill) are killed either way."""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        out, err = proc.communicate()
        pytest.fail(f"`{' '.join(proc.args)}` did not finish in {timeout} s\n{_output(out, err)}")
    finally:
        _kill_group(proc)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def cli(*args: str, cache_dir: Path, timeout: float = QUICK_TIMEOUT) -> subprocess.CompletedProcess:
    return finish(start(*args, cache_dir=cache_dir), timeout)


def prebuild_args(key: KernelKey) -> tuple[str, ...]:
    return ("prebuild", "--d-qk", str(key.d_qk), "--topk", str(key.topk))


def _output(stdout: str, stderr: str) -> str:
    return f"--- stdout ---\n{stdout}--- stderr ---\n{stderr}"


def show(result: subprocess.CompletedProcess) -> str:
    return f"`{' '.join(result.args[1:])}` exited {result.returncode}\n{_output(result.stdout, result.stderr)}"


def summary_statuses(result: subprocess.CompletedProcess, key: KernelKey) -> list[str]:
    """The status column of ``key``'s rows in prebuild's summary table (stdout)."""
    return re.findall(rf"^{re.escape(key.name)}\s+(\S+)\s", result.stdout, re.MULTILINE)


def list_states(result: subprocess.CompletedProcess, key: KernelKey) -> list[str]:
    """The state column of ``key``'s rows in ``list``'s output."""
    return re.findall(rf"^\s+(\S+)\s+{re.escape(key.name)}\s", result.stdout, re.MULTILINE)


# ---- /proc -----------------------------------------------------------------------------------------


def _process_table() -> dict[int, tuple[int, str, str]]:
    """pid -> (ppid, comm, state) of every process, from /proc/<pid>/stat."""
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
        state, ppid = stat[stat.rindex(")") + 2 :].split()[:2]
        table[int(name)] = (int(ppid), comm, state)
    return table


def descendants(root: int) -> dict[int, tuple[str, str]]:
    """pid -> (comm, state) of every process below ``root``."""
    table = _process_table()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    found, todo = {}, list(children.get(root, []))
    while todo:
        pid = todo.pop()
        found[pid] = table[pid][1:]
        todo.extend(children.get(pid, []))
    return found


def kill_compiler_when_running(proc: subprocess.Popen, key: KernelKey, *, kill_self: bool) -> str:
    """Waits until one of LONG_RUNNING_COMPILERS runs below ``proc``, then SIGKILLs that compiler, or
    ``proc`` itself when ``kill_self``. Returns what was killed; fails if the build ends first."""
    deadline = time.monotonic() + BUILD_TIMEOUT
    while proc.poll() is None and time.monotonic() < deadline:
        for pid, (comm, state) in sorted(descendants(proc.pid).items()):
            if comm in LONG_RUNNING_COMPILERS and state != "Z":
                victim = proc.pid if kill_self else pid
                try:
                    os.kill(victim, signal.SIGKILL)
                except ProcessLookupError:  # it ended between the scan and the kill: look again
                    break
                return f"prebuild (pid {proc.pid}) while {comm} ran" if kill_self else f"{comm} (pid {pid})"
        time.sleep(0.02)
    result = finish(proc, QUICK_TIMEOUT)
    pytest.fail(
        f"no {'/'.join(LONG_RUNNING_COMPILERS)} process was seen under the prebuild of {key.name} before it "
        f"ended, so nothing could be killed mid-build and this run proves nothing\n{show(result)}"
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
    """Two prebuilds of KEY_SHARED started together into one new cache. Tests 4 and 5 copy the entry
    it leaves (an entry holds no absolute path, so a copied cache root stays valid)."""
    cache_dir = tmp_path_factory.mktemp("concurrent")
    procs = [start(*prebuild_args(KEY_SHARED), cache_dir=cache_dir) for _ in range(2)]
    lock, waiters = lock_file(cache_dir, KEY_SHARED), set()
    deadline = time.monotonic() + BUILD_TIMEOUT
    try:
        while not waiters and any(p.poll() is None for p in procs) and time.monotonic() < deadline:
            waiters = blocked_lock_waiters(lock) & {p.pid for p in procs}
            time.sleep(0.05)
    finally:
        results = [finish(p, BUILD_TIMEOUT) for p in procs]
    return cache_dir, results, waiters


def test_two_processes_building_one_new_key_at_once_compile_it_once(concurrent_build):
    cache_dir, results, waiters = concurrent_build
    report = "\n".join(show(r) for r in results)
    assert all(r.returncode == 0 for r in results), report
    statuses = [summary_statuses(r, KEY_SHARED) for r in results]
    assert sorted(statuses) == [["built"], ["cached"]], f"expected one built and one cached: {statuses}\n{report}"
    builder, waiter = results if statuses[0] == ["built"] else results[::-1]
    assert "compiling" in builder.stderr and "compiling" not in waiter.stderr, report
    # The run proves concurrency only if the second process reached the cache while the first compiled.
    waiter_pid = next(p for p, r in zip(waiters or [0], results) if r is waiter) if waiters else None
    assert waiters, f"no prebuild was ever seen blocked on {lock_file(cache_dir, KEY_SHARED)}\n{report}"
    assert waiter_pid is not None or len(waiters) == 1, waiters
    listing = cli("list", cache_dir=cache_dir)
    assert list_states(listing, KEY_SHARED) == ["ok"], show(listing)
