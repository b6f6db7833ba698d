"""``python -m otel_rollout.trace FILE``: one line per step, its number then its batch age.

Below both :mod:`otel_rollout.trace` and :mod:`otel_rollout.cli`, so that the
reference module's ``main`` does not import the command line (and the command
line, which imports the simulator and through it the writer, does not import
itself back).  It also holds the command-line logging that both use.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence

from .analysis import BATCH_AGE_EVENTS, StepAges, run_file
from .reader import EventReader, trace_file, unreadable
from .render.words import printable

__all__ = ["print_batch_ages", "setup_logging"]


class _StderrHandler(logging.StreamHandler):
    """Our one handler: writes to whatever sys.stderr is at the time (tests swap it)."""

    def emit(self, record: logging.LogRecord) -> None:
        self.stream = sys.stderr
        super().emit(record)


class _OneLine(logging.Formatter):
    """``otel-rollout: LEVEL: message``, once: the package's messages begin with
    ``otel-rollout:`` themselves (for a trainer's own log), which is not said twice."""

    _PREFIX = "otel-rollout: "

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        head = f"{self._PREFIX}{record.levelname}: "
        if line.startswith(head + self._PREFIX):
            line = head + line[len(head) + len(self._PREFIX) :]
        return printable(line, newlines=record.exc_info is not None)  # a traceback's lines


def setup_logging() -> None:
    """Send the package's warnings to stderr as one ``otel-rollout: LEVEL: message`` line each."""
    logger = logging.getLogger("otel_rollout")
    if any(isinstance(h, _StderrHandler) for h in logger.handlers):
        return  # a second command in one process (tests, notebooks)
    handler = _StderrHandler(sys.stderr)
    handler.setFormatter(_OneLine("otel-rollout: %(levelname)s: %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False


def print_batch_ages(argv: Sequence[str] | None = None) -> int:
    """Print ``step batch_age`` for every step that has one; the exit code (0, or 2)."""
    parser = argparse.ArgumentParser(
        prog="python -m otel_rollout.trace",
        description="Print each training step's batch age from a rollout trace file.",
    )
    parser.add_argument("file", help="a rollout_trace.jsonl (or .jsonl.gz)")
    args = parser.parse_args(argv)
    setup_logging()
    path = trace_file(args.file)
    problem = unreadable(path)
    if problem is not None:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    reader = EventReader(path, typed=True, kinds=BATCH_AGE_EVENTS, warn_if_no_trace=False)
    try:
        [rows] = run_file(reader, [StepAges()])  # the one pass batch-age uses
        if reader.no_trace:
            print(
                f"error: {path}: not a trace file (none of its lines is a JSON event)",
                file=sys.stderr,
            )
            return 2
    except OSError as exc:
        print(f"error: {path}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    try:
        for row in rows:
            if row.batch_age is not None:
                print(f"{row.step} {row.batch_age:.6f}")
        sys.stdout.flush()
    except BrokenPipeError:
        sys.stderr.close()  # the reader went away (| head); nothing left to say
    except OSError as exc:  # the output's fault, not the file's (a full disk, /dev/full)
        print(f"error: cannot write the output: {exc.strerror or exc}", file=sys.stderr)
        drop_stdout()
        return 2
    return 0


def drop_stdout() -> None:
    """Point stdout at /dev/null, so that what is still buffered for it does not fail
    again (with a traceback) when the interpreter exits."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
