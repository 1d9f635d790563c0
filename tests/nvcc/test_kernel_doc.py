"""docs/kernel.md's budget tables are the compiled headers' numbers: a host program built with nvcc, with
the JIT's include folders and flags, prints every C++ expression the tables name (the shared-memory table's
column headers, the arrival table's expressions), and each printed value must be the one the page states.
The numbers are read from the page, not written here, so a change to `SharedStorage` or to an arrival count
fails here until the page says what the headers now hold."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from sparse_mla.jit import env
from sparse_mla.jit.build import CUDA_FLAGS, GENCODE, build_spec
from sparse_mla.jit.key import KernelKey

if env.cuda_home() is None:
    pytest.skip("nvcc not found: the nvcc tier needs the CUDA toolkit (set CUDA_HOME)", allow_module_level=True)

KERNEL_DOC = Path(__file__).resolve().parents[2] / "docs" / "kernel.md"
# The header that includes every tile, as the entry does.
KERNEL_HEADER = "sparse_mla/sm90/prefill/kernel.cuh"
NAMESPACE = "sparse_mla::sm90::prefill"
# Arrival counts the page must state whatever else it does: one per mbarrier, kv_full's per tile.
REQUIRED_ARRIVALS = ("Q_FULL_ARRIVALS", "Q_EMPTY_ARRIVALS", "KV_EMPTY_ARRIVALS")
COMPILE_TIMEOUT = 600  # a host program over the kernel headers takes ~10 s on 2 cores; this stops a hang


def markdown_tables(text: str) -> list[list[list[str]]]:
    """Every table of ``text``: its rows (header first, the |---| row left out), each a list of cells."""
    tables, rows = [], []
    for line in text.splitlines() + [""]:
        if line.startswith("|"):
            cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
            if not all(re.fullmatch(r":?-+:?", cell) for cell in cells):
                rows.append(cells)
        elif rows:
            tables.append(rows)
            rows = []
    return tables


def code(cell: str) -> str | None:
    """The C++ expression of a cell that is one code span, else None."""
    match = re.fullmatch(r"`([^`]+)`", cell)
    return match.group(1) if match else None


def number(cell: str) -> int:
    """A table's number: 207,872 or **207,872**."""
    digits = cell.strip("*").replace(",", "")
    assert digits.isdigit(), f"not a number: {cell!r}"
    return int(digits)


def shared_memory_table(tables) -> tuple[list[str], list[list[int]], list[int]]:
    """The table whose columns after the first are headed by a `SharedStorage<...>` type: the types, the rows
    above the total (the parts) per column, and the total row."""
    found = [t for t in tables if len(t[0]) > 1 and all((code(c) or "").startswith("SharedStorage<") for c in t[0][1:])]
    assert len(found) == 1, f"docs/kernel.md holds {len(found)} tables headed by SharedStorage<...> types, not 1"
    table = found[0]
    types = [code(c) for c in table[0][1:]]
    *parts, total = table[1:]
    assert "total" in total[0], f"the shared-memory table's last row is not its total: {total}"
    return types, [[number(c) for c in row[1:]] for row in parts], [number(c) for c in total[1:]]


def arrival_table(tables) -> dict[str, int]:
    """The table headed | mbarrier | arrivals | count |: each arrival expression and the count the page states."""
    found = [t for t in tables if [c.lower() for c in t[0]] == ["mbarrier", "arrivals", "count"]]
    assert len(found) == 1, f"docs/kernel.md holds {len(found)} tables headed | mbarrier | arrivals | count |, not 1"
    counts = {}
    for row in found[0][1:]:
        expression = code(row[1])
        assert expression, f"an arrival row without a C++ expression: {row}"
        counts[expression] = number(row[2])
    return counts


def tiles_in_headers() -> list[str]:
    """The enumerators of `enum class Tile` in the kernel headers."""
    for header in sorted((env.include_dir() / "sparse_mla").rglob("*.cuh")):
        match = re.search(r"enum class Tile\s*\{(.*?)\};", header.read_text(), re.DOTALL)
        if match:
            body = re.sub(r"//[^\n]*", "", match.group(1))
            return [name.strip() for name in body.split(",") if name.strip()]
    raise AssertionError("no `enum class Tile` in the kernel headers: say here how the tiles are named now")


def host_program(expressions: list[str]) -> str:
    prints = "\n".join(f'  std::printf("%lld\\n", static_cast<long long>({e}));' for e in expressions)
    return f"#include <cstdio>\n#include <{KERNEL_HEADER}>\nusing namespace {NAMESPACE};\nint main() {{\n{prints}\n}}\n"


def compiled_values(expressions: list[str], build_dir: Path) -> list[int]:
    """Each expression's value, as a host program built with the JIT's includes and flags prints it."""
    source = build_dir / "budget.cu"
    source.write_text(host_program(expressions))
    spec = build_spec(KernelKey(576, 2048))
    flags = [f for f in CUDA_FLAGS if f not in ("-Xcompiler", "-fPIC", "-Xptxas=-v")] + [GENCODE[spec.key.arch]]
    binary = build_dir / "budget"
    command = [str(env.cuda_home() / "bin" / "nvcc"), *flags, *(f"-I{i}" for i in spec.include_dirs), str(source),
               "-o", str(binary)]
    built = subprocess.run(command, capture_output=True, text=True, timeout=COMPILE_TIMEOUT)
    assert built.returncode == 0, built.stdout + built.stderr
    ran = subprocess.run([str(binary)], capture_output=True, text=True, timeout=60)
    assert ran.returncode == 0, ran.stderr
    return [int(line) for line in ran.stdout.split()]


def test_the_budget_tables_of_kernel_md_are_the_compiled_headers(tmp_path):
    tables = markdown_tables(KERNEL_DOC.read_text())
    types, parts, totals = shared_memory_table(tables)
    arrivals = arrival_table(tables)
    # What the tables must cover: both head dimensions, and every mbarrier's count (kv_full's per tile).
    assert any("576" in t for t in types) and any("512" in t for t in types), types
    required = list(REQUIRED_ARRIVALS) + [f"kv_full_arrivals<Tile::{tile}>()" for tile in tiles_in_headers()]
    missing = [e for e in required if e not in arrivals]
    assert not missing, f"docs/kernel.md's arrival table lacks {missing}"
    # The parts add up to the total in every column.
    for column, (t, total) in enumerate(zip(types, totals)):
        assert sum(row[column] for row in parts) == total, f"the rows of {t} do not add up to its total {total:,}"

    # Every tile's storage, at each d_qk the table covers, is as large as a column of that d_qk states (a
    # tile without a column of its own, such as the narrow tiles of 16 and 8 heads, shares one's members).
    stated_sizes = {}  # d_qk -> the totals of its columns
    for t, total in zip(types, totals):
        stated_sizes.setdefault(re.match(r"SharedStorage<(\d+)", t).group(1), set()).add(total)
    every_tile = {f"sizeof(SharedStorage<{d}, Tile::{tile}>)": d for d in stated_sizes for tile in tiles_in_headers()}

    expressions = [f"sizeof({t})" for t in types] + list(arrivals)
    values = dict(zip(expressions + list(every_tile), compiled_values(expressions + list(every_tile), tmp_path)))
    stated = dict(zip(expressions, totals + list(arrivals.values())))
    wrong = {e: f"page {stated[e]:,}, headers {values[e]:,}" for e in expressions if values[e] != stated[e]}
    assert not wrong, f"docs/kernel.md disagrees with the compiled headers: {wrong}"
    unstated = {e: f"{values[e]:,}" for e, d in every_tile.items() if values[e] not in stated_sizes[d]}
    assert not unstated, f"docs/kernel.md states no column of these tiles' sizes: {unstated}"


def test_the_table_parser_reads_numbers_and_code_spans():
    """The parser the check above relies on: a code span, a bold number, a table that ends the text."""
    tables = markdown_tables("text\n\n| a | `X<1>` |\n| --- | ---: |\n| **total** | **1,024** |")
    assert tables == [[["a", "`X<1>`"], ["**total**", "**1,024**"]]]
    assert code("`kv_full_arrivals<Tile::kWide>()`") == "kv_full_arrivals<Tile::kWide>()" and code("q_full") is None
    assert number("**207,872**") == 207872
    with pytest.raises(AssertionError):
        number("about 200 KB")
