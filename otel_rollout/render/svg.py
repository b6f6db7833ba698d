"""SVG charts for the HTML report: no library, no script, nothing fetched.

Each function returns one ``<svg>`` element as text, sized by ``viewBox`` so it
scales with the page.  What a plotting library gives for free is done here once:
round ("nice") tick values written without exponents, axis labels with their
units, a legend with colour swatches in a column beside the plot (never over the
data), and every point, bin, bar or cell with its values in a ``<title>`` (shown on
hover).  Long series are aggregated before they are drawn: past :data:`RAW_LIMIT`
points a series becomes at most :data:`MAX_BINS` bins, each drawn as its mean with a
band (p10–p90 or min–max) and a hover box that names the bin's range.  Every drawn
data element has the class ``mark``; the page's script counts them.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from html import escape
from typing import cast

from ..staleness import quantile

W, H = 860, 290
LEGEND_W = 165  # the legend column, right of the plot
LEGEND_CHARS = 22  # the longest label it shows whole
LEFT, TOP, BOTTOM = 66, 34, 46
PLOT_X0, PLOT_X1 = LEFT, W - LEGEND_W
PLOT_Y0, PLOT_Y1 = TOP, H - BOTTOM  # top and bottom of the plot area (SVG y grows down)
PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf"]
AGE_COLORS = ["#2ca02c", "#bcbd22", "#ff7f0e", "#d62728"]
HEAT = ["#f7fbff", "#c6dbef", "#6baed6", "#2171b5", "#08306b"]  # 0 … 100 % of a column

#: A series of at most this many points is drawn point by point; a longer one is binned.
RAW_LIMIT = 400
#: The most bins (or bars, or heat-map columns) a binned chart draws.
MAX_BINS = 200


# Ticks ------------------------------------------------------------------------------


def nice_step(span: float, count: int = 5) -> float:
    """A round step (1, 2, 2.5 or 5 times a power of ten) giving about ``count`` ticks."""
    if not math.isfinite(span) or span <= 0:
        return 1.0
    raw = span / max(count, 1)
    power = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 2.5, 5, 10):
        if raw <= m * power:
            return m * power
    return 10 * power  # pragma: no cover - the loop ends at 10


def nice_ticks(
    lo: float, hi: float, count: int = 5, min_step: float = 0.0
) -> tuple[list[float], float]:
    """Round tick values covering ``[lo, hi]`` (the domain grows to the outer ticks), and
    their step (at least ``min_step``: 1 for counts)."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        lo, hi = 0.0, 1.0
    if hi <= lo:
        lo, hi = (lo - 1, hi + 1) if lo else (0.0, 1.0)
    step = max(nice_step(hi - lo, count), min_step)
    first, last = math.floor(lo / step + 1e-9), math.ceil(hi / step - 1e-9)
    return [n * step for n in range(first, last + 1)], step


def tick_label(value: float, step: float) -> str:
    """A tick value as people write it: thousands separated, as many decimals as the step
    needs, never an exponent (``12,800``, ``0.25``, ``1,281,000``)."""
    decimals = 0
    while decimals < 12 and abs(step * 10**decimals - round(step * 10**decimals)) > 1e-6:
        decimals += 1
    text = f"{value:,.{decimals}f}"
    return "0" if text.strip("-0.,") == "" else text


# Frame, axes and legend ---------------------------------------------------------------


@dataclass
class Axis:
    """A linear axis from ``lo`` to ``hi`` mapped to pixels ``a`` … ``b``, with round ticks
    (a value axis grows to its outer ticks; a ``tight`` one keeps the data's span and shows
    the round ticks inside it)."""

    ticks: list[float]
    step: float
    lo: float
    hi: float
    a: float
    b: float

    @classmethod
    def of(
        cls,
        lo: float,
        hi: float,
        a: float,
        b: float,
        count: int = 5,
        tight: bool = False,
        min_step: float = 0.0,
    ) -> Axis:
        ticks, step = nice_ticks(lo, hi, count, min_step)
        if not tight or hi <= lo:
            return cls(ticks, step, ticks[0], ticks[-1], a, b)
        inside = [t for t in ticks if lo - 1e-9 * step <= t <= hi + 1e-9 * step]
        return cls(inside or ticks, step, lo, hi, a, b)

    def __call__(self, v: float) -> float:
        return self.a + (v - self.lo) * (self.b - self.a) / ((self.hi - self.lo) or 1.0)


@dataclass(frozen=True)
class LegendItem:
    """One legend row: ``kind`` is ``box`` (a filled swatch), ``line``, ``dash``, ``band``
    or ``head`` (a heading, no swatch)."""

    label: str
    color: str
    kind: str = "box"


LEGEND_ROWS = (H - TOP - 8) // 17  # the rows the legend column holds


def _legend(items: Sequence[LegendItem], y: float = TOP) -> list[str]:
    """The legend in its column right of the plot: a swatch and a label a row; a label too
    long for the column is cut with its whole text on hover, and rows past the column's
    height are counted in a last row."""
    x = PLOT_X1 + 14
    out = ['<g class="legend">']
    items = list(items)
    if len(items) > LEGEND_ROWS:
        hidden = len(items) - LEGEND_ROWS + 1
        items = [*items[: LEGEND_ROWS - 1], LegendItem(f"… and {hidden} more", "", "head")]
    for n, item in enumerate(items):
        yy = y + 4 + 17 * n
        if item.kind == "head":
            out.append(
                f'<text class="legend head" x="{x}" y="{yy + 9}">{escape(item.label)}</text>'
            )
            continue
        if item.kind == "line":
            out.append(
                f'<line class="swatch" x1="{x}" y1="{yy + 5}" x2="{x + 16}" y2="{yy + 5}" '
                f'stroke="{item.color}" stroke-width="2.5"/>'
            )
        elif item.kind == "dash":
            out.append(
                f'<line class="swatch" x1="{x + 8}" y1="{yy - 1}" x2="{x + 8}" y2="{yy + 11}" '
                f'stroke="{item.color}" stroke-width="2" stroke-dasharray="3 2"/>'
            )
        else:
            opacity = ' fill-opacity="0.3"' if item.kind == "band" else ""
            out.append(
                f'<rect class="swatch" x="{x}" y="{yy}" width="16" height="10" '
                f'fill="{item.color}"{opacity}/>'
            )
        label = item.label
        tip = f"<title>{escape(label)}</title>" if len(label) > LEGEND_CHARS else ""
        label = label if not tip else label[: LEGEND_CHARS - 1] + "…"
        out.append(f'<text class="legend" x="{x + 22}" y="{yy + 9}">{escape(label)}{tip}</text>')
    out.append("</g>")
    return out


def _grid(
    xa: Axis | None, ya: Axis | None, x_text: Callable[[float], str] | None = None
) -> list[str]:
    """Grid lines, tick labels and the plot's frame."""
    out = [
        f'<rect class="plot" x="{PLOT_X0}" y="{PLOT_Y0}" width="{PLOT_X1 - PLOT_X0}" '
        f'height="{PLOT_Y1 - PLOT_Y0}" fill="none" stroke="#999"/>'
    ]
    if ya is not None:
        for v in ya.ticks:
            y = ya(v)
            out.append(
                f'<line x1="{PLOT_X0}" y1="{y:.1f}" x2="{PLOT_X1}" y2="{y:.1f}" class="grid"/>'
                f'<text x="{PLOT_X0 - 6}" y="{y + 4:.1f}" text-anchor="end" class="tick">'
                f"{tick_label(v, ya.step)}</text>"
            )
    if xa is not None:
        for v in xa.ticks:
            x = xa(v)
            text = x_text(v) if x_text else tick_label(v, xa.step)
            out.append(
                f'<line x1="{x:.1f}" y1="{PLOT_Y1}" x2="{x:.1f}" y2="{PLOT_Y1 + 4}" '
                f'stroke="#666"/><text x="{x:.1f}" y="{PLOT_Y1 + 16}" text-anchor="middle" '
                f'class="tick">{escape(text)}</text>'
            )
    return out


def _frame(chart_id: str, title: str, body: list[str], x_label: str, y_label: str) -> str:
    mid_y = (PLOT_Y0 + PLOT_Y1) / 2
    return (
        f'<svg class="chart" id="{escape(chart_id)}" viewBox="0 0 {W} {H}" role="img" '
        f'xmlns="http://www.w3.org/2000/svg"><title>{escape(title)}</title>'
        f'<rect x="0" y="0" width="{W}" height="{H}" fill="white"/>'
        f'<text x="{PLOT_X0}" y="20" class="title">{escape(title)}</text>'
        + "".join(body)
        + f'<text x="{(PLOT_X0 + PLOT_X1) / 2}" y="{H - 8}" text-anchor="middle" class="axis">'
        f"{escape(x_label)}</text>"
        f'<text x="14" y="{mid_y}" transform="rotate(-90 14 {mid_y})" text-anchor="middle" '
        f'class="axis">{escape(y_label)}</text></svg>'
    )


def _empty(chart_id: str, title: str, x_label: str, y_label: str, text: str = "no data") -> str:
    body = [
        f'<text x="{(PLOT_X0 + PLOT_X1) / 2}" y="{H / 2}" text-anchor="middle" class="empty">'
        f"{escape(text)}</text>"
    ]
    return _frame(chart_id, title, body, x_label, y_label)


def _hover(x0: float, x1: float, text: str) -> str:
    """A transparent box over the plot's height with ``text`` as its tooltip."""
    return (
        f'<rect class="mark hover" x="{x0:.1f}" y="{PLOT_Y0}" width="{max(x1 - x0, 0.8):.1f}" '
        f'height="{PLOT_Y1 - PLOT_Y0}" fill="transparent"><title>{escape(text)}</title></rect>'
    )


def heat_color(share: float) -> str:
    """The heat map's colour of a share in [0, 1], between the :data:`HEAT` anchors."""
    share = min(max(share, 0.0), 1.0) * (len(HEAT) - 1)
    i = min(int(share), len(HEAT) - 2)
    f = share - i
    a, b = HEAT[i], HEAT[i + 1]
    mix = [round(int(a[j : j + 2], 16) * (1 - f) + int(b[j : j + 2], 16) * f) for j in (1, 3, 5)]
    return "#" + "".join(f"{c:02x}" for c in mix)


# Aggregation --------------------------------------------------------------------------


@dataclass
class Bin:
    """The points of one x range: how many, their mean, the band's low and high values, and
    the first and last key (a step number) and x among them."""

    x_lo: float
    x_hi: float
    n: int
    mean: float
    low: float
    high: float
    k_first: int | None
    k_last: int | None


def bin_points(
    points: Sequence[tuple[float, float, int | None]], edges: Sequence[float], band: str
) -> list[Bin]:
    """The points (x sorted) in the bins between ``edges``; ``band`` is ``p10-p90`` or
    ``min-max``.  Empty bins are left out."""
    out: list[Bin] = []
    i, n = 0, len(points)
    for lo, hi in itertools.pairwise(edges):
        chunk = []
        while i < n and (points[i][0] < hi or hi == edges[-1]):
            chunk.append(points[i])
            i += 1
        if not chunk:
            continue
        ys = sorted(p[1] for p in chunk)
        low, high = ys[0], ys[-1]
        if band == "p10-p90":  # the chunk is not empty, so neither quantile is None
            low, high = cast(float, quantile(ys, 0.1)), cast(float, quantile(ys, 0.9))
        out.append(Bin(lo, hi, len(ys), sum(ys) / len(ys), low, high, chunk[0][2], chunk[-1][2]))
    return out


def _ends(b: Bin) -> list[Point]:
    return [(b.x_lo, b.low, None), (b.x_hi, b.high, None)]


def merge_bins(fine: Sequence[Bin], edges: Sequence[float]) -> list[Bin]:
    """Narrow bins (x sorted) merged into the bins between ``edges``: the least low, the
    most high, the mean weighted by count, the first and last keys."""
    out: list[Bin] = []
    i, n = 0, len(fine)
    for lo, hi in itertools.pairwise(edges):
        chunk = []
        while i < n and (fine[i].x_lo < hi or hi == edges[-1]):
            chunk.append(fine[i])
            i += 1
        if chunk:
            count = sum(b.n for b in chunk)
            out.append(
                Bin(
                    lo,
                    hi,
                    count,
                    sum(b.mean * b.n for b in chunk) / count,
                    min(b.low for b in chunk),
                    max(b.high for b in chunk),
                    chunk[0].k_first,
                    chunk[-1].k_last,
                )
            )
    return out


def bin_edges(lo: float, hi: float, bins: int = MAX_BINS) -> list[float]:
    """Round bin edges from ``lo`` to past ``hi``: a nice width giving at most ``bins``."""
    width = nice_step(hi - lo, bins)
    while (hi - lo) / width >= bins:
        width = nice_step(width * 1.01 * bins, bins)
    start = math.floor(lo / width) * width
    count = max(1, math.ceil((hi - start) / width + 1e-9))
    if start + count * width <= hi:
        count += 1
    return [start + k * width for k in range(count + 1)]


# Charts -------------------------------------------------------------------------------

Point = tuple[float, float, int | None]  # x, y, and a key (a step number) or None


def band_chart(
    chart_id: str,
    title: str,
    series: Sequence[tuple[str, Sequence[Point]]],
    *,
    x_label: str,
    y_label: str,
    x_text: Callable[[float], str],
    point_text: Callable[[str, Point], str],
    bin_text: Callable[[str, Bin], str],
    band: str = "p10-p90",
    markers: Sequence[tuple[float, str, str]] = (),
    marker_legend: Sequence[LegendItem] = (),
    step: bool = False,
    x_from: float | None = None,
    counts: bool = False,
    fine: Sequence[tuple[str, Sequence[Bin]]] = (),
) -> str:
    """Lines of ``(x, y, key)`` points, one colour a series, drawn point by point (a hover
    dot each) up to :data:`RAW_LIMIT` points, else binned: the mean of each bin as the
    line, ``band`` as a shaded band, a hover box per bin.  ``fine`` gives series already
    aggregated into narrower bins (merged into the chart's).  ``markers`` are vertical
    lines ``(x, tooltip, colour)``; ``x_text`` writes a point's x for its tooltip.  The x
    axis starts at ``x_from`` if given (a time axis at its origin); ``counts`` ticks the y
    axis in whole numbers."""
    points = [p for _, pts in series for p in pts]
    if fine:  # the bins' edges and extremes stand for their points
        points = [p for _, bins in fine for b in bins for p in _ends(b)]
    if not points:
        return _empty(chart_id, title, x_label, y_label)
    x_min, x_max = min(p[0] for p in points), max(p[0] for p in points)
    if x_from is not None:
        x_min = min(x_min, x_from)
    for x, _, _ in markers:
        x_min, x_max = min(x_min, x), max(x_max, x)
    raw = not fine and len(points) <= RAW_LIMIT
    xa = Axis.of(x_min, x_max, PLOT_X0, PLOT_X1, 6, tight=True)
    body: list[str] = []
    drawn: list[tuple[str, str, list[Bin] | Sequence[Point]]] = []
    y_top = max(p[1] for p in points)
    edges = bin_edges(x_min, x_max) if not raw else []
    for n, (name, given) in enumerate(fine):
        drawn.append((name, PALETTE[n % len(PALETTE)], merge_bins(given, edges)))
    for n, (name, pts) in enumerate(() if fine else series):
        color = PALETTE[n % len(PALETTE)]
        ordered = sorted(pts, key=lambda p: p[0])
        if raw:
            drawn.append((name, color, ordered))
        else:
            bins = bin_points(ordered, edges, band)
            drawn.append((name, color, bins))
    y_min = min(0.0, min(p[1] for p in points))
    ya = Axis.of(y_min, y_top or 1.0, PLOT_Y1, PLOT_Y0, 5, min_step=1.0 if counts else 0.0)
    body += _grid(xa, ya)
    for x, label, color in markers:
        body.append(
            f'<line class="marker" x1="{xa(x):.1f}" y1="{PLOT_Y0}" x2="{xa(x):.1f}" '
            f'y2="{PLOT_Y1}" stroke="{color}" stroke-width="1.5" stroke-dasharray="4 3">'
            f"<title>{escape(label)} at {escape(x_text(x))}</title></line>"
        )
    legend: list[LegendItem] = []
    for name, color, items in drawn:
        legend.append(LegendItem(name, color, "line"))
        if raw:
            pts = [p for p in items if isinstance(p, tuple)]
            coords: list[str] = []
            for i, (x, y, _) in enumerate(pts):
                if step and i:
                    coords.append(f"{xa(x):.1f},{ya(pts[i - 1][1]):.1f}")
                coords.append(f"{xa(x):.1f},{ya(y):.1f}")
            body.append(
                f'<polyline class="mark series" fill="none" stroke="{color}" '
                f'stroke-width="1.6" points="{" ".join(coords)}"/>'
            )
            for p in pts:
                body.append(
                    f'<circle class="mark pt" cx="{xa(p[0]):.1f}" cy="{ya(p[1]):.1f}" r="2.6" '
                    f'fill="{color}"><title>{escape(point_text(name, p))}</title></circle>'
                )
            continue
        bins = [b for b in items if isinstance(b, Bin)]
        for run in _contiguous(bins):
            mids = [(xa((b.x_lo + b.x_hi) / 2), b) for b in run]
            if len(run) == 1:
                mids = [(xa(run[0].x_lo), run[0]), (xa(run[0].x_hi), run[0])]
            upper = " L".join(f"{x:.1f},{ya(b.high):.1f}" for x, b in mids)
            lower = " L".join(f"{x:.1f},{ya(b.low):.1f}" for x, b in reversed(mids))
            body.append(
                f'<path class="mark band" d="M{upper} L{lower} Z" fill="{color}" '
                f'fill-opacity="0.22" stroke="none"/>'
            )
            line = " ".join(f"{x:.1f},{ya(b.mean):.1f}" for x, b in mids)
            body.append(
                f'<polyline class="mark series" fill="none" stroke="{color}" '
                f'stroke-width="1.6" points="{line}"/>'
            )
        for b in bins:
            body.append(_hover(xa(b.x_lo), xa(b.x_hi), bin_text(name, b)))
    if not raw:  # one row says what every series' shading is
        legend.append(LegendItem(f"{band.replace('-', '–')} band", "#888", "band"))
    body += _legend([*legend, *marker_legend])
    return _frame(chart_id, title, body, x_label, y_label)


def _contiguous(bins: Sequence[Bin]) -> list[list[Bin]]:
    """Bins in runs without a gap (an empty bin breaks the line and the band)."""
    runs: list[list[Bin]] = []
    for b in bins:
        if runs and abs(runs[-1][-1].x_hi - b.x_lo) < 1e-9 * max(1.0, abs(b.x_lo)):
            runs[-1].append(b)
        else:
            runs.append([b])
    return runs


def stacked_bars(
    chart_id: str,
    title: str,
    rows: Sequence[tuple[int, Sequence[int]]],
    labels: Sequence[str],
    *,
    x_label: str,
    y_label: str,
    colors: Sequence[str] = AGE_COLORS,
) -> str:
    """One bar per key (a step) of counts stacked as shares of the bar's total, in
    ``colors``; more keys than :data:`MAX_BINS` are binned by key range (shares of each
    range's summed counts), each bar's tooltip its range, total and shares."""
    rows = [(k, list(c)) for k, c in sorted(rows) if sum(c)]
    if not rows:
        return _empty(chart_id, title, x_label, y_label)
    k0, k1 = rows[0][0], rows[-1][0]
    width = 1
    if len(rows) > MAX_BINS:
        width = max(1, math.ceil(nice_step(k1 - k0 + 1, MAX_BINS)))
        while (k1 - k0 + 1) / width > MAX_BINS:
            width = math.ceil(nice_step(width * 1.01 * MAX_BINS, MAX_BINS))
    bars: list[tuple[int, int, list[int]]] = []  # first key, last key, summed counts
    for k, counts in rows:
        start = k - (k % width) if width > 1 else k
        if bars and bars[-1][0] == start:
            bars[-1] = (start, k, [a + b for a, b in zip(bars[-1][2], counts, strict=False)])
        else:
            bars.append((start, k, list(counts)))
    xa = _key_axis(k0, k1, width)
    ya = Axis.of(0, 100, PLOT_Y1, PLOT_Y0, 4)
    body = _grid(xa, ya)
    px = abs(xa(width) - xa(0))
    gap = min(px * 0.15, 1.0) if px > 2 else 0.0
    for start, last, counts in bars:
        total = sum(counts)
        left = xa(start - 0.5 if width == 1 else start)
        base = 0.0
        shares = [c / total for c in counts]
        span = f"step {start:,}" if width == 1 else f"steps {start:,}–{last:,}"
        tip = f"{span}: {total:,} tokens; " + ", ".join(
            f"{label} {s:.1%}" for label, s in zip(labels, shares, strict=False)
        )
        for share, color in zip(shares, colors, strict=False):
            if share <= 0:
                continue
            top = base + share * 100
            body.append(
                f'<rect class="mark bar" x="{left + gap / 2:.1f}" y="{ya(top):.1f}" '
                f'width="{max(px - gap, 0.6):.1f}" height="{ya(base) - ya(top):.1f}" '
                f'fill="{color}"><title>{escape(tip)}</title></rect>'
            )
            base = top
    body += _legend([LegendItem(lb, c) for lb, c in zip(labels, colors, strict=False)])
    if width > 1:
        x_label += f" (bars of {width:,} steps)"
    return _frame(chart_id, title, body, x_label, y_label)


def _key_axis(k0: int, k1: int, width: int) -> Axis:
    """The x axis of bars or columns of ``width`` keys from ``k0`` to ``k1``."""
    if width == 1:
        return Axis.of(k0 - 0.5, k1 + 0.5, PLOT_X0, PLOT_X1, 6, tight=True)
    return Axis.of(k0 - k0 % width, k1 - k1 % width + width, PLOT_X0, PLOT_X1, 6, tight=True)


def heat_map(
    chart_id: str,
    title: str,
    columns: Sequence[tuple[int, dict[int, int]]],
    *,
    x_label: str,
    y_label: str,
    max_rows: int = 12,
) -> str:
    """Counts by row value (a token age) for each key (a step), as a heat map: the colour
    of a cell is its share of the column's total.  More keys than :data:`MAX_BINS` / 2 are
    binned by key range; ages past ``max_rows - 1`` share the top row (``N+``)."""
    columns = [(k, c) for k, c in sorted(columns) if sum(c.values())]
    if not columns:
        return _empty(chart_id, title, x_label, y_label)
    top_age = min(max(max(c) for _, c in columns), max_rows - 1)
    k0, k1 = columns[0][0], columns[-1][0]
    limit = MAX_BINS // 2
    width = 1
    if len(columns) > limit:
        width = max(1, math.ceil(nice_step(k1 - k0 + 1, limit)))
        while (k1 - k0 + 1) / width > limit:
            width = math.ceil(nice_step(width * 1.01 * limit, limit))
    cols: list[tuple[int, int, dict[int, int]]] = []
    for k, counts in columns:
        start = k - (k % width) if width > 1 else k
        if not cols or cols[-1][0] != start:
            cols.append((start, k, {}))
        first, _, summed = cols[-1]
        cols[-1] = (first, k, summed)
        for age, n in counts.items():
            row = min(age, top_age)
            summed[row] = summed.get(row, 0) + n
    xa = _key_axis(k0, k1, width)
    rows = top_age + 1
    cell_h = (PLOT_Y1 - PLOT_Y0) / rows
    body = _grid(xa, None)
    for r in range(rows):
        label = f"{r}+" if r == top_age and top_age == max_rows - 1 else str(r)
        y = PLOT_Y1 - (r + 0.5) * cell_h
        body.append(
            f'<text x="{PLOT_X0 - 6}" y="{y + 4:.1f}" text-anchor="end" class="tick">{label}</text>'
        )
    px = abs(xa(width) - xa(0))
    for start, last, summed in cols:
        total = sum(summed.values())
        left = xa(start - 0.5 if width == 1 else start)
        span = f"step {start:,}" if width == 1 else f"steps {start:,}–{last:,}"
        for age, n in sorted(summed.items()):
            share = n / total
            color = heat_color(share)
            name = f"age {age}+" if age == top_age and top_age == max_rows - 1 else f"age {age}"
            tip = f"{span}, {name}: {share:.1%} of {total:,} tokens ({n:,})"
            body.append(
                f'<rect class="mark cell" x="{left:.1f}" y="{PLOT_Y1 - (age + 1) * cell_h:.1f}" '
                f'width="{max(px, 0.6):.1f}" height="{cell_h:.1f}" fill="{color}">'
                f"<title>{escape(tip)}</title></rect>"
            )
    body += _legend(
        [LegendItem("share of tokens", "", "head")]
        + [LegendItem(f"{q:.0%}", heat_color(q)) for q in (0.0, 0.25, 0.5, 0.75, 1.0)]
    )
    if width > 1:
        x_label += f" (columns of {width:,} steps)"
    return _frame(chart_id, title, body, x_label, y_label)


def grouped_bars(
    chart_id: str,
    title: str,
    groups: Sequence[tuple[str, Sequence[float], str]],
    names: Sequence[str],
    *,
    x_label: str,
    y_label: str,
    percent: bool = True,
    empty: str = "no data",
    zero: str = "every value is 0",
) -> str:
    """Bars side by side for each group ``(label, values, tooltip)``, one colour per name;
    values are shares shown as percentages when ``percent``."""
    if not groups:
        return _empty(chart_id, title, x_label, y_label, empty)
    scale = 100.0 if percent else 1.0
    top = max((v * scale for _, vs, _ in groups for v in vs), default=0.0)
    ya = Axis.of(0, top or 1.0, PLOT_Y1, PLOT_Y0, 5)
    body = _grid(None, ya)
    slot = (PLOT_X1 - PLOT_X0) / len(groups)
    bar = slot * 0.8 / max(len(names), 1)
    unit = "%" if percent else ""
    for g, (label, values, tip) in enumerate(groups):
        x = PLOT_X0 + g * slot + slot * 0.1
        for n, (name, value) in enumerate(zip(names, values, strict=False)):
            v = value * scale
            text = f"{tip}: {name} {v:.1f}{unit}"
            body.append(
                f'<rect class="mark bar" x="{x + n * bar:.1f}" y="{ya(v):.1f}" '
                f'width="{bar - 1:.1f}" height="{max(ya(0) - ya(v), 0.0):.1f}" '
                f'fill="{PALETTE[n % len(PALETTE)]}"><title>{escape(text)}</title></rect>'
            )
        body.append(
            f'<text x="{PLOT_X0 + (g + 0.5) * slot:.1f}" y="{PLOT_Y1 + 16}" '
            f'text-anchor="middle" class="tick">{escape(label)}</text>'
        )
    if not top:
        body.append(
            f'<text x="{(PLOT_X0 + PLOT_X1) / 2}" y="{(PLOT_Y0 + PLOT_Y1) / 2}" '
            f'text-anchor="middle" class="empty">{escape(zero)}</text>'
        )
    body += _legend([LegendItem(nm, PALETTE[n % len(PALETTE)]) for n, nm in enumerate(names)])
    return _frame(chart_id, title, body, x_label, y_label)


def timeline(
    chart_id: str,
    title: str,
    rows: Sequence[tuple[str, Sequence[tuple[float, float, str, str]]]],
    *,
    x_label: str,
    x_text: Callable[[float], str],
    legend: Sequence[LegendItem] = (),
) -> str:
    """Horizontal bars: one row per run, each a list of ``(start, end, label, colour)``;
    each bar's tooltip says what it is, when it began and ended and how long it lasted."""
    spans = [s for _, segs in rows for s in segs]
    if not spans:
        return _empty(chart_id, title, x_label, "")
    xa = Axis.of(
        min(s[0] for s in spans), max(s[1] for s in spans), PLOT_X0, PLOT_X1, 6, tight=True
    )
    height = (PLOT_Y1 - PLOT_Y0) / max(len(rows), 1)
    body = _grid(xa, None)
    for n, (name, segs) in enumerate(rows):
        y = PLOT_Y0 + n * height
        first, _, rest = name.partition(" (")
        mid = y + height / 2
        if height < 30:  # too thin for two lines: the run's number, its ID on hover
            rest, mid = "", mid + 4
        rest = rest.rstrip(")")
        rest = rest if len(rest) <= 9 else rest[:8] + "…"  # the whole name on hover
        label = f'<tspan x="{PLOT_X0 - 6}" y="{mid - 2:.1f}">{escape(first)}</tspan>'
        if rest:
            label += f'<tspan x="{PLOT_X0 - 6}" y="{mid + 11:.1f}">{escape(rest)}</tspan>'
        body.append(
            f'<text text-anchor="end" class="tick">{label}<title>{escape(name)}</title></text>'
        )
        for start, end, label, color in segs:
            tip = f"{name} {label}: {x_text(start)} to {x_text(end)}"
            body.append(
                f'<rect class="mark span" x="{xa(start):.1f}" y="{y + 5:.1f}" '
                f'width="{max(xa(end) - xa(start), 1.5):.1f}" height="{max(height - 10, 2):.1f}" '
                f'fill="{color}"><title>{escape(tip)}</title></rect>'
            )
    body += _legend(legend)
    return _frame(chart_id, title, body, x_label, "")
