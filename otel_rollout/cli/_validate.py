"""``otel-rollout validate FILE``: check every line against the schema, by line number."""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from typing import Any

from ..analysis.state import ended_run_writes, never_sealed, sealed_after_training, step_again
from ..events import problems
from ..reader import TORN_LINE
from ..render.words import counted, printable
from ._common import check_is_trace, non_negative_int, print_json, trace_argument, trace_reader

_UNKNOWN = "unknown event kind"
_WHO_UNKNOWN = "its writer was killed mid-line"


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "validate",
        help="check a trace file against the schema",
        description=(
            "Check every line of a trace file against the schema (version 1): JSON that parses, "
            "the fields every line carries, each event kind's required fields and their types. "
            "Reports each problem with its line number and exits 1 when there is any error. "
            "Unknown event kinds and torn lines left by killed writers (the last line, or a "
            "line a resumed run's run.start follows) are warnings. With --from-spans (a file "
            "JsonlSpanExporter wrote from spans), also the order that promises, and a warning "
            "for each line earlier than its run's run.start (the downtime before that run then "
            "reads long)."
        ),
    )
    parser.add_argument(
        "file", type=trace_argument, help="a rollout_trace.jsonl (or .jsonl.gz), or its directory"
    )
    parser.add_argument(
        "--max-report",
        type=non_negative_int,
        default=50,
        metavar="N",
        help="print at most N problems (all are counted; default 50)",
    )
    parser.add_argument(
        "--strict",
        action="store_true",
        help="treat warnings (unknown kinds, torn lines) as errors",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help='print each problem as a JSON line, then {"summary": {lines, events, errors, ...}}',
    )
    parser.add_argument(
        "--from-spans",
        action="store_true",
        help="the file was written from spans (JsonlSpanExporter): also check that every run's "
        "lines follow its run.start and that no attempt line precedes its group's group.reserve; "
        "warn of lines earlier than their run's run.start; a second run.start of one run is an "
        "error",
    )
    parser.set_defaults(handler=run)


class _SpanOrder:
    """The order a file written from spans promises: each run's run.start first (and once),
    and each group's reserve before its attempts' lines.

    An attempt line before its group's reserve is an error once the reserve comes; if
    none comes, a warning at the end: the group's span was still open when the exporter
    shut down, and its attempts were written without it (their tokens are not lost)."""

    def __init__(self) -> None:
        self.runs: dict[str, float] = {}  # run → its run.start's time
        self.groups: set[str] = set()
        self._waiting: dict[str, list[tuple[int, str]]] = {}  # group → its early attempt lines

    def early(self, event: dict[str, Any]) -> str | None:
        """A warning when the line is earlier than its run's run.start: that run.start has the
        time of the earliest line in its first batch, and the downtime before the run that
        ``cost`` reports is at least that much too long."""
        started = self.runs.get(event["run_id"])
        if started is None or event["t"] >= started:
            return None
        return (
            f"this {event['event']} line is {started - event['t']:.3f} s earlier than its "
            f"run's run.start: the downtime before run {event['run_id']} reads at least that "
            "much too long"
        )

    def check(self, lineno: int, event: dict[str, Any]) -> list[tuple[int, str]]:
        """The errors this line shows: its own, or, for a reserve, its attempts' before it."""
        kind, run = event["event"], event["run_id"]
        if kind == "run.start":
            if run in self.runs:
                return [(lineno, f"a second run.start of run {run}: a run ID must be new at "
                         "each process start (a restarted pod keeps its name), or two runs "
                         "read as one")]  # fmt: skip
            self.runs[run] = event["t"]
            return []
        if run not in self.runs:
            return [(lineno, f"a {kind} line of run {run} before that run's run.start")]
        if kind == "group.reserve":
            group = event["group_id"]
            self.groups.add(group)
            return [(n, f"{what} before the group.reserve of its group {group}")
                    for n, what in self._waiting.pop(group, ())]  # fmt: skip
        if kind.startswith("attempt.") and event["group_id"] not in self.groups:
            what = f"{kind} of attempt {event['attempt_id']}"
            self._waiting.setdefault(event["group_id"], []).append((lineno, what))
        return []

    def unreserved(self) -> list[tuple[int, str]]:
        """At the end: the attempt lines whose group has no reserve in the file at all."""
        return sorted(
            (n, f"{what}: its group {group} has no group.reserve in the file (its span was "
                "still open when the exporter shut down?)")
            for group, lines in self._waiting.items()
            for n, what in lines
        )  # fmt: skip


class _Report:
    def __init__(self, path: str, limit: int, as_json: bool) -> None:
        self.path = path
        self.limit = limit
        self.as_json = as_json
        self.counts: Counter[str] = Counter()

    def add(self, lineno: int, severity: str, message: str) -> None:
        self.counts[severity] += 1
        if sum(self.counts.values()) > self.limit:
            return
        if self.as_json:
            line = {"line": lineno, "severity": severity, "problem": message}
            print_json(line)
        else:
            sys.stdout.write(printable(f"{self.path}:{lineno}: {severity}: {message}") + "\n")


def _aside(invalid: int, unknown: int) -> str:
    """What the summary's event count leaves out: lines no reader reads."""
    parts = []
    if invalid:
        parts.append(f"{counted(invalid, 'invalid line')} skipped by readers")
    if unknown:
        parts.append(f"{counted(unknown, 'of unknown kind')} passed over")
    return f" ({'; '.join(parts)})" if parts else ""


def run(args: argparse.Namespace) -> int:
    report = _Report(args.file, args.max_report, args.json)
    warn = "error" if args.strict else "warning"
    # A torn line with lines after it is a killed writer's only if a new run starts next:
    # it waits here for the next line to say which.
    torn: list[tuple[int, str]] = []
    last_run: list[str | None] = [None]  # the run of the last good event

    def settle(resumed: str | None) -> None:
        lineno, reason = torn.pop()
        if resumed is None:
            # A writer killed mid-line is followed by the next run's run.start, not by itself:
            # the reader's guess of a killed writer is left out of what is said.
            cause = reason
            if " mid-line (" in reason:
                cause = reason.rpartition(" mid-line (")[2].removesuffix(")")
            message = (
                "a line cut short, though no new run starts after it (not a killed writer): "
                + cause
            )
            report.add(lineno, "error", message)
        else:
            report.add(lineno, warn, f"{reason}; run {resumed} resumed after it")

    unread = [0]  # lines the reader itself skips (not JSON, not an object, torn, ...)

    def on_skip(lineno: int, reason: str) -> None:
        unread[0] += 1
        if torn:
            settle(None)
        if reason.startswith(TORN_LINE):
            if _WHO_UNKNOWN in reason and last_run[0] is not None:
                writer = f"the writer of run {last_run[0]} was killed mid-line"
                reason = reason.replace(_WHO_UNKNOWN, writer, 1)
            torn.append((lineno, reason))
        else:
            report.add(lineno, warn if reason.startswith("torn last line") else "error", reason)

    reader = trace_reader(args.file, on_skip=on_skip)
    kinds: Counter[str] = Counter()
    invalid = 0  # lines that parse but break the schema's rules
    unknown = 0  # events of kinds this version does not know
    sealed: set[str] = set()  # groups sealed so far, for the steps that name them
    trained: set[str] = set()  # groups a step trained, for a seal that comes after
    # step number → (the run that last logged it, checkpoint.restore lines before it)
    step_runs: dict[Any, tuple[str, int]] = {}
    restores = 0
    # Runs as the readers follow them: a forked child's lines are its first ancestor's
    # run; a run that a later run's run.start ended is not read again.
    family: dict[str, str] = {}  # a forked child's run_id → its first ancestor's
    begun: set[str] = set()
    ended: set[str] = set()
    ended_told: set[str] = set()
    order = _SpanOrder() if args.from_spans else None
    for lineno, event in reader.numbered():
        kind = event.get("event")
        if torn:
            starts = kind == "run.start" and event.get("run_id") != last_run[0]
            settle(f"{event.get('run_id')} (line {lineno})" if starts else None)
        run_id = event.get("run_id")
        last_run[0] = run_id if isinstance(run_id, str) else last_run[0]
        found = problems(event)
        if found:
            for problem in found:
                report.add(lineno, warn if problem.startswith(_UNKNOWN) else "error", problem)
            if any(not problem.startswith(_UNKNOWN) for problem in found):
                invalid += 1  # an error: every reader skips this line, so it is no event
            else:  # of a kind this version does not know: readers pass it over
                unknown += 1
            continue
        kinds[str(kind)] += 1
        writer: str = event["run_id"]  # a valid event's
        root = family.get(writer, writer)
        parent = event.get("parent_run_id") if kind == "run.start" else None
        if isinstance(parent, str) and writer not in family:
            root = family[writer] = family.get(parent, parent)
        if root in ended:
            if writer not in ended_told:
                ended_told.add(writer)
                report.add(lineno, warn, ended_run_writes(writer, root))
            continue
        begun.add(root)
        if kind == "run.start":
            ended |= begun - {root}
        for line, misplaced in order.check(lineno, event) if order is not None else ():
            report.add(line, "error", misplaced)
        early = order.early(event) if order is not None else None
        if early is not None:
            report.add(lineno, warn, early)
        if kind == "group.seal":
            if event["group_id"] in trained:
                report.add(lineno, warn, sealed_after_training(event["group_id"]))
            sealed.add(event["group_id"])
        elif kind == "train.step":
            unsealed = never_sealed(event["step"], event["group_ids"], sealed)
            if unsealed is not None:
                report.add(lineno, warn, unsealed)
            trained.update(event["group_ids"])
            if step_runs.get(event["step"]) == (root, restores):
                report.add(lineno, warn, step_again(event["step"]))
            step_runs[event["step"]] = (root, restores)
        elif kind == "checkpoint.restore":
            restores += 1
    for line, unreserved in order.unreserved() if order is not None else ():
        report.add(line, warn, unreserved)
    if torn:  # only blank lines after it: the file's torn last line
        lineno, reason = torn.pop()
        report.add(lineno, warn, reason)
    check_is_trace(reader, sum(kinds.values()) + invalid + unknown)
    errors, warnings = report.counts["error"], report.counts["warning"]
    shown = sum(report.counts.values())
    if shown > args.max_report:
        print(f"... {shown - args.max_report} more problems not shown", file=sys.stderr)
    print(
        f"{args.file}: {counted(reader.lines, 'line')}, {counted(sum(kinds.values()), 'event')}"
        f"{_aside(invalid + unread[0], unknown)}, "
        f"{counted(errors, 'error')}, {counted(warnings, 'warning')}",
        file=sys.stderr,
    )
    if args.json:  # the counts as the last JSON line, for a script (a clean file has no other)
        print_json({"summary": {"lines": reader.lines, "events": sum(kinds.values()),
                                "unread": invalid + unread[0], "unknown": unknown,
                                "errors": errors, "warnings": warnings}})  # fmt: skip
    return 1 if errors else 0
