"""The background engine: one queue, one thread, the log and a list of other exporters.

The caller's side is a callable made once (:func:`Pipeline.make_emit`: in C
where built, ``_emit.Emitter``, a closure otherwise).  When the log is the
pipeline's only exporter (the default: spans, metrics and trackers are made by
the export sidecar, from the file) it makes the event's line at once and
appends it to a line buffer (``_emit.LineBuffer``: in C from the call's arguments for the
common values, by the log's own rule,
:meth:`~otel_rollout.exporters.JsonlExporter.encode_line`, for the rest); the
writer thread takes the buffer whole and writes it, with no work of its own an
event.  With exporters in the process, emit builds the event dict (the time
stamp, ``run_id``, ``event`` and the fields) and puts it on a ``SimpleQueue``;
encoding, I/O, spans and metrics then happen on the writer thread.  Syncs to
disk happen on the log's own syncer thread, so the writer never waits for the
disk.  The log (:class:`~otel_rollout.exporters.LogExporter`) is the canonical
record: what it cannot write, and what the full queue or buffer turned away,
is reported in the log itself as ``trace.dropped`` once it accepts writes
again.
"""

from __future__ import annotations

import enum
import logging
import math
import reprlib
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from queue import SimpleQueue
from typing import Any

import orjson

from ._flag import Flag
from ._hold import Hold
from .exporters import CountingExporter, EventExporter, JsonlExporter, LogExporter

# The caller's emit in C wherever built (_emit.c: the same events and lines, and for the
# log alone the lines made in C into a LineBuffer); the closure in make_emit otherwise.
try:
    from ._emit import Emitter as _Emitter
    from ._emit import LineBuffer as _LineBuffer
except ImportError:  # pragma: no cover - built by every install with a C compiler
    _Emitter = _LineBuffer = None

_log = logging.getLogger("otel_rollout")

RESERVED = ("t", "run_id", "event")
_STOP = object()
#: Seconds the writer's drain lets lines gather after a write (no GIL is taken meanwhile):
#: the most a ``kill -9`` loses, past the write itself, while lines keep coming.  Each
#: write and timed wait costs the writer ~0.1 ms of the other core on this VM.
GATHER = 0.002
#: Seconds of writing after which the drain hands back to Python: the pipeline's counts,
#: drops reported in the file and the log's syncer are that late at most.  Each hand-back
#: takes the GIL from a busy controller once (~0.5 ms of its time here).
REPORT_AFTER = 0.25

Emit = Callable[..., None]


@dataclass
class PipelineStats:
    """What happened to the events the caller handed over (read them after ``flush``).

    The first fields are the pipeline's own; the rest add up what the exporters
    report through ``counts()`` (see :data:`otel_rollout.exporters.COUNTS`),
    and counts of other names are kept in ``other``.
    """

    written: int = 0
    dropped_queue_full: int = 0
    dropped_write_error: int = 0
    #: Events with a field named t, run_id or event (kept as t_, …), or a name that was no
    #: string (written as its text); each counted once.
    renamed_fields: int = 0
    exporter_errors: int = 0
    #: Events not yet counted written or lost when these stats were read: waiting, or being
    #: written.
    queued: int = 0
    spans_made: int = 0
    spans_sent: int = 0
    spans_failed: int = 0
    spans_dropped: int = 0
    spans_queued: int = 0
    metric_exports_failed: int = 0
    events_oversized: int = 0
    log_syncs: int = 0
    log_sync_errors: int = 0
    other: dict[str, int] = field(default_factory=dict)

    @property
    def dropped(self) -> int:
        return self.dropped_queue_full + self.dropped_write_error

    def add(self, counts: Mapping[str, int]) -> None:
        """Add an exporter's counts to these."""
        for name, value in counts.items():
            if name in _COUNTED:
                setattr(self, name, getattr(self, name) + value)
            else:
                self.other[name] = self.other.get(name, 0) + value


_OWN = ("written", "dropped_queue_full", "dropped_write_error", "renamed_fields", "exporter_errors")
_COUNTED = frozenset(f.name for f in fields(PipelineStats)) - {*_OWN, "other", "queued"}


class Pipeline:
    """Moves events from the caller's queue to the exporters on a daemon thread."""

    def __init__(
        self,
        run_id: str,
        log: LogExporter,
        exporters: Sequence[EventExporter] = (),
        *,
        capacity: int,
        max_batch: int,
        retry_max_delay: float = 0.2,
        busy_hold: float = 0.0,
    ) -> None:
        self.run_id = run_id
        self.stats = PipelineStats()
        #: The canonical log: retried while its faults may pass, synced to disk.
        self.log = log
        #: Every other exporter (spans, metrics, the caller's own): given each batch once.
        self.exporters: list[EventExporter] = list(exporters)
        self._failed_exporters: set[int] = set()  # id() of exporters whose failure was logged
        self._capacity = capacity
        self._max_batch = max_batch
        self._retry_max_delay = retry_max_delay
        self._busy_hold = busy_hold
        self._start()

    def _start(self, exporters: Callable[[], Sequence[EventExporter]] | None = None) -> None:
        self._queue: SimpleQueue[Any] = SimpleQueue()
        # Callers' side only (emit counting a drop or a rename, flush, close): the writer
        # thread never takes it, so a SIGTERM handler that closes the trace on a thread
        # interrupted inside it cannot wait on the writer (re-entrant, for that thread).
        self._lock = threading.RLock()
        self._markers_put = 0  # flush markers and the stop sentinel queued (callers' side)
        self._markers_taken = 0  # ...and taken (writer's side)
        self._hold = Hold(self._busy_hold)  # between writes while the GIL is busy
        self._drops_reported = 0  # queue-full drops already handed to a trace.dropped line
        self._unnamed = 0  # events whose name was no string (the writer's count: no lock)
        self._told_unnamed = False  # the first such name was logged
        self._drops_carried = 0  # drops whose report was lost in a failed write
        self._give_up_at: float | None = None  # set by close: stop retrying a failing log then
        self._closed = False
        #: The lines emit makes, waiting for the writer: only where the log is all there is
        #: to export to (no exporters now, nor any a forked child's thread will make) and the
        #: buffer is built (without C, the closure queues dicts: it is cheaper).
        alone = exporters is None and not self.exporters and isinstance(self.log, JsonlExporter)
        self.lines = _LineBuffer() if alone and _LineBuffer is not None else None
        self._writers_lines = self.lines  # the buffer the writer thread waits on
        self._thread = threading.Thread(
            target=self._run, args=(exporters,), name="otel-rollout-writer", daemon=True
        )
        self._thread.start()

    @property
    def caller_encodes(self) -> bool:
        """Emit makes each event's line, into :attr:`lines`, rather than queue its dict."""
        return self.lines is not None

    def make_emit(self, *, compiled: bool = True, now: Callable[[], float] = time.time) -> Emit:
        """The caller's hot path: stamp the event with ``now()`` and enqueue it (or append its
        line, if the pipeline :attr:`caller_encodes`), or count a drop (in C where built,
        unless not ``compiled``: the closure below, with the same results)."""
        if compiled and _Emitter is not None:
            # With a LineBuffer, C makes the common line (a str name; strings, numbers, None
            # and lists of them; under the limit) as the log would, and the log's own rule
            # makes every other one, through _encode_line.
            lines = self.lines
            limit = getattr(self.log, "max_event_bytes", sys.maxsize)
            return _Emitter(
                put=self._queue.put,
                qsize=self._queue.qsize,
                capacity=self._capacity,
                now=now,
                on_full=self._count_queue_full,
                rename=self._rename_reserved,
                run_id=self.run_id,
                buffer=lines,
                slow=self._encode_line if lines is not None else None,
                limit=min(limit, sys.maxsize),
            )
        lines = self.lines
        # With a line buffer built, its lines keep one order with the trace's own (submit).
        put = self._queue.put if lines is None else None
        held = self._queue.qsize if lines is None else lambda: lines.lines + lines.taken
        capacity = self._capacity
        on_full = self._count_queue_full
        rename = self._rename_reserved
        run_id = self.run_id
        encode = self._encode_line
        append = self._append_line

        def emit(name: str, /, **fields: Any) -> None:
            t = now()
            event = {"t": t, "run_id": run_id, "event": name, **fields}
            if len(event) != len(fields) + 3:  # a field named t, run_id or event
                event = rename(t, name, fields)
            if held() < capacity:
                if put is None:
                    append(lines, encode(event), t)
                else:
                    put(event)
            else:
                on_full()

        return emit

    def _encode_line(self, event: dict[str, Any]) -> bytes:
        """The event's line, made on the caller's thread by the log's rule; a name that is
        no string made text first, as the writer would (counted as renamed)."""
        name = event["event"]
        if not isinstance(name, str):
            value = _enum_value(name)
            if value is None:
                value = self._text_of(name)
                with self._lock:
                    self.stats.renamed_fields += 1
            event["event"] = value
        assert isinstance(self.log, JsonlExporter)  # caller_encodes: the log is the file
        return self.log.encode_line(event)

    def submit(self, event: dict[str, Any]) -> None:
        """Enqueue an event the trace itself makes (``run.start``), past the capacity check
        (as its line, after the lines emitted before it, in line mode)."""
        if self.lines is None:
            self._queue.put(event)
        else:  # to the microsecond, as the compiled emit's lines: the times stay in order
            event["t"] = math.floor(event["t"] * 1e6 + 0.5) / 1e6
            self._append_line(self.lines, self._encode_line(event), event["t"])

    def _append_line(self, lines: Any, line: bytes, t: float) -> None:
        """Append a line made in Python to ``lines``, as the compiled emit does (a writer
        waiting for a line is woken)."""
        lines.append(line, t)

    def snapshot(self) -> PipelineStats:
        """The pipeline's counts with the exporters' own added, as of now."""
        lines = self._writers_lines
        stats = replace(
            self.stats,
            other={},
            # The queue's events: less the flush markers and the stop sentinel still in it.
            queued=max(self._queue.qsize() - (self._markers_put - self._markers_taken), 0)
            # ...and the lines emitted, taken by the writer or not, not yet written or lost.
            + (lines.lines + lines.taken if lines is not None else 0),
            # (with those the writer's drain wrote, counted by the line buffer)
            written=self.stats.written + (lines.drained if lines is not None else 0),
            renamed_fields=self.stats.renamed_fields + self._unnamed,
        )
        for exporter in (self.log, *self.exporters):
            if isinstance(exporter, CountingExporter):
                try:
                    stats.add(exporter.counts())
                except Exception:
                    _log.exception("otel-rollout: %s.counts() failed", type(exporter).__name__)
        return stats

    def _count_queue_full(self) -> None:
        with self._lock:
            self.stats.dropped_queue_full += 1

    def flush(self, timeout: float | None = None, *, durable: bool = False) -> bool:
        """Wait until every event queued before this call has been exported (and, if
        ``durable``, made durable by the log: the wait for the disk is the caller's, so the
        writer thread goes on writing meanwhile)."""
        if self._closed or not self._thread.is_alive():
            return not self._thread.is_alive()
        # Not an Event: a SIGTERM handler that closes the trace, landing inside its wait,
        # had the writer's set() wait for the lock that wait holds until close gave up.
        done = Flag()
        with self._lock:
            self._markers_put += 1
        self._queue.put(done)
        self._wake_writer()
        deadline = None if timeout is None else time.monotonic() + timeout
        while not done.wait(0.05):
            if not self._thread.is_alive():
                return False
            if deadline is not None and time.monotonic() > deadline:
                return False
        if not durable:
            return True
        left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
        try:
            return self.log.durable(left)
        except Exception:
            _log.exception("otel-rollout: making the log durable failed")
            return False

    def close(self, timeout: float) -> bool:
        """Export everything queued, shut the exporters down and stop the thread.

        A second call (from a signal handler, say) waits for the first one's work."""
        with self._lock:
            first = not self._closed
            if first:
                self._closed = True
                self._markers_put += 1
        if first:
            # Leave the writer a tenth of the time to count what a failing log could not take.
            self._give_up_at = time.monotonic() + 0.9 * timeout
            self._queue.put(_STOP)
            self._wake_writer()
        self._thread.join(timeout)
        if self._thread.is_alive():
            _log.warning(
                "otel-rollout: the writer did not finish within %.1fs (OTEL_ROLLOUT_CLOSE_TIMEOUT);"
                " events it had not written are lost",
                timeout,
            )
            return False
        return True

    def _wake_writer(self) -> None:
        """End the writer's hold, wait or drain: a flush or close is queued.  No lock is
        taken that Python code may hold, so a signal handler may call it."""
        self._hold.wake()
        if self._writers_lines is not None:
            self._writers_lines.interrupt()

    def restart_in_child(
        self, run_id: str, exporters: Callable[[], Sequence[EventExporter]]
    ) -> None:
        """After ``fork``: a fresh queue and thread, the same log, and beside it the exporters
        ``exporters()`` makes; the parent's queued events stay its own.  The new thread makes
        them, not the fork hook: gRPC cannot open a channel while the fork is being handled."""
        self.run_id = run_id
        self.stats = PipelineStats()
        self.exporters = []
        self._failed_exporters = set()
        self._start(exporters)

    def _run(self, exporters: Callable[[], Sequence[EventExporter]] | None = None) -> None:
        if exporters is not None:
            try:
                self.exporters += exporters()
            except Exception:
                _log.exception("otel-rollout: exporters after fork failed; writing the log only")
        get = self._queue.get
        qsize = self._queue.qsize
        lines = self.lines
        hold = self._hold
        hold.start()

        def asked() -> bool:  # a flush or close is queued: do not hold
            return self._markers_put != self._markers_taken

        stopping = False
        max_batch = self._max_batch
        while not stopping:
            waiting = qsize()  # blocks in get() only when idle
            if waiting:
                items = [get() for _ in range(min(waiting, max_batch))]
            elif lines is None:
                items = [get()]
            elif self._drains():
                self._drain(lines)
                continue
            elif lines.lines:
                items = []
            else:
                lines.wait()  # until a line, a flush or a close comes: then look again
                continue
            try:
                # The lines after the markers taken: every line emitted before a flush is in it.
                chunk = lines.take() if lines is not None else None
                if chunk is None and not items:
                    continue
                hold.taken(chunk[2] if chunk is not None else _emitted_at(items[0]))
                stopping = self._process(items, chunk)
            except Exception:  # never let the writer die: the controller relies on it
                self._lost_on_the_way(lines)
            finally:
                if lines is not None:
                    lines.written()  # (already, unless the batch failed on the way)
            # Only a writer of the log alone holds: with exporters in this process (spans
            # made in-process, ~50 us an event) the writer's own work is what keeps the
            # GIL busy, and holding only delayed the log (bench/faults.py, in-process
            # export at up to 20,000 events/s: the log's p99 lag 54 ms against 3 ms).
            backlog = qsize() + (lines.lines if lines is not None else 0)
            if hold.due() and not stopping and not self.exporters and backlog < max_batch:
                hold.wait(asked)
        leftovers = [get() for _ in range(qsize())]
        try:
            self._process(leftovers, lines.take() if lines is not None else None)
        finally:
            self._shut_down_exporters()

    def _lost_on_the_way(self, lines: Any) -> None:
        """A batch failed on the writer's thread (out of memory, say): logged, and the lines
        it had taken and not yet counted written are counted lost."""
        _log.exception("otel-rollout: internal error in the writer thread")
        if lines is not None:
            self.stats.dropped_write_error += lines.taken

    def _drains(self) -> bool:
        """Whether the writer writes the line buffer without the GIL, in the log's own
        :meth:`JsonlExporter.drain`: while the log can, and while its ``export`` and
        ``drain`` are :class:`JsonlExporter`'s own (not replaced, on a subclass or by a
        test: the lines would not reach the replacement)."""
        log = self.log
        return (
            getattr(getattr(log, "drain", None), "__func__", None) is JsonlExporter.drain
            and getattr(log.export, "__func__", None) is JsonlExporter.export
            and log.can_drain()  # type: ignore[attr-defined]
        )

    def _drain(self, lines: Any) -> None:
        """The writer's steady state in line mode: the log writes lines as they come without
        the GIL, and hands back here to count them (drops too), to export a batch it could
        not write, or to answer a flush or close (queued: the loop takes it next)."""
        try:
            whole, rest = self.log.drain(lines, GATHER, REPORT_AFTER)  # type: ignore[attr-defined]
            self.stats.written += whole
            if rest is not None:
                self._process([], rest)
            elif self.stats.dropped_queue_full != self._drops_reported or self._drops_carried:
                # Their trace.dropped line, after the lines emitted before it (its time is
                # the last one's): drops come when the buffer is full.
                chunk = lines.take()
                if chunk is None:
                    self._export([])
                else:
                    self._export([chunk[0]], chunk[1] - 1)
        except Exception:  # never let the writer die: the controller relies on it
            self._lost_on_the_way(lines)
        finally:
            lines.written()

    def _shut_down_exporters(self) -> None:
        """The log first (it only syncs and closes a file); then the others, which may wait
        on a network, each on a helper thread given what is left of close's time."""
        _shut_down(self.log)
        for exporter in self.exporters:
            name = type(exporter).__name__
            helper = threading.Thread(
                target=_shut_down, args=(exporter,), name=f"otel-rollout-{name}", daemon=True
            )
            helper.start()
            give_up_at = self._give_up_at
            helper.join(None if give_up_at is None else max(give_up_at - time.monotonic(), 0.0))
            if helper.is_alive():
                self.stats.exporter_errors += 1
                _log.warning("otel-rollout: %s is still shutting down; not waiting for it", name)

    def _process(
        self,
        items: list[Any],
        chunk: tuple[bytes, int, float] | None = None,
    ) -> bool:
        """Export the events among ``items`` and the ``chunk`` of lines taken with them
        (its data, its number of lines, when its first was emitted), then release flush
        waiters; True on stop."""
        if self._markers_put == self._markers_taken:  # none queued: items are all events
            if chunk is not None:
                items.append(chunk[0])
            if items:
                self._export(items, chunk[1] - 1 if chunk is not None else 0)
            return False
        events, waiters, stopping = [], [], False
        for item in items:
            if item.__class__ is dict or item.__class__ is bytes:
                events.append(item)
            elif item is _STOP:
                stopping = True
            else:
                waiters.append(item)
        self._markers_taken += len(waiters) + stopping
        if chunk is not None:
            events.append(chunk[0])
        # Drops with no line after them are reported before a flush or close returns.
        unreported = self.stats.dropped_queue_full != self._drops_reported or self._drops_carried
        if events or unreported:
            self._export(events, chunk[1] - 1 if chunk is not None else 0)
        for waiter in waiters:
            waiter.set()
        return stopping

    def _name_as_text(self, event: dict[str, Any]) -> None:
        """``emit(123)``: the name is written as its text, an event kind readers pass over,
        so the line stays an event ``validate`` accepts; logged once, counted as renamed.
        A ``str`` subclass (a ``(str, Enum)`` member, say) is a name already: orjson
        writes its string, where ``str()`` would give ``Kind.SEAL``."""
        name = event["event"]
        if isinstance(name, str):
            return
        value = _enum_value(name)
        if value is not None:
            event["event"] = value
            return
        event["event"] = self._text_of(name)
        self._unnamed += 1

    def _text_of(self, name: Any) -> str:
        """A name that is no string, as text; the first one is logged."""
        try:
            text = str(name)
        except Exception:  # a __str__ that raises: the type's name is all there is
            text = f"<{type(name).__name__}>"
        if not self._told_unnamed:
            self._told_unnamed = True  # either thread may get here first: at worst two lines
            _log.warning(
                "otel-rollout: emit() takes the event's name as a string; %s (%s) is written "
                "as %s (counted in trace.stats.renamed_fields)",
                reprlib.repr(name),
                type(name).__name__,
                reprlib.repr(text),
            )
        return text

    def _rename_reserved(self, t: float, name: Any, fields: dict[str, Any]) -> dict[str, Any]:
        """Reserved keys win; a caller's ``t``/``run_id``/``event`` field is kept as ``t_`` etc.
        (A name that is no string is made text here too, so the event counts once.)"""
        with self._lock:
            self.stats.renamed_fields += 1
        if not isinstance(name, str):
            name = _enum_value(name) or self._text_of(name)
        event: dict[str, Any] = {"t": t, "run_id": self.run_id, "event": name}
        for key, value in fields.items():
            if key in RESERVED:
                key += "_"
                while key in fields or key in event:  # a t_ of the caller's own keeps its name
                    key += "_"
            event[key] = value
        return event

    def _export(self, events: list[Any], more_lines: int = 0) -> None:
        """Export a batch of events: dicts, or the lines the caller's thread made of them
        (an item of the lines taken from the buffer holds ``more_lines + 1`` of them)."""
        if not self.caller_encodes:  # (its lines' names were made text already)
            for event in events:  # ~30 ns an event, here rather than on the caller's thread
                if event.__class__ is dict and event["event"].__class__ is not str:
                    self._name_as_text(event)
        dropped = self.stats.dropped_queue_full  # one read of an int: no lock needed
        drops = dropped - self._drops_reported + self._drops_carried
        self._drops_reported, self._drops_carried = dropped, 0
        ours = len(events) + more_lines
        if drops:
            # Its time is the batch's last event's, so the file's times stay in order (the
            # next batch's events were emitted before this write, and after those).
            t = _emitted_at(events[-1]) if events else None
            t = time.time() if t is None else t
            events.append(
                {"t": t, "run_id": self.run_id, "event": "trace.dropped", "count": drops}
            )
        lost = self._export_to_log(events, ours + bool(drops))
        if lost:
            # The drop report is the batch's last line, so it is the first one lost.
            lost_ours = max(lost - 1, 0) if drops else lost
            self._drops_carried += lost_ours + drops
            self.stats.dropped_write_error += lost_ours
            ours -= lost_ours
        self.stats.written += ours
        if self.lines is not None:  # counted written or lost: the buffer has room for them
            self.lines.written()
        for exporter in self.exporters:
            self._call(exporter, events)

    def _export_to_log(self, events: list[Any], total: int) -> int:
        """Write ``events`` (``total`` lines) to the log, retrying the unwritten tail while
        its fault may pass (a full disk, a file made unwritable); how many of the last lines
        it could not take.

        While this waits, the caller's queue fills and ``emit`` drops and counts events:
        memory stays bounded and the controller never waits.  ``close`` ends the waiting.
        """
        log = self.log
        pending, delay = events, 0.01
        while True:
            lost = min(self._call(log, pending, total), total)
            if not lost or not log.retryable:
                return lost
            pending, total = _last_lines(pending, lost), lost
            give_up_at = self._give_up_at
            now = time.monotonic()
            if give_up_at is not None and now >= give_up_at:
                return lost
            wait = delay if give_up_at is None else min(delay, give_up_at - now)
            time.sleep(wait)
            delay = min(delay * 2, self._retry_max_delay)

    def _call(
        self,
        exporter: EventExporter,
        events: list[Any],
        size: int | None = None,
    ) -> int:
        """Hand ``events`` to ``exporter``; what it lost (all ``size`` of them, or every
        event, if it raised)."""
        try:
            lost = exporter.export(events)
        except Exception:
            self.stats.exporter_errors += 1
            if id(exporter) not in self._failed_exporters:
                self._failed_exporters.add(id(exporter))
                _log.exception(
                    "otel-rollout: %s failed; counting its losses", type(exporter).__name__
                )
            return len(events) if size is None else size
        return lost


def _last_lines(events: list[Any], count: int) -> list[Any]:
    """The last ``count`` lines of ``events``, the buffer's lines taken one by one."""
    lines: list[Any] = []
    for item in events:
        if item.__class__ is bytes and item.count(b"\n") > 1:
            lines += item.splitlines(keepends=True)
        else:
            lines.append(item)
    return lines[len(lines) - count :]


def _emitted_at(item: Any) -> float | None:
    """When a queued event was emitted (the ``t`` its line or dict holds); None for a
    flush or stop marker.  Parsing a line takes ~1 us: once a batch, at most."""
    if item.__class__ is bytes:  # (of the buffer's lines: the last one's)
        item = orjson.loads(item[item.rfind(b"\n", 0, len(item) - 1) + 1 :])
    if item.__class__ is dict:
        t = item.get("t")
        return t if isinstance(t, float) else None
    return None


def _enum_value(name: Any) -> str | None:
    """An ``Enum`` member whose value is a string names that kind (as an Enum field is
    written as its value); ``str()`` of it would be ``Kind.SEAL``."""
    if isinstance(name, enum.Enum) and isinstance(name.value, str):
        return name.value
    return None


def _shut_down(exporter: EventExporter) -> None:
    try:
        exporter.shutdown()
    except Exception:
        _log.exception("otel-rollout: %s failed to shut down", type(exporter).__name__)
