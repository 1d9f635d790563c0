"""Command line: ``python -m sparse_mla prebuild | list | clean | env``.

``prebuild`` compiles kernels ahead of time into a cache root through the same code as the JIT, on any
machine with nvcc (no GPU needed); a process pointed at that root (``SPARSE_MLA_JIT_CACHE_DIR`` or
``SPARSE_MLA_PREBUILT_DIRS``) then loads them without compiling.
"""

from __future__ import annotations

import argparse
import itertools
import logging
import shutil
import sys
import time
from pathlib import Path

from sparse_mla.errors import SparseMLAError
from sparse_mla.jit import env
from sparse_mla.jit.cache import KernelCache, scan
from sparse_mla.jit.key import SUPPORTED_D_QK, KernelKey


def _prebuild(args: argparse.Namespace) -> int:
    root = Path(args.cache_dir) if args.cache_dir else env.cache_dir()
    cache = KernelCache()
    keys = [KernelKey(d_qk=d_qk, topk=topk) for d_qk, topk in itertools.product(args.d_qk, args.topk)]
    print(f"prebuilding {len(keys)} kernel(s) into {root}")
    rows, failed = [], 0
    start = time.perf_counter()
    for key in keys:
        try:
            entry_dir, seconds = cache.prebuild(key, root)
            status = "built" if seconds is not None else "cached"
            rows.append((key.name, status, f"{seconds:.1f}" if seconds is not None else "-", str(entry_dir)))
        except SparseMLAError as error:
            failed += 1
            rows.append((key.name, "FAILED", "-", str(error)))
    print(f"{'kernel':<48} {'status':<7} {'seconds':>7}  path")
    for name, status, seconds, where in rows:
        print(f"{name:<48} {status:<7} {seconds:>7}  {where}")
    print(f"{len(keys) - failed} ok, {failed} failed, {time.perf_counter() - start:.1f} s")
    return 1 if failed else 0


def _list(args: argparse.Namespace) -> int:
    roots = [Path(args.cache_dir)] if args.cache_dir else env.lookup_dirs()
    for root in roots:
        entries = scan(root) if root.is_dir() else []
        print(f"{root}: {len(entries)} entr{'y' if len(entries) == 1 else 'ies'}")
        for entry in entries:
            seconds = f"{entry.compile_seconds:.1f} s" if entry.compile_seconds is not None else ""
            print(f"  {entry.state:<7} {entry.name:<48} {entry.path.name}  {seconds} {entry.detail}".rstrip())
    return 0


def _clean(args: argparse.Namespace) -> int:
    root = Path(args.cache_dir) if args.cache_dir else env.cache_dir()
    removed = 0
    for arch_dir in root.glob("sm*"):
        if arch_dir.is_dir():
            shutil.rmtree(arch_dir)
            removed += 1
    print(f"removed {removed} architecture folder(s) from {root}")
    return 0


def _env(args: argparse.Namespace) -> int:
    home = env.cuda_home()
    print(f"cache dir (writable):  {env.cache_dir()}")
    print(f"lookup dirs:           {', '.join(str(p) for p in env.lookup_dirs())}")
    print(f"JIT disabled:          {env.jit_disabled()}")
    print(f"headers:               {env.include_dir()}")
    print(f"CUDA toolkit:          {home} (CUDA_VERSION {env.cuda_version(home)})")
    try:
        print(f"CUTLASS:               {env.cutlass().version}")
        print(f"tvm-ffi:               {env.tvm_ffi_version()}")
    except SparseMLAError as error:
        print(f"toolchain problem:     {error}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sparse_mla", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    prebuild = commands.add_parser("prebuild", help="compile kernels ahead of time (no GPU needed)")
    prebuild.add_argument("--d-qk", type=int, nargs="+", required=True, choices=SUPPORTED_D_QK)
    prebuild.add_argument("--topk", type=int, nargs="+", required=True)
    for command, help_text in (("list", "show cached kernels"), ("clean", "delete cached kernels")):
        commands.add_parser(command, help=help_text)
    commands.add_parser("env", help="show the resolved cache, toolchain and headers")
    for sub in commands.choices.values():
        sub.add_argument("--cache-dir", help="cache root (default: $SPARSE_MLA_JIT_CACHE_DIR or jit_cache/)")
    args = parser.parse_args(argv)
    if args.command == "prebuild" and any(t < 1 for t in args.topk):
        parser.error("--topk values must be positive")
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    handler = {"prebuild": _prebuild, "list": _list, "clean": _clean, "env": _env}[args.command]
    return handler(args)


if __name__ == "__main__":
    sys.exit(main())
