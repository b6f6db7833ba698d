"""Where events go once the background pipeline has them.

An exporter is anything with ``export(events) -> int`` and ``shutdown()``: the
pipeline hands it each batch of event dicts on the background thread, in the
order they were emitted, and the exporter returns how many of them it could
not take.  One exporter has a role of its own, the pipeline's **log**
(:class:`LogExporter`, the JSONL file): its losses become ``trace.dropped``
lines, it is retried while a fault may pass, and it is made durable on disk.
An exporter that keeps counts reports them through one method,
:meth:`CountingExporter.counts`; ``RolloutTrace.stats`` adds them up.
"""

from __future__ import annotations

import enum
import logging
import math
import os
import stat
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path, PurePath
from typing import Any, Protocol, runtime_checkable

import orjson

from . import config
from ._syncer import Syncer
from .constants import MOST_DIGITS, ROLLOUT_TRACE_FILENAME

try:  # the deleted-file check and the write, in one release of the GIL
    from ._emit import DRAIN_FAILED as _DRAIN_FAILED
    from ._emit import write_whole as _write_whole
except ImportError:  # no compiler at install time: _write below does the same in steps
    _write_whole, _DRAIN_FAILED = None, None

__all__ = [
    "COUNTS",
    "CountingExporter",
    "EventExporter",
    "JsonlExporter",
    "LogExporter",
    "encode_event",
    "log_path",
]

_log = logging.getLogger("otel_rollout")

#: Options for the careful path only: on the fast path they cost up to 50% (NON_STR_KEYS).
_OPTIONS = orjson.OPT_NON_STR_KEYS | orjson.OPT_SERIALIZE_NUMPY


@runtime_checkable
class EventExporter(Protocol):
    """Receives batches of events on the pipeline's background thread, after the log has
    written them: an ``export`` that waits holds up the log's next lines, so slow work
    belongs on a thread of the exporter's own."""

    def export(self, events: Sequence[dict[str, Any]]) -> int:
        """Take a batch of events; return how many of them were lost."""
        ...

    def shutdown(self) -> None:
        """Release resources; called once, after the last export."""
        ...


#: The counts the package's exporters report, and what each one means.  An exporter of
#: your own may report other names too; ``RolloutTrace.stats.other`` keeps them.
COUNTS: dict[str, str] = {
    "spans_made": "spans started from events",
    "spans_sent": "spans the backend accepted",
    "spans_failed": "spans the backend refused, or that timed out",
    "spans_dropped": "spans dropped because the SDK's batch queue was full",
    "spans_queued": "spans still queued or being sent when the exporter shut down",
    "metric_exports_failed": "metric exports the backend refused, or that timed out",
    "events_oversized": "events written as their kind and time only, being too big",
    "log_syncs": "times the log was made durable on disk (fdatasync)",
    "log_sync_errors": "syncs of the log to disk that failed (each tried again later)",
    # JsonlSpanExporter's (span-first): a SpanExporter of the SDK, not of the pipeline.
    "spans_ignored": "spans that are not rollout spans",
    "spans_malformed": "rollout spans that could make no valid line, skipped",
    "spans_held": "attempt spans waiting for their group's span",
    "spans_held_past_bound": "attempt spans written before their group's, past the hold",
    "spans_after_shutdown": "spans exported after the exporter shut down, dropped",
    "lines_written": "lines the file took",
    "lines_lost": "lines the file could not take",
    # The experiment trackers' (trackers.TrackerHub): summed over every tracker.
    "tracker_rows_logged": "rows the trackers took (MLflow's: once its log_batch succeeded)",
    "tracker_rows_dropped": "rows a tracker could not take: its queue full, its run not made, "
    "its request failed, or left at close",
    "tracker_errors": "tracker calls that failed, and batches the trackers' thread could not "
    "handle",
    "tracker_events_dropped": "events past the trackers' inbox, dropped",
    "tracker_steps_without_age": "steps logged without batch age after events of the run dropped",
    "tracker_rows_unindexable": "rows at a step number past 2**63 - 1, which no tracker's "
    "step holds: not logged",
    "trackers_hung": "trackers given up on at close",
}


@runtime_checkable
class CountingExporter(EventExporter, Protocol):
    """An exporter that reports what became of what it was given."""

    def counts(self) -> Mapping[str, int]:
        """Totals so far, by name (see :data:`COUNTS`); cheap, and safe from any thread."""
        ...


@runtime_checkable
class LogExporter(EventExporter, Protocol):
    """The pipeline's canonical log, with the two contracts only the log has.

    *Retry.* ``retryable`` is True after an ``export`` lost events to a fault
    that may pass (a full disk, a file made unwritable).  The pipeline then
    exports the lost tail again with backoff, until it is taken or ``close``
    gives up; what is finally lost is reported as ``trace.dropped``.  Other
    exporters are never retried: their losses are theirs to count.

    *Durability.* The log makes what it wrote durable on its own schedule,
    without holding up ``export``; ``flush(durable=True)`` calls :meth:`durable`
    on the caller's thread once everything before it is exported.
    """

    retryable: bool

    def durable(self, timeout: float | None) -> bool:
        """Wait until everything exported so far is durable; False if ``timeout`` passed."""
        ...


def _default(value: Any) -> Any:
    """Encode what orjson does not know natively, losing as little as possible."""
    if isinstance(value, PurePath):
        return str(value)
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, (set, frozenset)):
        try:
            return sorted(value)
        except TypeError:
            return list(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).decode("utf-8", "backslashreplace")
    item = getattr(value, "item", None)  # numpy scalars, 0-d tensors
    if callable(item):
        try:
            return item()
        except Exception:
            pass
    tolist = getattr(value, "tolist", None)  # arrays orjson cannot take directly
    if callable(tolist):
        try:
            return tolist()
        except Exception:
            pass
    if isinstance(value, (tuple, list)):
        return list(value)
    return repr(value)


def jsonable(value: Any) -> Any:
    """A copy of ``value`` that orjson can always encode (the slow, rare path)."""
    if isinstance(value, dict):
        return {str(k) if not isinstance(k, str) else k: jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, bool) or value is None or isinstance(value, (str, float)):
        return value
    if isinstance(value, int):
        if -(2**63) <= value < 2**64:
            return value
        # Past orjson's 64 bits: still the exact number (readers keep integers of any size;
        # a string would make a schema field invalid), unless too long for a reader to read.
        try:
            digits = str(value).encode()
        except ValueError:  # past sys.get_int_max_str_digits()
            digits = b""
        if not digits or len(digits.lstrip(b"-")) > MOST_DIGITS:
            return f"an integer of {value.bit_length():,} bits"
        return orjson.Fragment(digits)
    try:
        orjson.dumps(value, default=_default, option=_OPTIONS)
        return value
    except (TypeError, RecursionError):
        return jsonable(_default(value)) if not isinstance(value, (set, frozenset)) else repr(value)


def encode_event(event: dict[str, Any]) -> bytes:
    """One event as one JSON line, never raising: exotic values become their closest JSON.

    (It runs on the caller's thread in line mode, inside ``emit``: a value whose own
    ``__repr__`` raises, or a name with a lone surrogate, still makes a line.)"""
    try:
        return orjson.dumps(event, default=_default, option=_OPTIONS) + b"\n"
    except Exception:
        try:
            return orjson.dumps(jsonable(event), default=_default, option=_OPTIONS) + b"\n"
        except Exception as exc:
            fallback: dict[str, Any] = {
                k: _plain(event[k]) for k in ("t", "run_id", "event") if k in event
            }
            fallback["unencodable"] = _plain(f"{type(exc).__name__}: {_text(exc)}")
            return orjson.dumps(fallback, option=_OPTIONS) + b"\n"


def _text(value: Any) -> str:
    try:
        return str(value)
    except Exception:
        return f"<{type(value).__name__}>"


def _plain(value: Any) -> Any:
    """A float or a string orjson takes for sure (a lone surrogate escaped), for the last
    resort line."""
    if value.__class__ is float or value.__class__ is int:
        return value
    text = value if isinstance(value, str) else _text(value)
    return str(text).encode("utf-8", "backslashreplace").decode("utf-8")


def _write(fd: int, data: bytes) -> tuple[int, OSError | None, bool]:
    """Write ``data`` to ``fd`` unless its file was deleted (no links: nothing written);
    the bytes written, the error that stopped it, and whether it was deleted.  In C, the
    check and the write give the GIL up once."""
    if _write_whole is not None:  # (os.fstat and os.write would each give the GIL up)
        done, errno, deleted = _write_whole(fd, data)
        return done, OSError(errno, os.strerror(errno)) if errno else None, bool(deleted)
    if os.fstat(fd).st_nlink == 0:
        return 0, None, True
    view = memoryview(data)
    done = 0
    try:
        while done < len(data):
            done += os.write(fd, view[done:])
    except OSError as exc:
        return done, exc, False
    return done, None, False


def _whole_lines(lines: Sequence[bytes], done: int) -> tuple[int, bool]:
    """Of ``lines`` written from their start until ``done`` bytes, how many reached the file
    whole, and whether the start of the next one is in the file (the next write leads with
    a newline that ends it).  A line cut just before its newline counts whole: that lead
    makes it whole (retried, it was in the file twice)."""
    whole = 0
    for line in lines:
        if done < len(line):
            return whole + (done == len(line) - 1), done > 0
        done -= len(line)
        whole += 1
    return whole, False


def _line_count(events: Sequence[dict[str, Any] | bytes]) -> int:
    """Lines in a batch: a dict is one; lines made already count their newlines."""
    return sum(e.count(b"\n") if isinstance(e, bytes) else 1 for e in events)


def oversized(event: dict[str, Any], size: int) -> bytes:
    """The line written instead of an event too big to write: its kind and time, not its fields."""
    kept: dict[str, Any] = {k: event[k] for k in ("t", "run_id", "event") if k in event}
    kept["oversized"] = {"bytes": size, "fields": sorted(str(k) for k in event if k not in kept)}
    return encode_event(kept)


#: Lines after which the log is synced at once: a restored checkpoint must find its
#: publish line on disk, whatever the interval.  Matched in the batch's bytes (50 ns an
#: event here, against 100-250 for a test of each event's kind in the encoding loop).
_SYNC_AT_ONCE = (b'"event":"checkpoint.publish"', b'"event":"checkpoint.restore"')


#: Suffixes that make a new path a log file rather than a log directory (``runs/lr0.5``
#: is a directory: a dot in a run's name is common).
LOG_FILE_SUFFIXES = frozenset({".jsonl", ".ndjson", ".json", ".log", ".txt"})


def log_path(path: str | os.PathLike[str]) -> Path:
    """The log file a writer given ``path`` writes: ``path`` itself, or
    ``path/rollout_trace.jsonl`` when ``path`` is a directory: one that exists, or a new
    path that ends in a separator or whose suffix is none of :data:`LOG_FILE_SUFFIXES`
    (``runs/exp1`` and ``runs/lr0.5``: log directories, as the simulator's ``--log-dir``
    is; ``runs/exp1.jsonl``: a file)."""
    text = os.fspath(path)
    target = Path(text)
    if target.exists():
        return target / ROLLOUT_TRACE_FILENAME if target.is_dir() else target
    if text.endswith((os.sep, "/")) or target.suffix.lower() not in LOG_FILE_SUFFIXES:
        return target / ROLLOUT_TRACE_FILENAME
    return target


class JsonlExporter:
    """Append each batch to a JSONL file with one ``write`` call, so a kill tears at most one line.

    The file is opened unbuffered in append mode: every batch is in the
    kernel's page cache when ``export`` returns, which survives ``kill -9``.
    A syncer thread (:class:`~otel_rollout._syncer.Syncer`) makes it durable
    against a node crash too: ``fdatasync`` at most every ``fsync_interval``
    seconds (``OTEL_ROLLOUT_FSYNC_INTERVAL``; 0: after every batch; ``off`` or
    infinity: never on its own) and at once after a ``checkpoint.publish`` or
    ``checkpoint.restore`` line, while the writer goes on writing.

    A file whose last line was torn (its writer was killed mid-line) is
    ended with a newline when opened, so the fragment stays one torn line
    and this writer's first line is whole.

    Faults: a failed write reports how many of the batch's lines did reach the
    file (a full disk can take part of a batch) and sets :attr:`retryable`; a
    line cut by the failure is ended by the next write, so it reads as one
    skipped line.  If the file (or its directory) is deleted, the next batch
    recreates it rather than writing into the void.  Events whose line would
    exceed ``max_event_bytes`` are written as their kind and time only.
    """

    def __init__(
        self,
        path: Path,
        *,
        max_event_bytes: int | None = None,
        fsync_interval: float | None = None,
    ) -> None:
        self.path = path
        self.max_event_bytes = config.MAX_EVENT_BYTES.resolve(max_event_bytes)
        self.fsync_interval = config.FSYNC_INTERVAL.resolve(fsync_interval)
        #: True after a write failed for a reason that may pass (full disk, read-only remount).
        self.retryable = False
        #: Events written as their kind and time only, because they were too big.
        self.oversized = 0
        self._count_lock = threading.Lock()
        self._fd: int | None = self._open()
        self._failing = False
        self._cut = False  # the last failed write left part of a line in the file
        self._end_torn_line()
        #: Syncs the file while the writer goes on; None for a pipe or device (nothing to sync).
        self._syncer = (
            Syncer(self._fd, self.fsync_interval, str(path)) if self._regular_file else None
        )

    def _open(self) -> int:
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        # A pipe or a device has nothing to sync (fdatasync fails with EINVAL).
        self._regular_file = stat.S_ISREG(os.fstat(fd).st_mode)
        return fd

    def _end_torn_line(self) -> None:
        """End a fragment a killed writer left at the file's end, so our first line is whole."""
        assert self._fd is not None
        if not self._regular_file:
            return
        try:
            size = os.fstat(self._fd).st_size
            if not size:
                return
            with open(self.path, "rb") as f:
                f.seek(size - 1)
                last = f.read(1)
        except OSError:
            return  # unreadable to us: we cannot tell, and must not guess
        if last not in (b"\n", b""):
            os.write(self._fd, b"\n")
            _log.warning(
                "otel-rollout: %s ended in a torn line (a writer was killed mid-line); ended it",
                self.path,
            )

    def counts(self) -> dict[str, int]:
        """Events written short because they were too big, and syncs to disk."""
        syncer = self._syncer
        return {
            "events_oversized": self.oversized,
            "log_syncs": syncer.syncs if syncer is not None else 0,
            "log_sync_errors": syncer.failures if syncer is not None else 0,
        }

    def encode_line(self, event: dict[str, Any]) -> bytes:
        """``event`` as its line: the rule every line of the log is made by, on the writer
        thread or, for a pipeline whose only exporter is this log, on the caller's.

        ``+ b"\n"`` copies the line into a right-sized object and frees orjson's oversized
        buffer at once; holding a batch of those buffers until the join (as
        OPT_APPEND_NEWLINE would) costs 2-3 us an event in malloc, not 0.25."""
        try:
            line = orjson.dumps(event, default=_default) + b"\n"
        except TypeError:
            line = encode_event(event)
        if len(line) > self.max_event_bytes:
            with self._count_lock:  # callers' threads may count at once
                self.oversized += 1
            line = oversized(event, len(line))
        return line

    def _encode(self, events: Sequence[dict[str, Any] | bytes]) -> list[bytes]:
        """Each event's line; an event the caller's thread encoded already is its line."""
        encode = self.encode_line
        return [event if isinstance(event, bytes) else encode(event) for event in events]

    def export(self, events: Sequence[dict[str, Any] | bytes]) -> int:
        """Write the events (dicts, or lines made already: one, or many joined) in one
        ``write``; how many lines it could not take."""
        if self._fd is None:
            self.retryable = False
            return _line_count(events)
        lines = self._encode(events)
        data = b"".join(lines)
        syncer = self._syncer
        urgent = syncer is not None and any(kind in data for kind in _SYNC_AT_ONCE)
        lead = b"\n" if self._cut else b""
        try:
            done, error, deleted = _write(self._fd, lead + data)
            if deleted:  # recreated, and written there, rather than into the void
                self._reopen()
                lead = b""
                done, error, _ = _write(self._fd, data)
        except OSError as exc:
            return self._failed(exc, _line_count(events))
        if done and syncer is not None:
            syncer.wrote(urgent=urgent)
        if error is None:
            self._cut = False
            if self._failing:
                _log.warning("otel-rollout: writing %s again", self.path)
                self._failing = False
            self.retryable = False
            return 0
        # Count the lines that reached the file whole; the rest are lost (and retried).
        lines = [one for line in lines for one in line.splitlines(keepends=True)]
        whole = 0
        if done >= len(lead):  # an earlier cut line is ended
            whole, self._cut = _whole_lines(lines, done - len(lead))
        return self._failed(error, len(lines) - whole)

    def can_drain(self) -> bool:
        """Whether :meth:`drain` may write now: the file is open, no line of it is cut (the
        next write leads with a newline), and a sync is not asked after every write."""
        syncer = self._syncer
        return self._fd is not None and not self._cut and (syncer is None or syncer.interval != 0)

    def drain(
        self, lines: Any, gather: float, report_after: float
    ) -> tuple[int, tuple[bytes, int, float] | None]:
        """Write the caller's line buffer ``lines`` as lines come, without the GIL
        (``LineBuffer.drain``, ``_emit_lines.h``), until a flush or close asks, it has
        written for ``report_after`` seconds, or a batch needs :meth:`export`: one with a
        checkpoint's line (synced at once), or one whose write failed or found the file
        deleted.  Returns how many lines of that batch reached the file whole, and the
        rest of it for :meth:`export` (data, lines, when the first was emitted), or None.
        The lines written before it are counted in ``lines.drained``."""
        assert self._fd is not None and not self._cut
        syncer = self._syncer
        urgent: tuple[bytes, ...] = ()  # (a pipe or a device: nothing to sync at once)
        if syncer is not None:
            # The syncer learns of the writes at the hand-back: a quarter of its interval
            # late at most, with the default interval (1 s) the pipeline's quarter second.
            report_after = min(report_after, syncer.interval / 4)
            urgent = _SYNC_AT_ONCE
        why, wrote, chunk, done, errno, _ = lines.drain(self._fd, gather, report_after, urgent)
        if wrote and syncer is not None:
            syncer.wrote()
        if chunk is None or why != _DRAIN_FAILED or not done:  # none of it written
            return 0, chunk
        data, count, first_t = chunk
        pieces = data.splitlines(keepends=True)
        whole, self._cut = _whole_lines(pieces, done)
        self._failed(OSError(errno, os.strerror(errno)), count - whole)
        if whole == count:  # all but the last newline, which the next write's lead ends
            return whole, None
        return whole, (b"".join(pieces[whole:]), count - whole, first_t)

    def _failed(self, exc: OSError, lost: int) -> int:
        if not self._failing:
            _log.error(
                "otel-rollout: cannot write %s: %s; retrying, and counting what is lost",
                self.path,
                exc,
            )
        self._failing = True
        self.retryable = True
        return lost

    def _reopen(self) -> None:
        """Recreate the log (and its directory): it was deleted while open."""
        assert self._fd is not None
        _log.warning("otel-rollout: %s was deleted; writing to a new file there", self.path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = self._open()
        old = self._syncer.replace(fd) if self._syncer is not None else self._fd
        os.close(old)
        self._fd, self._cut = fd, False

    def durable(self, timeout: float | None) -> bool:
        """Wait until every line written so far is synced to disk (see :class:`LogExporter`)."""
        if self._syncer is None or self._fd is None:
            return True
        return self._syncer.durable(timeout)

    def shutdown(self) -> None:
        if self._fd is not None:
            if self._syncer is not None:
                self._syncer.close(final_sync=self.fsync_interval != math.inf)
            os.close(self._fd)
            self._fd = None
