"""Command line: ``python -m sparse_mla prebuild | list | clean | env`` (installed as ``sparse-mla`` too).

``prebuild`` compiles kernels ahead of time into a cache root through the same code as the JIT, on any
machine with nvcc (no GPU needed); a process pointed at that root (``SPARSE_MLA_JIT_CACHE_DIR`` or
``SPARSE_MLA_PREBUILT_DIRS``) then loads them without compiling. ``env --json`` prints what a build
host and a GPU node must agree on for that, and ``env --compare FILE`` checks it against another host's.
Ctrl-C exits with status 130 at once: it stops the running compiles and starts no other.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import hashlib
import importlib.metadata
import itertools
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

from sparse_mla import __version__
from sparse_mla.errors import ConfigurationError, SparseMLAError, ToolchainError
from sparse_mla.jit import env, interrupt, store
from sparse_mla.jit.build import CUDA_FLAGS, GENCODE, LINK_FLAGS, build_spec, headers_digest
from sparse_mla.jit.cache import KernelCache
from sparse_mla.jit.key import SUPPORTED_D_QK, KernelKey

_DESCRIPTION = """\
sparse_mla: FP8 sparse MLA prefill kernels for Hopper, compiled ahead of time or on first use.
Installing the package installs this command as `sparse-mla`; `python -m sparse_mla` is the same
command. Run `{prog} COMMAND --help` for the options of a command."""

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

_ENV_EXAMPLES = """\
examples:
  python -m sparse_mla env                                  # versions, GPUs, cache roots, variables
  python -m sparse_mla env --json > build-host.json         # on the build host
  python -m sparse_mla env --compare build-host.json        # on a GPU node: exit 0 when they match

Prebuilt kernels load where these fields of `env --json` are equal: sparse_mla, headers_sha256, arch,
flags, nvidia-cutlass, apache-tvm-ffi, and cuda_toolkit on a node that has a toolkit. A node without a
toolkit needs none: its cuda_driver must be at least the build host's cuda_toolkit."""

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
        # A Ctrl-C ends the compiles the signal did not reach (one started just after it) and starts no
        # other, so that the workers the interpreter joins on its way out return at once.
        with interrupt.stopping_at_interrupt():
            results = list(pool.map(build, keys))
    finally:
        pool.shutdown(wait=False, cancel_futures=True)

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
    """Every entry of each root and its state; a root that was named (``--cache-dir``,
    ``SPARSE_MLA_PREBUILT_DIRS``) and does not exist is an error, the writable root not built yet is not."""
    roots = [Path(args.cache_dir)] if args.cache_dir else env.lookup_dirs()
    named = set(roots) if args.cache_dir else set(env.prebuilt_dirs())
    status = 0
    for root in roots:
        if not root.is_dir():
            what = "is not a directory" if root.exists() else "does not exist"
            if root in named:
                print(f"error: the cache directory {root} {what}", file=sys.stderr)
                status = 1
            else:
                print(f"{root}: {what} yet: 0 entries")
            continue
        entries = store.scan(root, build_spec)
        print(f"{root}: {len(entries)} entr{'y' if len(entries) == 1 else 'ies'}")
        for entry in entries:
            seconds = f"{entry.compile_seconds:.1f} s" if entry.compile_seconds is not None else ""
            print(f"  {entry.state:<7} {entry.name:<48} {entry.path.name}  {seconds} {entry.detail}".rstrip())
    return status


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


# The fields of `env --json` that a kernel's cache entry depends on: a GPU node loads what a build host
# prebuilt only where they are equal (the CUDA toolkit is compared apart, see _build_differences).
MUST_MATCH = ("sparse_mla", "headers_sha256", "arch", "flags", "nvidia-cutlass", "apache-tvm-ffi")


def _or_none(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def _release(version: str | None) -> str | None:
    return store.cuda_release(version) if version is not None else None


def build_identity() -> dict[str, Any]:
    """What ``env --json`` prints: the inputs of every kernel's digest besides the key (those of
    MUST_MATCH, and the CUDA toolkit), the newest CUDA the driver runs, and torch and Python for the record."""
    try:
        include = env.include_dir()
        headers: str | None = hashlib.sha256(json.dumps(headers_digest(include), sort_keys=True).encode()).hexdigest()
    except SparseMLAError:
        headers = None
    return {
        "sparse_mla": __version__,
        "headers_sha256": headers,
        "arch": ", ".join(sorted(flag.rsplit("=", 1)[1] for flag in GENCODE.values())),  # "sm_90a"
        "flags": [*CUDA_FLAGS, *LINK_FLAGS],
        "nvidia-cutlass": _or_none("nvidia-cutlass"),
        "apache-tvm-ffi": _or_none("apache-tvm-ffi"),
        "cuda_toolkit": _release(env.cuda_version(env.cuda_home())),
        "cuda_driver": _release(env.driver_cuda_version()),
        "torch": _or_none("torch"),
        "python": platform.python_version(),
    }


def _version_tuple(release: str) -> tuple[int, ...]:
    return tuple(int(part) for part in release.split("."))


def _build_differences(here: dict[str, Any], there: dict[str, Any], name: str) -> list[str]:
    """Why a kernel prebuilt on one of the two hosts would not load on the other, one line each."""
    lines = [
        f"{field}: this host {json.dumps(here.get(field))}, {name} {json.dumps(there.get(field))}"
        for field in MUST_MATCH
        if here.get(field) != there.get(field)
    ]
    toolkits = here.get("cuda_toolkit"), there.get("cuda_toolkit")
    if None not in toolkits:
        if toolkits[0] != toolkits[1]:
            lines.append(f"cuda_toolkit: this host {toolkits[0]}, {name} {toolkits[1]}")
        return lines
    # A host without a toolkit loads what any toolkit built, as long as its driver runs that CUDA.
    for builder, loader, builder_name, loader_name in ((here, there, "this host", name), (there, here, name, "this host")):
        built, driver = builder.get("cuda_toolkit"), loader.get("cuda_driver")
        if built is not None and loader.get("cuda_toolkit") is None and driver is not None:
            if _version_tuple(built) > _version_tuple(driver):
                lines.append(f"cuda_toolkit: {builder_name} builds with CUDA {built}, {loader_name}'s driver runs CUDA {driver} at most")
    return lines


def _compare(other: Path) -> int:
    """``env --compare FILE``: 0 when a kernel prebuilt on either host loads on the other, 1 (each
    difference printed) when not, 2 when FILE is not an ``env --json`` output."""
    try:
        there = json.loads(other.read_text())
    except (OSError, ValueError) as error:
        print(f"error: cannot read {other} as the output of `env --json`: {error}", file=sys.stderr)
        return 2
    if not isinstance(there, dict) or "sparse_mla" not in there:
        print(f"error: {other} is not the output of `env --json` (no \"sparse_mla\" field)", file=sys.stderr)
        return 2
    lines = _build_differences(build_identity(), there, str(other))
    for line in lines:
        print(line)
    if lines:
        print(f"{len(lines)} difference{'' if len(lines) == 1 else 's'}: kernels prebuilt on one of these hosts do not load on the other")
        return 1
    print(f"this host and {other} match: kernels prebuilt on one of them load on the other")
    return 0


def _toolkit() -> str:
    """The CUDA toolkit row of ``env``: a bad CUDA_HOME is shown there, since this command is where one
    looks for it."""
    try:
        home = env.cuda_home()
    except ToolchainError as error:
        return f"error: {error}"
    return f"{store.cuda_release(env.cuda_version(home))} at {home}" if home else "not found (no nvcc)"


def _switches() -> str:
    try:
        env.check_switches()
    except ConfigurationError as error:
        return f"error: {error}"
    return f"JIT disabled {env.jit_disabled()}, batch-invariant {env.batch_invariant()}, token groups {env.token_groups()}"


def _env(args: argparse.Namespace) -> int:
    if args.json:
        print(json.dumps(build_identity(), indent=2))
        return 0
    if args.compare:
        return _compare(Path(args.compare))
    root = _root(args)
    lookup = dict.fromkeys([*([root] if root else []), *env.prebuilt_dirs()])
    rows = [
        ("sparse_mla", __version__),
        ("torch", _version_of("torch")),
        ("apache-tvm-ffi", _version_of("apache-tvm-ffi")),
        ("nvidia-cutlass", _version_of("nvidia-cutlass")),
        ("CUDA toolkit", _toolkit()),
    ]
    rows += _torch_rows()
    rows += [
        ("cache dir (writable)", str(root or f"none ({_NO_ROOT})")),
        ("lookup dirs", ", ".join(str(p) for p in lookup)),
        ("trusted dirs", ", ".join(str(p) for p in env.trusted_dirs()) or "none"),
        ("switches", _switches()),
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


# argparse names a type function in its own message when the function raises ValueError ("invalid
# _topk value"): each of these raises ArgumentTypeError, whose message argparse prints as it is.


def _positive_int(text: str, expected: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{expected}, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{expected}, got {value}")
    return value


def _jobs(text: str) -> int:
    return _positive_int(text, "must be a whole number, at least 1")


def _topk(text: str) -> int:
    return _positive_int(text, "topk values must be positive whole numbers")


def _days(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be a number of days, at least 0, got {text!r}")
    return value


def _parser() -> argparse.ArgumentParser:
    # Run as the console script, it is called what the user typed.
    prog = "sparse-mla" if Path(sys.argv[0]).name == "sparse-mla" else "python -m sparse_mla"
    parser = argparse.ArgumentParser(
        prog=prog, description=_DESCRIPTION.format(prog=prog), formatter_class=argparse.RawDescriptionHelpFormatter
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
    env_command = commands.add_parser(
        "env",
        help="show versions, GPUs, the cache roots and the SPARSE_MLA_* variables",
        description="Show versions, GPUs, the cache roots and the SPARSE_MLA_* variables.",
        epilog=_ENV_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    output = env_command.add_mutually_exclusive_group()
    output.add_argument(
        "--json", action="store_true",
        help="print, as JSON, what a build host and a GPU node must agree on for prebuilt kernels to load, "
        "e.g. env --json > build-host.json",
    )
    output.add_argument(
        "--compare", metavar="FILE",
        help="compare this host with another's `env --json` output: prints each field that keeps kernels "
        "prebuilt on one from loading on the other and exits 1 if there is one, e.g. --compare build-host.json",
    )
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
    except SparseMLAError as error:  # a bad switch or CUDA_HOME: its message says what to change
        print(f"error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
