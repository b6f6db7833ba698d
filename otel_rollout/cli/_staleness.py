"""``otel-rollout staleness FILE``: how old trained tokens are, and who pays for it."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ..render.fields import Style
from ..render.records import staleness_record
from ..render.text import write_staleness
from ..staleness import staleness_file
from ._common import (
    add_full_ids,
    check_is_trace,
    print_json,
    trace_argument,
    trace_reader,
    without_cyclic_gc,
)


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "staleness",
        help="token age per step and run, length bias by outcome, prompts wasted again and again",
        description=(
            "Staleness diagnostics from one pass over a trace file: per surviving step, the "
            "histogram of its tokens' age (policy updates between generating and training) with "
            "p50/p90/max and the time its groups waited from reservation to training; the "
            "distribution per run and for the whole file; for each outcome (trained, discarded "
            "or abandoned by reason, refused, lost at a stop, ...) the generation length and "
            "time in flight of its rollouts; the discard and stale rates by length decile and "
            "the long-rollout starvation ratio; and prompts whose groups were wasted more than "
            "once."
        ),
    )
    parser.add_argument(
        "file", type=trace_argument, help="a rollout_trace.jsonl (or .jsonl.gz), or its directory"
    )
    parser.add_argument("--json", action="store_true", help="print the diagnostics as JSON")
    add_full_ids(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    without_cyclic_gc()
    reader = trace_reader(args.file, typed=True)
    report = staleness_file(reader)
    check_is_trace(reader, reader.events)
    if args.json:
        print_json(staleness_record(report.record()), indent=True)
    else:
        write_staleness(report.record(), sys.stdout, Style(full_ids=args.full_ids))
    return 0
