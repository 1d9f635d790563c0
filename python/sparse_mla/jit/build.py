"""Build description of a kernel key, its digest, and the compile (nvcc through ninja).

The digest covers everything that changes the binary: the key, the generated source, the arch, the
compile and link flags, the contents of every header under ``include/sparse_mla/``, the CUTLASS
version, the CUDA toolkit version and the tvm-ffi version (its headers and the library the module
links). It does not cover absolute paths, so moving a cache root or the checkout keeps every entry
valid, and a module prebuilt on one host loads on another.

The build is a ``build.ninja`` written into the build folder and run with ninja: every toolchain choice
(the toolkit's nvcc by absolute path, the pinned arch, the include and library folders) is written into
it, so the build changes nothing in the process's environment, which other threads keep reading.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shlex
import shutil
import sys
from pathlib import Path
from typing import Any

from sparse_mla.errors import ToolchainError
from sparse_mla.jit import env, interrupt
from sparse_mla.jit.key import KernelKey, generated_source

# nvcc flags besides the arch. Device code is optimized by ptxas at -O3 by default; -O2 is for the host
# side, whose object is linked into a shared library (-fPIC). -Xptxas=-v puts registers, shared memory
# and spills into the build log (the nvcc test tier reads it).
CUDA_FLAGS = (
    "-Xcompiler",
    "-fPIC",
    "-std=c++17",
    "-O2",
    "-DNDEBUG",
    "-lineinfo",
    "--expt-relaxed-constexpr",
    "-Xptxas=-v",
)
# The "a" keeps wgmma/setmaxnreg available: code for plain sm_90 would not compile, and must never be
# what a build falls back to.
GENCODE = {"sm90a": "-gencode=arch=compute_90a,code=sm_90a"}
# The module links tvm-ffi's library and the CUDA runtime (the folders are added where they are found).
LINK_FLAGS = ("-shared", "-ltvm_ffi", "-lcudart")


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
    flags: tuple[str, ...]  # nvcc's flags, the arch's included
    include_dirs: tuple[str, ...]
    inputs: dict[str, Any]  # the digest's inputs, recorded in key.json
    source_digest: str  # digest of everything but the CUDA toolkit version
    cuda_version: str | None  # None: no toolkit here (this host can load prebuilt modules only)

    @property
    def digest(self) -> str:
        return _sha256(f"{self.source_digest}\ncuda {self.cuda_version}")

    def entry_dir(self, root: Path) -> Path:
        """``<root>/<arch>/<name>/<digest16>``."""
        return root / self.key.arch / self.key.name / self.digest[:16]


def headers_digest(include: Path) -> dict[str, str]:
    """The sha256 of every kernel header, by its path below ``include``."""
    return {str(p.relative_to(include)): file_sha256(p) for p in env.header_files()}


def build_spec(key: KernelKey) -> BuildSpec:
    """Describe the build of ``key``; reads files but starts no subprocess."""
    source = generated_source(key)
    include = env.include_dir()
    cutlass = env.cutlass()
    inputs = {
        "key": key.name,
        "source_sha256": _sha256(source),
        "arch": GENCODE[key.arch].rsplit("=", 1)[1],
        "flags": list(CUDA_FLAGS),
        "link_flags": list(LINK_FLAGS),
        "headers": headers_digest(include),
        "cutlass": cutlass.version,
        "tvm_ffi": env.tvm_ffi_version(),
    }
    return BuildSpec(
        key=key,
        source=source,
        flags=CUDA_FLAGS + (GENCODE[key.arch],),
        include_dirs=(str(include),) + cutlass.include_dirs,
        inputs=inputs,
        source_digest=_sha256(json.dumps(inputs, sort_keys=True)),
        cuda_version=env.cuda_version(env.lookup_cuda_home()),
    )


@dataclasses.dataclass(frozen=True)
class BuildResult:
    so_name: str  # file name of the module inside the build directory
    log: str  # the compiler's full output
    command: str  # the compile command line, for error messages
    toolchain: str  # `nvcc --version`, recorded in key.json


def _ninja() -> str:
    found = shutil.which("ninja")
    if found is not None:
        return found
    # The `ninja` wheel installs its launcher beside the interpreter, which may not be on PATH.
    beside_python = Path(sys.executable).parent / "ninja"
    if beside_python.exists():
        return str(beside_python)
    raise ToolchainError("`ninja` is not on PATH: `pip install ninja`")


def _command(args: list[str]) -> str:
    """``args`` as a shell command line inside build.ninja (where ``$`` starts a variable)."""
    return " ".join(shlex.quote(arg) for arg in args).replace("$", "$$")


def ninja_file(spec: BuildSpec, cuda_home: Path, so_name: str) -> str:
    """The build.ninja that compiles ``spec`` (``<name>.cu`` in the build folder) into ``so_name``."""
    from tvm_ffi import libinfo  # the only place the package imports tvm-ffi's build support

    includes = dict.fromkeys([libinfo.find_include_path(), libinfo.find_dlpack_include_path(), *spec.include_dirs])
    compile_args = [str(cuda_home / "bin" / "nvcc"), *spec.flags, *(f"-I{Path(i).resolve()}" for i in includes)]
    libraries = [f"-L{Path(libinfo.find_libtvm_ffi()).parent}", f"-L{cuda_home / 'lib64'}"]
    cxx = os.environ.get("CXX", "c++").replace("$", "$$")  # as written: it may be a command with arguments
    return "\n".join(
        [
            "ninja_required_version = 1.3",
            "rule compile_cuda",
            f"  command = {_command(compile_args)} -c $in -o $out",
            "rule link",
            f"  command = {cxx} $in {_command([*LINK_FLAGS, *libraries])} -o $out",
            f"build cuda_0.o: compile_cuda {spec.key.name}.cu",
            f"build {so_name}: link cuda_0.o",
            f"default {so_name}",
            "",
        ]
    )


def _compile_command(text: str) -> str:
    for line in text.splitlines():
        if "nvcc" in line and " -c " in line:
            return line.split("] ", 1)[-1].strip()
    return ""


def compile_module(spec: BuildSpec, build_dir: Path) -> BuildResult:
    """Compile ``spec`` into ``build_dir``; raises RuntimeError with the log on failure, and
    KeyboardInterrupt when the build was interrupted."""
    cuda_home = env.cuda_home()
    if cuda_home is None:
        raise ToolchainError(
            "nvcc was not found (looked at $CUDA_HOME, $CUDA_PATH, /usr/local/cuda and PATH): install "
            "the CUDA toolkit or set CUDA_HOME, or load a prebuilt cache with SPARSE_MLA_PREBUILT_DIRS"
        )
    ninja = _ninja()
    so_name = f"{spec.key.name}.so"
    (build_dir / f"{spec.key.name}.cu").write_text(spec.source)
    (build_dir / "build.ninja").write_text(ninja_file(spec, cuda_home, so_name))
    toolchain = interrupt.run([str(cuda_home / "bin" / "nvcc"), "--version"], build_dir).stdout.strip()
    result = interrupt.run([ninja, "-v"], build_dir)
    if result.returncode != 0:
        raise RuntimeError(f"ninja exited with status {result.returncode}\n{result.stdout}")
    return BuildResult(so_name=so_name, log=result.stdout, command=_compile_command(result.stdout), toolchain=toolchain)


def describe_failure(error: BaseException, build_dir: Path) -> tuple[str, str]:
    """The (command, full output) of a failed compile, from the build's error and build.ninja."""
    text = str(error)
    command = _compile_command(text)
    if not command and (build_dir / "build.ninja").is_file():
        command = f"ninja -v -C {build_dir}  # see build.ninja"
    return command or "ninja -v", text
