"""A fake builder, loader and build spec for the cache tests: fast, and usable from child processes.

The fake "module" is a file starting with ``FAKE:`` and the key name; anything else fails to load,
as a truncated or garbage ``.so`` would. A build also leaves the by-products a real one does (an object
file, ninja's files), which are not published. Every build appends a line to ``$FAKE_JIT_BUILD_LOG``, so
a test can count compiles across processes; ``$FAKE_JIT_BUILD_SECONDS`` makes each build that slow, spent
in a child process (``sleep``) that the build starts as it starts ninja: a SIGINT to the process group,
or an interrupt of the process, ends it and the build is interrupted. ``$FAKE_JIT_BUILD_GATE``, the path
of a FIFO (``make_gate``), makes that child (``cat``) block on it instead: ``open_gate`` returns once the
compiler is running, and closing what it returned lets the compiler end, so a test orders its steps
against the build without guessing how long anything takes. Each such compiler appends its pid to
``$FAKE_JIT_COMPILER_LOG`` (when set) as it starts.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from pathlib import Path
from typing import IO, Any

from sparse_mla.jit import interrupt
from sparse_mla.jit.build import BuildResult, BuildSpec
from sparse_mla.jit.cache import KernelCache
from sparse_mla.jit.key import KernelKey, generated_source


class FakeModule:
    def __init__(self, name: str) -> None:
        self._name = name

    def kernel_key(self) -> str:
        return self._name


# The digest's inputs of a real spec (build.build_spec), with made-up values.
FAKE_INPUTS: dict[str, Any] = {
    "source_sha256": "generated-source",
    "arch": "sm_90a",
    "flags": ["-O2", "-fake"],
    "link_flags": ["-shared"],
    "headers": {"sparse_mla/entry.cuh": "entry-v1", "sparse_mla/sm90/consumer.cuh": "consumer-v1"},
    "cutlass": "4.2.0.0",
    "tvm_ffi": "0.1.15",
}


def fake_spec(key: KernelKey, cuda_version: str | None = "13000", **inputs: Any) -> BuildSpec:
    """The spec of ``key`` on a host with CUDA ``cuda_version`` and FAKE_INPUTS, ``inputs`` replacing some."""
    recorded = {"key": key.name, **FAKE_INPUTS, **inputs}
    return BuildSpec(
        key=key,
        source=generated_source(key),
        flags=("-fake",),
        include_dirs=(),
        inputs=recorded,
        source_digest=hashlib.sha256(json.dumps(recorded, sort_keys=True).encode()).hexdigest(),
        cuda_version=cuda_version,
    )


def fake_build(spec: BuildSpec, build_dir: Path) -> BuildResult:
    log = os.environ.get("FAKE_JIT_BUILD_LOG")
    if log:
        with open(log, "a") as f:
            f.write(f"{os.getpid()} {spec.key.name}\n")
    gate, seconds = os.environ.get("FAKE_JIT_BUILD_GATE"), os.environ.get("FAKE_JIT_BUILD_SECONDS")
    if gate or seconds:
        # The compiler, after it appended its pid to $FAKE_JIT_COMPILER_LOG (when set): `cat` of the gate
        # (until the test closes its end), or `sleep`.
        record = 'if [ -n "$FAKE_JIT_COMPILER_LOG" ]; then echo $$ >> "$FAKE_JIT_COMPILER_LOG"; fi; '
        argv = [record + 'exec cat "$0" > /dev/null', gate] if gate else [record + 'exec sleep "$0"', seconds]
        if interrupt.run(["sh", "-c", *argv], build_dir).returncode != 0:
            raise RuntimeError("the fake compiler failed")
    for by_product in ("cuda_0.o", "build.ninja", ".ninja_log"):
        (build_dir / by_product).write_bytes(b"by-product")
    # The build folder's name (a fresh staging folder each build) makes every build's bytes its own.
    (build_dir / "fake.so").write_bytes(f"FAKE:{spec.key.name}\n{build_dir.name}\n".encode())
    return BuildResult(so_name="fake.so", log="fake build", command="fake-nvcc -c x.cu", toolchain="fake")


def fake_load(so_path: Path) -> FakeModule:
    data = Path(so_path).read_bytes()
    if not data.startswith(b"FAKE:"):
        raise OSError(f"{so_path}: invalid ELF header")
    return FakeModule(data[5:].split(b"\n", 1)[0].decode())


def fake_cache(**inputs: Any) -> KernelCache:
    """A cache that builds and loads with the fakes, on a host whose specs are ``fake_spec(key, **inputs)``."""
    return KernelCache(builder=fake_build, loader=fake_load, spec_for=lambda key: fake_spec(key, **inputs))


def get_in_child(d_qk: int, topk: int, barrier) -> str:
    """Entry point of a child process: wait for all siblings, then ask for the same key."""
    barrier.wait()
    return fake_cache().get(KernelKey(d_qk, topk)).kernel_key()


def make_gate(path: Path) -> Path:
    """A FIFO at ``path`` for $FAKE_JIT_BUILD_GATE."""
    os.mkfifo(path)
    return path


def open_gate(path: Path, timeout: float = 120.0) -> IO[str]:
    """Returns once a fake compiler has opened the gate ``path`` (it runs, and blocks reading it until the
    returned file is closed). The FIFO's open is the rendezvous; ``timeout`` only ends a test whose
    compiler never starts."""
    opened: list[IO[str]] = []
    opener = threading.Thread(target=lambda: opened.append(open(path, "w")), daemon=True)
    opener.start()
    opener.join(timeout)
    if opener.is_alive():
        os.close(os.open(path, os.O_RDONLY | os.O_NONBLOCK))  # a reader of our own lets the open return
        opener.join()
        for gate in opened:
            gate.close()
        raise AssertionError(f"no fake compiler opened {path} in {timeout} s")
    if not opened:
        raise AssertionError(f"{path} could not be opened")
    return opened[0]


def compilers_of(pid: int) -> list[int]:
    """The pids of the running fake compilers (``sleep``, ``cat``) whose parent is ``pid``, from /proc."""
    found = []
    for name in os.listdir("/proc"):
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
        except (OSError, ValueError):
            continue
        comm, fields = stat[stat.index("(") + 1 : stat.rindex(")")], stat[stat.rindex(")") + 2 :].split()
        if comm in ("sleep", "cat") and int(fields[1]) == pid and fields[0] != "Z":
            found.append(int(name))
    return found
