"""Command line: ``python -m sparse_mla prebuild | list | clean | env``.

``prebuild`` compiles kernels ahead of time into a cache root through the same code as the JIT, on any
machine with nvcc (no GPU needed); a process pointed at that root (``SPARSE_MLA_JIT_CACHE_DIR`` or
``SPARSE_MLA_PREBUILT_DIRS``) then loads them without compiling. Ctrl-C exits with status 130.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import importlib.metadata
import itertools
import os
import sys
import time
from pathlib import Path

from sparse_mla import __version__
from sparse_mla.errors import SparseMLAError
from sparse_mla.jit import env, store
from sparse_mla.jit.build import build_spec
from sparse_mla.jit.cache import KernelCache
from sparse_mla.jit.key import SUPPORTED_D_QK, KernelKey

_DESCRIPTION = """\
sparse_mla: FP8 sparse MLA prefill kernels for Hopper, compiled ahead of time or on first use.
Run `python -m sparse_mla COMMAND --help` for the options of a command."""

_PREBUILD_EXAMPLES = """\
examples:
  python -m sparse_mla prebuild --d-qk 576 --topk 2048            # the DeepSeek-V3.2 kernel
  python -m sparse_mla prebuild --d-qk 512 576 --topk 512 2048    # all 4 combinations, in parallel
  python -m sparse_mla prebuild --d-qk 576 --topk 2048 --cache-dir /shared/sparse_mla -j 1

A kernel already in the cache is reported `cached` and not compiled again. Copy the cache root to
the GPU hosts and point them at it with SPARSE_MLA_JIT_CACHE_DIR or SPARSE_MLA_PREBUILT_DIRS."""

_CLEAN_EXAMPLES = """\
examples:
  python -m sparse_mla clean --dry-run                 # list what would be removed
  python -m sparse_mla clean --older-than 30           # only kernels built more than 30 days ago
  python -m sparse_mla clean --cache-dir /shared/sparse_mla

Only a root sparse_mla built into (it holds a CACHEDIR.TAG) is cleaned, and in it only entries with a
key.json that belong to this user, each under its lock; symbolic links are never followed."""

_DEFAULT_ROOT = "$SPARSE_MLA_JIT_CACHE_DIR, else jit_cache/ in a source checkout or ~/.cache/sparse_mla"
_NO_ROOT = "no cache directory: HOME is unset and this uid has no passwd entry; pass --cache-dir DIR"


def _cpu_count() -> int:
    return len(os.sched_getaffinity(0))


def _root(args: argparse.Namespace) -> Path | None:
    return Path(args.cache_dir) if args.cache_dir else env.cache_dir()


def _prebuild(args: argparse.Namespace) -> int:
    root = _root(args)
    if root is None:
        print(f"error: {_NO_ROOT}", file=sys.stderr)
        return 1
    if args.cache_dir:
        advice = "make it writable, or choose another directory"
    else:
        advice = "pass --cache-dir DIR, or set SPARSE_MLA_JIT_CACHE_DIR, to use another directory"
    keys = list(dict.fromkeys(KernelKey(d_qk, topk) for d_qk, topk in itertools.product(args.d_qk, args.topk)))
    jobs = min(args.jobs, len(keys))
    print(f"prebuilding {len(keys)} kernel(s) into {root}, {jobs} at a time", flush=True)
    cache = KernelCache()

    def build(key: KernelKey) -> tuple[str, str, str]:
        try:
            entry_dir, seconds = cache.prebuild(key, root, advice)
        except SparseMLAError as error:
            return "FAILED", "-", str(error)
        if seconds is None:
            return "cached", "-", str(entry_dir)
        return "built", f"{seconds:.1f}", str(entry_dir)

    start = time.perf_counter()
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=jobs)
    try:
        results = list(pool.map(build, keys))
    finally:
        pool.shutdown(wait=False, cancel_futures=True)  # after Ctrl-C: start no further compile

    errors = []
    print(f"{'kernel':<48} {'status':<7} {'seconds':>7}  path")
    for key, (status, seconds, detail) in zip(keys, results):
        if status == "FAILED":
            errors.append(f"{key.name}: {detail}")
            detail = f"(error {len(errors)} below)"
        print(f"{key.name:<48} {status:<7} {seconds:>7}  {detail}")
    print(f"{len(keys) - len(errors)} ok, {len(errors)} failed, {time.perf_counter() - start:.1f} s", flush=True)
    for number, error in enumerate(errors, 1):
        print(f"\nerror {number}: {error}", file=sys.stderr)
    return 1 if errors else 0


def _list(args: argparse.Namespace) -> int:
    roots = [Path(args.cache_dir)] if args.cache_dir else env.lookup_dirs()
    for root in roots:
        entries = store.scan(root, build_spec) if root.is_dir() else []
        print(f"{root}: {len(entries)} entr{'y' if len(entries) == 1 else 'ies'}")
        for entry in entries:
            seconds = f"{entry.compile_seconds:.1f} s" if entry.compile_seconds is not None else ""
            print(f"  {entry.state:<7} {entry.name:<48} {entry.path.name}  {seconds} {entry.detail}".rstrip())
    return 0


def _clean(args: argparse.Namespace) -> int:
    root = _root(args)
    if root is None:
        print(f"error: {_NO_ROOT}", file=sys.stderr)
        return 1
    if not root.is_dir():
        print(f"{root} does not exist: nothing to clean")
        return 0
    if not store.is_tagged(root):
        print(
            f"error: {root} holds no {store.TAG_FILE}, so sparse_mla did not build into it: nothing removed",
            file=sys.stderr,
        )
        return 1
    report = store.clean(root, older_than_days=args.older_than, dry_run=args.dry_run)
    for entry_dir, outcome in report:
        print(f"{outcome:<36} {entry_dir}")
    removed = sum(outcome in ("removed", "would be removed") for _, outcome in report)
    verb = "would remove" if args.dry_run else "removed"
    print(f"{verb} {removed} of {len(report)} entr{'y' if len(report) == 1 else 'ies'} in {root}")
    return 0


def _version_of(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _cuda_release(version: str | None) -> str:
    """``13000`` (cuda.h's CUDA_VERSION) as ``13.0``."""
    return f"{int(version) // 1000}.{int(version) % 1000 // 10}" if version else "unknown"


def _torch_rows() -> list[tuple[str, str]]:
    """torch's CUDA version and the GPUs torch sees (it honours CUDA_VISIBLE_DEVICES)."""
    try:
        import torch
    except ImportError:
        return [("GPU", "unknown (torch is not installed)")]
    rows = [("torch's CUDA", torch.version.cuda or "none (a CPU build of torch)")]
    if not torch.cuda.is_available():
        return rows + [("GPU", "none visible")]
    for index in range(torch.cuda.device_count()):
        major, minor = torch.cuda.get_device_capability(index)
        supported = "supported" if (major, minor) == (9, 0) else "not supported: sparse_mla needs sm_90"
        rows.append(("GPU", f"cuda:{index} {torch.cuda.get_device_name(index)} (sm_{major}{minor}, {supported})"))
    return rows


def _env(args: argparse.Namespace) -> int:
    home, root = env.cuda_home(), _root(args)
    lookup = dict.fromkeys([*([root] if root else []), *env.prebuilt_dirs()])
    rows = [
        ("sparse_mla", __version__),
        ("torch", _version_of("torch")),
        ("apache-tvm-ffi", _version_of("apache-tvm-ffi")),
        ("nvidia-cutlass", _version_of("nvidia-cutlass")),
        ("CUDA toolkit", f"{_cuda_release(env.cuda_version(home))} at {home}" if home else "not found (no nvcc)"),
    ]
    rows += _torch_rows()
    rows += [
        ("cache dir (writable)", str(root or f"none ({_NO_ROOT})")),
        ("lookup dirs", ", ".join(str(p) for p in lookup)),
        ("trusted dirs", ", ".join(str(p) for p in env.trusted_dirs()) or "none"),
        ("JIT disabled", str(env.jit_disabled())),
    ]
    try:
        rows.append(("headers", str(env.include_dir())))
    except SparseMLAError as error:
        rows.append(("headers", str(error)))
    variables = sorted((name, value) for name, value in os.environ.items() if name.startswith("SPARSE_MLA_"))
    rows += [(name, value) for name, value in variables] or [("SPARSE_MLA_* variables", "none set")]
    for name, value in rows:
        print(f"{name + ':':<27} {value}")
    return 0


def _jobs(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _days(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be a number of days, at least 0, got {text}")
    return value


def _topk(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"topk values must be positive, got {value}")
    return value


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m sparse_mla", description=_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--version", action="version", version=f"sparse_mla {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    prebuild = commands.add_parser(
        "prebuild",
        help="compile kernels into a cache root (needs nvcc, no GPU)",
        description="Compile the kernels for every (d_qk, topk) combination into a cache root.",
        epilog=_PREBUILD_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    prebuild.add_argument(
        "--d-qk", type=int, nargs="+", required=True, choices=SUPPORTED_D_QK, metavar="D_QK",
        help="head dimension of q and kv: 576 (512 'nope' + 64 'rope' columns, DeepSeek-V3.2) or 512; "
        "several values allowed, e.g. --d-qk 512 576",
    )
    prebuild.add_argument(
        "--topk", type=_topk, nargs="+", required=True, metavar="TOPK",
        help="KV rows each query token attends to (indices.shape[2]); one kernel per value, e.g. --topk 512 2048",
    )
    prebuild.add_argument(
        "-j", "--jobs", type=_jobs, default=_cpu_count(), metavar="N",
        help=f"compile up to N kernels at once (default: the {_cpu_count()} CPU cores this process may use), "
        "e.g. -j 1 on a host short of memory",
    )
    commands.add_parser("list", help="show the cached kernels and whether each is ok, stale, corrupt, unreadable or untrusted")
    clean = commands.add_parser(
        "clean",
        help="delete the cached kernels",
        description="Delete the kernels in a cache root.",
        epilog=_CLEAN_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    clean.add_argument("--dry-run", action="store_true", help="list what would be removed, remove nothing")
    clean.add_argument(
        "--older-than", type=_days, metavar="DAYS",
        help="only kernels built more than DAYS days ago (nothing evicts kernels otherwise), e.g. --older-than 30",
    )
    commands.add_parser("env", help="show versions, GPUs, the cache roots and the SPARSE_MLA_* variables")
    for command in commands.choices.values():
        command.add_argument(
            "--cache-dir", metavar="DIR", help=f"cache root (default: {_DEFAULT_ROOT}), e.g. --cache-dir /shared/sparse_mla"
        )
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        args = _parser().parse_args(argv)
        handler = {"prebuild": _prebuild, "list": _list, "clean": _clean, "env": _env}[args.command]
        return handler(args)
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
