"""One screen of ``otel-rollout watch``: a :class:`~otel_rollout.live.Frame` as text.

:func:`frame_lines` says what the screen shows, as ``(label, value)`` rows of
plain text; :func:`frame_view` lays them out with ``rich`` (the ``watch``
extra), which only this module and the command import.
"""

from __future__ import annotations

import math
import time
from typing import Any

from rich.console import Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from ..age import AGE_BUCKETS
from ..live import Frame
from .fields import AGE_LABELS, PLAIN, Style, share, short_run
from .words import counted, printable

__all__ = ["frame_lines", "frame_view", "sparkline"]

_BARS = "▁▂▃▄▅▆▇█"


def sparkline(values: list[float | None]) -> str:
    """One character per value, from the lowest bar (the smallest) to the highest; a
    gap for a step with no batch age.  Ages past a float's range (``±inf``) take the
    lowest or highest bar and leave the finite ones their scale."""
    known = [v for v in values if v is not None and math.isfinite(v)]
    low, high = (min(known), max(known)) if known else (0.0, 0.0)
    span = high - low
    top = len(_BARS) - 1
    out = []
    for v in values:
        if v is None:
            out.append(" ")
        elif not math.isfinite(v):
            out.append(_BARS[top if v > 0 else 0])
        else:
            out.append(_BARS[round((v - low) / span * top) if span > 0 else top // 2])
    return "".join(out)


def _age(value: float | None) -> str:
    return "n/a" if value is None else f"{value:,.4f}"


def _ago(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def _bytes(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024  # type: ignore[assignment]  # a float from here on
    return str(n)  # pragma: no cover


def frame_lines(
    f: Frame, style: Style = PLAIN, now: float | None = None, live: bool = True
) -> list[tuple[str, str]]:
    """What one screen says, row by row: ``(label, value)``."""
    now = time.time() if now is None else now
    rows: list[tuple[str, str]] = []
    fig = f.figures
    if not f.exists and not f.lines:
        return [("file", f"{f.path}: waiting for it to appear")]
    if f.run_id is not None:
        run = f"{short_run(f.run_id, style)} (the file's run {f.runs})"
        if f.run_first_t is not None and f.last_t is not None:
            run += f" · up {_ago(f.last_t - f.run_first_t)}"
            if live:
                run += f" · last event {_ago(max(0.0, now - f.last_t))} ago"
        rows.append(("run", run))
    versions = []
    if fig["trainer_version"] is not None:
        versions.append(f"trainer v{fig['trainer_version']}")
    if fig["engine_version"] is not None:
        versions.append(f"engine v{fig['engine_version']}")
    if f.step is None:
        rows.append(("step", "no train.step yet" + (f" ({', '.join(versions)})" * bool(versions))))
    else:
        step = f"{f.step:,}"
        if fig["top_step"] is not None and fig["top_step"] > f.step:
            step += f" (training again: the file reached {fig['top_step']:,})"
        rows.append(("step", step + (f" · {' · '.join(versions)}" if versions else "")))
    if f.age is not None:
        ages = [a for _, a in f.recent]
        line = _age(f.age.batch_age)
        if len(f.recent) > 1:
            known = [a for a in ages if a is not None]
            line += f"   {sparkline(ages)}  steps {f.recent[0][0]:,}–{f.recent[-1][0]:,}"
            if known:
                line += f", min {_age(min(known))}, max {_age(max(known))}"
        rows.append(("batch age", line))
        if f.age.tokens:
            pairs = zip(AGE_LABELS, AGE_BUCKETS, strict=True)
            shares = [f"{label} {f.age.share(a):.1%}" for label, a in pairs]
            rows.append(("token age", "  ".join(shares) + f"  of {counted(f.age.tokens, 'token')}"))
    flight = (
        f"{counted(f.attempts_in_flight, 'attempt')} · "
        f"{counted(f.groups_in_flight, 'group')} reserved, not yet trained "
        f"({f.groups_sealed:,} of them sealed)"
    )
    rows.append(("in flight", flight))
    paused = f"{counted(fig['paused_calls'], 'call')} paused ({fig['last_paused']:,} by the last)"
    refits = f"{fig['refits']:,} · {paused}"
    rows.append(("refits", refits))
    rate = f" · {f.events_per_s:,.0f}/s" if live and f.events_per_s is not None else ""
    rows.append(("events", f"{f.events:,} in {f.lines:,} lines{rate}"))
    problems = (
        f"{counted(f.skipped, 'line')} skipped · {counted(f.step_warnings, 'step warning')} · "
        f"{fig['trace_events_dropped']:,} trace events dropped"
    )
    rows.append(("problems", problems))
    if f.last_skip:
        rows.append(("", f"last skipped: {_clip(f.last_skip)}"))
    if f.last_step_warning:
        rows.append(("", f"last warning: {_clip(f.last_step_warning)}"))
    rows += _cost_lines(f, style)
    where = f"{f.path} · {_bytes(f.complete_to)} read"
    if f.size > f.complete_to + f.partial:
        where += f" · catching up: {share(f.complete_to, f.size)} of {_bytes(f.size)}"
    if not live and f.partial:
        where += f" · a last line of {f.partial:,} bytes not yet complete (not read)"
    rows.append(("file", where))
    rows += [("note", n) for n in f.notes[-2:]]
    return rows


def _cost_lines(f: Frame, style: Style) -> list[tuple[str, str]]:
    """The cost analysis's own figures for the stops so far."""
    c = f.cost
    if c is None or not c.boundaries:
        return []
    b = c.boundaries[-1]
    last = (
        f"last: run {short_run(b.old_run, style)} → {short_run(b.new_run, style)}, "
        f"{b.downtime_s:,.2f} s down, {counted(b.attempts_in_flight, 'attempt')} running, "
        f"{counted(b.groups_in_flight + b.sealed_groups_untrained, 'group')} not yet trained, "
        f"{b.tokens_at_risk:,} tokens at risk; steps trained again: {b.steps_retrained:,}"
    )
    if b.catch_up_s is not None:
        last += f", back in {b.catch_up_s:,.2f} s"
    if b.batch_age_before is not None or b.batch_age_after is not None:
        last += (  # over --window steps each side
            f"; batch age {_age(b.batch_age_before)} before → {_age(b.batch_age_after)} after"
        )
    wasted = sum(c.waste.values())
    tokens = (
        f"tokens {c.tokens_generated:,} generated · {c.tokens_trained:,} trained · "
        f"{wasted:,} wasted ({share(wasted, c.tokens_generated)}) · {c.tokens_pending:,} pending"
    )
    return [("stops", f"{len(c.boundaries):,} so far · {last}"), ("", tokens)]


def _clip(text: str, width: int = 110) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def frame_view(f: Frame, style: Style = PLAIN, live: bool = True) -> Any:
    """The screen as a ``rich`` renderable: the rows in a panel titled by the file."""
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold cyan", no_wrap=True)
    table.add_column(overflow="fold")
    for label, value in frame_lines(f, style, live=live):
        table.add_row(label, Text(printable(value)))
    footer = "Ctrl-C to quit" if live else time.strftime("%Y-%m-%d %H:%M:%S")
    title = "otel-rollout watch" + (" · following" if live else "")
    return Panel(Group(table), title=title, subtitle=footer, expand=False)
