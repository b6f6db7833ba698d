"""``otel-rollout batch-age FILE``: each step's batch age and the age of its tokens."""

from __future__ import annotations

import argparse
import logging
import math
import sys
from collections.abc import Sequence
from typing import Any, TextIO

from ..age import AGE_BUCKETS, StepAge
from ..analysis import BATCH_AGE_EVENTS, StepAges, run_file
from ._common import check_is_trace, print_json, trace_reader, without_cyclic_gc

_log = logging.getLogger("otel_rollout")

_AGE_LABELS = [f"age{a}" for a in AGE_BUCKETS[:-1]] + [f"age{AGE_BUCKETS[-1]}+"]


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
    parser.add_argument("file", help="a rollout_trace.jsonl (or .jsonl.gz)")
    parser.add_argument("--json", action="store_true", help="print JSON lines instead of a table")
    parser.set_defaults(handler=run)


def load_steps(path: str, *, progress: bool = True) -> list[StepAge]:
    """Read a trace's steps and seals only, and compute every step's batch age.

    Lines that are not valid events are skipped with a warning naming their line.
    """
    reader = trace_reader(path, kinds=BATCH_AGE_EVENTS, progress=progress, typed=True)
    [rows] = run_file(reader, [StepAges()])
    check_is_trace(reader, reader.events)
    return rows  # type: ignore[no-any-return]


def step_record(row: StepAge) -> dict[str, Any]:
    """One step as the JSON object ``--json`` prints."""
    return {
        "step": row.step,
        "trained_version": row.trained_version,
        "groups": row.groups,
        "tokens": row.tokens,
        "batch_age": row.batch_age,
        "token_share_by_age": {
            label: row.share(a) for label, a in zip(_AGE_LABELS, AGE_BUCKETS, strict=True)
        },
        "run_id": row.run_id,
    }


def write_table(rows: Sequence[StepAge], out: TextIO) -> None:
    """The human-readable table, one line per step, and a line of totals."""
    head = ["step", "version", "groups", "tokens", "batch_age", *_AGE_LABELS]
    out.write("{:>6} {:>8} {:>7} {:>10} {:>10} ".format(*head[:5]))
    out.write(" ".join(f"{h:>6}" for h in head[5:]) + "\n")
    for r in rows:
        age = "-" if r.batch_age is None else f"{r.batch_age:.4f}"
        out.write(f"{r.step:>6} {r.trained_version:>8} {r.groups:>7} {r.tokens:>10} {age:>10} ")
        if r.tokens:
            out.write(" ".join(f"{100 * r.share(a):5.1f}%" for a in AGE_BUCKETS) + "\n")
        else:  # shares of no tokens
            out.write(" ".join(f"{'n/a':>6}" for _ in AGE_BUCKETS) + "\n")
    aged = [r for r in rows if r.batch_age is not None]
    tokens = sum(r.tokens for r in aged)
    if aged and tokens:
        mean = sum(r.batch_age * r.tokens for r in aged) / tokens  # type: ignore[operator]
        out.write(
            f"{len(rows)} steps, {len(aged)} with token counts; "
            f"token-weighted mean batch age {mean:.4f}, max {max(r.batch_age for r in aged):.4f}\n"  # type: ignore[type-var]
        )
    else:
        out.write(f"{len(rows)} steps; none carries token counts, so no batch age\n")
    mismatched = [
        r
        for r in aged
        if r.logged_batch_age is not None
        and not math.isclose(r.logged_batch_age, r.batch_age, rel_tol=1e-9, abs_tol=1e-9)  # type: ignore[arg-type]
    ]
    if mismatched:
        out.write(
            f"note: {len(mismatched)} steps logged a batch_age that differs from the one their "
            f"groups' token counts give (first: step {mismatched[0].step})\n"
        )


def run(args: argparse.Namespace) -> int:
    without_cyclic_gc()
    rows = load_steps(args.file)
    if args.json:
        for row in rows:
            print_json(step_record(row))
    else:
        write_table(rows, sys.stdout)
    return 0
