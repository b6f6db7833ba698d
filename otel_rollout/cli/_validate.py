"""``otel-rollout validate FILE``: check every line against the schema, by line number."""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from typing import Any

from ..analysis.state import never_sealed
from ..schema import problems
from ._common import check_is_trace, print_json, trace_reader

_UNKNOWN = "unknown event kind"


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "validate",
        help="check a trace file against the schema",
        description=(
            "Check every line of a trace file against the schema (version 1): JSON that parses, "
            "the fields every line carries, each event kind's required fields and their types. "
            "Reports each problem with its line number and exits 1 when there is any error. "
            "Unknown event kinds and a torn last line (a killed writer) are warnings."
        ),
    )
    parser.add_argument("file", help="a rollout_trace.jsonl (or .jsonl.gz)")
    parser.add_argument(
        "--max-report",
        type=int,
        default=50,
        metavar="N",
        help="print at most N problems (all are counted; default 50)",
    )
    parser.add_argument(
        "--strict",
        action="store_true",
        help="treat warnings (unknown kinds, torn last line) as errors",
    )
    parser.add_argument("--json", action="store_true", help="print each problem as a JSON line")
    parser.set_defaults(handler=run)


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
            sys.stdout.write(f"{self.path}:{lineno}: {severity}: {message}\n")


def run(args: argparse.Namespace) -> int:
    report = _Report(args.file, args.max_report, args.json)
    warn = "error" if args.strict else "warning"

    def on_skip(lineno: int, reason: str) -> None:
        report.add(lineno, warn if reason.startswith("torn last line") else "error", reason)

    reader = trace_reader(args.file, on_skip=on_skip)
    kinds: Counter[str] = Counter()
    sealed: set[str] = set()  # groups sealed so far, for the steps that name them
    for lineno, event in reader.numbered():
        kind = event.get("event")
        kinds[str(kind)] += 1
        found = problems(event)
        for problem in found:
            report.add(lineno, warn if problem.startswith(_UNKNOWN) else "error", problem)
        if found:
            continue
        if kind == "group.seal":
            sealed.add(event["group_id"])
        elif kind == "train.step":
            unsealed = never_sealed(event["step"], event["group_ids"], sealed)
            if unsealed is not None:
                report.add(lineno, warn, unsealed)
    check_is_trace(reader, sum(kinds.values()))
    errors, warnings = report.counts["error"], report.counts["warning"]
    shown = sum(report.counts.values())
    if shown > args.max_report:
        print(f"... {shown - args.max_report} more problems not shown", file=sys.stderr)
    print(
        f"{args.file}: {reader.lines} lines, {sum(kinds.values())} events, "
        f"{errors} errors, {warnings} warnings",
        file=sys.stderr,
    )
    return 1 if errors else 0
