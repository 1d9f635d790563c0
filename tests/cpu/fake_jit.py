"""A fake builder, loader and build spec for the cache tests: fast, and usable from child processes.

The fake "module" is a file starting with ``FAKE:`` and the key name; anything else fails to load,
as a truncated or garbage ``.so`` would. A build also leaves the by-products a real one does (an object
file, ninja's files, tvm-ffi's lock), which are not published. Every build appends a line to
``$FAKE_JIT_BUILD_LOG``, so a test can count compiles across processes; ``$FAKE_JIT_BUILD_SECONDS`` makes
each build that slow, spent in a child process (``sleep``) as a real build spends it in nvcc: a signal
to the process group ends it, and the build fails.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from sparse_mla.jit.build import BuildResult, BuildSpec
from sparse_mla.jit.cache import KernelCache
from sparse_mla.jit.key import KernelKey, generated_source


class FakeModule:
    def __init__(self, name: str) -> None:
        self._name = name

    def kernel_key(self) -> str:
        return self._name


def fake_spec(key: KernelKey, cuda_version: str | None = "13000") -> BuildSpec:
    source = generated_source(key)
    return BuildSpec(
        key=key,
        source=source,
        flags=("-fake",),
        include_dirs=(),
        inputs={"key": key.name},
        source_digest=f"source-of-{key.name}",
        cuda_version=cuda_version,
    )


def fake_build(spec: BuildSpec, build_dir: Path) -> BuildResult:
    log = os.environ.get("FAKE_JIT_BUILD_LOG")
    if log:
        with open(log, "a") as f:
            f.write(f"{os.getpid()} {spec.key.name}\n")
    seconds = os.environ.get("FAKE_JIT_BUILD_SECONDS")
    if seconds:
        subprocess.run(["sleep", seconds], check=True)
    for by_product in ("cuda_0.o", "build.ninja", ".ninja_log", "lock"):
        (build_dir / by_product).write_bytes(b"by-product")
    (build_dir / "fake.so").write_bytes(f"FAKE:{spec.key.name}\n".encode() + os.urandom(64))
    return BuildResult(so_name="fake.so", log="fake build", command="fake-nvcc -c x.cu", toolchain="fake")


def fake_load(so_path: Path) -> FakeModule:
    data = Path(so_path).read_bytes()
    if not data.startswith(b"FAKE:"):
        raise OSError(f"{so_path}: invalid ELF header")
    return FakeModule(data[5:].split(b"\n", 1)[0].decode())


def fake_cache() -> KernelCache:
    return KernelCache(builder=fake_build, loader=fake_load, spec_for=fake_spec)


def get_in_child(d_qk: int, topk: int, barrier) -> str:
    """Entry point of a child process: wait for all siblings, then ask for the same key."""
    barrier.wait()
    return fake_cache().get(KernelKey(d_qk, topk)).kernel_key()
