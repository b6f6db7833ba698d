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
    "HANDLE_SIGTERM",
    "MAX_BATCH",
    "MAX_EVENT_BYTES",
    "MAX_LINE_BYTES",
    "QUEUE_SIZE",
    "RETRY_MAX_DELAY",
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
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value <= 0:
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

RETRY_MAX_DELAY: Setting[float] = Setting(
    "OTEL_ROLLOUT_RETRY_MAX_DELAY",
    0.2,
    float,
    "Longest wait between attempts to write the log while a disk fault lasts (seconds).",
)
MAX_EVENT_BYTES: Setting[int] = Setting(
    "OTEL_ROLLOUT_MAX_EVENT_BYTES",
    4 << 20,
    int,
    "Longest line the writer writes; a bigger event keeps its kind and time, not its fields.",
)
MAX_LINE_BYTES: Setting[int] = Setting(
    "OTEL_ROLLOUT_MAX_LINE_BYTES",
    64 << 20,
    int,
    "Longest line readers hold; longer ones are skipped and counted, not loaded.",
)


def _flag(raw: str) -> bool:
    value = raw.lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ValueError("expected true or false")


HANDLE_SIGTERM: Setting[bool] = Setting(
    "OTEL_ROLLOUT_HANDLE_SIGTERM",
    True,
    _flag,
    "On SIGTERM (when no other handler is set), write queued events, then die as usual.",
)

SETTINGS: tuple[Setting, ...] = (
    QUEUE_SIZE,
    MAX_BATCH,
    CLOSE_TIMEOUT,
    RETRY_MAX_DELAY,
    MAX_EVENT_BYTES,
    MAX_LINE_BYTES,
    HANDLE_SIGTERM,
)
