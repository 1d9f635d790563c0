"""The command line without a compiler: help and version, argument errors, prebuild's summary, errors
and parallel builds (with the fake compiler), Ctrl-C, list, clean and env. The real prebuild is in the
nvcc tier."""

from __future__ import annotations

import fcntl
import hashlib
import importlib.metadata
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

import fake_jit
import sparse_mla
import sparse_mla.__main__ as cli
from sparse_mla.__main__ import main
from sparse_mla.jit import env, store
from sparse_mla.jit.build import build_spec
from sparse_mla.jit.cache import KernelCache
from sparse_mla.jit.key import KernelKey

TESTS_CPU = str(Path(__file__).parent)
COMMANDS = ("prebuild", "list", "clean", "env")


def run_cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "sparse_mla", *args], capture_output=True, text=True, env=env, timeout=120)


@pytest.fixture
def fake_compiler(monkeypatch, tmp_path):
    """The CLI builds with the fake compiler; returns the file that counts its builds."""
    log = tmp_path / "builds.log"
    monkeypatch.setenv("FAKE_JIT_BUILD_LOG", str(log))
    monkeypatch.setattr(cli, "KernelCache", fake_jit.fake_cache)
    return log


def test_help_lists_the_commands_in_plain_text():
    result = run_cli("--help")
    assert result.returncode == 0
    for command in COMMANDS:
        assert command in result.stdout
    for command in ("", *COMMANDS):
        text = run_cli(*([command] if command else []), "--help").stdout
        assert "``" not in text and ":class:" not in text and ":mod:" not in text, (command, text)


def test_prebuild_help_explains_each_option_with_an_example():
    text = run_cli("prebuild", "--help").stdout
    options = text.split("\noptions:\n", 1)[1]
    for option in ("--d-qk D_QK", "--topk TOPK", "-j N, --jobs N", "--cache-dir DIR"):
        help_text = options.split(f"\n  {option}", 1)[1].split("\n  -", 1)[0]
        assert "e.g." in help_text, (option, help_text)
    assert "examples:\n  python -m sparse_mla prebuild --d-qk 576 --topk 2048" in text


def test_version_is_the_package_version_everywhere():
    result = run_cli("--version")
    assert result.returncode == 0 and result.stdout == f"sparse_mla {sparse_mla.__version__}\n"
    assert importlib.metadata.version("sparse_mla") == sparse_mla.__version__


@pytest.mark.parametrize(
    "args",
    [
        ["prebuild", "--topk", "2048"],
        ["prebuild", "--d-qk", "320", "--topk", "64"],
        ["prebuild", "--d-qk", "576", "--topk", "0"],
        ["prebuild", "--d-qk", "576", "--topk", "64", "-j", "0"],
    ],
)
def test_prebuild_argument_errors(args):
    result = run_cli(*args)
    assert result.returncode == 2 and "error" in result.stderr and "Traceback" not in result.stderr


def test_prebuild_prints_a_summary_and_a_second_run_compiles_nothing(fake_compiler, tmp_path, capsys):
    args = ["prebuild", "--d-qk", "576", "--topk", "64", "2048", "--cache-dir", str(tmp_path / "cache")]
    assert main(args) == 0
    first = capsys.readouterr().out
    assert re.search(r"^sparse_mla_prefill_dqk576_topk64_sm90a\s+built\s+\d+\.\d ", first, re.MULTILINE), first
    assert "2 ok, 0 failed" in first
    assert main(args) == 0
    second = capsys.readouterr().out
    assert re.search(r"^sparse_mla_prefill_dqk576_topk2048_sm90a\s+cached\s+- ", second, re.MULTILINE), second
    assert len(fake_compiler.read_text().splitlines()) == 2


def test_prebuild_builds_keys_in_parallel(monkeypatch, tmp_path, capsys):
    """-j 3 with three keys: each build waits until all three are building, so they must overlap."""
    all_building = threading.Barrier(3, timeout=30)

    def builder(spec, build_dir):
        all_building.wait()
        return fake_jit.fake_build(spec, build_dir)

    monkeypatch.setattr(
        cli, "KernelCache", lambda: KernelCache(builder=builder, loader=fake_jit.fake_load, spec_for=fake_jit.fake_spec)
    )
    assert main(["prebuild", "--d-qk", "576", "--topk", "1", "2", "3", "-j", "3", "--cache-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "3 at a time" in out and "3 ok, 0 failed" in out, out


def test_prebuild_defaults_to_one_job_per_core():
    assert cli._parser().parse_args(["prebuild", "--d-qk", "576", "--topk", "1"]).jobs == len(os.sched_getaffinity(0))


@pytest.mark.parametrize("given", [True, False], ids=["--cache-dir", "environment"])
def test_a_failure_is_explained_below_the_table_with_advice_that_fits_the_command(fake_compiler, tmp_path, monkeypatch, capsys, given):
    not_a_directory = tmp_path / "file"
    not_a_directory.write_text("")
    args = ["prebuild", "--d-qk", "576", "--topk", "64", "2048"]
    if given:
        args += ["--cache-dir", str(not_a_directory)]
    else:
        monkeypatch.setenv("SPARSE_MLA_JIT_CACHE_DIR", str(not_a_directory))
    assert main(args) == 1
    captured = capsys.readouterr()
    rows = [line for line in captured.out.splitlines() if line.startswith("sparse_mla_prefill")]
    assert [row.split()[1:] for row in rows] == [["FAILED", "-", "(error", "1", "below)"], ["FAILED", "-", "(error", "2", "below)"]]
    assert captured.out.rstrip().endswith("0 ok, 2 failed, " + captured.out.rstrip().rsplit(", ", 1)[1])
    errors = captured.err.strip().split("\n\n")
    assert [e.split(":", 1)[0] for e in errors] == ["error 1", "error 2"], captured.err
    assert f"the kernel cache directory {not_a_directory} cannot be used" in errors[0]
    if given:
        assert "--cache-dir" not in captured.err and "choose another directory" in captured.err
    else:
        assert "pass --cache-dir DIR, or set SPARSE_MLA_JIT_CACHE_DIR" in captured.err


CTRL_C_CHILD = """
import pathlib, sys, threading
sys.path.insert(0, {tests!r})
import fake_jit, sparse_mla.__main__ as cli
from sparse_mla.jit import interrupt
from sparse_mla.jit.cache import KernelCache

handled = threading.Event()  # the interrupt stopped the builds (interrupt.stop ran)
stop = interrupt.stop
def stop_and_tell():
    stop()
    handled.set()
interrupt.stop = stop_and_tell

def builder(spec, build_dir):
    pathlib.Path({markers!r}, spec.key.name).touch()  # the staging folder exists: the build has begun
    if {before_compiler}:
        handled.wait()  # the Ctrl-C lands between the build's start and its compiler's
    return fake_jit.fake_build(spec, build_dir)

cli.KernelCache = lambda: KernelCache(builder=builder, loader=fake_jit.fake_load, spec_for=fake_jit.fake_spec)
sys.exit(cli.main(["prebuild", "--d-qk", "576", "--topk", "1", "2", "3", "-j", "2", "--cache-dir", {cache!r}]))
"""


@pytest.mark.parametrize("moment", ["compiling", "before-the-compiler-starts"])
def test_ctrl_c_exits_130_at_once_without_a_traceback(tmp_path, moment):
    """SIGINT to the process group, as a terminal sends it, while two of three builds run: with both
    fake compilers running (they die of it), or between a build's start and its compiler's (the signal
    misses the compiler, which must then never start). Either way prebuild exits at once, and neither an
    entry nor a failure log is left (the compilers did not fail)."""
    markers, cache, compilers = tmp_path / "markers", tmp_path / "cache", tmp_path / "compilers.log"
    markers.mkdir()
    script = CTRL_C_CHILD.format(tests=TESTS_CPU, markers=str(markers), before_compiler=moment != "compiling",
                                 cache=str(cache))
    # A fake compile of an hour: a prebuild that waited for one would still run when the test gives up on
    # it, 120 s after the Ctrl-C (a bound for a hang, not a timing).
    child = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=dict(os.environ, FAKE_JIT_BUILD_SECONDS="3600", FAKE_JIT_COMPILER_LOG=str(compilers)), start_new_session=True,
    )
    deadline = time.time() + 60

    def ready() -> bool:
        if moment == "compiling":
            return len(fake_jit.compilers_of(child.pid)) == 2
        return len(list(markers.iterdir())) == 2

    while not ready() and child.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    if not ready():
        child.kill()
        pytest.fail(f"the two builds never reached the moment {moment}: {child.communicate()}")
    os.killpg(child.pid, signal.SIGINT)
    try:
        out, err = child.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)
        pytest.fail(f"prebuild was still running 120 s after Ctrl-C: it waited for a compile: {child.communicate()}")
    assert child.returncode == 130, (out, err)
    assert err.endswith("\ninterrupted\n") and "Traceback" not in err, err
    assert not list(cache.glob("sm90a/*/*/key.json")), "an interrupted build was published"
    assert not list(cache.glob("sm90a/*/*.failed.log")), "an interrupted build left a failure log"
    started = compilers.read_text().split() if compilers.exists() else []
    assert len(started) == (2 if moment == "compiling" else 0), f"compilers started: {started}"
    assert not [pid for pid in map(int, started) if os.path.exists(f"/proc/{pid}")], "a compiler outlived prebuild"


def list_states(capsys) -> dict[str, str]:
    return {line.split()[1]: line.split()[0] for line in capsys.readouterr().out.splitlines()[1:]}


def test_list_reports_each_entry_ok_stale_or_corrupt(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(cli, "build_spec", fake_jit.fake_spec)  # freshness against the fake compiler's specs
    cache = fake_jit.fake_cache()
    ok, _ = cache.prebuild(KernelKey(576, 2048), tmp_path)
    stale, _ = cache.prebuild(KernelKey(576, 64), tmp_path)
    corrupt, _ = cache.prebuild(KernelKey(512, 512), tmp_path)
    meta = json.loads((stale / "key.json").read_text())
    meta["source_digest"] = "built from older headers"
    (stale / "key.json").write_text(json.dumps(meta))
    (corrupt / "fake.so").write_bytes(b"garbage")
    assert main(["list", "--cache-dir", str(tmp_path)]) == 0
    assert list_states(capsys) == {
        "sparse_mla_prefill_dqk576_topk2048_sm90a": "ok",
        "sparse_mla_prefill_dqk576_topk64_sm90a": "stale",
        "sparse_mla_prefill_dqk512_topk512_sm90a": "corrupt",
    }


@pytest.mark.parametrize(
    "change",
    [
        lambda meta: meta.update(key=["576", "2048"]),
        lambda meta: meta["key"].update(d_qk="576"),
        lambda meta: meta["key"].update(d_qk=320),
        lambda meta: meta.update(so_file=7),
        lambda meta: meta.update(compile_seconds="fast"),
        lambda meta: meta.pop("digest"),
        lambda meta: meta.update(so_file="/elsewhere/module.so"),
    ],
    ids=["key-not-a-dict", "d_qk-a-string", "d_qk-unsupported", "so_file-not-a-string", "seconds-not-a-number",
         "no-digest", "so_file-a-path"],
)
def test_list_reports_a_key_json_with_malformed_fields_as_corrupt(tmp_path, capsys, change):
    entry, _ = fake_jit.fake_cache().prebuild(KernelKey(576, 2048), tmp_path)
    meta = json.loads((entry / "key.json").read_text())
    change(meta)  # the module's checksum still matches
    (entry / "key.json").write_text(json.dumps(meta))
    assert main(["list", "--cache-dir", str(tmp_path)]) == 0
    assert list_states(capsys) == {"sparse_mla_prefill_dqk576_topk2048_sm90a": "corrupt"}


@pytest.fixture
def busy_root(tmp_path):
    """A root with two kernels and things sparse_mla did not make, at every level."""
    root = tmp_path / "D"
    cache = fake_jit.fake_cache()
    entries = [cache.prebuild(KernelKey(576, 2048), root)[0], cache.prebuild(KernelKey(512, 512), root)[0]]
    (root / "smb_share").mkdir()
    (root / "smb_share" / "file").write_text("a user's file")
    (root / "smtp-notes").write_text("a user's notes")
    (root / "sm90a" / "notes.txt").write_text("a user's notes beside the kernels")
    (entries[0].parent / "0123456789abcdef").mkdir()  # named like an entry, but no key.json
    outside = tmp_path / "outside"
    shutil.copytree(entries[0].parent, outside / "sparse_mla_prefill_dqk576_topk7_sm90a")
    (root / "sm90a" / "sparse_mla_prefill_dqk576_topk7_sm90a").symlink_to(outside / "sparse_mla_prefill_dqk576_topk7_sm90a")
    return root, entries, outside


def _tree(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*")}


def test_clean_removes_the_entries_only_and_never_follows_a_link(busy_root, capsys):
    root, entries, outside = busy_root
    before_outside = _tree(outside)
    assert main(["clean", "--cache-dir", str(root)]) == 0
    assert "removed 2 of 2 entries" in capsys.readouterr().out
    assert not any(entry.exists() for entry in entries)
    for kept in ("smb_share/file", "smtp-notes", "sm90a/notes.txt", "CACHEDIR.TAG"):
        assert (root / kept).exists(), kept
    assert (entries[0].parent / "0123456789abcdef").is_dir()
    assert (root / "sm90a" / "sparse_mla_prefill_dqk576_topk7_sm90a").is_symlink()
    assert _tree(outside) == before_outside


def test_clean_dry_run_removes_nothing(busy_root, capsys):
    root, entries, _ = busy_root
    assert main(["clean", "--dry-run", "--cache-dir", str(root)]) == 0
    out = capsys.readouterr().out
    assert out.count("would be removed") == 2 and "would remove 2 of 2 entries" in out
    assert all(entry.exists() for entry in entries)


def test_clean_older_than_keeps_recent_entries(busy_root, capsys):
    root, (old, recent), _ = busy_root
    forty_days_ago = time.time() - 40 * 86400
    os.utime(old / "key.json", (forty_days_ago, forty_days_ago))
    assert main(["clean", "--older-than", "30", "--cache-dir", str(root)]) == 0
    out = capsys.readouterr().out
    assert not old.exists() and recent.exists()
    assert "kept: built less than 30 days ago" in out and "removed 1 of 2 entries" in out


def test_clean_refuses_a_root_sparse_mla_did_not_build_into(tmp_path, capsys):
    (tmp_path / "sm90a" / "something").mkdir(parents=True)
    assert main(["clean", "--cache-dir", str(tmp_path)]) == 1
    assert "holds no CACHEDIR.TAG" in capsys.readouterr().err
    assert (tmp_path / "sm90a" / "something").is_dir()


def test_clean_waits_for_a_build_holding_the_entry_lock(busy_root):
    root, entries, _ = busy_root
    with open(store.lock_path(entries[0]), "a+") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)  # as a build of this entry would
        cleaner = threading.Thread(target=main, args=(["clean", "--cache-dir", str(root)],))
        cleaner.start()
        cleaner.join(1.0)
        assert cleaner.is_alive() and entries[0].exists(), "clean did not wait for the lock"
        fcntl.flock(lock.fileno(), fcntl.LOCK_UN)
    cleaner.join(30)
    assert not cleaner.is_alive() and not entries[0].exists()


@pytest.mark.skipif(os.getuid() != 0, reason="chown to another user needs root")
def test_clean_keeps_another_users_entry(busy_root, capsys):
    root, (theirs, mine), _ = busy_root
    os.chown(theirs, 65534, 65534)
    assert main(["clean", "--cache-dir", str(root)]) == 0
    assert "kept: belongs to another user (uid 65534)" in capsys.readouterr().out
    assert theirs.exists() and not mine.exists()


def test_env_prints_versions_gpus_roots_and_the_variables_that_are_set(tmp_path):
    environment = {k: v for k, v in os.environ.items() if not k.startswith("SPARSE_MLA_")}
    environment.update(SPARSE_MLA_JIT_CACHE_DIR=str(tmp_path / "env"), SPARSE_MLA_DISABLE_JIT="1")
    result = run_cli("env", env=environment)
    assert result.returncode == 0, result.stderr
    rows = dict(re.findall(r"^(.+?):\s+(.*)$", result.stdout, re.MULTILINE))
    assert rows["sparse_mla"] == sparse_mla.__version__
    for distribution in ("torch", "apache-tvm-ffi", "nvidia-cutlass"):
        assert rows[distribution] == importlib.metadata.version(distribution)
    assert "CUDA toolkit" in rows and "torch's CUDA" in rows and "GPU" in rows
    assert rows["cache dir (writable)"] == str(tmp_path / "env")
    assert rows["SPARSE_MLA_JIT_CACHE_DIR"] == str(tmp_path / "env") and rows["SPARSE_MLA_DISABLE_JIT"] == "1"
    given = run_cli("env", "--cache-dir", str(tmp_path / "given"), env=environment)
    rows = dict(re.findall(r"^(.+?):\s+(.*)$", given.stdout, re.MULTILINE))
    assert rows["cache dir (writable)"] == str(tmp_path / "given") and rows["lookup dirs"] == str(tmp_path / "given")


@pytest.mark.parametrize(
    "args, words",
    [
        (["prebuild", "--d-qk", "576", "--topk", "abc"], "argument --topk: topk values must be positive whole numbers, got 'abc'"),
        (["prebuild", "--d-qk", "576", "--topk", "64", "-j", "two"], "argument -j/--jobs: must be a whole number, at least 1, got 'two'"),
        (["clean", "--older-than", "soon"], "argument --older-than: must be a number of days, at least 0, got 'soon'"),
    ],
)
def test_an_argument_that_is_no_number_is_named_without_internal_names(args, words):
    result = run_cli(*args)
    assert result.returncode == 2 and result.stderr.rstrip().endswith(words), result.stderr
    assert not re.search(r"invalid _\w+ value", result.stderr)


def test_the_compile_lines_of_prebuild_do_not_advise_prebuild(fake_compiler, tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="sparse_mla"):
        assert main(["prebuild", "--d-qk", "576", "--topk", "64", "--cache-dir", str(tmp_path / "cache")]) == 0
    compiling = [r.getMessage() for r in caplog.records if "compiling" in r.getMessage()]
    assert compiling == ["sparse_mla: compiling sparse_mla_prefill_dqk576_topk64_sm90a (not in the cache yet) ..."]


def test_list_of_a_directory_that_does_not_exist_is_an_error(tmp_path, capsys):
    assert main(["list", "--cache-dir", str(tmp_path / "nowhere")]) == 1
    captured = capsys.readouterr()
    assert captured.err == f"error: the cache directory {tmp_path / 'nowhere'} does not exist\n" and captured.out == ""


def test_list_of_a_missing_prebuilt_dir_is_an_error_and_of_an_unbuilt_writable_root_is_not(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SPARSE_MLA_JIT_CACHE_DIR", str(tmp_path / "writable"))
    monkeypatch.setenv("SPARSE_MLA_PREBUILT_DIRS", str(tmp_path / "prebuilt"))
    assert main(["list"]) == 1
    captured = capsys.readouterr()
    assert captured.out == f"{tmp_path / 'writable'}: does not exist yet: 0 entries\n"
    assert captured.err == f"error: the cache directory {tmp_path / 'prebuilt'} does not exist\n"
    monkeypatch.delenv("SPARSE_MLA_PREBUILT_DIRS")
    assert main(["list"]) == 0


def test_list_says_what_differs_for_each_stale_entry(tmp_path, monkeypatch, capsys):
    fake_jit.fake_cache(cutlass="4.1.0").prebuild(KernelKey(576, 2048), tmp_path)
    fake_jit.fake_cache(cuda_version="12090").prebuild(KernelKey(576, 2048), tmp_path)
    monkeypatch.setattr(cli, "build_spec", fake_jit.fake_spec)  # this host: CUDA 13.0, nvidia-cutlass 4.2.0.0
    assert main(["list", "--cache-dir", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()[1:]
    cutlass = fake_jit.fake_spec(KernelKey(576, 2048), cutlass="4.1.0").entry_dir(tmp_path).name
    toolkit = fake_jit.fake_spec(KernelKey(576, 2048), cuda_version="12090").entry_dir(tmp_path).name
    assert sorted(re.sub(r"\s+", " ", line).strip() for line in lines) == sorted([
        f"stale {KernelKey(576, 2048).name} {cutlass} 0.0 s entry {cutlass} was built with nvidia-cutlass 4.1.0; "
        "this host has nvidia-cutlass 4.2.0.0",
        f"stale {KernelKey(576, 2048).name} {toolkit} 0.0 s entry {toolkit} was built with CUDA 12.9; this host has CUDA 13.0",
    ]), lines


# ---- env --json and env --compare ---------------------------------------------------------------

IDENTITY_FIELDS = {
    "sparse_mla", "headers_sha256", "arch", "flags", "nvidia-cutlass", "apache-tvm-ffi", "cuda_toolkit", "cuda_driver",
    "torch", "python",
}


def test_env_json_prints_what_build_host_and_gpu_node_must_agree_on():
    result = run_cli("env", "--json")
    assert result.returncode == 0, result.stderr
    identity = json.loads(result.stdout)
    assert set(identity) == IDENTITY_FIELDS
    spec = build_spec(KernelKey(576, 2048))
    assert identity["sparse_mla"] == sparse_mla.__version__ and identity["arch"] == "sm_90a" == spec.inputs["arch"]
    assert identity["flags"] == spec.inputs["flags"] + spec.inputs["link_flags"]
    assert identity["nvidia-cutlass"] == spec.inputs["cutlass"] == importlib.metadata.version("nvidia-cutlass")
    assert identity["apache-tvm-ffi"] == spec.inputs["tvm_ffi"] == importlib.metadata.version("apache-tvm-ffi")
    headers = json.dumps(spec.inputs["headers"], sort_keys=True).encode()
    assert identity["headers_sha256"] == hashlib.sha256(headers).hexdigest()
    toolkit = env.cuda_version(env.cuda_home())
    assert identity["cuda_toolkit"] == (f"{int(toolkit) // 1000}.{int(toolkit) % 1000 // 10}" if toolkit else None)


def write_identity(path: Path, **changes) -> Path:
    path.write_text(json.dumps(cli.build_identity() | changes))
    return path


def test_env_compare_with_the_same_host_matches(tmp_path, capsys):
    assert main(["env", "--compare", str(write_identity(tmp_path / "same.json"))]) == 0
    assert "match" in capsys.readouterr().out


def test_env_compare_prints_each_field_that_differs_and_fails(tmp_path, capsys):
    here = cli.build_identity()
    other = write_identity(tmp_path / "node.json", **{"nvidia-cutlass": "4.1.0", "headers_sha256": "0" * 64, "torch": "2.0"})
    assert main(["env", "--compare", str(other)]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines == [
        f'headers_sha256: this host "{here["headers_sha256"]}", {other} "{"0" * 64}"',
        f'nvidia-cutlass: this host "{here["nvidia-cutlass"]}", {other} "4.1.0"',
        "2 differences: kernels prebuilt on one of these hosts do not load on the other",
    ]


@pytest.mark.parametrize(
    "build_host, node, line",
    [
        ({"cuda_toolkit": "13.0"}, {"cuda_toolkit": "12.9"}, "cuda_toolkit: this host 13.0, node.json 12.9"),
        ({"cuda_toolkit": "13.0"}, {"cuda_toolkit": None, "cuda_driver": "12.8"},
         "cuda_toolkit: this host builds with CUDA 13.0, node.json's driver runs CUDA 12.8 at most"),
        ({"cuda_toolkit": "12.9"}, {"cuda_toolkit": None, "cuda_driver": "13.0"}, None),
        ({"cuda_toolkit": None, "cuda_driver": "12.8"}, {"cuda_toolkit": "13.0"},
         "cuda_toolkit: node.json builds with CUDA 13.0, this host's driver runs CUDA 12.8 at most"),
    ],
    ids=["two-toolkits", "node-driver-too-old", "node-without-toolkit", "this-host-is-the-node"],
)
def test_env_compare_asks_of_a_node_without_a_toolkit_only_a_driver_new_enough(build_host, node, line):
    here, there = cli.build_identity() | build_host, cli.build_identity() | node
    assert cli._build_differences(here, there, "node.json") == ([line] if line else [])


def test_env_compare_of_a_file_that_is_not_env_json_is_an_error(tmp_path, capsys):
    (tmp_path / "other.json").write_text("[1, 2]")
    assert main(["env", "--compare", str(tmp_path / "other.json")]) == 2
    assert main(["env", "--compare", str(tmp_path / "missing.json")]) == 2
    err = capsys.readouterr().err
    assert "is not the output of `env --json`" in err and f"cannot read {tmp_path / 'missing.json'}" in err
