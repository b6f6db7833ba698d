"""What every command shares: its error type, opening trace files, progress on a terminal."""

from __future__ import annotations

import argparse
import atexit
import gc
import math
import os
import sys
import time
from collections.abc import Callable, Collection, Iterator
from pathlib import Path
from typing import Any

import msgspec
import orjson

from ..config import LONGEST_WAIT
from ..reader import EventReader, OnSkip, trace_file, unreadable


class CliError(Exception):
    """A problem to report in one line; exit code 2 (usage, I/O) unless said otherwise."""

    def __init__(self, message: str, exit_code: int = 2) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def trace_argument(value: str) -> str:
    """The argparse type of a command's trace: a file, or a log directory holding one."""
    return str(trace_file(value))


def trace_reader(
    path: str | os.PathLike[str],
    *,
    kinds: Collection[str] | None = None,
    on_skip: OnSkip | None = None,
    progress: bool = True,
    as_type: type[msgspec.Struct] | None = None,
    typed: bool = False,
    validate: bool = False,
) -> EventReader:
    """An :class:`EventReader` for a file the user named, checked up front."""
    p = Path(path)
    problem = unreadable(p)
    if problem is not None:
        raise CliError(problem)
    report = terminal_progress(f"reading {p.name}") if progress else None
    return EventReader(
        p,
        kinds=kinds,
        on_skip=on_skip,
        progress=report,
        as_type=as_type,
        typed=typed,
        validate=validate,
        warn_if_no_trace=False,  # check_is_trace says so, as an error
    )


def checked_batches(reader: EventReader) -> Iterator[list[Any]]:
    """The reader's events block by block; at the end, raise if the file was not a trace."""
    seen = 0
    for batch in reader.batches():
        seen += len(batch)
        yield batch
    check_is_trace(reader, seen)


def checked_events(reader: EventReader) -> Iterator[Any]:
    """The reader's events; once they are read, raise if the file was not a trace at all."""
    for batch in checked_batches(reader):
        yield from batch


def check_is_trace(reader: EventReader, events_seen: int) -> None:
    """Raise when a file is evidently not a trace: it has lines and its first is no event,
    or it is empty (a trace's writer writes its run.start at once)."""
    if events_seen:
        return
    if reader.first_line_is_event is False:
        raise CliError(f"{reader.path}: not a trace file (none of its lines is a JSON event)")
    if reader.lines == 0:
        raise CliError(
            f"{reader.path}: empty: no events (is it the right file? a trace's writer writes "
            "its run.start line at once)"
        )


def terminal_progress(label: str) -> Callable[[int, int], None] | None:
    """A ``(done, total)`` callback redrawing one line on stderr, if stderr is a terminal."""
    if not sys.stderr.isatty():
        return None
    last = [0.0]

    def report(done: int, total: int) -> None:
        now = time.monotonic()
        finished = total and done >= total
        if not finished and now - last[0] < 0.1:
            return
        last[0] = now
        pct = 100.0 * done / total if total else 100.0
        sys.stderr.write(f"\r{label}: {pct:5.1f}% of {total / 1e6:,.1f} MB")
        if finished:
            sys.stderr.write("\r\033[K")
        sys.stderr.flush()

    return report


def print_json(value: Any, *, indent: bool = False) -> None:
    """One JSON document on stdout; integers past 64 bits written as their exact digits,
    as in the log."""
    option = orjson.OPT_INDENT_2 if indent else 0
    try:
        data = orjson.dumps(value, option=option)
    except TypeError:
        from ..exporters import jsonable  # the writer's module: only for what orjson refuses

        data = orjson.dumps(jsonable(value), option=option)
    sys.stdout.buffer.write(data + b"\n")


def without_cyclic_gc() -> None:
    """Turn the cyclic garbage collector off for the rest of this command's process.

    A read command keeps one small record per group and step, none in a cycle,
    while it decodes a container per line; the collector would rescan that
    growing state again and again for nothing.  Off, the ``cost`` pass over the
    600k-line bench trace took 1.37 s against 2.33 s with it on (same run); reference
    counting still frees every event.  Only commands do this: the library
    leaves the caller's process alone.

    At exit everything is frozen too (out of the collector's sight): the interpreter's
    last collection otherwise scans the whole state once more, 0.12 s of ``staleness``
    on that trace.
    """
    gc.disable()
    atexit.register(gc.freeze)


def at_least(minimum: int, most: int = 10**9) -> Callable[[str], int]:
    """An argparse type: a whole number from ``minimum`` to ``most``, or a one-line usage
    error (a window of 10**20 steps made a traceback, a simulated group of 10**20
    generations took memory without end)."""

    def parse(raw: str) -> int:
        try:
            value = int(raw)
        except ValueError:
            value = minimum - 1
        if value < minimum:
            least = "0 or more" if minimum == 0 else f"a whole number of at least {minimum}"
            raise argparse.ArgumentTypeError(f"must be {least}, got {raw!r}")
        if value > most:
            raise argparse.ArgumentTypeError(f"must be at most {most:,}, got {raw!r}")
        return value

    return parse


positive_int = at_least(1)
non_negative_int = at_least(0)


def amount_of(unit: str, *, zero: bool = True) -> Callable[[str], float]:
    """An argparse type: a finite number ≥ 0 of ``unit`` (seconds, say; > 0 without
    ``zero``), or a one-line usage error (a NaN or an infinite timeout made a traceback, a
    negative one no sense)."""

    def parse(raw: str) -> float:
        try:
            value = float(raw)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and 0 <= value <= LONGEST_WAIT and (zero or value > 0)):
            most = f"{LONGEST_WAIT:g}"
            which = f"from 0 to {most}" if zero else f"over 0 and at most {most}"
            raise argparse.ArgumentTypeError(f"must be a number of {unit} {which}, got {raw!r}")
        return value

    return parse


seconds = amount_of("seconds")
#: A wait that must let something happen: a timeout of 0 could only fail.
some_seconds = amount_of("seconds", zero=False)


def endpoint_url(raw: str) -> str:
    """An argparse type: an OTLP endpoint URL (``http://host:port`` or ``https://…``), or
    a one-line usage error (the SDK would retry a bad one for half a minute, then fail)."""
    try:
        import urllib.parse  # only for a URL; the read commands do not need it

        parts = urllib.parse.urlsplit(raw)
        port = parts.port  # a port that is no number, or past 65535, raises
        ok = parts.scheme in ("http", "https") and bool(parts.hostname)
        ok = ok and (port is not None or not parts.netloc.endswith(":"))
    except ValueError:  # a port that is no number
        ok = False
    if not ok or any(c.isspace() for c in raw):
        raise argparse.ArgumentTypeError(f"must be a URL like http://127.0.0.1:4317, got {raw!r}")
    return raw


def port_number(raw: str) -> int:
    """An argparse type: a TCP port, 1 to 65535, or a one-line usage error."""
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port number from 1 to 65535, got {raw!r}")
    return value


def add_full_ids(parser: Any) -> None:
    """The flag every read command has for whole run IDs (they show the first 8 otherwise)."""
    parser.add_argument(
        "--full-ids",
        action="store_true",
        help="show whole run IDs (the first 8 characters otherwise)",
    )


def prepare_output(path: Path, reading: Path) -> str:
    """Ready ``path`` to be written with what was read from ``reading``: refuse it if it is
    that very file (by name or through a link: writing would destroy the trace, a live
    trainer's log among them), and make its directory if it is missing.  Returns the note
    for the "wrote" line: `` (made the directory D)``, or nothing.  Either problem is a
    :class:`CliError`."""
    try:
        same = os.path.samefile(path, reading)
    except OSError:  # either is missing (or unreadable): not the same file
        same = False
    if same:
        raise CliError(f"{path} is the trace being read ({reading}): name another output file")
    parent = path.parent
    if parent.exists():
        return ""
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CliError(f"cannot make the directory {parent}: {exc.strerror or exc}") from None
    return f" (made the directory {parent})"
