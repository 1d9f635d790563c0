"""The command line (SPEC §7) without a compiler: list, clean, env and argument errors. The real
prebuild is in the nvcc tier."""

from __future__ import annotations

import subprocess
import sys

import pytest

import fake_jit
from sparse_mla.__main__ import main
from sparse_mla.jit.key import KernelKey


def run_cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "sparse_mla", *args], capture_output=True, text=True, env=env, timeout=120)


def test_help_lists_the_commands():
    result = run_cli("--help")
    assert result.returncode == 0
    for command in ("prebuild", "list", "clean", "env"):
        assert command in result.stdout


@pytest.mark.parametrize("args", [["prebuild", "--topk", "2048"], ["prebuild", "--d-qk", "320", "--topk", "64"], ["prebuild", "--d-qk", "576", "--topk", "0"]])
def test_prebuild_argument_errors(args):
    result = run_cli(*args)
    assert result.returncode == 2 and "error" in result.stderr


def test_list_reports_ok_and_corrupt_entries_then_clean_removes_them(tmp_path, monkeypatch, capsys):
    cache = fake_jit.fake_cache()
    good, _ = cache.prebuild(KernelKey(576, 2048), tmp_path)
    bad, _ = cache.prebuild(KernelKey(512, 512), tmp_path)
    (bad / "fake.so").write_bytes(b"garbage")
    assert main(["list", "--cache-dir", str(tmp_path)]) == 0
    listing = capsys.readouterr().out
    assert "2 entries" in listing
    lines = {line.split()[1]: line.split()[0] for line in listing.splitlines()[1:]}
    assert lines == {"sparse_mla_prefill_dqk576_topk2048_sm90a": "stale", "sparse_mla_prefill_dqk512_topk512_sm90a": "corrupt"}
    assert main(["clean", "--cache-dir", str(tmp_path)]) == 0
    assert not (tmp_path / "sm90a").exists()


def test_env_prints_the_resolved_configuration(tmp_path):
    result = run_cli("env", env={**__import__("os").environ, "SPARSE_MLA_JIT_CACHE_DIR": str(tmp_path)})
    assert result.returncode == 0, result.stderr
    assert f"cache dir (writable):  {tmp_path}" in result.stdout
