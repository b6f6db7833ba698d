"""``otel-rollout batch-age FILE``: each step's batch age and the age of its tokens."""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any

from ..age import StepAge
from ..analysis import BATCH_AGE_EVENTS, StepAges, run_file
from ..render.fields import Style
from ..render.records import step_record
from ..render.text import write_steps
from ._common import (
    add_full_ids,
    check_is_trace,
    print_json,
    trace_argument,
    trace_reader,
    without_cyclic_gc,
)

_log = logging.getLogger("otel_rollout")


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "batch-age",
        help="batch age per training step",
        description=(
            "Print, for every train.step of a trace file, the trained version, the number of "
            "groups and tokens it trained, its batch age (token-weighted policy updates between "
            "generating a token and training on it) and the share of its tokens at age 0, 1, 2 "
            "and 3 or more. A step that a resumed run trained again shows the later run's value."
        ),
    )
    parser.add_argument(
        "file", type=trace_argument, help="a rollout_trace.jsonl (or .jsonl.gz), or its directory"
    )
    parser.add_argument(
        "--json", action="store_true", help="print JSON Lines (an object a step), not a table"
    )
    add_full_ids(parser)
    parser.set_defaults(handler=run)


def load_steps(path: str, *, progress: bool = True, quiet: bool = False) -> list[StepAge]:
    """Read a trace's steps and seals only, and compute every step's batch age.

    Lines that are not valid events are skipped with a warning naming their line (with
    ``quiet``, silently: for a caller that reads the file again with warnings).
    """
    on_skip = (lambda line, why: None) if quiet else None
    reader = trace_reader(
        path, kinds=BATCH_AGE_EVENTS, progress=progress, typed=True, on_skip=on_skip
    )
    [rows] = run_file(reader, [StepAges()])
    check_is_trace(reader, reader.events)
    return rows


def run(args: argparse.Namespace) -> int:
    without_cyclic_gc()
    rows = load_steps(args.file)
    if args.json:
        for row in rows:
            print_json(step_record(row))
    else:
        write_steps(rows, sys.stdout, Style(full_ids=args.full_ids))
    return 0
