"""The ``sparse_mla`` logger, and where its records go when the application configured no logging.

A compile blocks its caller for seconds, and waiting for another process's compile as long, so both
are announced at INFO (a line when they start, one with the time when they end). So that a serving
process sees them without configuring anything, the logger carries one handler that writes to stderr
as long as the application has no logging of its own (no handler on the root logger or on this
logger); once it has, the records go to the application's handlers only.

Silence the announcements with ``SPARSE_MLA_LOG_LEVEL=WARNING`` (read when this module is imported), or
the standard way: ``logging.getLogger("sparse_mla").setLevel(logging.WARNING)``.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import TextIO

logger = logging.getLogger("sparse_mla")

LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


class _StderrUntilConfigured(logging.StreamHandler):
    """Writes to the current ``sys.stderr`` while no other handler would receive the record."""

    def __init__(self) -> None:
        super().__init__()
        self.setFormatter(logging.Formatter("%(message)s"))

    @property  # the current sys.stderr, read at each write
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, value: TextIO) -> None:  # StreamHandler.__init__ assigns it; sys.stderr is read at each write
        pass

    def emit(self, record: logging.LogRecord) -> None:
        if logging.getLogger().handlers or any(h is not self for h in logger.handlers):
            return
        super().emit(record)


def _configure() -> None:
    if not any(isinstance(h, _StderrUntilConfigured) for h in logger.handlers):
        logger.addHandler(_StderrUntilConfigured())
    level = os.environ.get("SPARSE_MLA_LOG_LEVEL", "").strip().upper()
    if level in LEVELS:
        logger.setLevel(level)
        return
    if logger.level == logging.NOTSET:
        logger.setLevel(logging.INFO)
    if level:
        logger.warning("sparse_mla: ignoring SPARSE_MLA_LOG_LEVEL=%s (not one of %s)", level, ", ".join(LEVELS))


_configure()
