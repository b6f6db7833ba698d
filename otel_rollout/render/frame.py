"""The frame every report chart is drawn in: the picture's size and plot area, the grid
with its round tick labels, the axis labels, the legend column right of the plot, and a
hover box.  :mod:`.svg` draws the data inside it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from html import escape

from .scale import Axis, tick_label

W, H = 860, 290
LEGEND_W = 165  # the legend column, right of the plot
LEGEND_CHARS = 22  # the longest label it shows whole
LEFT, TOP, BOTTOM = 66, 34, 46
PLOT_X0, PLOT_X1 = LEFT, W - LEGEND_W
PLOT_Y0, PLOT_Y1 = TOP, H - BOTTOM  # top and bottom of the plot area (SVG y grows down)
PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf"]
AGE_COLORS = ["#2ca02c", "#bcbd22", "#ff7f0e", "#d62728"]


@dataclass(frozen=True)
class LegendItem:
    """One legend row: ``kind`` is ``box`` (a filled swatch), ``line``, ``dash``, ``band``
    or ``head`` (a heading, no swatch)."""

    label: str
    color: str
    kind: str = "box"


LEGEND_ROWS = (H - TOP - 8) // 17  # the rows the legend column holds


def legend(items: Sequence[LegendItem], y: float = TOP) -> list[str]:
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


def grid(
    xa: Axis | None, ya: Axis | None, x_text: Callable[[float], str] | None = None
) -> list[str]:
    """Grid lines, tick labels and the plot's frame (whose ``data-x`` holds the x axis's
    ends, for the zoom script to read a drag)."""
    domain = f' data-x="{xa.lo!r} {xa.hi!r}"' if xa is not None else ""
    out = [
        f'<rect class="plot" x="{PLOT_X0}" y="{PLOT_Y0}" width="{PLOT_X1 - PLOT_X0}" '
        f'height="{PLOT_Y1 - PLOT_Y0}" fill="none" stroke="#999"{domain}/>'
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


def chart(chart_id: str, title: str, body: list[str], x_label: str, y_label: str) -> str:
    """The chart's ``<svg>``: a white picture with its title, ``body`` and axis labels."""
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


def empty(chart_id: str, title: str, x_label: str, y_label: str, text: str = "no data") -> str:
    """A chart with nothing to draw: ``text`` where the plot would be."""
    body = [
        f'<text x="{(PLOT_X0 + PLOT_X1) / 2}" y="{H / 2}" text-anchor="middle" class="empty">'
        f"{escape(text)}</text>"
    ]
    return chart(chart_id, title, body, x_label, y_label)


def steps_attr(first: int | None, last: int | None) -> str:
    """The ``data-steps`` of a bin, bar or column of steps ``first`` … ``last``: clicking it
    zooms to them."""
    return "" if first is None or last is None else f' data-steps="{first} {last}"'


def hover(x0: float, x1: float, text: str, steps: str = "") -> str:
    """A transparent box over the plot's height with ``text`` as its tooltip (``steps``: its
    :func:`steps_attr`)."""
    return (
        f'<rect class="mark hover" x="{x0:.1f}" y="{PLOT_Y0}" width="{max(x1 - x0, 0.8):.1f}" '
        f'height="{PLOT_Y1 - PLOT_Y0}" fill="transparent"{steps}><title>{escape(text)}</title>'
        "</rect>"
    )
