"""Numbers as a metrics backend or a tracker takes them: the schema allows integers of any
size (read exactly by every command); a protobuf int64, a Prometheus sample, a tracker's
scalar and a tracker's step do not.  One rule, used by the metrics exporter and the
trackers alike."""

from __future__ import annotations

import math
from typing import Any

__all__ = ["indexable_step", "metric_value"]

_INT64 = 1 << 63


def metric_value(n: Any) -> Any:
    """``n`` as a value every metrics backend and tracker takes: an integer within 64 bits
    as it is, a wider one as a float (±inf past what a float holds).  The schema allows
    integers of any size; a protobuf int64, a Prometheus sample and a tracker's scalar do
    not, and ``float(n)`` raises past ~1.8e308."""
    if n.__class__ is not int or -_INT64 <= n < _INT64:
        return n
    try:
        return float(n)
    except OverflowError:
        return math.inf if n > 0 else -math.inf


def indexable_step(step: int) -> bool:
    """Whether a step number can be a tracker's step (an int64 ≥ 0, in all three)."""
    return 0 <= step < _INT64
