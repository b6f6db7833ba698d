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

from collections.abc import Callable, Sequence
from html import escape

from . import frame
from .frame import (
    AGE_COLORS,
    LEGEND_ROWS,
    PALETTE,
    PLOT_X0,
    PLOT_X1,
    PLOT_Y0,
    PLOT_Y1,
    H,
    LegendItem,
    W,
)
from .scale import (
    HEAT_ROWS,
    MAX_BINS,
    RAW_LIMIT,
    Axis,
    Bin,
    bin_edges,
    bin_points,
    heat_color,
    key_width,
    merge_bins,
    nice_ticks,
    tick_label,
)

__all__ = [
    "LEGEND_ROWS",
    "MAX_BINS",
    "RAW_LIMIT",
    "Bin",
    "H",
    "LegendItem",
    "W",
    "band_chart",
    "grouped_bars",
    "heat_map",
    "nice_ticks",
    "stacked_bars",
    "tick_label",
    "timeline",
]  # fmt: skip


def _ends(b: Bin) -> list[Point]:
    return [(b.x_lo, b.low, None), (b.x_hi, b.high, None)]


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
        return frame.empty(chart_id, title, x_label, y_label)
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
    body += frame.grid(xa, ya)
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
            steps = frame.steps_attr(b.k_first, b.k_last)
            body.append(frame.hover(xa(b.x_lo), xa(b.x_hi), bin_text(name, b), steps))
    if not raw:  # one row says what every series' shading is
        legend.append(LegendItem(f"{band.replace('-', '–')} band", "#888", "band"))
    body += frame.legend([*legend, *marker_legend])
    return frame.chart(chart_id, title, body, x_label, y_label)


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
        return frame.empty(chart_id, title, x_label, y_label)
    k0, k1 = rows[0][0], rows[-1][0]
    width = key_width(k0, k1, len(rows), MAX_BINS)
    bars: list[tuple[int, int, list[int]]] = []  # first key, last key, summed counts
    for k, counts in rows:
        start = k - (k % width) if width > 1 else k
        if bars and bars[-1][0] == start:
            bars[-1] = (start, k, [a + b for a, b in zip(bars[-1][2], counts, strict=False)])
        else:
            bars.append((start, k, list(counts)))
    xa = _key_axis(k0, k1, width)
    ya = Axis.of(0, 100, PLOT_Y1, PLOT_Y0, 4)
    body = frame.grid(xa, ya)
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
                f'fill="{color}"{frame.steps_attr(start, last)}><title>{escape(tip)}</title></rect>'
            )
            base = top
    body += frame.legend([LegendItem(lb, c) for lb, c in zip(labels, colors, strict=False)])
    if width > 1:
        x_label += f" (bars of {width:,} steps)"
    return frame.chart(chart_id, title, body, x_label, y_label)


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
    max_rows: int = HEAT_ROWS,
) -> str:
    """Counts by row value (a token age) for each key (a step), as a heat map: the colour
    of a cell is its share of the column's total.  More keys than :data:`MAX_BINS` / 2 are
    binned by key range; ages past ``max_rows - 1`` share the top row (``N+``)."""
    columns = [(k, c) for k, c in sorted(columns) if sum(c.values())]
    if not columns:
        return frame.empty(chart_id, title, x_label, y_label)
    top_age = min(max(max(c) for _, c in columns), max_rows - 1)
    k0, k1 = columns[0][0], columns[-1][0]
    width = key_width(k0, k1, len(columns), MAX_BINS // 2)
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
    body = frame.grid(xa, None)
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
                f'width="{max(px, 0.6):.1f}" height="{cell_h:.1f}" fill="{color}"'
                f"{frame.steps_attr(start, last)}><title>{escape(tip)}</title></rect>"
            )
    body += frame.legend(
        [LegendItem("share of tokens", "", "head")]
        + [LegendItem(f"{q:.0%}", heat_color(q)) for q in (0.0, 0.25, 0.5, 0.75, 1.0)]
    )
    if width > 1:
        x_label += f" (columns of {width:,} steps)"
    return frame.chart(chart_id, title, body, x_label, y_label)


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
        return frame.empty(chart_id, title, x_label, y_label, empty)
    scale = 100.0 if percent else 1.0
    top = max((v * scale for _, vs, _ in groups for v in vs), default=0.0)
    ya = Axis.of(0, top or 1.0, PLOT_Y1, PLOT_Y0, 5)
    body = frame.grid(None, ya)
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
    body += frame.legend([LegendItem(nm, PALETTE[n % len(PALETTE)]) for n, nm in enumerate(names)])
    return frame.chart(chart_id, title, body, x_label, y_label)


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
        return frame.empty(chart_id, title, x_label, "")
    xa = Axis.of(
        min(s[0] for s in spans), max(s[1] for s in spans), PLOT_X0, PLOT_X1, 6, tight=True
    )
    height = (PLOT_Y1 - PLOT_Y0) / max(len(rows), 1)
    body = frame.grid(xa, None)
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
    body += frame.legend(legend)
    return frame.chart(chart_id, title, body, x_label, "")
