"""The pipeline's writer thread: it takes what the callers queued or emitted, writes the
log, hands each batch to the other exporters, reports drops, and answers flushes.

In line mode (the log alone, the compiled emit) its steady state is the log's drain:
the lines are written in C without the GIL, and the thread takes the GIL only to hand
back (:meth:`Writer._drain`).  Otherwise it takes the queue's items in batches, holding
between writes while the controller keeps the GIL busy (``_hold.py``).  :class:`Writer`
is the half of :class:`~otel_rollout._pipeline.Pipeline` that runs on that thread.
"""

from __future__ import annotations

import enum
import logging
import reprlib
import threading
import time
from collections.abc import Callable, Sequence
from queue import SimpleQueue
from typing import Any

import orjson

from ._hold import Hold
from ._stats import PipelineStats
from .exporters import EventExporter, JsonlExporter, LogExporter

_log = logging.getLogger("otel_rollout")

#: Put on the queue by close: the writer writes what is left, shuts the exporters down, ends.
STOP = object()
#: Seconds the writer's drain lets lines gather after a write (no GIL is taken meanwhile):
#: the most a ``kill -9`` loses, past the write itself, while lines keep coming.  Each
#: write and timed wait costs the writer ~0.1 ms of the other core on this VM.
GATHER = 0.002
#: Seconds of writing after which the drain hands back to Python: the pipeline's counts,
#: drops reported in the file and the log's syncer are that late at most.  Each hand-back
#: takes the GIL from a busy controller once (~0.5 ms of its time here).
REPORT_AFTER = 0.25


class Writer:
    """The writer thread's methods; :class:`~otel_rollout._pipeline.Pipeline` sets up the
    state below and starts :meth:`_run` on a thread of its own."""

    run_id: str
    stats: PipelineStats
    log: LogExporter
    exporters: list[EventExporter]
    lines: Any
    _failed_exporters: set[int]
    _queue: SimpleQueue[Any]
    _hold: Hold
    _max_batch: int
    _markers_put: int
    _markers_taken: int
    _drops_reported: int
    _drops_carried: int
    _unnamed: int
    _told_unnamed: bool
    _give_up_at: float | None
    _retry_max_delay: float

    @property
    def caller_encodes(self) -> bool:
        """Emit makes each event's line, into :attr:`lines`, rather than queue its dict."""
        return self.lines is not None

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
            if lines is not None and self._drains():
                continue  # (a batch with a flush or close: the drain goes on, it never holds)
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
            elif item is STOP:
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
        value = enum_value(name)
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


def enum_value(name: Any) -> str | None:
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
