"""The canonical JSONL log from OpenTelemetry spans: a ``SpanExporter`` for the SDK's processors.

A training stack that already makes rollout spans (following
:mod:`otel_rollout.span_contract`) adds :class:`JsonlSpanExporter` to its own
``TracerProvider`` through a ``BatchSpanProcessor`` and gets the same file
``RolloutTrace`` writes, which every command of ``otel-rollout`` reads.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from . import config
from .constants import ROLLOUT_TRACE_FILENAME
from .events import from_object
from .exporters import JsonlExporter
from .schema import EVENTS, SCHEMA_VERSION, problems
from .span_contract import (
    ARRAYS,
    KIND_ORDER,
    RUN_ATTRIBUTE,
    SPAN_ONLY,
    SPANS,
    SpanConvention,
    attribute_name,
    decode_arrays,
    from_ns,
    rows,
)

__all__ = ["JsonlSpanExporter", "span_events"]

_log = logging.getLogger("otel_rollout")

#: Group IDs remembered as exported, so that their late attempts are not held.
_GROUPS_REMEMBERED = 1 << 17
#: Attributes of the contract: the rest of a span's ``rollout.*`` go on its last line.
_KNOWN = frozenset(
    {r.attribute for r in rows()} | set(SPAN_ONLY) | {RUN_ATTRIBUTE, "rollout.call.id"}
)
_ARRAY, _TEXT, _PLAIN = 0, 1, 2
#: How an attempt may end without having run (no version, no opening line).
_ENDS_WITHOUT_START = ("refused", "abandoned")


def _plan(kind: str) -> tuple[tuple[str, str, int], ...]:
    """Each field of a ``kind`` line: its name, its attribute, and how the value comes back."""
    spec = EVENTS[kind]
    plan = []
    for name, ftype in (*spec.required.items(), *spec.optional.items()):
        text = ftype.schema.get("type") in ("array", "object", None)
        how = _ARRAY if name in ARRAYS else _TEXT if text else _PLAIN
        plan.append((name, attribute_name(name), how))
    return tuple(plan)


#: Per kind: how its fields come from attributes (lists and objects may be JSON text).
_PLANS = {kind: _plan(kind) for kind in EVENTS}


class Malformed(ValueError):
    """A rollout span whose attributes cannot make a valid line."""


#: The integers a line can carry as JSON numbers: the encoder takes 64 bits, signed or not.
_INT_MIN, _INT_MAX = -(2**63), 2**64 - 1


def _fits(value: Any) -> bool:
    """Whether every integer in ``value`` fits in 64 bits (else the encoder would write it as
    a string, an invalid line).  An attribute's array has one type: min and max, in C."""
    cls = value.__class__
    if cls is int:
        return _INT_MIN <= value <= _INT_MAX
    if cls is tuple:
        if not value or value[0].__class__ is not int:
            return True
        return min(value) >= _INT_MIN and max(value) <= _INT_MAX
    if cls is list:  # decoded JSON text
        return all(_fits(v) for v in value)
    if cls is dict:
        return all(_fits(v) for v in value.values())
    return True


def _fitting(attr: str, value: Any) -> Any:
    if not _fits(value):
        raise Malformed(f"{attr} holds an integer past 64 bits")
    return value


def _fields(kind: str, attrs: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of one ``kind`` line that the span's attributes carry."""
    out: dict[str, Any] = {}
    for name, attr, how in _PLANS[kind]:
        if how == _ARRAY:
            value = decode_arrays(name, attrs)
            if value is not None:
                columns = [attrs.get(a) for a in ARRAYS[name]]
                text = any(c.__class__ is str for c in columns)  # JSON text: check as decoded
                if not (_fits(value) if text else all(map(_fits, columns))):
                    raise Malformed(f"the arrays of {name} hold an integer past 64 bits")
        else:
            value = _fitting(attr, attrs.get(attr))
            if value.__class__ is tuple:
                value = list(value)
            elif how == _TEXT and value.__class__ is str:
                # JSON text only if it parses; the validator names what is wrong
                with contextlib.suppress(ValueError):
                    value = json.loads(value)
                _fitting(attr, value)
        if value is not None:
            out[name] = value
    return out


def span_events(
    span: ReadableSpan, convention: SpanConvention, run_id: str, attrs: Mapping[str, Any]
) -> list[dict]:
    """The JSONL lines of one rollout span (whose attributes are ``attrs``), each at its
    recorded time; :class:`Malformed` when a line would break the schema."""
    start, end = span.start_time, span.end_time
    if start is None or end is None:
        raise Malformed("the span has no start or end time")
    out: list[dict[str, Any]] = []

    def line(kind: str, t_ns: int, **extra: Any) -> dict[str, Any]:
        event = {"t": from_ns(t_ns), "run_id": run_id, "event": kind}
        event.update(_fields(kind, attrs), **extra)
        out.append(event)
        return event

    if convention.single is not None:
        event = line(convention.single, end)
        if end > start and "duration_s" in EVENTS[convention.single].optional:
            event.setdefault("duration_s", from_ns(end - start))
    else:
        # An attempt refused or abandoned before it ran never had a version: its span is that
        # end alone.  Any other attempt without one writes its opening line anyway, which the
        # schema check below refuses: counted malformed, not written as a bare seal.
        ran = (
            span.name != "rollout.attempt"
            or "rollout.weight_version" in attrs
            or attrs.get("rollout.outcome") not in _ENDS_WITHOUT_START
        )
        if convention.opens and ran:
            resumed = "rollout.resumed_tokens" in attrs and len(convention.opens) > 1
            line(convention.opens[-1] if resumed else convention.opens[0], start)
        for span_event in span.events:
            kind = convention.span_events.get(span_event.name)
            if kind is not None:
                line(kind, span_event.timestamp)
        outcome = attrs.get("rollout.outcome")
        if outcome is not None:  # none: the span was ended when its run stopped
            closing = convention.closes.get(str(outcome))
            if closing is None:
                known = ", ".join(convention.closes)
                raise Malformed(f"rollout.outcome {outcome!r} is none of {known}")
            line(closing, end)
    beyond = attrs.keys() - _KNOWN
    if out and beyond:  # fields beyond the contract: the last line keeps them, as readers do
        for key in beyond:
            if key.startswith("rollout."):
                value = _fitting(key, attrs[key])
                out[-1].setdefault(key[8:], list(value) if isinstance(value, tuple) else value)
    for event in out:
        # The readers' check in C; where it refuses (it cannot take every value of an "any"
        # field from Python), the validator's own words decide.
        if from_object(event)[1] is not None:
            found = [p for p in problems(event) if not p.startswith("unknown event kind")]
            if found:
                raise Malformed(f"{event['event']}: {'; '.join(found)}")
    return out


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
    ``service.instance.id``, else one ID this exporter makes.  An attempt
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
        target = Path(path)
        if target.is_dir():
            target = target / ROLLOUT_TRACE_FILENAME
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
        self._own_run = uuid.uuid4().hex
        self._closed = False
        self._counts = {
            "spans_ignored": 0,
            "spans_malformed": 0,
            "spans_held_past_bound": 0,
            "spans_after_shutdown": 0,
            "lines_written": 0,
            "lines_lost": 0,
        }

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
        made = self._runs.get(run_id) or {"pid": os.getpid(), "host": socket.gethostname()}
        start = {"t": t, "run_id": run_id, "event": "run.start", "schema": SCHEMA_VERSION}
        return {**start, **made, "source": "spans"}
