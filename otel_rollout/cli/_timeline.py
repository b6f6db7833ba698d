"""``otel-rollout timeline FILE -o timeline.json``: the whole file on one time axis, for a
trace viewer (Perfetto UI, chrome://tracing, speedscope)."""

from __future__ import annotations

import argparse
import contextlib
import gzip
import os
import sys
from pathlib import Path
from typing import Any, BinaryIO

from ..analysis import run_file
from ..timeline import RunSelector, StepRange, Timeline, TimelineSummary, TraceEventWriter
from ..timeline import step_windows as find_step_windows
from ..timeline.trace_events import OutputError
from ._common import (
    CliError,
    amount_of,
    check_is_trace,
    prepare_output,
    trace_argument,
    trace_reader,
    without_cyclic_gc,
)


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "timeline",
        help="the whole file on one time axis, for Perfetto UI, chrome://tracing or speedscope",
        description=(
            "Write the trace as a Chrome Trace Event Format file (a JSON object with "
            "traceEvents) that Perfetto UI (ui.perfetto.dev), chrome://tracing and speedscope "
            "open. One process per run, named with the run's ID (a stop is the gap between "
            "two); a trainer thread with a slice per train.step (step, trained version, batch "
            "age) and checkpoint instants; a weights thread with each refit (the calls it "
            "paused); engine lanes with every attempt from its dispatch or resume to its seal, "
            "refusal or abandonment, packed so attempts on one lane never overlap, split at "
            "the refits that changed its weights and named and coloured by the weight version "
            "that generated each piece; counters for the engine's weight version, attempts "
            "and groups in flight and batch age per step. Time is microseconds from the "
            "file's first event. Streams: events are written as they are made."
        ),
        epilog=(
            "Open the file at https://ui.perfetto.dev (Open trace file), in chrome://tracing "
            "(Load), or at https://www.speedscope.app (one profile per lane)."
        ),
    )
    parser.add_argument(
        "file", type=trace_argument, help="a rollout_trace.jsonl (or .jsonl.gz), or its directory"
    )
    parser.add_argument(
        "-o",
        "--output",
        default="timeline.json",
        metavar="OUT",
        help="where to write (default timeline.json; a name ending in .gz is gzipped; - for "
        "standard output)",
    )
    parser.add_argument(
        "--runs",
        metavar="R[,R…]",
        help="only these runs: positions in the file (1 is the first) or run ID prefixes "
        "(at least 4 characters)",
    )
    parser.add_argument(
        "--steps",
        metavar="A:B",
        help="only the time of steps A to B-1 (A: or :B leave an end open), in every run "
        "that trained them; attempts that overlap it are drawn whole",
    )
    parser.add_argument(
        "--counter-ms",
        type=amount_of("milliseconds"),
        default=10.0,
        metavar="MS",
        help="shortest trace time between two samples of the in-flight counters (10 ms; 0 "
        "samples every change)",
    )
    parser.set_defaults(handler=run)


def write_timeline(
    path: str,
    out: BinaryIO,
    *,
    runs: RunSelector | None = None,
    steps: StepRange | None = None,
    counter_ms: float = 10.0,
    progress: bool = True,
) -> TimelineSummary:
    """Write the timeline of ``path`` to ``out``; raises :class:`CliError` for a file that
    is not a trace, or a cut that keeps nothing."""
    windows = None
    if steps is not None:
        # Two passes: the steps' windows of time first, read without a word (the second
        # pass warns of every line it skips, once); so the file must be one to read twice.
        if not Path(path).is_file():
            raise CliError(
                f"{path}: --steps reads the trace twice, and this is no regular file (a "
                "pipe?): save it to a file first"
            )
        quiet = trace_reader(
            path, kinds={"train.step"}, typed=True, progress=progress,
            on_skip=lambda line, why: None,
        )  # fmt: skip
        found, seen = find_step_windows(quiet, steps)
        if not found:
            raise CliError(
                f"{path}: no train.step in --steps {_show(steps)} ({seen:,} steps in the file)"
            )
        windows = found
    reader = trace_reader(path, typed=True, progress=progress)
    timeline = Timeline(
        TraceEventWriter(out),
        runs=runs,
        windows=windows,
        steps=steps,
        counter_resolution=counter_ms / 1000.0,
        source=Path(path).name,
    )
    [summary] = run_file(reader, [timeline])
    check_is_trace(reader, reader.events)
    if runs is not None and not runs.matched:
        raise CliError(f"{path}: --runs matches none of the file's {len(timeline.state.runs)} runs")
    for prefix, matched in (runs.ambiguous() if runs is not None else {}).items():
        print(f"otel-rollout: note: --runs {prefix} matches {len(matched)} runs "
              f"({', '.join(matched)}); all are drawn, give more of an ID to pick one",
              file=sys.stderr)  # fmt: skip
    if steps is not None and not summary.runs:
        raise CliError(f"{path}: the runs chosen have no step in --steps {_show(steps)}")
    return summary


def _show(steps: StepRange | None) -> str:
    if steps is None:
        return ""
    return steps.text()


def run(args: argparse.Namespace) -> int:
    without_cyclic_gc()
    try:
        runs = RunSelector.parse(args.runs) if args.runs is not None else None
        steps = StepRange.parse(args.steps) if args.steps is not None else None
    except ValueError as exc:
        raise CliError(str(exc)) from None
    trace_reader(args.file, progress=False)  # a missing or unreadable file: one line, first
    if args.output == "-":  # standard output (a write error there is the CLI's one line)
        summary = write_timeline(args.file, sys.stdout.buffer, runs=runs, steps=steps,
                                 counter_ms=args.counter_ms, progress=False)  # fmt: skip
        sys.stdout.buffer.flush()
        print(f"standard output: {summary.line()}", file=sys.stderr)
        return 0
    out_path = Path(args.output)
    where = prepare_output(out_path, Path(args.file))
    try:
        if args.output.endswith(".gz"):
            raw = open(out_path, "wb")  # noqa: SIM115  # closed below, through the gzip stream
            out: BinaryIO = gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=6)  # type: ignore[assignment]  # a binary file
        else:
            raw = out = open(out_path, "wb")  # noqa: SIM115  # closed below
    except OSError as exc:
        raise CliError(f"{out_path}: cannot write ({exc.strerror})") from None
    done = False
    try:
        try:
            summary = write_timeline(
                args.file, out, runs=runs, steps=steps, counter_ms=args.counter_ms
            )
        except OutputError:
            raise
        except OSError as exc:  # reading the trace (it opened: checked above), not writing
            raise CliError(f"{args.file}: cannot read ({exc.strerror or exc})") from None
        out.close()
        raw.close()
        done = True
    except OSError as exc:  # a full disk, say
        raise CliError(f"{out_path}: cannot write ({exc.strerror or exc})") from None
    finally:
        if not done:
            with contextlib.suppress(OSError):
                out.close()
            with contextlib.suppress(OSError):
                raw.close()
            if out_path.is_file():  # a partial output, never a device (/dev/full) or a pipe
                with contextlib.suppress(OSError):
                    os.unlink(out_path)
    print(f"{out_path}{where}: {summary.line()}", file=sys.stderr)
    return 0
