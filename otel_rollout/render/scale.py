"""The rules the report's charts are drawn by: round ("nice") ticks written without
exponents, round bin edges, the step width of a bar or heat-map column, the heat map's
colours and a time axis's unit.

The page's zoom script (``draw.js``) redraws three charts in the browser by the same
rules, written a second time in JavaScript; ``tests/test_report_zoom.py`` runs that script
in headless Chromium and checks both give the same ticks, labels, edges and widths.  A
change here needs its twin there.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

from ..distributions import quantile

__all__ = [
    "HEAT", "HEAT_ROWS", "MAX_BINS", "RAW_LIMIT", "TIME_UNITS", "Axis", "Bin", "bin_edges",
    "bin_points", "heat_color", "key_width", "merge_bins", "nice_step", "nice_ticks",
    "tick_label", "time_unit",
]  # fmt: skip

HEAT = ["#f7fbff", "#c6dbef", "#6baed6", "#2171b5", "#08306b"]  # 0 … 100 % of a column

#: A series of at most this many points is drawn point by point; a longer one is binned.
RAW_LIMIT = 400
#: The most bins (or bars, or heat-map columns) a binned chart draws.
MAX_BINS = 200
#: The heat map's rows: ages past ``HEAT_ROWS - 1`` share the top one.
HEAT_ROWS = 12


# Ticks -----------------------------------------------------------------------------


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


def heat_color(share: float) -> str:
    """The heat map's colour of a share in [0, 1], between the :data:`HEAT` anchors."""
    share = min(max(share, 0.0), 1.0) * (len(HEAT) - 1)
    i = min(int(share), len(HEAT) - 2)
    f = share - i
    a, b = HEAT[i], HEAT[i + 1]
    mix = [round(int(a[j : j + 2], 16) * (1 - f) + int(b[j : j + 2], 16) * f) for j in (1, 3, 5)]
    return "#" + "".join(f"{c:02x}" for c in mix)


# Aggregation -----------------------------------------------------------------------


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


def key_width(k0: int, k1: int, count: int, limit: int) -> int:
    """How many keys (steps) one bar or column holds so that ``count`` keys from ``k0`` to
    ``k1`` make at most ``limit`` of them: 1 while they fit, else a round width."""
    if count <= limit:
        return 1
    width = max(1, math.ceil(nice_step(k1 - k0 + 1, limit)))
    while (k1 - k0 + 1) / width > limit:
        width = math.ceil(nice_step(width * 1.01 * limit, limit))
    return width


#: ``(longest span in seconds, seconds a unit, the unit)`` of a time axis, shortest first.
TIME_UNITS = [(120.0, 1.0, "seconds"), (7200.0, 60.0, "minutes"), (172800.0, 3600.0, "hours")]


def time_unit(span_s: float) -> tuple[float, str]:
    """The unit a time axis of ``span_s`` seconds is written in: seconds up to two minutes,
    minutes up to two hours, hours up to two days, then days."""
    for limit, size, name in TIME_UNITS:
        if span_s <= limit:
            return size, name
    return 86400.0, "days"
