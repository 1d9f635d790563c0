"""A non-editable wheel ships the kernel headers inside the package, where the JIT finds them."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

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
    for module in ("__init__.py", "api.py", "validate.py", "__main__.py", "jit/cache.py", "testing/__init__.py"):
        assert f"sparse_mla/{module}" in names
