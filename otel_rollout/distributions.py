"""The statistics the staleness diagnostics report: exact quantiles of values and of
histograms, and rates by length decile (the long-rollout starvation ratio)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import Any

__all__ = ["STALE", "deciles", "hist_summary", "quantile", "summary", "weighted_quantile"]

#: The discard (or abandon) reason that means "too old to train".
STALE = "stale"


def quantile(values: Sequence[float], q: float) -> float | None:
    """The ``q`` quantile of sorted ``values`` (nearest rank: the smallest value with at
    least a share ``q`` of the values at or below it), or None for none."""
    if not values:
        return None
    return values[max(0, math.ceil(q * len(values)) - 1)]


def weighted_quantile(histogram: Mapping[int, int], q: float) -> int | None:
    """The same for a histogram ``{value: count}`` (token ages weighted by tokens)."""
    total = sum(histogram.values())
    if not total:
        return None
    try:
        need: float | Fraction = q * total
    except OverflowError:  # tokens past a float's range (an integer of any size is valid)
        need = Fraction(q) * total
    seen = 0
    for value in sorted(histogram):
        seen += histogram[value]
        if seen >= need:
            return value
    return max(histogram)  # pragma: no cover - seen reaches total


def summary(values: list[float]) -> dict[str, float | None]:
    """p50 / p90 / max of ``values`` (sorted in place)."""
    values.sort()
    return {"p50": quantile(values, 0.5), "p90": quantile(values, 0.9), "max": quantile(values, 1)}


def hist_summary(histogram: Mapping[int, int], per: int = 1) -> dict[str, float | None]:
    """p50 / p90 / max of a histogram, each value divided by ``per`` (ms → s)."""
    out: dict[str, float | None] = {}
    for name, q in (("p50", 0.5), ("p90", 0.9), ("max", 1.0)):
        value = weighted_quantile(histogram, q)
        out[name] = value if value is None or per == 1 else value / per
    return out


def deciles(counts: Mapping[tuple[int, str], int]) -> tuple[list[dict[str, Any]], float | None]:
    """Discard and stale rates by generation-length decile from a histogram of ``(tokens,
    outcome)``, and the starvation ratio (stale rate of the longest tenth over the
    shortest's): the attempts ranked by length (then outcome) and cut into ten parts."""
    ranked = sorted((key, n) for key, n in counts.items() if n)
    total = sum(n for _, n in ranked)
    if total < 10:
        return [], None
    stale = (f"discarded: {STALE}", f"abandoned: {STALE}")
    rows: list[dict[str, Any]] = []
    for d in range(10):
        lo, hi = d * total // 10, (d + 1) * total // 10
        seen = wasted = stale_n = 0
        first = last = None
        for (tokens, outcome), n in ranked:
            a, b = max(seen, lo), min(seen + n, hi)
            seen += n
            if a >= b:
                if seen >= hi:
                    break
                continue
            first = tokens if first is None else first
            last = tokens
            if outcome.startswith(("discarded", "abandoned")):
                wasted += b - a
            if outcome in stale:
                stale_n += b - a
        rows.append(
            {
                "decile": d + 1,
                "min_tokens": first,
                "max_tokens": last,
                "attempts": hi - lo,
                "discard_rate": wasted / (hi - lo),
                "stale_rate": stale_n / (hi - lo),
            }
        )
    low, high = rows[0]["stale_rate"], rows[-1]["stale_rate"]
    if low:
        return rows, high / low
    return rows, (math.inf if high else None)
