"""One bound for every time span a view turns into whole milliseconds or microseconds.

A ``t`` may be any finite float (valid by the schema), so a span between two of them
may be 1e303 seconds, or infinite (``-1.7e308`` to ``1.7e308``), or seconds mixed
with nanoseconds (1.7e9 to 1.7e18): none fits the 64-bit integers that arrays, JSON
readers and trace viewers hold.  Every view holds a span at :data:`FAR_S`.
"""

from __future__ import annotations

__all__ = ["FAR_S", "bounded", "whole_ms"]

#: Seconds past which a span is drawn and counted at this bound (~31,700 years; as
#: microseconds 1e18, inside a signed 64-bit integer).
FAR_S = 1e12


def bounded(seconds: float) -> float:
    """``seconds`` held inside ``[-FAR_S, FAR_S]`` (infinities too)."""
    return -FAR_S if seconds < -FAR_S else FAR_S if seconds > FAR_S else seconds


def whole_ms(seconds: float) -> int:
    """A span of time ≥ 0 as whole milliseconds (rounded; negative spans are 0)."""
    return round(bounded(seconds) * 1000) if seconds > 0.0 else 0
