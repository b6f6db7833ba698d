"""Every tuning knob of otel-rollout, its environment variable and its default.

A knob is resolved in this order: an explicit argument, then the environment
variable, then the default.  A malformed environment value is logged once and
the default used instead: a typo in a job script must not kill a training run.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

__all__ = [
    "CLOSE_TIMEOUT",
    "COMPILED_PASS",
    "EXPORT_MODE",
    "EXPORT_MODES",
    "FSYNC_INTERVAL",
    "HANDLE_SIGTERM",
    "MAX_BATCH",
    "MAX_EVENT_BYTES",
    "MAX_LINE_BYTES",
    "QUEUE_SIZE",
    "RETRY_MAX_DELAY",
    "SETTINGS",
    "SIDECAR_LINGER",
    "SPAN_HOLD_BYTES",
    "TRACKERS",
    "WATCH_INTERVAL",
    "WRITER_HOLD",
    "Setting",
]

_log = logging.getLogger("otel_rollout")

T = TypeVar("T")


#: ``(variable, value)`` pairs already warned of as malformed.
_WARNED: set[tuple[str, str]] = set()


@dataclass(frozen=True)
class Setting(Generic[T]):
    """One knob: the variable that sets it, how to parse it and its default."""

    env: str
    default: T
    parse: Callable[[str], T]
    doc: str
    zero_ok: bool = False  # 0 is a meaningful value (none at all), not a mistake
    at_least: float | None = None  # the smallest value that works, for a number

    def resolve(self, explicit: T | None = None) -> T:
        """The explicit value if given, else the environment's, else the default."""
        if explicit is not None:
            return self.check(explicit)
        raw = os.environ.get(self.env)
        if raw is None or raw.strip() == "":
            return self.default
        try:
            value = self.parse(raw.strip())
        except ValueError as exc:
            return self._ignore(raw, _expected(self.parse) or str(exc))
        try:
            return self.check(value)
        except ValueError as exc:
            return self._ignore(raw, str(exc))

    def _ignore(self, raw: str, why: str) -> T:
        """Warn once of a value that cannot be used, and use the default."""
        if (self.env, raw) not in _WARNED:  # once a value, however often it is read
            _WARNED.add((self.env, raw))
            default = "none" if self.default == () else repr(self.default)
            _log.warning("otel-rollout: ignoring %s=%r (%s); using %s", self.env, raw, why,
                         default)  # fmt: skip
        return self.default

    def check(self, value: T) -> T:
        """Reject values that cannot work (a queue of zero events, a negative timeout)."""
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if number and value != value:  # NaN passes every comparison below
            raise ValueError(f"{self.env} must be a number, got {value!r}")
        if number and (value < 0 or (value == 0 and not self.zero_ok)):  # type: ignore[operator]  # a number Setting's value
            least = "0 or more" if self.zero_ok else "positive"
            raise ValueError(f"{self.env} must be {least}, got {value!r}")
        if number and self.at_least is not None and value < self.at_least:  # type: ignore[operator]  # a number Setting's value
            raise ValueError(f"{self.env} must be at least {self.at_least}, got {value!r}")
        if isinstance(value, float) and LONGEST_WAIT < value < math.inf:  # seconds
            raise ValueError(f"{self.env} must be at most {LONGEST_WAIT:g} seconds, got {value!r}")
        return value


def _expected(parse: Callable[[str], Any]) -> str | None:
    """What a value that does not parse should have been, in words (None: the parser
    says it best)."""
    if parse is int:
        return "expected a whole number"
    if parse is float or parse in (_seconds, _interval):
        return "expected a number of seconds" + (", or off" if parse is _interval else "")
    return None


#: The longest wait a setting may name, in seconds (~31 years): Python's waits refuse longer
#: ones (``threading.TIMEOUT_MAX`` is ~9.2e9 here), and a close timeout of 1e300 made
#: ``close()`` raise and lose the events still queued.
LONGEST_WAIT = 1e9


def _seconds(raw: str) -> float:
    """A finite number of seconds (NaN and infinity are no interval)."""
    value = float(raw)
    if not math.isfinite(value):
        raise ValueError(f"expected a number of seconds, got {raw!r}")
    return value


def _interval(raw: str) -> float:
    """Seconds, or ``off`` or infinity (never on its own: ``math.inf``)."""
    if raw.strip().lower() in ("off", "never", "none", "false", "inf", "+inf", "infinity"):
        return math.inf
    return _seconds(raw)


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
    "Most queued events the background thread takes for one write (the lines the compiled"
    " emit makes for the log alone are written all at once: they are lines already).",
)
CLOSE_TIMEOUT: Setting[float] = Setting(
    "OTEL_ROLLOUT_CLOSE_TIMEOUT",
    10.0,
    _seconds,
    "Seconds close() waits for the writer to finish before giving up on it.",
)

RETRY_MAX_DELAY: Setting[float] = Setting(
    "OTEL_ROLLOUT_RETRY_MAX_DELAY",
    0.2,
    _seconds,
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


# Why a busy GIL makes the writer hold, and when it does: _hold.py.  Tuned in one process at
# 10,000 events/s, slices in turn (100 each, median and 95% interval): no hold 95.4%
# (93.8-97.8), 20 ms 96.4% (95.2-98.2), 50 ms 98.3% (96.8-99.2) of the no-trace loop.
# The price: such a controller's lines reach the file 31-34 ms after emit at the median and
# 62-67 ms at p99 (bench/trackers.py), against ~5 ms with no hold.
WRITER_HOLD: Setting[float] = Setting(
    "OTEL_ROLLOUT_WRITER_HOLD",
    0.05,
    _seconds,
    "On the writer's Python path (no compiled piece, a forked child, a sync after every "
    "write): seconds it lets events gather between writes while the controller keeps the GIL "
    "busy (two batches in a row waited over 2 ms for the writer while the other threads used "
    "half a core or more; never with exporters in the process), taking the GIL less often; "
    "0: never.",
    zero_ok=True,
)

# Without a sync the kernel writes the page cache back only after ~30 s
# (dirty_expire_centisecs): a node crash or power loss takes up to that much of the log.
# One fdatasync a second costs the drain rate nothing measurable (219k events/s against 217k
# without, median of 5 runs of bench/run.py --only fsync on this 2-core VM's ext4) and moves
# the emit→file p99 at 10k events/s from 0.39 ms to 1.2 ms while the sync ran on the writer
# thread (the lines written while a sync held the writer), and syncing every batch cost 4% of
# the drain and a 7.8 ms p99.  The sync now runs on a syncer thread of its own (_syncer.py).
FSYNC_INTERVAL: Setting[float] = Setting(
    "OTEL_ROLLOUT_FSYNC_INTERVAL",
    1.0,
    _interval,
    "Most seconds between syncs of the log to disk (fdatasync, on a syncer thread); "
    "0: after every batch; 'off': never on its own. Checkpoint lines are synced at once.",
    zero_ok=True,
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


def _export_mode(raw: str) -> str:
    value = raw.lower()
    if value not in EXPORT_MODES:
        raise ValueError(f"expected one of {', '.join(EXPORT_MODES)}")
    return value


#: Where spans and metrics are made when export is on (see EXPORT_MODE).
EXPORT_MODES = ("sidecar", "inprocess")

# The trade-off, measured in bench/README.md: in-process export builds spans and metric
# updates on the trainer's background thread, under its GIL (a controller doing Python work
# kept 64-76% of its throughput); the sidecar leaves the trainer only the log to write.
EXPORT_MODE: Setting[str] = Setting(
    "OTEL_ROLLOUT_EXPORT_MODE",
    "sidecar",
    _export_mode,
    "Where spans and metrics are made: 'sidecar' (a process of their own, reading the log) "
    "or 'inprocess' (the trainer's background thread).",
)
SIDECAR_LINGER: Setting[float] = Setting(
    "OTEL_ROLLOUT_SIDECAR_LINGER",
    30.0,
    _seconds,
    "Seconds the sidecar keeps serving after the last run it follows stopped, for a resumed "
    "run to append to the same log (the scrape endpoint stays up through a restart).",
    zero_ok=True,
)


# Twice a second: following a file growing at ~9.4k events/s the view used 10-12.5% of one
# core, a plain follower parsing every line 1.5-1.7% (bench/README.md, the live view).
WATCH_INTERVAL: Setting[float] = Setting(
    "OTEL_ROLLOUT_WATCH_INTERVAL",
    0.5,
    _seconds,
    "Seconds between refreshes of 'otel-rollout watch' (its --interval wins).",
    # --interval 1e-9 redrew in a busy loop, a whole core; a screen redrawn more than 20
    # times a second shows nothing more.
    at_least=0.05,
)


# An attempt's span ends before its group's (a group is sealed after its attempts), so under
# span-first export nearly every attempt waits for its group: the bound is the attempts of
# the groups open at once.  Measured (tracemalloc): a held attempt takes 1.2 KB with one
# call, 16 KB with 100 calls, so a bound by count could reach a GB; the bound is bytes.
SPAN_HOLD_BYTES: Setting[int] = Setting(
    "OTEL_ROLLOUT_SPAN_HOLD_BYTES",
    64 << 20,
    int,
    "Most memory, in bytes, the attempt spans JsonlSpanExporter holds until their group's span "
    "is exported may take (so no attempt line precedes its group's reserve; each is estimated "
    "as 1.1 KB and 160 bytes a call); past it, the oldest are written and counted.",
)


def _trackers(raw: str) -> tuple[str, ...]:
    """The trackers among ``raw``'s comma-separated items.  One that is wrong is warned of
    (once) and left out, the rest kept: a typo in one does not turn every tracker off.
    None right: a ValueError (the variable is ignored, with a warning)."""
    from .trackers._spec import TrackerSpecError, parse_specs  # the package imports only _spec

    kept: list[str] = []
    wrong: list[str] = []
    for item in raw.split(","):
        try:
            kept += [str(spec) for spec in parse_specs(item) if str(spec) not in kept]
        except TrackerSpecError as exc:
            wrong.append(str(exc))
    if wrong and not kept:
        raise ValueError("; ".join(wrong))
    for why in wrong:
        if ("OTEL_ROLLOUT_TRACKERS", why) not in _WARNED:
            _WARNED.add(("OTEL_ROLLOUT_TRACKERS", why))
            _log.warning("otel-rollout: OTEL_ROLLOUT_TRACKERS: leaving out %s; logging to %s",
                         why, ", ".join(kept))  # fmt: skip
    return tuple(kept)


TRACKERS: Setting[tuple[str, ...]] = Setting(
    "OTEL_ROLLOUT_TRACKERS",
    (),
    _trackers,
    "Experiment trackers the export sidecar logs each step's batch age and rollout counts "
    "into, comma-separated: tensorboard:DIR, mlflow[:TRACKING_URI], wandb[:PROJECT].",
)

# The read side's compiled path (analysis/hot.py): off, every line takes the Python path,
# with the same results (a test holds the two to them) and at about twice the time.
COMPILED_PASS: Setting[bool] = Setting(
    "OTEL_ROLLOUT_COMPILED_PASS",
    True,
    _flag,
    "Read the commonest lines of a trace in compiled code where a pass allows; false: every "
    "line in Python (the same results, slower).",
)

SETTINGS: tuple[Setting, ...] = (
    QUEUE_SIZE,
    MAX_BATCH,
    CLOSE_TIMEOUT,
    RETRY_MAX_DELAY,
    MAX_EVENT_BYTES,
    MAX_LINE_BYTES,
    FSYNC_INTERVAL,
    WRITER_HOLD,
    HANDLE_SIGTERM,
    EXPORT_MODE,
    SIDECAR_LINGER,
    WATCH_INTERVAL,
    SPAN_HOLD_BYTES,
    TRACKERS,
    COMPILED_PASS,
)
