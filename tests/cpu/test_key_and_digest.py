"""Kernel keys, the generated source and the digest that names a cache entry."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from sparse_mla.jit import build as build_module
from sparse_mla.jit import env
from sparse_mla.jit.key import KernelKey, generated_source


def test_key_name_and_prebuild_command():
    key = KernelKey(576, 2048)
    assert key.name == "sparse_mla_prefill_dqk576_topk2048_sm90a"
    assert key.prebuild_command == "python -m sparse_mla prebuild --d-qk 576 --topk 2048"
    assert KernelKey(576, 2048) == key and hash(KernelKey(576, 2048)) == hash(key)


@pytest.mark.parametrize("d_qk, topk, arch", [(320, 64, "sm90a"), (576, 0, "sm90a"), (576, -1, "sm90a"), (576, 64, "sm90"), (576, 2.0, "sm90a")])
def test_invalid_keys(d_qk, topk, arch):
    with pytest.raises(ValueError):
        KernelKey(d_qk, topk, arch)


def test_generated_source_instantiates_the_entry_and_exports_the_key():
    source = generated_source(KernelKey(512, 100))
    assert "#include <sparse_mla/entry.cuh>" in source
    assert "sparse_mla::prefill_fwd<512, 100>" in source
    assert "TVM_FFI_DLL_EXPORT_TYPED_FUNC(prefill_fwd, prefill_fwd)" in source
    assert '"sparse_mla_prefill_dqk512_topk100_sm90a"' in source


def _copy_headers(tmp_path, monkeypatch):
    include = tmp_path / "include"
    shutil.copytree(env.include_dir(), include)
    monkeypatch.setattr(env, "include_dir", lambda: include)
    return include


def test_digest_is_stable_and_distinct_per_key(tmp_path, monkeypatch):
    spec = build_module.build_spec(KernelKey(576, 2048))
    assert spec.digest == build_module.build_spec(KernelKey(576, 2048)).digest
    assert spec.digest != build_module.build_spec(KernelKey(576, 512)).digest
    assert spec.digest != build_module.build_spec(KernelKey(512, 2048)).digest
    assert spec.entry_dir(tmp_path) == tmp_path / "sm90a" / spec.key.name / spec.digest[:16]


def test_a_header_edit_changes_the_digest(tmp_path, monkeypatch):
    include = _copy_headers(tmp_path, monkeypatch)
    before = build_module.build_spec(KernelKey(576, 2048)).digest
    kernel = next((include / "sparse_mla" / "sm90").rglob("*.cuh"))
    kernel.write_text(kernel.read_text() + "\n// an edit\n")
    assert build_module.build_spec(KernelKey(576, 2048)).digest != before


def test_a_new_header_changes_the_digest(tmp_path, monkeypatch):
    include = _copy_headers(tmp_path, monkeypatch)
    before = build_module.build_spec(KernelKey(576, 2048)).digest
    (include / "sparse_mla" / "sm90" / "extra.cuh").write_text("#pragma once\n")
    assert build_module.build_spec(KernelKey(576, 2048)).digest != before


def test_moving_the_headers_keeps_the_digest(tmp_path, monkeypatch):
    before = build_module.build_spec(KernelKey(576, 2048)).digest
    _copy_headers(tmp_path, monkeypatch)
    assert build_module.build_spec(KernelKey(576, 2048)).digest == before


@pytest.mark.parametrize(
    "patch",
    [
        ("cuda_version", lambda home: "12080"),
        ("tvm_ffi_version", lambda: "0.0.1"),
        ("cutlass", lambda: env.Cutlass(version="3.9.0", include_dirs=())),
    ],
)
def test_toolchain_versions_change_the_digest(monkeypatch, patch):
    before = build_module.build_spec(KernelKey(576, 2048)).digest
    monkeypatch.setattr(env, patch[0], patch[1])
    assert build_module.build_spec(KernelKey(576, 2048)).digest != before


@pytest.mark.parametrize(
    "name, value",
    [
        ("CUDA_FLAGS", build_module.CUDA_FLAGS + ("--use_fast_math",)),
        ("LINK_FLAGS", build_module.LINK_FLAGS + ("-lcuda",)),
        ("GENCODE", {"sm90a": "-gencode=arch=compute_90,code=sm_90"}),
    ],
)
def test_flags_and_the_arch_change_the_digest(monkeypatch, name, value):
    before = build_module.build_spec(KernelKey(576, 2048)).digest
    monkeypatch.setattr(build_module, name, value)
    assert build_module.build_spec(KernelKey(576, 2048)).digest != before


def test_the_arch_is_pinned_to_sm_90a_in_the_compile_flags():
    spec = build_module.build_spec(KernelKey(576, 2048))
    assert [flag for flag in spec.flags if "arch" in flag] == ["-gencode=arch=compute_90a,code=sm_90a"]
    assert spec.inputs["arch"] == "sm_90a"


def test_cache_dir_does_not_enter_the_digest(monkeypatch, tmp_path):
    before = build_module.build_spec(KernelKey(576, 2048)).digest
    monkeypatch.setenv("SPARSE_MLA_JIT_CACHE_DIR", str(tmp_path))
    assert build_module.build_spec(KernelKey(576, 2048)).digest == before


def test_cuda_home_skips_a_wrapper_script_on_path(tmp_path, monkeypatch):
    wrapper_bin = tmp_path / "bin"
    wrapper_bin.mkdir()
    (wrapper_bin / "nvcc").write_text("#!/bin/sh\nexec /somewhere/nvcc \"$@\"\n")
    (wrapper_bin / "nvcc").chmod(0o755)
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.setenv("PATH", str(wrapper_bin))
    home = env.cuda_home()
    assert home is None or (home / "include" / "cuda.h").is_file()
    assert home != tmp_path


def test_import_is_cheap():
    """Importing the package imports no tvm-ffi, initializes no CUDA, and starts no compiler."""
    script = (
        "import sys, torch, sparse_mla, sparse_mla.testing\n"
        "print('tvm_ffi' in sys.modules, torch.cuda.is_initialized())\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False", "False"]
