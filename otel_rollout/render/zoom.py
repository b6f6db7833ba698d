"""What the page's zoom script needs: each zoomable chart's per-step data, embedded once
beside the chart as compact JSON columns, the drawing constants, and the script itself.

The batch-age, token-age and heat-map charts zoom to a step range (drag across the plot,
click a bin, or type the range); the script (``zoom.js``) redraws the zoomed chart by the
rules of :mod:`.scale` and :mod:`.frame` (``draw.js``), from these columns.  Steps and
times are stored as differences from the one before (mostly ``1`` and two digits): on the
1M-line bench trace (12,819 steps) the three charts' columns are 0.74 MB of the 4.05 MB
page (batch age 0.18, token shares 0.24, histograms 0.32).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from importlib import resources
from itertools import pairwise
from typing import Any

from .._spans_of_time import bounded
from ..age import AGE_BUCKETS
from ..cost import CostReport
from ..report import ReportData
from . import frame, scale
from .fields import AGE_LABELS, Style, short_run
from .scale import Bin

Point = tuple[float, float, int | None]  # as svg.band_chart draws: x, y, step

__all__ = [
    "MARKER_LEGEND",
    "ZOOMABLE",
    "age_bin_text",
    "age_point_text",
    "config_tag",
    "data_tag",
    "run_labels",
    "script",
    "stop_markers",
]

#: The charts that zoom to a step range, with their titles and x and y axis labels (the x
#: label of the batch-age chart is its time unit and origin).
ZOOMABLE = {
    "batch-age": (
        "Batch age per step (mean per bin and p10–p90 when binned)",
        "",
        "batch age (updates)",
    ),
    "token-age": (
        "Share of each step's tokens by age (updates behind the trained version)",
        "training step",
        "share of tokens (%)",
    ),
    "age-heatmap": (
        "Token age histogram per step: share of the step's tokens at each age",
        "training step",
        "token age (updates)",
    ),
}


def run_labels(data: ReportData, style: Style) -> dict[str, str]:
    """Each run as the charts name it: ``run 2 (1a2b3c4d)``."""
    return {r: f"run {n + 1} ({short_run(r, style)})" for n, r in enumerate(data.runs)}


def stop_markers(data: ReportData, style: Style) -> list[tuple[float, str, str]]:
    """Each stop and restore as ``(epoch seconds, label, colour)``."""
    out = []
    for b in (data.cost or CostReport()).boundaries:
        old, new = short_run(b.old_run, style), short_run(b.new_run, style)
        out.append((b.stopped_at, f"stop of run {old}", "#d62728"))
        out.append((b.resumed_at, f"restore: run {new}", "#2ca02c"))
    return out


#: The legend rows of the stop and restore markers.
MARKER_LEGEND = [
    frame.LegendItem("stop", "#d62728", "dash"),
    frame.LegendItem("restore", "#2ca02c", "dash"),
]


def age_point_text(when: Callable[[float], str]) -> Callable[[str, Point], str]:
    """The hover text of one step's dot on the batch-age chart (``when``: its x in words)."""
    return lambda run, p: f"{run}, step {p[2]:,} at {when(p[0])}: batch age {p[1]:.2f} updates"


def age_bin_text(when: Callable[[float], str]) -> Callable[[str, Bin], str]:
    """The hover text of a bin of the batch-age chart."""
    return lambda run, b: (
        f"{run}, steps {b.k_first:,}–{b.k_last:,} ({b.n:,} steps) "
        f"from {when(b.x_lo)} to {when(b.x_hi)}: batch age mean {b.mean:.2f}, "
        f"p10 {b.low:.2f}, p90 {b.high:.2f} updates"
    )


def _deltas(values: list[int]) -> list[int]:
    """``values`` as the first, then each one's difference from the one before."""
    return values[:1] + [b - a for a, b in pairwise(values)]


def chart_data(name: str, data: ReportData, style: Style) -> dict[str, Any]:
    """The columns chart ``name`` zooms from, and its title and axis labels."""
    title, x_label, y_label = ZOOMABLE[name]
    return {"title": title, "x": x_label, "y": y_label, **_columns(name, data, style)}


def _columns(name: str, data: ReportData, style: Style) -> dict[str, Any]:
    if name == "batch-age":
        t0 = data.t0 or 0.0
        t_end = max((span[1] for span in data.runs.values()), default=t0)
        labels = run_labels(data, style)
        runs = list(data.runs)
        by_run: list[list[tuple[float, str, int, float]]] = [[] for _ in runs]
        index = {r: n for n, r in enumerate(runs)}
        for row in data.steps:
            by_run[index[row[1]]].append(row)
        rows = [row for part in by_run for row in part]
        return {
            "t0": t0,
            "unit": scale.time_unit(t_end - t0)[0],  # seconds a unit of the static chart's x
            "runs": [labels[r] for r in runs],
            "n": [len(part) for part in by_run],  # points of each run, in run order
            "ms": _deltas([round(bounded(t - t0) * 1000) for t, _, _, _ in rows]),  # since t0
            "step": _deltas([step for _, _, step, _ in rows]),
            "age": [round(age, 6) for _, _, _, age in rows],
            "markers": [[round(t - t0, 3), label, c] for t, label, c in stop_markers(data, style)],
        }
    if name == "token-age":
        kept = sorted(
            (r for r in data.step_ages if any(r.tokens_by_age.get(a) for a in AGE_BUCKETS)),
            key=lambda r: r.step,
        )
        return {
            "step": _deltas([r.step for r in kept]),
            "tokens": [r.tokens_by_age.get(a, 0) for r in kept for a in AGE_BUCKETS],
        }
    assert name == "age-heatmap", name
    cols = sorted((k, c) for k, c in data.age_tokens if sum(c.values()))
    return {
        "step": _deltas([k for k, _ in cols]),
        "n": [len(c) for _, c in cols],  # ages of each step
        "age": [a for _, c in cols for a in sorted(c)],
        "tokens": [c[a] for _, c in cols for a in sorted(c)],
    }


def _tag(attrs: str, value: Any) -> str:
    # no "<" at all inside the element: neither "</script>" nor "<!--" can end or bend it
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False).replace("<", "\\u003c")
    return f'<script type="application/json" {attrs}>{text}</script>'


def data_tag(name: str, data: ReportData, style: Style) -> str:
    """Chart ``name``'s columns as an inert JSON script element (no script: nothing)."""
    return _tag(f'class="zoom-data" data-for="{name}"', chart_data(name, data, style))


def config_tag() -> str:
    """The drawing constants the script shares with :mod:`.frame` and :mod:`.scale`."""
    return _tag(
        'id="zoom-config"',
        {
            "W": frame.W,
            "H": frame.H,
            "X0": frame.PLOT_X0,
            "X1": frame.PLOT_X1,
            "Y0": frame.PLOT_Y0,
            "Y1": frame.PLOT_Y1,
            "LEGEND_ROWS": frame.LEGEND_ROWS,
            "LEGEND_CHARS": frame.LEGEND_CHARS,
            "PALETTE": frame.PALETTE,
            "AGE_COLORS": frame.AGE_COLORS,
            "AGE_LABELS": AGE_LABELS,
            "HEAT": scale.HEAT,
            "HEAT_ROWS": scale.HEAT_ROWS,
            "RAW_LIMIT": scale.RAW_LIMIT,
            "MAX_BINS": scale.MAX_BINS,
            "UNITS": scale.TIME_UNITS,
        },
    )


def script() -> str:
    """The zoom script: ``draw.js`` and ``zoom.js`` in one function of their own (nothing
    but ``window.otelRollout`` reaches the page's scope)."""
    here = resources.files(__package__)
    parts = [here.joinpath(name).read_text(encoding="utf-8") for name in ("draw.js", "zoom.js")]
    return '(function () {\n"use strict";\n' + "".join(parts) + "})();\n"
