"""Marks every test with its tier (the folder it lives in): cpu, nvcc or gpu."""

import pathlib

import pytest


def pytest_collection_modifyitems(config, items):
    for item in items:
        tier = pathlib.Path(str(item.fspath)).parent.name
        if tier in ("cpu", "nvcc", "gpu"):
            item.add_marker(getattr(pytest.mark, tier))
