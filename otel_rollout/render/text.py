"""The read commands' text: tables and reports for a terminal, from :mod:`.fields`."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TextIO

from ..age import AGE_BUCKETS, StepAge
from .fields import (
    BOUNDARY_FIELDS,
    PLAIN,
    STEP_FIELDS,
    SUMMARY_FIELDS,
    Style,
    as_text,
    ledger_balance,
    ledger_rows,
    share,
    short_run,
)
from .records import AGE_KEYS
from .words import counted

if TYPE_CHECKING:  # the cost module only for its report type: batch-age need not load it
    from ..cost import CostReport

__all__ = ["write_cost", "write_staleness", "write_steps"]

_BY_KEY = {f.key: f for f in STEP_FIELDS}


def _columns(
    out: TextIO,
    head: Sequence[str],
    widths: Sequence[int],
    items: Sequence[Any],
    cells: Callable[[Any], Sequence[str]],
) -> None:
    """A table of right-aligned columns, each as wide as its widest cell (a step past a
    million, a full run ID) or its width in ``widths``: measured in a first pass over
    ``items``, so rows stay aligned without the table's text held in memory."""
    wide = list(widths)
    for item in items:
        for i, cell in enumerate(cells(item)):
            if len(cell) > wide[i]:
                wide[i] = len(cell)
    out.write(" ".join(f"{h:>{w}}" for h, w in zip(head, wide, strict=True)) + "\n")
    for item in items:
        out.write(" ".join(f"{c:>{w}}" for c, w in zip(cells(item), wide, strict=True)) + "\n")


def write_steps(rows: Sequence[StepAge], out: TextIO, style: Style = PLAIN) -> None:
    """One line per step, then a line of totals."""
    age_field = _BY_KEY["batch_age"]
    head = ["step", "version", "groups", "tokens", "batch age", *AGE_KEYS, "run"]
    widths = [6, 8, 7, 10, 10, *[6] * len(AGE_KEYS), 8 if not style.full_ids else 32]

    def cells(r: StepAge) -> list[str]:
        found = [
            as_text(_BY_KEY[key], getattr(r, key), style)
            for key in ("step", "trained_version", "groups", "tokens", "batch_age")
        ]
        if r.tokens:
            found += [f"{r.share(a):.1%}" for a in AGE_BUCKETS]
        else:  # shares of no tokens
            found += ["n/a"] * len(AGE_BUCKETS)
        found.append(short_run(r.run_id, style))
        return found

    _columns(out, head, widths, rows, cells)
    aged = [r for r in rows if r.batch_age is not None]
    tokens = sum(r.tokens for r in aged)
    if aged and tokens:
        ages = [(float(r.batch_age), r.tokens) for r in aged if r.batch_age is not None]
        try:
            mean = sum(age * n for age, n in ages) / tokens
        except OverflowError:  # tokens past a float's range: exact, then rounded
            from fractions import Fraction  # only past 2**53 tokens; ~3 ms to import

            mean = float(sum(Fraction(age) * n for age, n in ages) / tokens)
        top = max(age for age, _ in ages)
        # Steps aged +inf and -inf (versions past a float's range both ways) have no mean.
        shown = "n/a" if math.isnan(mean) else as_text(age_field, mean)
        out.write(
            f"{counted(len(rows), 'step')}, {len(aged):,} with token counts; "
            f"token-weighted mean batch age {shown}, max {as_text(age_field, top)}\n"
        )
    else:
        out.write(
            f"{counted(len(rows), 'step')}; none carries token counts, so no batch age (a "
            "step's tokens by version come from its groups' group.seal tokens_by_version)\n"
        )
    mismatched = [
        r
        for r in aged
        if r.logged_batch_age is not None
        and not math.isclose(r.logged_batch_age, r.batch_age, rel_tol=1e-9, abs_tol=1e-9)  # type: ignore[arg-type]  # aged rows have a batch_age
    ]
    if mismatched:
        out.write(
            f"note: {counted(len(mismatched), 'step')} logged a batch_age that differs from the "
            "one their "
            f"groups' token counts give (first: step {mismatched[0].step})\n"
        )


def write_cost(report: CostReport, out: TextIO, style: Style = PLAIN) -> None:
    """Every stop and restore, the whole file, and the token ledger with its balance."""
    stops = counted(len(report.boundaries), "stop and restore", "stops and restores")
    out.write(f"{counted(len(report.runs), 'run')}, {stops}\n")
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


def _number(value: Any, digits: int) -> str:
    """A quantile as text: an integer whole (past what a float holds, too), a float rounded."""
    if value is None:
        return "-"
    return f"{value:,}" if isinstance(value, int) else f"{value:,.{digits}f}"


def _q(summary: dict[str, Any], unit: str = "", digits: int = 0) -> str:
    """``p50 / p90 / max`` of a summary, with a unit."""
    parts = [_number(summary[k], digits) for k in ("p50", "p90", "max")]
    return " / ".join(parts) + unit


def write_staleness(record: dict[str, Any], out: TextIO, style: Style = PLAIN) -> None:
    """``staleness``: token age per step and run, length bias, repeat waste."""
    whole = record["file"]
    out.write(f"token age, whole file ({counted(whole['tokens'], 'trained token')})\n")
    out.write(f"  p50 / p90 / max: {_q(whole)} updates\n")
    for age, n in whole["age_tokens"].items():
        out.write(f"  age {age:>3}: {n:>12,} tokens  {share(n, whole['tokens']):>6}\n")
    out.write("\nby run\n")
    for run_id, dist in record["runs"].items():
        out.write(
            f"  {short_run(run_id, style):<10} {dist['tokens']:>12,} tokens, "
            f"age p50 / p90 / max {_q(dist)}\n"
        )
    out.write("\n")
    _columns(
        out,
        ["step", "version", "tokens", "age p50/p90/max", "wait s p50/p90/max", "run"],
        [6, 8, 10, 16, 22, 8],
        record["steps"],
        lambda row: [
            f"{row['step']:,}",  # as batch-age prints them
            f"{row['trained_version']:,}",
            f"{row['tokens']:,}",
            _q(row["age"]),
            _q(row["wait_s"], digits=2),
            short_run(row["run_id"], style),
        ],
    )
    bias = record["length_bias"]
    out.write(
        f"\nlength bias: each outcome's rollouts\n  {'outcome':<36} {'attempts':>9} "
        f"{'tokens':>12}  {'length p50/p90/max':>20}  {'seconds in flight p50/p90/max':>30}\n"
    )
    for outcome, o in bias["outcomes"].items():
        out.write(
            f"  {outcome:<36} {o['attempts']:>9,} {o['tokens']:>12,}  "
            f"{_q(o['length_tokens']):>20}  {_q(o['seconds_in_flight'], digits=2):>30}\n"
        )
    if bias["deciles"]:
        out.write("\ndiscard rate by generation length (tenths of the rollouts, shortest first)\n")
        out.write(f"  {'tenth':>5} {'tokens':>13} {'attempts':>9} {'discarded':>10} {'stale':>7}\n")
        for d in bias["deciles"]:
            span = f"{d['min_tokens']:,}–{d['max_tokens']:,}"
            out.write(
                f"  {d['decile']:>5} {span:>13} {d['attempts']:>9,} "
                f"{d['discard_rate']:>10.1%} {d['stale_rate']:>7.1%}\n"
            )
    ratio = bias["long_rollout_starvation"]
    if not bias["deciles"]:
        words = "n/a (fewer than 10 finished rollouts)"
    elif ratio is None:
        words = "n/a (no stale discard in the shortest or the longest tenth)"
    else:
        words = f"{ratio:.2f}"
    out.write(
        f"\nlong-rollout starvation: {words}  (stale rate of the longest tenth ÷ the shortest "
        "tenth; 1 is no bias, above 1 long rollouts are discarded as stale more often)\n"
    )
    p = record["prompts"]
    again = p["share_of_wasted_tokens_more_than_once"]
    most = counted(p["most_times_wasted"], "time")
    out.write(
        f"\nprompts (once per epoch) whose groups were discarded or lost: {p['prompts_wasted']:,}; "
        "more than "
        f"once: {p['prompts_wasted_more_than_once']:,} (at most {most}, "
        f"{'n/a' if again is None else f'{again:.1%}'} of the tokens wasted on those prompts)\n"
    )
