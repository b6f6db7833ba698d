"""``otel-rollout watch FILE``: a live terminal view of a growing trace, as ``tail -f`` follows.

Each refresh reads only the lines appended since the last one
(:class:`~otel_rollout.live.LiveTrace`) into one analysis pass that carries
over; the screen is drawn with ``rich`` (the ``watch`` extra), imported only here.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from .. import config
from .._blocks import is_gzipped
from ..exporters import log_path
from ..live import LiveTrace
from ..reader import unreadable
from ..render.fields import Style
from ._common import (
    CliError,
    add_full_ids,
    check_is_trace,
    positive_int,
    terminal_progress,
    trace_argument,
    without_cyclic_gc,
)

_MISSING = "otel-rollout watch needs rich: pip install 'otel-rollout[watch]'"


def _interval(raw: str) -> float:
    """``--interval``: checked by the setting's own rules, with a clear message."""
    setting = config.WATCH_INTERVAL
    try:
        return setting.check(setting.parse(raw))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"must be a number of seconds, at least {setting.at_least}, got {raw!r}"
        ) from None


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "watch",
        help="a live terminal view of a growing trace (follows it as tail -f does)",
        description=(
            "Follow a rollout_trace.jsonl as it grows (and as a resumed run appends to it) "
            "and redraw one screen: the current run and step, trained and engine weight "
            "versions, batch age (the last step's, and a sparkline of recent steps), the "
            "last step's token-age shares, attempts and groups in flight, refits and the "
            "calls they paused, events per second, lines skipped, step warnings and trace "
            "events dropped, and, once the file holds a stop, what the stops cost so far "
            "(as 'otel-rollout cost' counts it). Each refresh reads only what was appended; "
            "a partial last line waits for its newline; a truncated or replaced file is "
            "read again from its start. Ctrl-C quits. Needs the 'watch' extra (rich)."
        ),
    )
    parser.add_argument(
        "file",
        type=trace_argument,
        help="a rollout_trace.jsonl (it may not exist yet), or its directory",
    )
    parser.add_argument(
        "--interval",
        type=_interval,
        default=None,
        metavar="S",
        help=f"seconds between refreshes (OTEL_ROLLOUT_WATCH_INTERVAL, "
        f"default {config.WATCH_INTERVAL.default})",
    )
    parser.add_argument(
        "--once",
        action="store_true",
        help="read the file as it is, print one frame to stdout and exit (for scripts)",
    )
    parser.add_argument(
        "--window", type=positive_int, default=5, metavar="N", help="steps before/after a stop (5)"
    )
    add_full_ids(parser)
    parser.set_defaults(handler=run)


def _rich() -> Any:
    try:
        from ..render import live as render
    except ImportError as exc:
        if getattr(exc, "name", "") and not str(exc.name).startswith("rich"):
            raise
        raise CliError(_MISSING) from None
    return render


def run(args: argparse.Namespace) -> int:
    render = _rich()
    from rich.console import Console

    style = Style(full_ids=args.full_ids)
    if args.once:
        return _once(args.file, render, Console, style, args.window)
    # The log a writer given this path writes (a log directory's, even before it exists).
    path = str(log_path(args.file))
    if is_gzipped(path):
        raise CliError(f"{path}: gzipped; a live view follows a plain log as it grows "
                       "(a finished .gz: watch --once, batch-age, cost or report)")  # fmt: skip
    if os.path.exists(path):  # a path with nothing at it yet is waited for
        _check_readable(path)
    console = Console()
    if not console.is_terminal:
        raise CliError("the live view needs a terminal; --once prints one frame to a pipe or file")
    interval = config.WATCH_INTERVAL.resolve(args.interval)  # (--once draws no second frame)
    return _follow(LiveTrace(path, window=args.window), render, console, style, interval)


def _check_readable(path: str | Path) -> None:
    problem = unreadable(Path(path))
    if problem is not None:
        raise CliError(problem)


def _once(path: str, render: Any, console_type: Any, style: Style, window: int) -> int:
    _check_readable(path)
    without_cyclic_gc()
    progress = terminal_progress(f"reading {Path(path).name}")
    trace = LiveTrace(path, window=window)
    try:
        total = trace.follower.size()  # the file as it is now; what is appended later waits
        if is_gzipped(path):  # a finished, gzipped run: read as every read command reads it
            trace.read_whole(progress)
        else:
            _read_to(trace, total, progress)
        if progress is not None:
            progress(total, total)
        check_is_trace(trace.reader, trace.reader.events)
        width = None if sys.stdout.isatty() else 120  # a pipe gets lines of 120 characters
        console = console_type(file=sys.stdout, width=width, highlight=False)
        console.print(render.frame_view(trace.frame(), style, live=False))
    finally:
        trace.close()
    return 0


def _read_to(trace: LiveTrace, total: int, progress: Any) -> None:
    """Read a plain log up to byte ``total`` (its size when asked), showing progress."""
    while True:
        trace.read(budget=0.1)
        if progress is not None:
            progress(min(trace.follower.offset, total), total)
        if trace.caught_up or trace.follower.read_to >= total:
            return


def _follow(trace: LiveTrace, render: Any, console: Any, style: Style, interval: float) -> int:
    """Redraw every ``interval`` seconds until Ctrl-C (or SIGTERM): exit 0, screen restored."""
    from rich.live import Live

    def stop(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, stop)
    last = None
    try:
        with Live(console=console, auto_refresh=False, screen=True, transient=True) as view:
            while True:
                began = time.monotonic()
                try:
                    trace.read(budget=max(0.05, interval / 2))
                except OSError as exc:  # a directory or an unreadable file came at the path
                    # Raised inside the Live block, so the screen is restored before it is said.
                    _check_readable(trace.path)
                    raise CliError(f"{trace.path}: {exc.strerror or exc}") from None
                last = trace.frame()
                view.update(render.frame_view(last, style), refresh=True)
                # A file still catching up is read again at once (the screen shows progress).
                if trace.caught_up:
                    time.sleep(max(0.0, interval - (time.monotonic() - began)))
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        trace.close()
    if last is not None and last.step is not None:
        age = last.age.batch_age if last.age is not None else None
        shown = "n/a" if age is None else f"{age:.4f}"
        print(f"{trace.path}: step {last.step}, batch age {shown} ({last.events:,} events read)")
    return 0
