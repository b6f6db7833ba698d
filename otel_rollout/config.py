"""Every tuning knob of otel-rollout, its environment variable and its default.

A knob is resolved in this order: an explicit argument, then the environment
variable, then the default.  A malformed environment value is logged once and
the default used instead: a typo in a job script must not kill a training run.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

__all__ = [
    "CLOSE_TIMEOUT",
    "MAX_BATCH",
    "QUEUE_SIZE",
    "SETTINGS",
    "Setting",
]

_log = logging.getLogger("otel_rollout")

T = TypeVar("T")


@dataclass(frozen=True)
class Setting(Generic[T]):
    """One knob: the variable that sets it, how to parse it and its default."""

    env: str
    default: T
    parse: Callable[[str], T]
    doc: str

    def resolve(self, explicit: T | None = None) -> T:
        """The explicit value if given, else the environment's, else the default."""
        if explicit is not None:
            return self.check(explicit)
        raw = os.environ.get(self.env)
        if raw is None or raw.strip() == "":
            return self.default
        try:
            return self.check(self.parse(raw.strip()))
        except ValueError as exc:
            _log.warning("ignoring %s=%r (%s); using %r", self.env, raw, exc, self.default)
            return self.default

    def check(self, value: T) -> T:
        """Reject values that cannot work (a queue of zero events, a negative timeout)."""
        if isinstance(value, (int, float)) and value <= 0:
            raise ValueError(f"{self.env} must be positive, got {value!r}")
        return value


QUEUE_SIZE: Setting[int] = Setting(
    "OTEL_ROLLOUT_QUEUE_SIZE",
    262_144,
    int,
    "Events the writer may hold before emit starts dropping (and counting) them.",
)
MAX_BATCH: Setting[int] = Setting(
    "OTEL_ROLLOUT_MAX_BATCH",
    4_096,
    int,
    "Most events the background thread takes from the queue for one write.",
)
CLOSE_TIMEOUT: Setting[float] = Setting(
    "OTEL_ROLLOUT_CLOSE_TIMEOUT",
    10.0,
    float,
    "Seconds close() waits for the writer to finish before giving up on it.",
)

SETTINGS: tuple[Setting, ...] = (QUEUE_SIZE, MAX_BATCH, CLOSE_TIMEOUT)
