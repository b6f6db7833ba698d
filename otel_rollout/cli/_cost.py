"""``otel-rollout cost FILE``: what each stop and restore cost, and where tokens went."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ..cost import CostReport, analyze_file
from ..render.fields import Style
from ..render.records import cost_record
from ..render.text import write_cost
from ._common import (
    add_full_ids,
    check_is_trace,
    positive_int,
    print_json,
    trace_argument,
    trace_reader,
    without_cyclic_gc,
)


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "cost",
        help="what each stop and restore cost (downtime, work lost and redone, staleness)",
        description=(
            "For every boundary between a run and the run that resumed into the same file: "
            "downtime; the old run's last step and checkpoint; the checkpoint restored; "
            "attempts and groups in flight at the stop and the tokens at risk; what became "
            "of the interrupted rollouts (matched by epoch, prompt_id, generation_index): "
            "resumed from a snapshot, re-dispatched from scratch, or never run again; tokens "
            "recovered and generated again; steps trained again and the time to get back; "
            "batch age over the last N steps before and the first N after. Then "
            "the token ledger: every logged token once, as trained, wasted (by cause) or "
            "pending, with its balance. Streams: memory is the work in flight plus one small "
            "record per group and per step, not the file."
        ),
    )
    parser.add_argument(
        "file", type=trace_argument, help="a rollout_trace.jsonl (or .jsonl.gz), or its directory"
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    add_full_ids(parser)
    parser.add_argument(
        "--window",
        type=positive_int,
        default=5,
        metavar="N",
        help="steps before/after for batch age (5)",
    )
    parser.set_defaults(handler=run)


def load_report(path: str, window: int = 5, progress: bool = True) -> CostReport:
    reader = trace_reader(path, progress=progress, typed=True)
    report = analyze_file(reader, window=window)
    check_is_trace(reader, reader.events)
    return report


def run(args: argparse.Namespace) -> int:
    without_cyclic_gc()
    report = load_report(args.file, args.window)
    if args.json:
        print_json(cost_record(report), indent=True)
    else:
        write_cost(report, sys.stdout, Style(full_ids=args.full_ids))
    return 0
