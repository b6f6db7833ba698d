"""The stop/restore report: one self-contained HTML page (charts and cost tables).

Read in one streaming pass: batch age per step with the stops and restores
marked, the token-age distribution per step, a timeline of the runs (active,
down, catching up), attempts in flight over time, and the cost tables of
:mod:`otel_rollout.cost`.  The page has inline SVG and styles only; its one
inline script records page errors for the tests.  Nothing is fetched.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from html import escape
from pathlib import Path
from typing import Any

from . import _svg
from .age import AGE_BUCKETS, step_age
from .analysis import Analysis, Stop, run_events, run_file
from .cost import CostAnalysis, CostReport
from .reader import EventReader, Progress

__all__ = ["ReportData", "ReportSeries", "collect", "collect_file", "render_html", "write_pngs"]

_MAX_POINTS = 2000
_ENDS = ("attempt.seal", "attempt.refuse", "attempt.abandon")
_AGE_LABELS = [f"age {a}" for a in AGE_BUCKETS[:-1]] + [f"age {AGE_BUCKETS[-1]}+"]


@dataclass
class ReportData:
    """Everything the page shows, gathered in one pass."""

    source: str
    t0: float | None = None
    runs: dict[str, list[float]] = field(default_factory=dict)  # run → [first t, last t]
    steps: list[tuple[float, str, int, float]] = field(default_factory=list)  # t, run, step, age
    shares: dict[int, list[float]] = field(default_factory=dict)  # step → shares by age
    in_flight: list[tuple[float, int]] = field(default_factory=list)
    cost: CostReport | None = None


class ReportSeries(Analysis):
    """The page's time series: batch age per step as trained, token-age shares, attempts in
    flight, and each run's span (an analysis of the one pass, beside the cost analysis)."""

    kinds = frozenset({"attempt.dispatch", "attempt.resume", "train.step", "group.seal", *_ENDS})

    def __init__(self, data: ReportData) -> None:
        self.data = data

    def handlers(self) -> Mapping[str, Callable[[Any], None]]:
        ends = dict.fromkeys(_ENDS, self._end)
        return {"attempt.dispatch": self._start, "attempt.resume": self._start,
                "train.step": self._step, **ends}  # fmt: skip

    def stop(self, stop: Stop) -> None:
        if stop.attempts:  # the old run's attempts died with it
            self.data.in_flight.append((stop.new.first_t, len(self.state.attempts)))

    def _start(self, e: Any) -> None:
        running = self.state.attempts
        self.data.in_flight.append((e.t, len(running) + (e.attempt_id not in running)))

    def _end(self, e: Any) -> None:
        running = self.state.attempts
        if e.attempt_id in running:
            self.data.in_flight.append((e.t, len(running) - 1))

    def _step(self, e: Any) -> None:
        row = step_age(e.step, e.trained_version, e.group_ids, self.state.seals)
        age = e.batch_age if e.batch_age is not None else row.batch_age
        if age is not None:
            self.data.steps.append((e.t, e.run_id, e.step, float(age)))
        if row.tokens:
            self.data.shares[e.step] = [row.share(a) for a in AGE_BUCKETS]

    def result(self) -> ReportData:
        data = self.data
        for run in self.state.runs:
            span = data.runs.setdefault(run.run_id, [run.first_t, run.last_t])
            span[1] = max(span[1], run.last_t)
        if self.state.runs:
            data.t0 = self.state.runs[0].first_t
        data.in_flight = _thin(data.in_flight)
        return data


def collect(events: Iterable[Any], source: str = "") -> ReportData:
    """Read ``events`` once (dicts or typed events, file order) for the whole page."""
    data = ReportData(source)
    data.cost, _ = run_events(events, [CostAnalysis(), ReportSeries(data)])
    return data


def collect_file(
    path: str | os.PathLike[str] | EventReader, *, progress: Progress | None = None
) -> ReportData:
    """:func:`collect` over a trace file, read once in typed blocks."""
    source = path.path if isinstance(path, EventReader) else path
    data = ReportData(str(source))
    data.cost, _ = run_file(path, [CostAnalysis(), ReportSeries(data)], progress=progress)
    return data


def _thin(points: list[tuple[float, int]]) -> list[tuple[float, int]]:
    if len(points) <= _MAX_POINTS:
        return points
    every = len(points) // _MAX_POINTS + 1
    return points[::every] + points[-1:]


def charts(data: ReportData) -> dict[str, str]:
    """Every chart of the page, by id, as SVG text."""
    t0 = data.t0 or 0.0
    runs = list(data.runs)
    short = {r: f"run {n + 1} ({r[:8]})" for n, r in enumerate(runs)}
    cost = data.cost or CostReport()
    markers = []
    for b in cost.boundaries:
        markers.append((b.stopped_at - t0, f"stop: {b.old_run[:8]}", "#d62728"))
        markers.append((b.resumed_at - t0, f"restore: {b.new_run[:8]}", "#2ca02c"))
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
    return {
        "batch-age": _svg.line_chart(
            "batch-age",
            "Batch age per step (stops red, restores green)",
            series,
            markers,
            "seconds since the first event",
            "batch age (updates)",
        ),
        "token-age": _svg.stacked_bars(
            "token-age",
            "Share of each step's tokens by age",
            sorted(data.shares.items()),
            _AGE_LABELS,
            "step",
            "share of tokens",
        ),
        "timeline": _svg.timeline("timeline", "Runs: active, down, catching up", timeline_rows),
        "in-flight": _svg.line_chart(
            "in-flight",
            "Attempts in flight",
            [("attempts", [(t - t0, float(n)) for t, n in data.in_flight])],
            markers,
            "seconds since the first event",
            "attempts",
            step=True,
        ),
    }


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


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f'<td class="n">{value:,.3f}</td>'
    if isinstance(value, int):
        return f'<td class="n">{value:,}</td>'
    if isinstance(value, dict):
        return f"<td>{escape(', '.join(f'{k}={v}' for k, v in value.items()))}</td>"
    return f"<td>{escape('-' if value is None else str(value))}</td>"


def _label(key: str) -> str:
    return escape(key.replace("_", " "))


def _tables(cost: CostReport) -> str:
    parts = []
    if cost.boundaries:
        reports = [b.report() for b in cost.boundaries]
        head = "".join(f"<th>stop {n + 1}</th>" for n in range(len(reports)))
        rows = "".join(
            f"<tr><th>{_label(k)}</th>{''.join(_cell(r[k]) for r in reports)}</tr>"
            for k in reports[0]
        )
        parts.append(f"<table><tr><th></th>{head}</tr>{rows}</table>")
    else:
        parts.append('<p class="muted">One run: no stop and restore in this file.</p>')
    summary = cost.report()["summary"]
    rows = "".join(
        f"<tr><th>{_label(k)}</th>{_cell(summary[k])}</tr>" for k in ("steps", "refused_attempts")
    )
    parts.append(f"<h2>Whole file</h2><table>{rows}</table>")
    rows = "".join(
        f'<tr><th>{escape(label)}</th>{_cell(n)}<td class="n">{share}</td></tr>'
        for label, n, share in cost.ledger_rows()
    )
    parts.append(
        f'<h2>Token ledger</h2><table>{rows}</table><p class="muted">{escape(cost.balance())}</p>'
    )
    return "".join(parts)


def render_html(data: ReportData) -> str:
    """The page, as text: no external resource of any kind."""
    cost = data.cost or CostReport()
    drawn = charts(data)
    body = [
        f'<h1>Rollout stop/restore report</h1><p class="muted">{escape(data.source)} — '
        f"{len(data.runs)} runs, {len(cost.boundaries)} stops, {cost.steps} training steps</p>",
        "<h2>Batch age per step</h2>",
        drawn["batch-age"],
        "<h2>Token age per step</h2>",
        drawn["token-age"],
        "<h2>Runs</h2>",
        drawn["timeline"],
        "<h2>Attempts in flight</h2>",
        drawn["in-flight"],
        "<h2>What each stop cost</h2>",
        _tables(cost),
    ]
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        "<title>otel-rollout report</title>"
        f"<style>{_STYLE}</style><script>{_SCRIPT}</script></head><body>"
        + "".join(body)
        + "</body></html>\n"
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
        for chart_id, svg in charts(data).items():
            page = Path(tmp) / f"{chart_id}.html"
            page.write_text(f"<html><body style='margin:0'>{svg}</body></html>")
            out = directory / f"{chart_id}.png"
            subprocess.run(
                [
                    browser,
                    *CHROMIUM_FLAGS,
                    f"--user-data-dir={tmp}/profile",
                    f"--screenshot={out}",
                    f"--window-size={_svg.W},{_svg.H}",
                    page.as_uri(),
                ],
                capture_output=True,
                timeout=60,
                check=True,
            )
            written.append(out)
    return written
