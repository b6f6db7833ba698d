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

import logging
import math
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from queue import SimpleQueue
from typing import Any

from ._flag import Flag
from ._hold import Hold
from ._stats import PipelineStats
from ._writer import STOP, Writer, enum_value
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

Emit = Callable[..., None]


class Pipeline(Writer):
    """Moves events from the caller's queue to the exporters on a daemon thread (the
    caller's side here; the thread's in :class:`~otel_rollout._writer.Writer`)."""

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
            value = enum_value(name)
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
            self._queue.put(STOP)
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

    def _rename_reserved(self, t: float, name: Any, fields: dict[str, Any]) -> dict[str, Any]:
        """Reserved keys win; a caller's ``t``/``run_id``/``event`` field is kept as ``t_`` etc.
        (A name that is no string is made text here too, so the event counts once.)"""
        with self._lock:
            self.stats.renamed_fields += 1
        if not isinstance(name, str):
            name = enum_value(name) or self._text_of(name)
        event: dict[str, Any] = {"t": t, "run_id": self.run_id, "event": name}
        for key, value in fields.items():
            if key in RESERVED:
                key += "_"
                while key in fields or key in event:  # a t_ of the caller's own keeps its name
                    key += "_"
            event[key] = value
        return event
