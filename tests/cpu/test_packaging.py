"""A non-editable wheel ships the kernel headers inside the package, where the JIT finds them, the
py.typed marker and the `sparse-mla` console script; type checkers see the lazy names' signatures;
constraints.txt pins what the tests run with; the build floor and the dev extra say what CI and the
README use."""

from __future__ import annotations

import importlib.metadata
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import sparse_mla

ROOT = Path(__file__).resolve().parents[2]


def test_wheel_contains_the_headers_and_the_package(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr
    (wheel,) = tmp_path.glob("sparse_mla-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    headers = sorted(p.relative_to(ROOT / "include") for p in (ROOT / "include").rglob("*.cuh"))
    assert headers, "no headers in the checkout"
    for header in headers:
        assert f"sparse_mla/include/{header.as_posix()}" in names
    for module in ("__init__.py", "api.py", "validate.py", "__main__.py", "jit/cache.py", "testing/__init__.py", "py.typed",
                   "integrations/sglang.py"):
        assert f"sparse_mla/{module}" in names
    (entry_points,) = [name for name in names if name.endswith(".dist-info/entry_points.txt")]
    text = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert "[console_scripts]\nsparse-mla = sparse_mla.__main__:main\n" in text, text


def test_the_console_script_is_the_command_line():
    script = Path(sys.executable).parent / "sparse-mla"
    assert script.is_file(), f"{script} is missing: the package was installed before [project.scripts] existed"
    result = subprocess.run([str(script), "env", "--help"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.startswith("usage: sparse-mla env "), result.stdout + result.stderr
    assert subprocess.run([str(script), "--version"], capture_output=True, text=True, timeout=120).stdout == (
        f"sparse_mla {sparse_mla.__version__}\n"
    )


TYPED_SNIPPET = """\
from sparse_mla import sparse_mla_q8kv8_prefill_fwd, warmup

reveal_type(warmup)
reveal_type(sparse_mla_q8kv8_prefill_fwd)
warmup(d_qk="576")
"""


def test_a_type_checker_sees_the_lazy_names_with_their_signatures(tmp_path):
    pytest.importorskip("mypy", reason="mypy is not installed (.ci/run installs it)")
    (tmp_path / "snippet.py").write_text(TYPED_SNIPPET)
    environment = dict(os.environ)
    package_parent = Path(sparse_mla.__file__).resolve().parent.parent
    if package_parent.name not in ("site-packages", "dist-packages"):
        environment["MYPYPATH"] = str(package_parent)  # an editable install, which mypy cannot follow
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--follow-imports=silent", "--cache-dir", str(tmp_path / "cache"), "snippet.py"],
        capture_output=True, text=True, cwd=tmp_path, env=environment, timeout=600,
    )
    revealed = re.findall(r'^snippet\.py:(\d+): note: Revealed type is "(.*)"$', result.stdout, re.MULTILINE)
    assert [line for line, _ in revealed] == ["3", "4"], result.stdout
    assert revealed[0][1].startswith("def (d_qk: int | typing.Iterable[int] =, topk: int | typing.Iterable[int] =)")
    assert revealed[1][1].startswith("def (q: torch._tensor.Tensor, kv: torch._tensor.Tensor, indices: torch._tensor.Tensor,")
    assert re.search(r'^snippet\.py:5: error: Argument "d_qk" to "warmup" has incompatible type "str"', result.stdout, re.MULTILINE)


def test_dir_lists_the_lazy_names_without_importing_torch():
    script = "import sys, sparse_mla; print(sorted(set(sparse_mla.__all__) - set(dir(sparse_mla))), 'torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.stdout.split("\n")[0] == "[] False", result.stdout + result.stderr


def test_the_constraints_pin_the_versions_the_tests_run_with():
    pins = dict(
        line.split("==") for line in (ROOT / "constraints.txt").read_text().splitlines() if line and not line.startswith("#")
    )
    assert pins == {name: importlib.metadata.version(name) for name in ("apache-tvm-ffi", "nvidia-cutlass")}


def _pyproject() -> str:
    return (ROOT / "pyproject.toml").read_text()


def test_the_build_requires_a_setuptools_that_reads_the_spdx_license_field():
    """setuptools 76 rejects `license = "Apache-2.0"` (an SPDX expression) with `license-files`; 77 is the
    first that builds the package (checked with `pip wheel . --no-build-isolation` in a venv of each)."""
    (requires,) = re.findall(r"^requires = \[(.*)\]$", _pyproject(), re.MULTILINE)
    floors = re.findall(r'"setuptools>=(\d+)[^"]*"', requires)
    assert floors and int(floors[0]) >= 77, requires
    assert re.search(r'^license = "Apache-2.0"$', _pyproject(), re.MULTILINE), "the floor is for the SPDX license field"


def _extra(name: str) -> list[str]:
    (items,) = re.findall(rf"^{name} = \[(.*)\]$", _pyproject(), re.MULTILINE)
    return re.findall(r'"([^"]+)"', items)


def test_the_dev_extra_is_what_ci_installs_and_what_the_readme_tells_a_developer_to_install():
    """The dev extra is the test extra plus mypy pinned; CI installs it, and no other mypy, so the
    README's test command runs every test CI runs (the type-checker test needs mypy)."""
    dev, test = _extra("dev"), _extra("test")
    assert set(test) < set(dev) and [r for r in dev if r not in test] == [r for r in dev if r.startswith("mypy==")], dev
    ci = (ROOT / ".ci" / "run").read_text()
    assert 'pip install -q ".[dev]" -c constraints.txt' in ci and "mypy==" not in ci
    readme = (ROOT / "README.md").read_text()
    assert 'pip install -e ".[dev]"' in readme and ".[test]" not in readme


def test_the_help_names_the_sparse_mla_command():
    for argv in ([sys.executable, "-m", "sparse_mla", "--help"], [str(Path(sys.executable).parent / "sparse-mla"), "--help"]):
        result = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr
        assert "installs this command as `sparse-mla`; `python -m sparse_mla` is the same\ncommand" in result.stdout, result.stdout
