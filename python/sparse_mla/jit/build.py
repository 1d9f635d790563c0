"""Build description of a kernel key, its digest, and the compile through tvm-ffi.

The digest covers everything that changes the binary: the key, the generated source, the
flags, the contents of every header under ``include/sparse_mla/``, the CUTLASS version, the CUDA
toolkit version and the tvm-ffi version. It does not cover absolute paths, so moving a cache root or
the checkout keeps every entry valid, and a module prebuilt on one host loads on another.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

from sparse_mla.errors import ToolchainError
from sparse_mla.jit import env
from sparse_mla.jit.key import KernelKey, generated_source

# nvcc flags besides the arch (pinned through TVM_FFI_CUDA_ARCH_LIST, see _toolchain_overrides).
# Device code is optimized by ptxas at -O3 by default; tvm-ffi adds -O2 for the host side.
# -Xptxas=-v puts registers, shared memory and spills into the build log (the nvcc test tier reads it).
CUDA_FLAGS = (
    "-std=c++17",
    "-DNDEBUG",
    "-lineinfo",
    "--expt-relaxed-constexpr",
    "-Xptxas=-v",
)
# tvm-ffi spells an arch as compute capability; the "a" keeps wgmma/setmaxnreg available.
_TVM_FFI_ARCH = {"sm90a": "9.0a"}


def _sha256(data: bytes | str) -> str:
    return hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest()


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


@dataclasses.dataclass(frozen=True)
class BuildSpec:
    """What is compiled for a key, and the digest that names its cache entry."""

    key: KernelKey
    source: str
    flags: tuple[str, ...]
    include_dirs: tuple[str, ...]
    inputs: dict  # the digest's inputs, recorded in key.json
    source_digest: str  # digest of everything but the CUDA toolkit version
    cuda_version: str | None  # None: no toolkit here (this host can load prebuilt modules only)

    @property
    def digest(self) -> str:
        return _sha256(f"{self.source_digest}\ncuda {self.cuda_version}")

    def entry_dir(self, root: Path) -> Path:
        """``<root>/<arch>/<name>/<digest16>``."""
        return root / self.key.arch / self.key.name / self.digest[:16]


def build_spec(key: KernelKey) -> BuildSpec:
    """Describe the build of ``key``; reads files but starts no subprocess."""
    source = generated_source(key)
    include = env.include_dir()
    cutlass = env.cutlass()
    inputs = {
        "key": key.name,
        "source_sha256": _sha256(source),
        "flags": list(CUDA_FLAGS) + [f"arch={_TVM_FFI_ARCH[key.arch]}"],
        "headers": {str(p.relative_to(include)): file_sha256(p) for p in env.header_files()},
        "cutlass": cutlass.version,
        "tvm_ffi": env.tvm_ffi_version(),
    }
    return BuildSpec(
        key=key,
        source=source,
        flags=CUDA_FLAGS,
        include_dirs=(str(include),) + cutlass.include_dirs,
        inputs=inputs,
        source_digest=_sha256(json.dumps(inputs, sort_keys=True)),
        cuda_version=env.cuda_version(env.cuda_home()),
    )


@dataclasses.dataclass(frozen=True)
class BuildResult:
    so_name: str  # file name of the module inside the build directory
    log: str  # the compiler's full output
    command: str  # the compile command line, for error messages
    toolchain: str  # `nvcc --version`, recorded in key.json


class _SharedToolchainEnvironment:
    """The process environment tvm-ffi builds with, shared by concurrent builds.

    tvm-ffi reads its settings from ``os.environ`` and logs the compiler output on its own logger. Builds
    that need the same settings run side by side (``prebuild -j``, a ``warmup`` of several keys): the
    first sets the variables and the logger, the last restores them; a build that needs other settings
    waits until no build runs.
    """

    def __init__(self) -> None:
        self._condition = threading.Condition()
        self._active: dict[str, str] | None = None
        self._users = 0
        self._saved: dict[str, str | None] = {}
        self._saved_logger: tuple[int, bool] = (logging.NOTSET, True)

    @contextlib.contextmanager
    def applied(self, overrides: dict[str, str]):
        extension_logger = logging.getLogger("tvm_ffi.cpp.extension")
        with self._condition:
            self._condition.wait_for(lambda: self._users == 0 or self._active == overrides)
            if self._users == 0:
                self._active = overrides
                self._saved = {name: os.environ.get(name) for name in overrides}
                os.environ.update(overrides)
                self._saved_logger = (extension_logger.level, extension_logger.propagate)
                extension_logger.setLevel(logging.INFO)
                extension_logger.propagate = False  # the output goes to build.log (and to our log when verbose)
            self._users += 1
        try:
            yield
        finally:
            with self._condition:
                self._users -= 1
                if self._users == 0:
                    for name, value in self._saved.items():
                        if value is None:
                            os.environ.pop(name, None)
                        else:
                            os.environ[name] = value
                    extension_logger.setLevel(self._saved_logger[0])
                    extension_logger.propagate = self._saved_logger[1]
                    self._active = None
                    self._condition.notify_all()


_ENVIRONMENT = _SharedToolchainEnvironment()


def _toolchain_overrides(spec: BuildSpec, cuda_home: Path) -> dict[str, str]:
    overrides = {
        "TVM_FFI_CUDA_ARCH_LIST": _TVM_FFI_ARCH[spec.key.arch],  # never let it probe nvidia-smi
        "TVM_FFI_GPU_BACKEND": "cuda",
        "CUDA_HOME": str(cuda_home),
        "TVM_FFI_CPP_EXTENSION_LOG_BUILD": "1",  # hand the compiler output to our log
    }
    if shutil.which("ninja") is None:
        # The `ninja` wheel installs its launcher beside the interpreter, which may not be on PATH.
        beside_python = Path(sys.executable).parent
        if not (beside_python / "ninja").exists():
            raise ToolchainError("`ninja` is not on PATH: `pip install ninja`")
        overrides["PATH"] = f"{beside_python}{os.pathsep}{os.environ.get('PATH', '')}"
    return overrides


class _ThreadLogCapture(logging.Handler):
    """Collects the records logged by the thread that created it (concurrent builds log side by side)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self._thread = threading.get_ident()
        self.records: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.thread == self._thread:
            self.records.append(record.getMessage())


def _compile_command(text: str) -> str:
    for line in text.splitlines():
        if "nvcc" in line and " -c " in line:
            return line.split("] ", 1)[-1].strip()
    return ""


def compile_module(spec: BuildSpec, build_dir: Path) -> BuildResult:
    """Compile ``spec`` into ``build_dir`` with tvm-ffi; raises RuntimeError with the log on failure."""
    cuda_home = env.cuda_home()
    if cuda_home is None:
        raise ToolchainError(
            "nvcc was not found (looked at $CUDA_HOME, $CUDA_PATH, /usr/local/cuda and PATH): install "
            "the CUDA toolkit or set CUDA_HOME, or load a prebuilt cache with SPARSE_MLA_PREBUILT_DIRS"
        )
    source_path = build_dir / f"{spec.key.name}.cu"
    source_path.write_text(spec.source)
    toolchain = subprocess.run(
        [str(cuda_home / "bin" / "nvcc"), "--version"], capture_output=True, text=True, check=False
    ).stdout.strip()

    from tvm_ffi import cpp  # the only place the package imports tvm-ffi's build machinery

    capture = _ThreadLogCapture()
    extension_logger = logging.getLogger("tvm_ffi.cpp.extension")
    extension_logger.addHandler(capture)
    try:
        with _ENVIRONMENT.applied(_toolchain_overrides(spec, cuda_home)):
            so_path = cpp.build(
                spec.key.name,
                cuda_files=[str(source_path)],
                extra_cuda_cflags=list(spec.flags),
                extra_include_paths=list(spec.include_dirs),
                build_directory=str(build_dir),
            )
    finally:
        extension_logger.removeHandler(capture)
    log = "\n".join(capture.records)
    return BuildResult(
        so_name=Path(so_path).name, log=log, command=_compile_command(log), toolchain=toolchain
    )


def describe_failure(error: BaseException, build_dir: Path) -> tuple[str, str]:
    """The (command, full output) of a failed compile, from tvm-ffi's error and build.ninja."""
    text = str(error)
    command = _compile_command(text)
    if not command and (build_dir / "build.ninja").is_file():
        command = f"ninja -v -C {build_dir}  # see build.ninja"
    return command or "ninja -v", text
