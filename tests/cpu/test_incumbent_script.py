"""benchmarks/incumbent.py without the network or a compiler: it asks pip for the pinned wheel only,
builds only from that file, takes only the kernel's folder out of it, and exports the entry functions
under the names sglang's JIT gives them (bench.py calls ``dispatch``)."""

from __future__ import annotations

import hashlib
import importlib.util
import zipfile
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "incumbent.py"


@pytest.fixture(scope="module")
def incumbent():
    spec = importlib.util.spec_from_file_location("sparse_mla_incumbent", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_pip_is_asked_for_the_pinned_version_only_without_dependencies(incumbent, tmp_path):
    command = incumbent.download_command(tmp_path)
    assert command[1:4] == ["-m", "pip", "download"] and "--no-deps" in command
    assert command[-1] == f"sglang=={incumbent.SGLANG_VERSION}" and incumbent.SGLANG_VERSION in incumbent.WHEEL
    for option, value in (("--python-version", "3.11"), ("--abi", "cp311"), ("--platform", "manylinux_2_34_x86_64")):
        assert command[command.index(option) + 1] == value and value.replace(".", "") in incumbent.WHEEL.replace(".", "")


def _wheel(path: Path, files: dict[str, str]) -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        for name, text in files.items():
            archive.writestr(name, text)
    return path


def test_a_wheel_other_than_the_pinned_file_is_refused(incumbent, tmp_path):
    wheel = _wheel(tmp_path / incumbent.WHEEL, {incumbent.KERNEL_DIR + "entry.cuh": "// not sglang's"})
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    with pytest.raises(SystemExit, match=f"sha256 {digest}\\) is not the pinned {incumbent.WHEEL} "
                                         f"\\(sha256 {incumbent.WHEEL_SHA256}\\): refusing"):
        incumbent.check_wheel(wheel)


def test_only_the_kernel_s_folder_is_extracted(incumbent, tmp_path):
    wheel = _wheel(tmp_path / "w.whl", {
        incumbent.KERNEL_DIR + "entry.cuh": "entry", incumbent.KERNEL_DIR + "kernel.cuh": "kernel",
        "sglang/srt/server.py": "", "sglang/kernels/jit/csrc/other_kernel/entry.cuh": "",
    })
    kernel = incumbent.extract_kernel(wheel, tmp_path / "src")
    assert kernel == tmp_path / "src" / incumbent.KERNEL_DIR
    found = sorted(str(p.relative_to(tmp_path / "src")) for p in (tmp_path / "src").rglob("*") if p.is_file())
    assert found == [incumbent.KERNEL_DIR + "entry.cuh", incumbent.KERNEL_DIR + "kernel.cuh"]
    with pytest.raises(SystemExit, match="has no sglang/kernels/jit/csrc/sparse_mla_q8kv8_prefill_sm90/entry.cuh"):
        incumbent.extract_kernel(_wheel(tmp_path / "empty.whl", {"sglang/__init__.py": ""}), tmp_path / "other")


def test_the_module_exports_the_entry_functions_under_sglang_s_names(incumbent, tmp_path):
    source = incumbent.translation_unit(tmp_path / "kernel")
    assert source.startswith(f'#include "{tmp_path / "kernel" / "entry.cuh"}"\n')
    assert "TVM_FFI_DLL_EXPORT_TYPED_FUNC(dispatch, sglang::sparse_prefill_q8kv8_dispatch);" in source
    assert [name for name, _ in incumbent.ENTRIES] == ["dispatch", "dispatch_full", "dispatch_topk_length"]


def test_the_readme_builds_the_incumbent_where_bench_py_is_told_to_load_it(incumbent):
    readme = " ".join((SCRIPT.parents[1] / "README.md").read_text().split())  # line breaks as spaces
    default = Path(".incumbent") / f"{incumbent.MODULE}.so"
    assert "python benchmarks/incumbent.py" in readme
    assert f"python benchmarks/bench.py --quick --incumbent {default}" in readme
    assert f"sglang {incumbent.SGLANG_VERSION}'s `{incumbent.KERNEL}` kernel" in readme
