"""The environment's switches and the toolkit: a value a switch does not accept, and a CUDA_HOME that
is not a toolkit, are errors that say so where they are read, and a kernel lookup checks every switch
before it loads or compiles anything."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import sparse_mla
from sparse_mla.errors import ConfigurationError, ToolchainError
from sparse_mla.jit import env
from sparse_mla.jit.build import build_spec, compile_module
from sparse_mla.jit.cache import KernelCache
from sparse_mla.jit.key import KernelKey

ROOT = Path(__file__).resolve().parents[2]
FLAGS = {
    "SPARSE_MLA_DISABLE_JIT": env.jit_disabled,
    "SPARSE_MLA_JIT_VERBOSE": env.verbose,
    "SPARSE_MLA_BATCH_INVARIANT": env.batch_invariant,
}


@pytest.mark.parametrize("name", FLAGS)
@pytest.mark.parametrize("value, meaning", [("1", True), ("TRUE", True), (" yes ", True), ("on", True),
                                            ("0", False), ("False", False), ("no", False), ("off", False), ("", False)])
def test_a_flag_reads_the_accepted_words(monkeypatch, name, value, meaning):
    monkeypatch.setenv(name, value)
    assert FLAGS[name]() is meaning


@pytest.mark.parametrize("name", FLAGS)
@pytest.mark.parametrize("value", ["maybe", "2", "enabled"])
def test_a_flag_with_another_value_is_an_error_naming_it_and_the_accepted_words(monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    with pytest.raises(ConfigurationError, match=rf"^{name}='{value}' is neither on \(1, true, yes, on\) nor off "
                                                 r"\(0, false, no, off or empty\)"):
        FLAGS[name]()
    assert issubclass(ConfigurationError, ValueError) and issubclass(ConfigurationError, sparse_mla.SparseMLAError)


@pytest.mark.parametrize("name, value", [("SPARSE_MLA_TOKEN_GROUPS", "bogus"), ("SPARSE_MLA_BATCH_INVARIANT", "maybe"),
                                         ("SPARSE_MLA_DISABLE_JIT", "sometimes")])
def test_a_lookup_checks_every_switch_before_it_loads_or_compiles(monkeypatch, tmp_path, name, value):
    monkeypatch.setenv("SPARSE_MLA_JIT_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv(name, value)
    cache = KernelCache(spec_for=lambda key: pytest.fail("the lookup went on past a bad switch"))
    with pytest.raises(ConfigurationError, match=name):
        cache.get(KernelKey(576, 64))
    with pytest.raises(ConfigurationError, match=name):
        sparse_mla.warmup(d_qk=576, topk=3)  # a key no test of this process has loaded
    assert not any(tmp_path.iterdir())


def _toolkit(root):
    for name in ("bin/nvcc", "include/cuda.h"):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text("#define CUDA_VERSION 13000\n" if name.endswith(".h") else "")
    return root


@pytest.mark.parametrize("variable", ["CUDA_HOME", "CUDA_PATH"])
def test_a_set_cuda_home_that_is_no_toolkit_is_an_error_not_another_toolkit(monkeypatch, tmp_path, variable):
    monkeypatch.setattr(env, "DEFAULT_CUDA_HOME", str(_toolkit(tmp_path / "default")))
    for name in ("CUDA_HOME", "CUDA_PATH"):
        monkeypatch.delenv(name, raising=False)
    assert env.cuda_home() == tmp_path / "default"
    monkeypatch.setenv(variable, str(tmp_path / "not-a-toolkit"))
    with pytest.raises(ToolchainError, match=rf"^{variable}={tmp_path / 'not-a-toolkit'} is not a CUDA toolkit "
                                             r"\(it needs bin/nvcc and include/cuda.h\)"):
        env.cuda_home()
    monkeypatch.setenv(variable, str(_toolkit(tmp_path / "chosen")))
    assert env.cuda_home() == tmp_path / "chosen"
    monkeypatch.setenv(variable, "")  # set but empty: as if unset
    assert env.cuda_home() == tmp_path / "default"


def test_a_bad_cuda_home_stops_a_compile_but_not_a_node_that_loads_prebuilt_kernels(monkeypatch, tmp_path):
    """A lookup matches entries as on a host without a toolkit (the newest its driver runs); a compile
    raises, naming the variable."""
    monkeypatch.setattr(env, "DEFAULT_CUDA_HOME", str(_toolkit(tmp_path / "default")))
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "runtime-only"))
    spec = build_spec(KernelKey(576, 64))
    assert spec.cuda_version is None
    with pytest.raises(ToolchainError, match=f"^CUDA_HOME={tmp_path / 'runtime-only'} is not a CUDA toolkit"):
        compile_module(spec, tmp_path)
    monkeypatch.delenv("CUDA_HOME")
    assert build_spec(KernelKey(576, 64)).cuda_version == "13000"


def test_the_env_command_shows_a_bad_cuda_home_and_a_bad_switch_and_env_json_fails(tmp_path):
    environment = {k: v for k, v in os.environ.items() if not k.startswith("SPARSE_MLA_")}
    environment.update(CUDA_HOME=str(tmp_path), SPARSE_MLA_TOKEN_GROUPS="bogus",
                       SPARSE_MLA_JIT_CACHE_DIR=str(tmp_path / "cache"))

    def run(*args):
        return subprocess.run([sys.executable, "-m", "sparse_mla", *args], capture_output=True, text=True,
                              env=environment, timeout=120)

    shown = run("env")
    assert shown.returncode == 0, shown.stderr
    assert f"CUDA toolkit:               error: CUDA_HOME={tmp_path} is not a CUDA toolkit" in shown.stdout, shown.stdout
    assert "switches:                   error: SPARSE_MLA_TOKEN_GROUPS must be one of auto, always, never, got 'bogus'" in shown.stdout
    as_json = run("env", "--json")
    assert as_json.returncode == 1 and as_json.stdout == "", as_json.stdout
    assert as_json.stderr.startswith(f"error: CUDA_HOME={tmp_path} is not a CUDA toolkit"), as_json.stderr
    assert "Traceback" not in as_json.stderr


def test_the_readme_lists_every_variable_the_package_reads():
    package = Path(sparse_mla.__file__).resolve().parent
    read = {name for path in package.rglob("*.py") for name in re.findall(r"\"(SPARSE_MLA_[A-Z_]+)\"", path.read_text())}
    assert {"SPARSE_MLA_TOKEN_GROUPS", "SPARSE_MLA_LOG_LEVEL", "SPARSE_MLA_DISABLE_JIT"} <= read, read
    table = (ROOT / "README.md").read_text().split("## Environment variables", 1)[1].split("\n## ", 1)[0]
    listed = set(re.findall(r"^\| `(SPARSE_MLA_[A-Z_]+)` \|", table, re.MULTILINE))
    assert listed == read
