"""The stop/restore report: one self-contained HTML page (charts and tables).

Batch age per step with the stops and restores marked, the token-age
distribution per step, a timeline of the runs (active, down, catching up),
attempts in flight over time, the cost tables and the token ledger, and every
step's batch age in a table.  Tables come from the field descriptions of
:mod:`.fields`, as the text and JSON do.  The page has inline SVG and styles
only; its one inline script records page errors for the tests.  Nothing is fetched.
"""

from __future__ import annotations

import io
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator, Sequence
from html import escape
from pathlib import Path
from typing import Any, TextIO

from ..age import StepAge
from ..cost import CostReport
from ..report import ReportData
from . import svg
from .fields import (
    AGE_LABELS,
    BOUNDARY_FIELDS,
    PLAIN,
    STEP_FIELDS,
    SUMMARY_FIELDS,
    Field,
    Style,
    as_html,
    ledger_balance,
    ledger_rows,
    short_run,
)
from .records import step_record

__all__ = ["CHROMIUM_FLAGS", "charts", "chromium", "render_html", "write_html", "write_pngs"]


def charts(data: ReportData, style: Style = PLAIN, only: str | None = None) -> dict[str, str]:
    """Every chart of the page (or ``only`` that one), by id, as SVG text."""
    t0 = data.t0 or 0.0
    runs = list(data.runs)
    short = {r: f"run {n + 1} ({short_run(r, style)})" for n, r in enumerate(runs)}
    cost = data.cost or CostReport()
    markers = []
    for b in cost.boundaries:
        markers.append((b.stopped_at - t0, f"stop: {short_run(b.old_run, style)}", "#d62728"))
        markers.append((b.resumed_at - t0, f"restore: {short_run(b.new_run, style)}", "#2ca02c"))
    series = [
        (short[r], [(t - t0, age) for t, run, _, age in data.steps if run == r]) for r in runs
    ]
    timeline_rows = []
    for n, r in enumerate(runs):
        first, last = data.runs[r]
        segments = [(first - t0, last - t0, "active", "#1f77b4")]
        if n + 1 < len(runs):
            segments.append((last - t0, data.runs[runs[n + 1]][0] - t0, "down", "#d62728"))
        for b in cost.boundaries:
            if b.new_run == r and b.catch_up_s is not None:
                start = b.resumed_at - t0
                segments.append((start, start + b.catch_up_s, "catching up", "#ff7f0e"))
        timeline_rows.append((short[r], segments))
    makers: dict[str, Callable[[], str]] = {
        "batch-age": lambda: svg.line_chart(
            "batch-age",
            "Batch age per step (stops red, restores green)",
            series,
            markers,
            "seconds since the first event",
            "batch age (updates)",
        ),
        "token-age": lambda: svg.stacked_bars(
            "token-age",
            "Share of each step's tokens by age",
            sorted(data.shares.items()),
            AGE_LABELS,
            "step",
            "share of tokens",
        ),
        "timeline": lambda: svg.timeline(
            "timeline", "Runs: active, down, catching up", timeline_rows
        ),
        "in-flight": lambda: svg.line_chart(
            "in-flight",
            "Attempts in flight",
            [("attempts", [(t - t0, float(n)) for t, n in data.in_flight])],
            markers,
            "seconds since the first event",
            "attempts",
            step=True,
        ),
    }
    return {name: draw() for name, draw in makers.items() if only in (None, name)}


_STYLE = """
body{font:14px/1.45 system-ui,sans-serif;margin:24px auto;max-width:900px;color:#222}
h1{font-size:22px} h2{font-size:17px;margin-top:28px}
.chart{width:100%;height:auto;border:1px solid #ddd;margin:6px 0}
.axis,.tick,.legend{font:11px sans-serif;fill:#333}
table{border-collapse:collapse;margin:8px 0} td,th{border:1px solid #ccc;padding:3px 8px}
td.n{text-align:right;font-variant-numeric:tabular-nums} .muted{color:#777}
"""

# Records page errors where a test (or a curious reader) can see them.
_SCRIPT = """
window.__errors = [];
window.addEventListener("error", function (e) { window.__errors.push(String(e.message)); });
document.addEventListener("DOMContentLoaded", function () {
  var drawn = document.querySelectorAll(
    "svg.chart polyline, svg.chart rect.bar, svg.chart rect.span");
  document.body.setAttribute("data-charts", document.querySelectorAll("svg.chart").length);
  document.body.setAttribute("data-marks", drawn.length);
  document.body.setAttribute("data-errors", window.__errors.length);
});
"""


def _rows(fields: Sequence[Field], records: Sequence[dict[str, Any]], style: Style) -> str:
    """One row per field, one column per record: label (help in its tooltip), then values."""
    return "".join(
        f'<tr><th title="{escape(f.help)}">{escape(f.label.strip())}</th>'
        + "".join(as_html(f, r[f.key], style) for r in records)
        + "</tr>"
        for f in fields
    )


def _tables(cost: CostReport, style: Style) -> str:
    parts = []
    if cost.boundaries:
        reports = [b.report() for b in cost.boundaries]
        head = "".join(f"<th>stop {n + 1}</th>" for n in range(len(reports)))
        rows = _rows(BOUNDARY_FIELDS, reports, style)
        parts.append(f"<table><tr><th></th>{head}</tr>{rows}</table>")
    else:
        parts.append('<p class="muted">One run: no stop and restore in this file.</p>')
    summary = cost.report()["summary"]
    parts.append(f"<h2>Whole file</h2><table>{_rows(SUMMARY_FIELDS, [summary], style)}</table>")
    rows = "".join(
        f'<tr><th>{escape(label)}</th><td class="n">{n:,}</td><td class="n">{part}</td></tr>'
        for label, n, part in ledger_rows(cost.ledger)
    )
    balance = escape(ledger_balance(cost.ledger))
    parts.append(f'<h2>Token ledger</h2><table>{rows}</table><p class="muted">{balance}</p>')
    return "".join(parts)


def _steps_table(rows: Sequence[StepAge], style: Style) -> Iterator[str]:
    """Every surviving step's batch age, as ``batch-age`` prints it, folded away (row by
    row, so a long run's table is never one string)."""
    head = "".join(f"<th>{escape(f.label)}</th>" for f in STEP_FIELDS)
    yield f"<details><summary>{len(rows):,} steps (the table of otel-rollout batch-age)</summary>"
    yield f"<table><tr>{head}</tr>"
    for r in rows:
        record = step_record(r)
        yield "<tr>" + "".join(as_html(f, record[f.key], style) for f in STEP_FIELDS) + "</tr>"
    yield "</table></details>"


def write_html(data: ReportData, out: TextIO, style: Style = PLAIN) -> None:
    """The page, written part by part: no external resource of any kind.  Each chart is
    drawn just before it is written, so the page is never held whole (on the 1M-line
    bench trace that kept the report's peak at 118 MB)."""
    cost = data.cost or CostReport()
    out.write(
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        "<title>otel-rollout report</title>"
        f"<style>{_STYLE}</style><script>{_SCRIPT}</script></head><body>"
        f'<h1>Rollout stop/restore report</h1><p class="muted">{escape(data.source)} — '
        f"{len(data.runs)} runs, {len(cost.boundaries)} stops, {cost.steps} training steps</p>"
    )
    for chart_id, title in _CHARTS:
        out.write(f"<h2>{title}</h2>")
        out.write(charts(data, style, only=chart_id)[chart_id])
    out.write("<h2>What each stop cost</h2>")
    out.write(_tables(cost, style))
    out.write("<h2>Batch age of every step</h2>")
    for part in _steps_table(data.step_ages, style):
        out.write(part)
    out.write("</body></html>\n")


def render_html(data: ReportData, style: Style = PLAIN) -> str:
    """The page, as text (see :func:`write_html`)."""
    out = io.StringIO()
    write_html(data, out, style)
    return out.getvalue()


_CHARTS = [
    ("batch-age", "Batch age per step"),
    ("token-age", "Token age per step"),
    ("timeline", "Runs"),
    ("in-flight", "Attempts in flight"),
]


def chromium() -> str | None:
    """The headless browser the PNG export (and the tests) use, if installed."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
]


def write_pngs(data: ReportData, directory: Path) -> list[Path]:
    """Each chart as a PNG in ``directory``, rendered by headless Chromium."""
    browser = chromium()
    if browser is None:
        raise FileNotFoundError("--png needs Chromium (Debian: apt-get install -y chromium)")
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    with tempfile.TemporaryDirectory() as tmp:
        for chart_id, drawing in charts(data).items():
            page = Path(tmp) / f"{chart_id}.html"
            page.write_text(f"<html><body style='margin:0'>{drawing}</body></html>")
            out = directory / f"{chart_id}.png"
            subprocess.run(
                [
                    browser,
                    *CHROMIUM_FLAGS,
                    f"--user-data-dir={tmp}/profile",
                    f"--screenshot={out}",
                    f"--window-size={svg.W},{svg.H}",
                    page.as_uri(),
                ],
                capture_output=True,
                timeout=60,
                check=True,
            )
            written.append(out)
    return written
