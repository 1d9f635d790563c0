"""The build tools this process runs, and how an interrupt stops them.

A terminal's Ctrl-C sends SIGINT to every process of the foreground group: ninja passes it on to the
compilers it started (each in a process group of its own) and exits, and the build fails at once. A tool
started just after the signal never sees it, though: its build would run to the end, and the interpreter,
which joins every worker thread before it exits, would wait for it. So the command line and ``warmup``
run their builds inside :func:`stopping_at_interrupt`, which then calls :func:`stop`: it sends SIGINT to
every tool still running, and from then on :func:`run` starts none. ``warmup`` calls :func:`resume` once
its builds have returned, so that a process that survives the interrupt (a notebook) can build again.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

_lock = threading.Lock()  # a tool is started and registered, or refused, in one step
_running: set[subprocess.Popen[str]] = set()
_stopped = False
_stop_at_first_interrupt = False

# A tool that died of SIGINT, or that exited the way a shell reports it (128 + SIGINT; ninja does).
_INTERRUPTED = (-signal.SIGINT, 128 + signal.SIGINT)


def _interrupted(argv: list[str]) -> KeyboardInterrupt:
    return KeyboardInterrupt(f"interrupted: {Path(argv[0]).name}")


def raise_if_stopped(what: str) -> None:
    """Raises KeyboardInterrupt once :func:`stop` was called (or the first interrupted tool stopped the
    builds): a build that a worker thread takes up after the interrupt then begins nothing, not even its
    announcement, which would print after the command's own "interrupted"."""
    with _lock:
        if _stopped:
            raise KeyboardInterrupt(f"interrupted: {what}")


def run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """Runs a build tool in ``cwd`` with the process's environment, unchanged, and returns its output
    (stdout and stderr together). Raises KeyboardInterrupt, starting nothing, once :func:`stop` was
    called, and when the tool was interrupted (then the build failed for no fault of its own)."""
    global _stopped
    with _lock:
        if _stopped:
            raise _interrupted(argv)
        process = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        _running.add(process)
    try:
        output, _ = process.communicate()
    except BaseException:
        # A KeyboardInterrupt in the thread that runs the tool (the signal may not have reached the tool)
        process.send_signal(signal.SIGINT)
        process.communicate()
        with _lock:
            _running.discard(process)
        raise
    with _lock:
        _running.discard(process)
        interrupted = process.returncode in _INTERRUPTED or _stopped
        _stopped = _stopped or (interrupted and _stop_at_first_interrupt)
    if interrupted:
        raise _interrupted(argv)
    return subprocess.CompletedProcess(argv, process.returncode, output)


@contextlib.contextmanager
def stopping_at_interrupt() -> Iterator[None]:
    """Inside, an interrupt stops every build tool and starts no other (:func:`stop`): a
    KeyboardInterrupt raised inside (in the main thread, which Python hands it to), and the first tool
    that is interrupted, since the thread of that tool would otherwise start the next kernel's compiler
    before the main thread has handled its KeyboardInterrupt."""
    global _stop_at_first_interrupt
    _stop_at_first_interrupt = True
    try:
        yield
    except KeyboardInterrupt:
        stop()
        raise
    finally:
        _stop_at_first_interrupt = False


def stop() -> None:
    """Interrupts every running build tool (SIGINT: ninja ends the compilers it started) and refuses
    to start another until :func:`resume`."""
    global _stopped
    with _lock:
        _stopped = True
        for process in _running:
            process.send_signal(signal.SIGINT)  # a no-op for one that has ended


def resume() -> None:
    """Lets :func:`run` start tools again (after the builds an interrupt stopped have returned)."""
    global _stopped
    with _lock:
        _stopped = False
