"""The trackers' threads: one that turns events into rows, and one worker per tracker.

:class:`TrackerHub` is an exporter (``export``, ``shutdown``, ``counts``): in
the export sidecar it is fed the log's events, in the training process the
pipeline's.  ``export`` only hands the batch to the hub's own thread, which
builds the rows (:class:`~._rows.RowBuilder`) and gives them to each
tracker's :class:`Worker`, a thread with a bounded queue of its own.  A tracker
that fails is logged once and counted; one that hangs fills its own queue
(rows past it are dropped and counted) and is left behind at close, after
``timeout`` seconds: never does it hold the log, the caller or another tracker.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from queue import Empty, Full, Queue
from typing import Any

from ._rows import Row, RowBuilder
from ._sinks import Sink, kind_of, opener

__all__ = ["TrackerHub", "Worker"]

_log = logging.getLogger("otel_rollout")

#: Rows a tracker may have waiting before new ones are dropped (and counted): ~10 minutes of
#: a run training a step a second, with a restore row or two.
WORKER_QUEUE = 1024
#: Events waiting for the hub's thread before new batches are dropped (and counted): counted
#: in events, not batches, as a batch may hold one event or thousands.  ~1 minute of a run
#: logging 4,000 events a second.
INBOX_EVENTS = 262_144
#: Seconds between flushes of a tracker (an MLflow log_batch, a TensorBoard file flush).
FLUSH_INTERVAL = 1.0


class Worker:
    """One tracker's thread: opens a sink per trace run, logs its rows, flushes, closes."""

    def __init__(
        self, name: str, open_sink: Callable[[str], Sink], held: Collection[str] = ()
    ) -> None:
        self.name = name
        self._open = open_sink
        #: Trace runs this tracker already holds a run of (a backfill leaves them out).
        self.held = frozenset(held)
        self._queue: Queue[Any] = Queue(maxsize=WORKER_QUEUE)
        self._sinks: dict[str, Sink | None] = {}  # None: the run's sink could not be made
        self.logged = self.dropped = self.failed = 0
        self.opened = 0  # tracker runs made (their library imported, their run open)
        self.hung = False
        self._stopping = threading.Event()
        self._complained = False
        self._thread = threading.Thread(target=self._run, name=f"otel-rollout-{name}", daemon=True)
        self._thread.start()

    def put(self, item: Any, wait: float = 0.0) -> None:
        """Queue a row, or a run's end.  Live, never waits: a full queue drops the row
        (counted); a backfill waits for room instead, up to ``wait`` seconds."""
        try:
            self._queue.put(item, timeout=wait) if wait > 0 else self._queue.put_nowait(item)
        except Full:
            if item[0] == "row":
                self.dropped += 1
                self._complain("is not keeping up; dropping rows (counted)")

    def flush(self, deadline: float) -> bool:
        """Wait until what was queued before is logged and flushed (False past ``deadline``)."""
        done = threading.Event()
        try:
            self._queue.put(done, timeout=max(deadline - time.monotonic(), 0.0))
        except Full:
            return False
        return done.wait(max(deadline - time.monotonic(), 0.0))

    def stop(self) -> None:
        """Ask the thread to log what is queued, close every sink and end (never waits)."""
        self._stopping.set()
        with contextlib.suppress(Full):
            self._queue.put_nowait(None)  # a wake-up; a full queue ends on _stopping

    def close(self, deadline: float) -> None:
        """:meth:`stop`, then wait until ``deadline``; a thread still busy is hung (counted)."""
        self.stop()
        self._thread.join(max(deadline - time.monotonic(), 0.0))
        if self._thread.is_alive():
            self.hung = True
            with self._queue.mutex:  # rows only: not the wake-up or a flush's event
                left = sum(isinstance(i, tuple) and i[0] == "row" for i in self._queue.queue)
            # and rows a batching sink (MLflow) holds for its next request
            left += sum(getattr(sink, "waiting", 0) for sink in list(self._sinks.values()))
            self.dropped += left
            _log.warning(
                "otel-rollout: tracker %s did not finish in time; %d rows left unlogged",
                self.name,
                left,
            )

    def _complain(self, what: str, exc: BaseException | None = None) -> None:
        if not self._complained:
            self._complained = True
            suffix = f": {type(exc).__name__}: {exc}" if exc is not None else ""
            _log.error("otel-rollout: tracker %s %s%s", self.name, what, suffix)

    def _call(self, fn: Callable[[], Any]) -> bool:
        try:
            fn()
        except Exception as exc:
            self.failed += 1
            self._complain("failed; counting its losses (trace.stats)", exc)
            return False
        return True

    def _sink(self, run_id: str) -> Sink | None:
        if run_id not in self._sinks:
            made: list[Sink] = []
            self._call(lambda: made.append(self._open(run_id)))
            self._sinks[run_id] = made[0] if made else None
            self.opened += bool(made)
        return self._sinks[run_id]

    def _run(self) -> None:
        get, next_flush = self._queue.get, time.monotonic() + FLUSH_INTERVAL
        while True:
            try:
                item = get(timeout=max(next_flush - time.monotonic(), 0.001))
            except Empty:
                item = ()
                if self._stopping.is_set():
                    break
            if item is None:
                if self._queue.empty():
                    break
                continue  # the wake-up came before the last rows (a full queue): log them
            if isinstance(item, threading.Event):
                self._flush_all()
                item.set()
            elif item:
                self._handle(item)
            if time.monotonic() >= next_flush:
                self._flush_all()
                next_flush = time.monotonic() + FLUSH_INTERVAL
        for run_id in list(self._sinks):
            self._end(run_id)

    def _handle(self, item: tuple[Any, ...]) -> None:
        if item[0] == "row":
            _, run_id, step, values = item
            sink = self._sink(run_id)
            if sink is None:
                self.dropped += 1  # its tracker run could not be made (logged, counted once)
            elif self._call(lambda: sink.log(step, values)) and not hasattr(sink, "waiting"):
                self.logged += 1  # a sink that batches (MLflow) counts at its flush
        elif item[0] == "end":
            self._end(item[1])

    def _end(self, run_id: str) -> None:
        sink = self._sinks.pop(run_id, None)
        if sink is not None:
            self._flush(sink)
            self._call(sink.close)

    def _flush(self, sink: Sink) -> None:
        """Flush ``sink``; a sink that batches rows counts them now: logged if sent, else
        dropped (a failed request is not retried)."""
        waiting = getattr(sink, "waiting", None)
        if waiting is None:
            self._call(sink.flush)
            return
        sent = sink.sent  # type: ignore[attr-defined]
        self._call(sink.flush)
        done = sink.sent - sent  # type: ignore[attr-defined]
        self.logged += done
        self.dropped += waiting - done

    def _flush_all(self) -> None:
        for sink in self._sinks.values():
            if sink is not None:
                self._flush(sink)


class TrackerHub:
    """Every tracker of one trace (or of one log, in the sidecar), as one exporter.

    ``targets`` are :class:`~._spec.Spec` s and run objects of yours; ``path`` is
    the log and ``start`` the byte where the events fed begin (None: its end now):
    the runs before it are read once, for the first restore row (see RowBuilder).
    """

    def __init__(
        self,
        targets: Sequence[Any],
        path: Path | None,
        *,
        backfill: bool = False,
        wait: float = 120.0,
        start: int | None = None,
        held: Sequence[Collection[str]] = (),
    ) -> None:
        # A finished file: wait for a slow tracker rather than drop, up to ``wait`` seconds a put
        self._wait = wait if backfill else 0.0
        held = list(held) + [()] * (len(targets) - len(held))
        self.workers = [
            Worker(f"{kind_of(t)}{':' + str(t.target) if getattr(t, 'target', None) else ''}",
                   opener(t), runs)
            for t, runs in zip(targets, held, strict=True)
        ]  # fmt: skip
        self._builder = RowBuilder(path, start)
        self._inbox: Queue[Any] = Queue()  # bounded by INBOX_EVENTS, counted in export
        self._queued = 0  # events in the inbox
        self._room = threading.Condition()
        self.events_dropped = 0
        self.internal_errors = 0
        self.rows = 0
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="otel-rollout-trackers", daemon=True)
        self._thread.start()

    # The exporter protocol.

    def export(self, events: Sequence[dict[str, Any]]) -> int:
        n = len(events)
        with self._room:
            fits = lambda: not self._queued or self._queued + n <= INBOX_EVENTS  # noqa: E731
            if not (fits() or (self._wait and self._room.wait_for(fits, self._wait))):
                self.events_dropped += n
                runs = {e.get("run_id") for e in events if isinstance(e, dict)}
                self._inbox.put(("gap", runs))  # their batch age is not known any more
                return 0
            self._queued += n
        self._inbox.put(("events", events))
        return 0

    def end_run(self, run_id: str) -> None:
        """A run is over: its restore row if owed, then its tracker runs are closed."""
        with contextlib.suppress(Full):
            self._inbox.put_nowait(("end", run_id))

    def counts(self) -> dict[str, int]:
        return {
            "tracker_rows_logged": sum(w.logged for w in self.workers),
            "tracker_rows_dropped": sum(w.dropped for w in self.workers),
            "tracker_errors": sum(w.failed for w in self.workers) + self.internal_errors,
            "tracker_events_dropped": self.events_dropped,
            "tracker_steps_without_age": self._builder.withheld,
            "tracker_rows_unindexable": self._builder.unindexable,
            "trackers_hung": sum(w.hung for w in self.workers),
        }

    @property
    def opened(self) -> int:
        """Tracker runs made so far, over every tracker: each made one imports its library
        and opens its run, long-lived objects the export sidecar then freezes (see
        :mod:`otel_rollout.sidecar`)."""
        return sum(w.opened for w in self.workers)

    def flush(self, timeout: float) -> bool:
        """Wait (at most ``timeout`` s) until every row of the events so far is logged."""
        deadline = time.monotonic() + timeout
        done = threading.Event()
        try:
            self._inbox.put(done, timeout=timeout)
        except Full:
            return False
        if not done.wait(max(deadline - time.monotonic(), 0.0)):
            return False
        return all([w.flush(deadline) for w in self.workers])

    def shutdown(self) -> None:
        from .. import config

        # The pipeline waits for its exporters within what is left of the close timeout; half
        # of it lets a hung tracker be given up on (and counted) before close returns.
        self.close(config.CLOSE_TIMEOUT.resolve() / 2)

    def close(self, timeout: float) -> None:
        """Every run is over: owed rows, then each tracker closed, within ``timeout`` seconds."""
        if self._closed:
            return
        self._closed = True
        now = time.monotonic()
        deadline = now + timeout
        # The hub's thread (owed restore rows: a pass of cost's) gets half; the rest is kept
        # for the workers to log, flush and end their tracker runs, so a busy hub does not
        # leave healthy trackers reported hung.
        built = now + timeout / 2
        with contextlib.suppress(Full):
            self._inbox.put(None, timeout=timeout / 2)
        self._thread.join(max(built - time.monotonic(), 0.0))
        if self._thread.is_alive():
            _log.warning("otel-rollout: trackers: the last rows were not ready in time")
        for worker in self.workers:  # all at once: a hung one costs only itself
            worker.stop()
        for worker in self.workers:
            worker.close(deadline)

    # The hub's thread.

    def _internal_error(self) -> None:
        """A batch the hub could not handle: its traceback logged once, every one counted."""
        self.internal_errors += 1
        if self.internal_errors == 1:
            _log.exception("otel-rollout: trackers: internal error (logged once, counted)")

    def _fan_out(self, rows: list[Row]) -> None:
        self.rows += len(rows)
        for run_id, step, values in rows:
            for worker in self.workers:
                if run_id not in worker.held:
                    worker.put(("row", run_id, step, values), self._wait)

    def _run(self) -> None:
        builder = self._builder
        while (item := self._inbox.get()) is not None:
            try:
                if isinstance(item, threading.Event):
                    item.set()
                elif item[0] == "events":
                    with self._room:
                        self._queued -= len(item[1])
                        self._room.notify_all()
                    self._fan_out(builder.feed(item[1]))
                elif item[0] == "gap":
                    builder.lost_events(item[1])
                else:
                    self._fan_out(builder.end_run(item[1]))
                    for worker in self.workers:
                        if item[1] not in worker.held:
                            worker.put(("end", item[1]))
            except Exception:  # never let the hub die: the next batch may be fine
                self._internal_error()
        try:
            self._fan_out(builder.end_all())
        except Exception:
            self._internal_error()
