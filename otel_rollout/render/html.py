"""The stop/restore report: one self-contained HTML page (charts and tables).

Batch age per step with the stops and restores marked, the token-age
distribution per step (shares by age, and the full histogram as a heat map),
discard and stale rates by generation-length decile, a timeline of the runs
(active, down, catching up), attempts in flight over time, the cost tables and
the token ledger, and every step's batch age in a table.  Tables come from the field descriptions of
:mod:`.fields`, as the text and JSON do.  The page has inline SVG, styles and one inline
script, which records page errors for the tests and lets the batch-age, token-age and
heat-map charts zoom to raw steps (:mod:`.zoom`); with scripts off the static charts are
the page.  Nothing is fetched.
"""

from __future__ import annotations

import io
import math
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from html import escape
from pathlib import Path
from typing import Any, TextIO

from ..age import AGE_BUCKETS, StepAge
from ..cost import CostReport
from ..report import ReportData
from . import frame, svg, zoom
from .fields import (
    AGE_LABELS,
    BOUNDARY_FIELDS,
    PLAIN,
    STEP_FIELDS,
    SUMMARY_FIELDS,
    Field,
    Style,
    as_html,
    iso_utc,
    ledger_balance,
    ledger_rows,
)
from .records import step_record
from .scale import time_unit

__all__ = ["CHROMIUM_FLAGS", "charts", "chromium", "render_html", "write_html", "write_pngs"]


def charts(data: ReportData, style: Style = PLAIN, only: str | None = None) -> dict[str, str]:
    """Every chart of the page (or ``only`` that one), by id, as SVG text."""
    wanted = [(c, title) for c, title in _CHARTS if only in (None, c)]
    return {name: _drawn(name, title, data, style) for name, title in wanted}


def _drawn(name: str, title: str, data: ReportData, style: Style) -> str:
    """One chart; a chart whose numbers a float cannot hold (a step or version past
    10**308, which the schema allows) says so where its plot would be."""
    try:
        return _draw(name, data, style)
    except OverflowError:
        text = "values past what a float holds (over 10^308): not drawn; see the tables"
        return frame.empty(name, title, "", "", text)


def _draw(name: str, data: ReportData, style: Style) -> str:
    t0 = data.t0 or 0.0
    runs = list(data.runs)
    short = zoom.run_labels(data, style)
    cost = data.cost or CostReport()
    t_end = max((span[1] for span in data.runs.values()), default=t0)
    unit, unit_name = time_unit(t_end - t0)
    x_label = f"{unit_name} since {iso_utc(t0)}"

    def when(x: float) -> str:  # an x of a time axis, in words
        return iso_utc(t0 + x * unit)

    markers = [((t - t0) / unit, label, c) for t, label, c in zoom.stop_markers(data, style)]
    marker_legend = zoom.MARKER_LEGEND if markers else []
    if name == "batch-age":
        series = [
            (
                short[r],
                [((t - t0) / unit, age, step) for t, run, step, age in data.steps if run == r],
            )
            for r in runs
        ]
        title, _, y_label = zoom.ZOOMABLE[name]
        return svg.band_chart(
            "batch-age",
            title,
            series,
            x_label=x_label,
            y_label=y_label,
            x_text=when,
            point_text=zoom.age_point_text(when),
            bin_text=zoom.age_bin_text(when),
            markers=markers,
            marker_legend=marker_legend,
            x_from=0.0,
        )
    if name == "token-age":
        rows = [(r.step, [r.tokens_by_age.get(a, 0) for a in AGE_BUCKETS]) for r in data.step_ages]
        title, x_name, y_label = zoom.ZOOMABLE[name]
        return svg.stacked_bars(
            "token-age", title, rows, AGE_LABELS, x_label=x_name, y_label=y_label
        )
    if name == "age-heatmap":
        title, x_name, y_label = zoom.ZOOMABLE[name]
        return svg.heat_map("age-heatmap", title, data.age_tokens, x_label=x_name, y_label=y_label)
    if name == "length-bias":
        ratio = data.starvation
        if ratio is None:
            said = "n/a"
        elif math.isinf(ratio):
            said = "∞"
        else:
            said = f"{ratio:.2f}×"
        groups = [
            (
                str(d["decile"]),
                [d["discard_rate"], d["stale_rate"]],
                f"decile {d['decile']} ({d['min_tokens']:,}–{d['max_tokens']:,} tokens, "
                f"{d['attempts']:,} rollouts)",
            )
            for d in data.deciles
        ]
        return svg.grouped_bars(
            "length-bias",
            f"Discard and stale rate by length decile; long-rollout starvation ratio {said}",
            groups,
            ["discarded/abandoned", "stale"],
            x_label="generation-length decile (1 = shortest tenth of rollouts, 10 = longest)",
            y_label="share of the decile's rollouts (%)",
            empty="fewer than 10 finished rollouts: no deciles",
            zero="no rollout was discarded or abandoned",
        )
    if name == "timeline":
        timeline_rows = []
        for n, r in enumerate(runs):
            first, last = data.runs[r]
            segments = [((first - t0) / unit, (last - t0) / unit, "active", "#1f77b4")]
            if n + 1 < len(runs):
                nxt = data.runs[runs[n + 1]][0]
                segments.append(((last - t0) / unit, (nxt - t0) / unit, "down", "#d62728"))
            for b in cost.boundaries:
                if b.new_run == r and b.catch_up_s is not None:
                    start = (b.resumed_at - t0) / unit
                    segments.append((start, start + b.catch_up_s / unit, "catching up", "#ff7f0e"))
            timeline_rows.append((short[r], segments))
        return svg.timeline(
            "timeline",
            "Runs: active, down, catching up",
            timeline_rows,
            x_label=x_label,
            x_text=when,
            legend=[
                svg.LegendItem("active", "#1f77b4"),
                svg.LegendItem("down", "#d62728"),
                svg.LegendItem("catching up", "#ff7f0e"),
            ],
        )
    assert name == "in-flight", name
    buckets = data.in_flight
    raw = len(buckets) <= svg.RAW_LIMIT and all(b[5] == 1 for b in buckets)
    fine = [
        svg.Bin((a - t0) / unit, (z - t0) / unit, int(c), s / c, lo, hi, None, None)
        for a, z, lo, hi, s, c in buckets
    ]
    return svg.band_chart(
        "in-flight",
        "Attempts in flight (min–max per bin when binned)",
        [("attempts", [((b[0] - t0) / unit, float(b[2]), None) for b in buckets] if raw else [])],
        fine=[] if raw else [("attempts", fine)],
        x_label=x_label,
        y_label="attempts in flight",
        x_text=when,
        point_text=lambda _, p: f"{when(p[0])}: {p[1]:,.0f} attempts in flight",
        bin_text=lambda _, b: (
            f"{when(b.x_lo)} to {when(b.x_hi)}: {b.low:,.0f}–{b.high:,.0f} "
            f"attempts in flight, mean {b.mean:,.1f}"
        ),
        band="min-max",
        markers=markers,
        marker_legend=marker_legend,
        step=True,
        x_from=0.0,
        counts=True,
    )


_STYLE = """
body{font:14px/1.45 system-ui,sans-serif;margin:24px auto;max-width:900px;color:#222}
h1{font-size:22px} h2{font-size:17px;margin-top:28px}
.chart{width:100%;height:auto;border:1px solid #ddd;margin:6px 0}
.axis,.tick,.legend{font:11px sans-serif;fill:#333} .title{font:bold 13px sans-serif;fill:#222}
.grid{stroke:#e6e6e6} .empty{font:13px sans-serif;fill:#777} .head{font-weight:bold}
.caption{margin:2px 0 0} .hover:hover{fill:rgba(0,0,0,.06)}
.chart circle.pt:hover{r:5} .chart.zoomable{cursor:crosshair}
.zoom-sel{fill:rgba(31,119,180,.15);stroke:#1f77b4} .zoom{font-size:13px;margin:0 0 4px}
.zoom input{width:7em}
table{border-collapse:collapse;margin:8px 0} td,th{border:1px solid #ccc;padding:3px 8px}
td.n{text-align:right;font-variant-numeric:tabular-nums} .muted{color:#777}
"""

# Records page errors where a test (or a curious reader) can see them; then the zoom.
_SCRIPT = """
window.__errors = [];
window.addEventListener("error", function (e) { window.__errors.push(String(e.message)); });
document.addEventListener("DOMContentLoaded", function () {
  var charts = document.querySelectorAll("svg.chart"), marks = 0, drawn = 0;
  for (var i = 0; i < charts.length; i++) {
    var n = charts[i].querySelectorAll(".mark").length;
    marks += n;
    if (n > 0) drawn += 1;
  }
  document.body.setAttribute("data-charts", charts.length);
  document.body.setAttribute("data-drawn", drawn);
  document.body.setAttribute("data-marks", marks);
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
        f"<style>{_STYLE}</style><script>{_SCRIPT}{zoom.script()}</script></head><body>"
        f'<h1>Rollout stop/restore report</h1><p class="muted">{escape(data.source)} — '
        f"{len(data.runs)} runs, {len(cost.boundaries)} stops, {cost.steps:,} training steps</p>"
    )
    out.write(zoom.config_tag())
    for chart_id, title in _CHARTS:
        out.write(f"<h2>{title}</h2>")
        out.write(charts(data, style, only=chart_id)[chart_id])
        if chart_id in zoom.ZOOMABLE:
            out.write(zoom.data_tag(chart_id, data, style))
        out.write(f'<p class="caption muted">{escape(caption(chart_id, data))}</p>')
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
    ("age-heatmap", "Token age histogram per step"),
    ("length-bias", "Length bias: are long rollouts starved?"),
    ("timeline", "Runs"),
    ("in-flight", "Attempts in flight"),
]


def caption(chart_id: str, data: ReportData) -> str:
    """The line under a chart: how to read it, and where its exact values are."""
    binned = f"past {svg.RAW_LIMIT:,} points a chart shows bins of a round width"
    if chart_id == "batch-age":
        return (
            f"Each dot is a step (hover it for its values); {binned}: the line is each bin's "
            "mean and the band its p10–p90, and hovering a bin gives its step range. Every "
            "step's batch age is in the table at the end of the page"
            + (
                f" ({data.steps_off_chart:,} of them past what a float holds, ±inf: "
                "there, and not drawn)."
                if data.steps_off_chart
                else "."
            )
        )
    if chart_id == "token-age":
        return (
            f"One bar a step, or past {svg.MAX_BINS:,} steps one bar a range of steps (the "
            "shares of the range's tokens); hover a bar for its tokens and shares."
        )
    if chart_id == "age-heatmap":
        return (
            "Every age a token had when trained (updates between the weights that generated "
            "it and the version trained), one column a step or a range of steps; hover a cell "
            "for its share and tokens. `otel-rollout staleness` prints the same histograms."
        )
    if chart_id == "length-bias":
        ratio = data.starvation
        said = (
            "n/a (neither tenth has stale rollouts)"
            if ratio is None
            else "∞ (only the longest tenth has stale rollouts)"
            if math.isinf(ratio)
            else f"{ratio:.2f}"
        )
        return (
            "Rollouts ranked by generation length (tokens) and cut into tenths; for each, "
            "the share discarded or abandoned and the share dropped as stale. The long-rollout "
            "starvation ratio is the stale rate of the longest tenth over that of the shortest "
            f"(1 means no length bias): {said}."
        )
    if chart_id == "timeline":
        return "Hover a bar for when it began and ended (ISO-8601 UTC)."
    return (
        f"Attempts running at each moment; {binned}, with the line the mean and the band "
        "the least and most in the bin."
    )


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
            style = f"{_STYLE}.chart{{margin:0;border:0}}"
            page.write_text(
                f"<html><head><style>{style}</style></head>"
                f"<body style='margin:0'>{drawing}</body></html>"
            )
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
