"""Build the incumbent that ``bench.py --incumbent`` times: sglang's SM90 Q8KV8 sparse prefill, unmodified.

    python benchmarks/incumbent.py                     # writes .incumbent/sglang_q8kv8.so, prints its version
    python benchmarks/bench.py --incumbent .incumbent/sglang_q8kv8.so

It downloads sglang's published wheel of the pinned version with pip (``--no-deps``: nothing is
installed; about 40 MB), checks the file's sha256, takes the kernel's folder out of it, and compiles it
for sm_90a into a tvm-ffi module exporting the kernel's three entry functions, under the names sglang's
own JIT gives them (``dispatch``, ``dispatch_full``, ``dispatch_topk_length``), with the flags sglang's
JIT compiles it with. It needs what this library's prebuild needs (nvcc, apache-tvm-ffi, nvidia-cutlass;
no GPU): about 80 s of compiling on 2 cores. The wheel is fetched for one fixed platform whatever this
machine is, so that every run gets the same file and its pinned hash; only the kernel's sources are
used from it. The version, the wheel and the toolchain are written to ``sglang_q8kv8.json`` beside the
module.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

SGLANG_VERSION = "0.5.23"
WHEEL = f"sglang-{SGLANG_VERSION}-cp311-cp311-manylinux_2_34_x86_64.whl"
WHEEL_SHA256 = "00b3cd5b265ac76c64185fbb6b95424f324ddd9f428d0306b77bc9db9d859937"
KERNEL = "sparse_mla_q8kv8_prefill_sm90"
KERNEL_DIR = f"sglang/kernels/jit/csrc/{KERNEL}/"
MODULE = "sglang_q8kv8"
# (exported name, C++ function in namespace sglang): the wrappers sglang's JIT declares for this kernel.
ENTRIES = (
    ("dispatch", "sparse_prefill_q8kv8_dispatch"),
    ("dispatch_full", "sparse_prefill_q8kv8_dispatch_full"),
    ("dispatch_topk_length", "sparse_prefill_q8kv8_dispatch_topk_length"),
)
# sglang's JIT default flags for SM90 (the arch macro, C++20, -O3, relaxed constexpr) and the kernel's own.
CUDA_FLAGS = (
    "-DSGL_CUDA_ARCH=900", "-std=c++20", "-O3", "--expt-relaxed-constexpr",
    "-DNDEBUG", "-DCUTE_USE_PACKED_TUPLE=1", "-DCUTLASS_ENABLE_TENSOR_CORE_MMA=1", "--use_fast_math",
)
ARCH = "9.0a"


def download_command(directory: Path) -> list[str]:
    """pip's command for the pinned wheel, whatever Python and platform run it."""
    return [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
            "--python-version", "3.11", "--implementation", "cp", "--abi", "cp311",
            "--platform", "manylinux_2_34_x86_64", "--dest", str(directory), f"sglang=={SGLANG_VERSION}"]


def check_wheel(wheel: Path) -> None:
    """Raises SystemExit unless ``wheel`` is the pinned file."""
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    if wheel.name != WHEEL or digest != WHEEL_SHA256:
        raise SystemExit(f"{wheel.name} (sha256 {digest}) is not the pinned {WHEEL} (sha256 {WHEEL_SHA256}): "
                         f"refusing to build from it")


def extract_kernel(wheel: Path, destination: Path) -> Path:
    """The kernel's folder out of ``wheel``, under ``destination``; returns the folder."""
    with zipfile.ZipFile(wheel) as archive:
        members = [name for name in archive.namelist() if name.startswith(KERNEL_DIR) and not name.endswith("/")]
        if not any(name.endswith("/entry.cuh") for name in members):
            raise SystemExit(f"{wheel.name} has no {KERNEL_DIR}entry.cuh")
        archive.extractall(destination, members)
    return destination / KERNEL_DIR


def fetch_kernel(destination: Path) -> Path:
    """The kernel's folder of the pinned wheel under ``destination``, downloaded unless already there."""
    kernel = destination / KERNEL_DIR
    if (kernel / "entry.cuh").is_file():
        return kernel
    with tempfile.TemporaryDirectory() as directory:
        subprocess.run(download_command(Path(directory)), check=True)
        wheel = Path(directory) / WHEEL
        if not wheel.is_file():
            raise SystemExit(f"pip did not download {WHEEL} (found {sorted(os.listdir(directory))})")
        check_wheel(wheel)
        return extract_kernel(wheel, destination)


def translation_unit(kernel: Path) -> str:
    """The one source file compiled: the kernel's entry header and an export per entry function."""
    exports = "".join(f"TVM_FFI_DLL_EXPORT_TYPED_FUNC({name}, sglang::{function});\n" for name, function in ENTRIES)
    return f'#include "{kernel / "entry.cuh"}"\n#include <tvm/ffi/function.h>\n\n{exports}'


def build(out: Path) -> tuple[Path, dict]:
    """Compile the module into ``out``; returns its path and what was built (for the JSON beside it)."""
    import tvm_ffi.cpp

    from sparse_mla.jit import env

    kernel = fetch_kernel(out / "src")
    home = env.cuda_home()
    if home is None:
        raise SystemExit("nvcc was not found: set CUDA_HOME to a CUDA toolkit")
    cutlass = env.cutlass()
    source = out / f"{MODULE}.cu"
    source.write_text(translation_unit(kernel))
    # tvm-ffi reads the toolkit and the arch from the environment; this process only builds.
    os.environ["CUDA_HOME"] = str(home)
    os.environ["TVM_FFI_CUDA_ARCH_LIST"] = ARCH
    module = tvm_ffi.cpp.build(MODULE, cuda_files=[str(source)], extra_cuda_cflags=list(CUDA_FLAGS),
                               extra_include_paths=[*cutlass.include_dirs, str(kernel)], build_directory=str(out))
    for leftover in out.glob("*.o"):
        leftover.unlink()
    nvcc = subprocess.run([str(home / "bin" / "nvcc"), "--version"], capture_output=True, text=True).stdout
    record = {
        "sglang": SGLANG_VERSION,
        "kernel": KERNEL,
        "wheel": WHEEL,
        "wheel_sha256": WHEEL_SHA256,
        "arch": ARCH,
        "flags": list(CUDA_FLAGS),
        "nvcc": next((line for line in nvcc.splitlines() if "release" in line), None),  # "... release 13.0, V13.0.88"
        "nvidia-cutlass": cutlass.version,
        "apache-tvm-ffi": env.tvm_ffi_version(),
    }
    (out / f"{MODULE}.json").write_text(json.dumps(record, indent=2) + "\n")
    return Path(module), record


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(".incumbent"), help="folder of the module (default .incumbent)")
    args = parser.parse_args(argv)
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    module, record = build(out)
    print(f"incumbent: sglang {record['sglang']} {record['kernel']} (unmodified, from {record['wheel']}), "
          f"built for sm_90a with {record['nvcc']}, CUTLASS {record['nvidia-cutlass']}")
    print(module)


if __name__ == "__main__":
    main()
