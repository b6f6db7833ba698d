"""Small SVG charts for the HTML report: no library, no script, nothing fetched.

Each function returns one ``<svg>`` element as text, sized by ``viewBox`` so
it scales with the page.  Values are escaped; colors come from one palette.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from html import escape

W, H = 860, 260
LEFT, RIGHT, TOP, BOTTOM = 56, 16, 18, 34
PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf"]
AGE_COLORS = ["#2ca02c", "#bcbd22", "#ff7f0e", "#d62728"]


def _scale(lo: float, hi: float, a: float, b: float) -> Callable[[float], float]:
    span = (hi - lo) or 1.0
    return lambda v: a + (v - lo) * (b - a) / span


def _frame(title: str, body: list[str], x_label: str, y_label: str, chart_id: str) -> str:
    return (
        f'<svg class="chart" id="{escape(chart_id)}" viewBox="0 0 {W} {H}" role="img" '
        f'xmlns="http://www.w3.org/2000/svg"><title>{escape(title)}</title>'
        f'<rect x="0" y="0" width="{W}" height="{H}" fill="white"/>'
        + "".join(body)
        + f'<text x="{W / 2}" y="{H - 4}" text-anchor="middle" class="axis">'
        + f"{escape(x_label)}</text>"
        f'<text x="12" y="{H / 2}" transform="rotate(-90 12 {H / 2})" text-anchor="middle" '
        f'class="axis">{escape(y_label)}</text></svg>'
    )


def _axes(x0: float, x1: float, y0: float, y1: float) -> list[str]:
    sx = _scale(x0, x1, LEFT, W - RIGHT)
    sy = _scale(y0, y1, H - BOTTOM, TOP)
    out = [
        f'<line x1="{LEFT}" y1="{H - BOTTOM}" x2="{W - RIGHT}" y2="{H - BOTTOM}" stroke="#444"/>',
        f'<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{H - BOTTOM}" stroke="#444"/>',
    ]
    for i in range(5):
        yv = y0 + (y1 - y0) * i / 4
        xv = x0 + (x1 - x0) * i / 4
        out.append(
            f'<text x="{LEFT - 6}" y="{sy(yv) + 4:.1f}" text-anchor="end" class="tick">'
            f"{yv:.3g}</text>"
        )
        out.append(
            f'<text x="{sx(xv):.1f}" y="{H - BOTTOM + 14}" text-anchor="middle" class="tick">'
            f"{xv:.4g}</text>"
        )
    return out


def line_chart(
    chart_id: str,
    title: str,
    series: Sequence[tuple[str, Sequence[tuple[float, float]]]],
    markers: Sequence[tuple[float, str, str]] = (),
    x_label: str = "",
    y_label: str = "",
    step: bool = False,
) -> str:
    """Lines (or steps) of (x, y) points, one color per series; ``markers`` are vertical
    lines ``(x, label, color)``."""
    points = [p for _, pts in series for p in pts]
    if not points:
        return _frame(title, ['<text x="300" y="130">no data</text>'], x_label, y_label, chart_id)
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    x0, x1, y0, y1 = min(xs), max(xs), min(0.0, min(ys)), max(ys) * 1.1 or 1.0
    sx, sy = _scale(x0, x1, LEFT, W - RIGHT), _scale(y0, y1, H - BOTTOM, TOP)
    body = _axes(x0, x1, y0, y1)
    for x, label, color in markers:
        body.append(
            f'<line x1="{sx(x):.1f}" y1="{TOP}" x2="{sx(x):.1f}" y2="{H - BOTTOM}" '
            f'stroke="{color}" stroke-dasharray="4 3"><title>{escape(label)}</title></line>'
        )
    for n, (name, pts) in enumerate(series):
        color = PALETTE[n % len(PALETTE)]
        coords: list[str] = []
        for i, (x, y) in enumerate(pts):
            if step and i:
                coords.append(f"{sx(x):.1f},{sy(pts[i - 1][1]):.1f}")
            coords.append(f"{sx(x):.1f},{sy(y):.1f}")
        body.append(
            f'<polyline class="series" fill="none" stroke="{color}" stroke-width="1.6" '
            f'points="{" ".join(coords)}"><title>{escape(name)}</title></polyline>'
        )
        body.append(
            f'<text x="{W - RIGHT - 4}" y="{TOP + 12 + 14 * n}" text-anchor="end" '
            f'fill="{color}" class="legend">{escape(name)}</text>'
        )
    return _frame(title, body, x_label, y_label, chart_id)


def stacked_bars(
    chart_id: str,
    title: str,
    bars: Sequence[tuple[float, Sequence[float]]],
    labels: Sequence[str],
    x_label: str = "",
    y_label: str = "",
) -> str:
    """One bar per x, stacked shares (summing to 1) in ``AGE_COLORS``."""
    if not bars:
        return _frame(title, ['<text x="300" y="130">no data</text>'], x_label, y_label, chart_id)
    x0, x1 = min(b[0] for b in bars), max(b[0] for b in bars)
    sx, sy = _scale(x0 - 0.5, x1 + 0.5, LEFT, W - RIGHT), _scale(0, 1, H - BOTTOM, TOP)
    width = max((W - LEFT - RIGHT) / max(len(bars), 1) * 0.8, 1.0)
    body = _axes(x0, x1, 0, 1)
    for x, shares in bars:
        base = 0.0
        for share, color in zip(shares, AGE_COLORS, strict=False):
            if share > 0:
                top = base + share
                body.append(
                    f'<rect class="bar" x="{sx(x) - width / 2:.1f}" y="{sy(top):.1f}" '
                    f'width="{width:.1f}" height="{sy(base) - sy(top):.1f}" fill="{color}"/>'
                )
                base = top
    for n, label in enumerate(labels):
        body.append(
            f'<text x="{W - RIGHT - 4}" y="{TOP + 12 + 14 * n}" text-anchor="end" '
            f'fill="{AGE_COLORS[n % len(AGE_COLORS)]}" class="legend">{escape(label)}</text>'
        )
    return _frame(title, body, x_label, y_label, chart_id)


def timeline(
    chart_id: str, title: str, rows: Sequence[tuple[str, Sequence[tuple[float, float, str, str]]]]
) -> str:
    """Horizontal bars: one row per run, each a list of ``(start, end, label, color)``."""
    spans = [s for _, segs in rows for s in segs]
    if not spans:
        return _frame(title, ['<text x="300" y="130">no data</text>'], "", "", chart_id)
    x0, x1 = min(s[0] for s in spans), max(s[1] for s in spans)
    sx = _scale(x0, x1, LEFT + 60, W - RIGHT)
    height = (H - TOP - BOTTOM) / max(len(rows), 1)
    body = []
    for n, (name, segs) in enumerate(rows):
        y = TOP + n * height
        body.append(f'<text x="4" y="{y + height / 2 + 4:.1f}" class="tick">{escape(name)}</text>')
        for start, end, label, color in segs:
            body.append(
                f'<rect class="span" x="{sx(start):.1f}" y="{y + 4:.1f}" '
                f'width="{max(sx(end) - sx(start), 1.5):.1f}" height="{height - 8:.1f}" '
                f'fill="{color}"><title>{escape(label)}: {end - start:.2f} s</title></rect>'
            )
    return _frame(title, body, "seconds since the first event", "", chart_id)
