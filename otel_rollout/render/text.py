"""The read commands' text: tables and reports for a terminal, from :mod:`.fields`."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TextIO

from ..age import AGE_BUCKETS, StepAge
from ..cost import CostReport
from .fields import (
    BOUNDARY_FIELDS,
    PLAIN,
    STEP_FIELDS,
    SUMMARY_FIELDS,
    Style,
    as_text,
    ledger_balance,
    ledger_rows,
    short_run,
)
from .records import AGE_KEYS

__all__ = ["write_cost", "write_steps"]

_BY_KEY = {f.key: f for f in STEP_FIELDS}


def write_steps(rows: Sequence[StepAge], out: TextIO, style: Style = PLAIN) -> None:
    """One line per step, then a line of totals."""
    age_field = _BY_KEY["batch_age"]
    head = ["step", "version", "groups", "tokens", "batch age", *AGE_KEYS, "run"]
    widths = [6, 8, 7, 10, 10, *[6] * len(AGE_KEYS), 8 if not style.full_ids else 32]
    out.write(" ".join(f"{h:>{w}}" for h, w in zip(head, widths, strict=True)).rstrip() + "\n")
    for r in rows:
        cells = [
            as_text(_BY_KEY[key], getattr(r, key), style)
            for key in ("step", "trained_version", "groups", "tokens", "batch_age")
        ]
        if r.tokens:
            cells += [f"{r.share(a):.1%}" for a in AGE_BUCKETS]
        else:  # shares of no tokens
            cells += ["n/a"] * len(AGE_BUCKETS)
        cells.append(short_run(r.run_id, style))
        out.write(" ".join(f"{c:>{w}}" for c, w in zip(cells, widths, strict=True)) + "\n")
    aged = [r for r in rows if r.batch_age is not None]
    tokens = sum(r.tokens for r in aged)
    if aged and tokens:
        ages = [(float(r.batch_age), r.tokens) for r in aged if r.batch_age is not None]
        mean = sum(age * n for age, n in ages) / tokens
        top = max(age for age, _ in ages)
        out.write(
            f"{len(rows)} steps, {len(aged)} with token counts; token-weighted mean batch age "
            f"{as_text(age_field, mean)}, max {as_text(age_field, top)}\n"
        )
    else:
        out.write(f"{len(rows)} steps; none carries token counts, so no batch age\n")
    mismatched = [
        r
        for r in aged
        if r.logged_batch_age is not None
        and not math.isclose(r.logged_batch_age, r.batch_age, rel_tol=1e-9, abs_tol=1e-9)  # type: ignore[arg-type]  # aged rows have a batch_age
    ]
    if mismatched:
        out.write(
            f"note: {len(mismatched)} steps logged a batch_age that differs from the one their "
            f"groups' token counts give (first: step {mismatched[0].step})\n"
        )


def write_cost(report: CostReport, out: TextIO, style: Style = PLAIN) -> None:
    """Every stop and restore, the whole file, and the token ledger with its balance."""
    out.write(f"{len(report.runs)} runs, {len(report.boundaries)} stops and restores\n")
    width = max(len(f.label) for f in (*BOUNDARY_FIELDS, *SUMMARY_FIELDS)) + 2
    for n, b in enumerate(report.boundaries, 1):
        values = b.report()
        out.write(f"\nstop {n}\n")
        for f in BOUNDARY_FIELDS:
            out.write(f"  {f.label:<{width}} {as_text(f, values[f.key], style)}\n")
    summary = report.report()["summary"]
    out.write("\nwhole file\n")
    for f in SUMMARY_FIELDS:
        out.write(f"  {f.label:<{width}} {as_text(f, summary[f.key], style)}\n")
    out.write("\ntoken ledger (every logged token in one bucket)\n")
    for label, tokens, part in ledger_rows(report.ledger):
        out.write(f"  {label:<{width}} {tokens:>12,}  {part:>6}\n")
    out.write(f"  {ledger_balance(report.ledger)}\n")
