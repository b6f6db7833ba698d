"""The canonical JSONL log from OpenTelemetry spans: a ``SpanExporter`` for the SDK's processors.

A training stack that already makes rollout spans (following
:mod:`otel_rollout.span_contract`) adds :class:`JsonlSpanExporter` to its own
``TracerProvider`` through a ``BatchSpanProcessor`` and gets the same file
``RolloutTrace`` writes, which every command of ``otel-rollout`` reads.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from . import config
from .exporters import JsonlExporter, log_path
from .schema import SCHEMA_VERSION
from .span_contract import KIND_ORDER, RUN_ATTRIBUTE, SPANS
from .span_lines import Malformed, span_events
from .trace import new_run_id

__all__ = ["JsonlSpanExporter", "Malformed", "span_events"]

_log = logging.getLogger("otel_rollout")

#: Group IDs remembered as exported, so that their late attempts are not held.
_GROUPS_REMEMBERED = 1 << 17


def _held_size(attrs: Mapping[str, Any]) -> int:
    """About the bytes a held attempt's lines take: 1.1 KB and 160 bytes a call (measured
    with tracemalloc: 1.2 KB with one call, 16 KB with 100), and its snapshot's text twice."""
    snapshot = attrs.get("rollout.snapshot")
    calls = attrs.get("rollout.calls.call_id")
    return (
        1_100
        + 160 * (len(calls) if isinstance(calls, (tuple, list)) else 0)
        + 2 * (len(snapshot) if isinstance(snapshot, str) else 0)
    )


def _order(event: dict[str, Any]) -> tuple[float, int]:
    return event["t"], KIND_ORDER.get(event["event"], len(KIND_ORDER))


class JsonlSpanExporter(SpanExporter):
    """Writes the canonical JSONL log (schema 1) from rollout spans, through :class:`JsonlExporter`.

    ``path`` is a file or a directory (which gets ``rollout_trace.jsonl``).
    Each export writes the lines of its spans in time order with one write.
    A ``run.start`` line opens every run the first time one of its spans is
    written; the run is the span's ``rollout.run.id``, else its resource's
    ``service.instance.id``, else one ID this exporter makes (a forked
    child makes its own).  An attempt
    span whose group's span was not exported yet is held until it is, so
    that no attempt line precedes its group's ``group.reserve``: at most
    ``hold_bytes`` of them, estimated (``OTEL_ROLLOUT_SPAN_HOLD_BYTES``); past
    that the oldest group's are written as they are and counted, as are those
    still held at shutdown.

    Never raises into the SDK.  Spans that are not rollout spans are
    ignored and counted; a rollout span that cannot make a valid line is
    counted and skipped (the first one is logged).  Lines the file could not
    take are counted, and the file's fault is logged once, as the log's.
    """

    def __init__(
        self,
        path: Path | str,
        *,
        hold_bytes: int | None = None,
        fsync_interval: float | None = None,
    ) -> None:
        target = log_path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        self.path = target
        self.hold_bytes = config.SPAN_HOLD_BYTES.resolve(hold_bytes)
        self._log = JsonlExporter(target, fsync_interval=fsync_interval)
        self._lock = threading.Lock()
        self._held: OrderedDict[str, list[dict[str, Any]]] = OrderedDict()  # group → lines
        self._held_spans: OrderedDict[str, list[int]] = OrderedDict()  # group → spans, bytes
        self._groups: OrderedDict[str, None] = OrderedDict()
        self._runs: dict[str, dict[str, Any]] = {}  # run → what its run.start says
        self._written_runs: set[str] = set()
        self._n_held = self._held_size = 0
        self._own_run = new_run_id()
        self._closed = False
        self._counts = {
            "spans_ignored": 0,
            "spans_malformed": 0,
            "spans_held_past_bound": 0,
            "spans_after_shutdown": 0,
            "lines_written": 0,
            "lines_lost": 0,
        }
        _LIVE.add(self)

    # The SDK's SpanExporter interface.

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        try:
            with self._lock:
                if self._closed:
                    self._counts["spans_after_shutdown"] += len(spans)
                    return SpanExportResult.FAILURE
                lines: list[dict[str, Any]] = []
                for span in spans:
                    self._take(span, lines)
                return self._write(lines)
        except Exception:  # never into the SDK's worker thread
            _log.exception("otel-rollout: JsonlSpanExporter could not export a batch")
            return SpanExportResult.FAILURE

    def force_flush(self, timeout_millis: int | None = 30_000) -> bool:
        """Make what was written durable on disk within the timeout (attempts held for their
        group stay held); False if the timeout passed.  Waits for the disk outside the lock,
        so exports go on meanwhile; after :meth:`shutdown`, True at once.

        The SDK's processors never call this (their ``force_flush`` exports what they hold
        and returns): for a durable flush, call ``provider.force_flush()`` and then this.
        """
        timeout = 30.0 if timeout_millis is None else max(timeout_millis, 0) / 1000
        deadline = time.monotonic() + timeout
        if not self._lock.acquire(timeout=timeout):
            return False
        try:
            if self._closed:
                return True
        finally:
            self._lock.release()
        return self._log.durable(max(deadline - time.monotonic(), 0.0))

    def shutdown(self) -> None:
        """Write what is still held (counted), then close the file."""
        with self._lock:
            if self._closed:
                return
            try:
                lines = [line for held in self._held.values() for line in held]
                self._counts["spans_held_past_bound"] += self._n_held
                self._held.clear()
                self._held_spans.clear()
                self._n_held = self._held_size = 0
                self._write(lines)
            except Exception:
                _log.exception("otel-rollout: JsonlSpanExporter could not write held spans")
            finally:
                self._closed = True
                self._log.shutdown()

    def counts(self) -> dict[str, int]:
        """Spans ignored (not rollout spans), malformed, held past the bound, exported after
        shutdown (dropped); lines written and lost; and the log's own counts (oversized
        events, syncs)."""
        with self._lock:
            return {**self._counts, "spans_held": self._n_held, **self._log.counts()}

    def _after_fork_in_child(self) -> None:
        """A forked child: a lock of its own (the parent's may have been held at the fork), a
        run of its own where this exporter named the run, and none of the parent's held
        attempts (the parent writes those)."""
        self._lock = threading.Lock()
        self._runs.pop(self._own_run, None)
        self._own_run = new_run_id()
        self._held.clear()
        self._held_spans.clear()
        self._n_held = self._held_size = 0

    # The work, under the lock.

    def _run_id(self, span: ReadableSpan, attrs: Mapping[str, Any]) -> str:
        resource = span.resource.attributes if span.resource is not None else {}
        run = attrs.get(RUN_ATTRIBUTE)
        if run is None:
            run = resource.get("service.instance.id")
        run = str(run) if run is not None else self._own_run
        if run not in self._runs:  # the process and host that made it, when the resource says
            pid, host = resource.get("process.pid"), resource.get("host.name")
            self._runs[run] = {
                "pid": pid if isinstance(pid, int) else os.getpid(),
                "host": str(host) if host is not None else socket.gethostname(),
            }
        return run

    def _take(self, span: ReadableSpan, lines: list[dict[str, Any]]) -> None:
        convention = SPANS.get(span.name)
        if convention is None:
            self._counts["spans_ignored"] += 1
            return
        try:
            attrs = dict(span.attributes or {})  # one copy: the SDK's mapping is slow to read
            events = span_events(span, convention, self._run_id(span, attrs), attrs)
        except Exception as exc:  # one span's fault (a JSON string nested too deep, a time
            # past a float's range) costs that span alone, never the rest of its batch
            self._counts["spans_malformed"] += 1
            if self._counts["spans_malformed"] == 1:
                _log.warning(
                    "otel-rollout: a %s span makes no valid line (%s); such spans are counted,"
                    " not reported one by one",
                    span.name,
                    exc,
                )
            return
        group = str(attrs.get("rollout.group_id"))
        if span.name == "rollout.group":
            self._groups[group] = None
            self._groups.move_to_end(group)  # exported again: remembered as the newest
            if len(self._groups) > _GROUPS_REMEMBERED:
                self._groups.popitem(last=False)
            lines += events
            lines += self._held.pop(group, ())
            n, size = self._held_spans.pop(group, (0, 0))
            self._n_held, self._held_size = self._n_held - n, self._held_size - size
        elif span.name == "rollout.attempt" and events and group not in self._groups:
            self._held.setdefault(group, []).extend(events)
            size = _held_size(attrs)
            held = self._held_spans.setdefault(group, [0, 0])
            held[0], held[1] = held[0] + 1, held[1] + size
            self._n_held, self._held_size = self._n_held + 1, self._held_size + size
            while self._held_size > self.hold_bytes:  # the oldest group's attempts, as they are
                oldest, (n, size) = self._held_spans.popitem(last=False)
                lines += self._held.pop(oldest)
                self._n_held, self._held_size = self._n_held - n, self._held_size - size
                self._counts["spans_held_past_bound"] += n
        else:
            lines += events

    def _write(self, lines: list[dict[str, Any]]) -> SpanExportResult:
        if not lines:
            return SpanExportResult.SUCCESS
        lines.sort(key=_order)
        batch: list[dict[str, Any]] = []
        starts: dict[str, int] = {}  # run → where its run.start is in the batch
        for event in lines:
            run = event["run_id"]
            if run not in self._written_runs and run not in starts:
                starts[run] = len(batch)
                batch.append(self._run_start(run, event["t"]))
            batch.append(event)
        lost = self._log.export(batch)  # synced at the log's interval by its syncer thread
        # The lines that reached the file whole are the batch's first: a run whose run.start
        # is not among them gets one again before its next line.
        self._written_runs.update(run for run, at in starts.items() if at < len(batch) - lost)
        self._counts["lines_written"] += len(batch) - lost
        self._counts["lines_lost"] += lost
        return SpanExportResult.FAILURE if lost else SpanExportResult.SUCCESS

    def _run_start(self, run_id: str, t: float) -> dict[str, Any]:
        start = {"t": t, "run_id": run_id, "event": "run.start", "schema": SCHEMA_VERSION}
        return {**start, **self._runs[run_id], "source": "spans"}  # _run_id saw every run


#: Every exporter alive, so that a forked child can reset each.
_LIVE: weakref.WeakSet[JsonlSpanExporter] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for exporter in list(_LIVE):
        exporter._after_fork_in_child()


os.register_at_fork(after_in_child=_after_fork_in_child)
