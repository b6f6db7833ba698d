"""Rollout lifecycles as OpenTelemetry spans, built from events on the background thread.

:class:`SpanBuilder` is an exporter of the pipeline (and of ``otel-rollout
export``, which replays a file through it).  Every span's start and end are
the ``t`` of the events that opened and closed it, so a span built live and
one built from the file a week later are the same.

* **group** (``rollout.group``): ``group.reserve`` → ``group.seal`` /
  ``group.discard``; the root of one trace per prompt group.
* **attempt** (``rollout.attempt``): child of its group, ``attempt.dispatch``
  or ``attempt.resume`` → ``attempt.seal`` / ``attempt.refuse`` /
  ``attempt.abandon``; every refit that paused one of its calls is a
  ``refit`` span event at the refit's time.
* **train step**, **weight sync**, **checkpoint publish/restore**: spans of
  their own; a train step links to every group it trained.
* a sealed group dropped later (``group.discard`` after its ``group.seal``) is an
  instant ``rollout.group.discard`` span, a child of its group's span.

:mod:`otel_rollout.span_contract` is the contract these spans follow.
"""

from __future__ import annotations

import json
import logging
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from opentelemetry import trace as otel_trace
from opentelemetry.trace import Link, SpanContext, Status, StatusCode

from .span_contract import (
    ARRAYS,
    OUTCOME_OF,
    REFIT_EVENT,
    RUN_ATTRIBUTE,
    SPAN_EVENT_ATTRIBUTES,
    SPAN_EVENT_OF,
    SPAN_OF,
    attribute_name,
    encode_arrays,
)
from .span_contract import to_ns as _ns

__all__ = ["ERROR_REASONS", "SpanBuilder", "attributes"]

_log = logging.getLogger("otel_rollout")

#: Reasons that mark an abandoned attempt or a discarded group as an error.
ERROR_REASONS = frozenset({"error", "failed", "timeout", "crash"})

#: Most open spans of a kind, group contexts (for links) and call cuts held at once.
_MEMORY = 100_000

_SEMCONV = {"tokens": "gen_ai.usage.output_tokens"}
_SUMMARIZED = {"calls": "rollout.calls.count", "cuts": "rollout.refit.paused_calls"}
_SKIP = frozenset({"t", "event"})
#: Fields a span already has from its start event; its end event only adds the rest.
_IDENTITY = _SKIP | {"run_id", "group_id", "prompt_id", "attempt_id", "generation_index", "epoch"}
_SCALARS = (str, int, float, bool)
#: A refit span event's attributes, in the contract table's order.
_REFIT_ATTRIBUTES = tuple(SPAN_EVENT_ATTRIBUTES[REFIT_EVENT])
_NAMES: dict[str, str] = {"run_id": attribute_name("run_id")}


def attributes(event: dict[str, Any], skip: frozenset[str] = _SKIP) -> dict[str, Any]:
    """An event's fields as span attributes (:mod:`otel_rollout.span_contract`):
    ``rollout.<field>``, with semantic-convention names where one exists; calls, cuts and
    tokens by version as parallel arrays (calls and cuts counted too); other nested values
    as JSON text."""
    attrs: dict[str, Any] = {}
    for key, value in event.items():
        if key in skip:
            continue
        cls = value.__class__
        if cls in _SCALARS:
            name = _NAMES.get(key)
            if name is None:
                name = _NAMES[key] = f"rollout.{key}"
            attrs[name] = value
            if key in _SEMCONV:
                attrs[_SEMCONV[key]] = value
        elif key in ARRAYS and (arrays := encode_arrays(key, value)) is not None:
            attrs.update(arrays)
            if key in _SUMMARIZED:
                attrs[_SUMMARIZED[key]] = len(value)
        elif cls is list and key in _SUMMARIZED:
            attrs[_SUMMARIZED[key]] = len(value)
        elif value is not None:
            attrs[f"rollout.{key}"] = _sequence_or_json(value)
    return attrs


def _sequence_or_json(value: Any) -> Any:
    """A list of one scalar type is an attribute as it is; anything else is JSON text."""
    if isinstance(value, list) and not value:
        return value  # an empty array (group_ids of a step that trained nothing)
    if (
        isinstance(value, list)
        and len({v.__class__ for v in value}) == 1
        and value[0].__class__ in _SCALARS
    ):
        return value
    return json.dumps(value, default=str)


class SpanBuilder:
    """Turns rollout events into spans through ``tracer_for(run_id)``.

    ``tracer_for`` gives the tracer of a run (its resource carries
    ``service.instance.id`` = the run's ID); a live trace has one run, a
    replayed file may have several.  ``on_shutdown`` runs after open spans
    are ended (to flush and shut down the providers); ``counts`` gives what
    the span exporter behind the tracer counted, for :meth:`counts`.  With ``end_other_runs``
    a ``run.start`` ends what every other run left open (a replayed file: the
    earlier run has stopped); the sidecar, which knows which runs are alive,
    turns it off and calls :meth:`end_open_spans` itself.
    """

    def __init__(
        self,
        tracer_for: Callable[[str], otel_trace.Tracer],
        on_shutdown: Callable[[], None] | None = None,
        *,
        end_other_runs: bool = True,
        counts: Callable[[], Mapping[str, int]] | None = None,
    ) -> None:
        self._tracer_for = tracer_for
        self._counts = counts
        self._on_shutdown = on_shutdown
        self._end_other_runs = end_other_runs
        self._groups: dict[str, otel_trace.Span] = {}
        self._attempts: dict[str, otel_trace.Span] = {}
        self._group_contexts: OrderedDict[str, SpanContext] = OrderedDict()
        self._cuts: OrderedDict[str, list[tuple[int, dict[str, Any]]]] = OrderedDict()
        self._last_t: dict[str, float] = {}
        self.spans_started = 0
        #: Events of a known kind that could not become spans (a field missing or mistyped).
        self.malformed = 0
        self._handlers: dict[str, Callable[[dict[str, Any]], None]] = {
            "run.start": self._run_start,
            "group.reserve": self._group_reserve,
            "group.admit": self._group_admit,
            "group.seal": self._group_end,
            "group.discard": self._group_end,
            "attempt.dispatch": self._attempt_start,
            "attempt.resume": self._attempt_start,
            "attempt.seal": self._attempt_end,
            "attempt.refuse": self._attempt_end,
            "attempt.abandon": self._attempt_end,
            "weights.sync": self._weights_sync,
            "train.step": self._train_step,
            "checkpoint.publish": self._instant,
            "checkpoint.restore": self._instant,
        }

    # The exporter protocol.

    def export(self, events: Sequence[dict[str, Any]]) -> int:
        for event in events:
            kind = event.get("event")
            handler = self._handlers.get(kind) if kind.__class__ is str else None
            if handler is None:
                continue
            try:
                run_id, t = event["run_id"], event["t"]
                if run_id.__class__ is not str or t.__class__ not in (float, int):
                    raise TypeError("run_id must be a string and t a number")
                self._last_t[run_id] = t
                handler(event)
            except (LookupError, TypeError, ValueError, AttributeError, OverflowError) as exc:
                self.malformed += 1
                if self.malformed == 1:
                    _log.warning(
                        "otel-rollout: no span for a %s event with a missing or mistyped field"
                        " (%s: %s); such events are counted, not reported one by one",
                        kind,
                        type(exc).__name__,
                        exc,
                    )
        return 0

    def shutdown(self) -> None:
        """End every span still open (its run ended first), then flush the providers."""
        self.end_open_spans(reason="trace.close")
        if self._on_shutdown is not None:
            self._on_shutdown()

    def end_open_spans(self, reason: str, run_id: str | None = None) -> None:
        """End the open spans (of ``run_id``, or all) at their run's last event."""
        for spans in (self._attempts, self._groups):
            for key, span in list(spans.items()):
                run = span.attributes.get(RUN_ATTRIBUTE) if hasattr(span, "attributes") else None
                if run_id is not None and run != run_id:
                    continue
                span.set_attribute("rollout.ended_by", reason)
                span.end(end_time=_ns(self._last_t.get(run, 0.0)) if run else None)
                del spans[key]

    def counts(self) -> dict[str, int]:
        """Spans made, and what the exporter behind them counted (sent, failed, dropped...)."""
        extra = self._counts() if self._counts is not None else {}
        return {"spans_made": self.spans_started, **extra}

    # Handlers, one per event kind.

    def _tracer(self, event: dict[str, Any]) -> otel_trace.Tracer:
        return self._tracer_for(event["run_id"])

    def _start(
        self,
        name: str,
        event: dict[str, Any],
        *,
        start: float | None = None,
        parent: otel_trace.Span | None = None,
        links: Sequence[Link] = (),
    ) -> otel_trace.Span:
        context = otel_trace.set_span_in_context(parent) if parent is not None else None
        self.spans_started += 1
        return self._tracer(event).start_span(
            name,
            context=context,
            attributes=attributes(event),
            links=links,
            start_time=_ns(event["t"] if start is None else start),
        )

    def _run_start(self, event: dict[str, Any]) -> None:
        # A new process resumed into the file: what the earlier runs left open stays open forever.
        # A forked child's parent goes on, so its spans stay open.
        if not self._end_other_runs:
            return
        for run_id in list(self._last_t):
            if run_id not in (event["run_id"], event.get("parent_run_id")):
                self.end_open_spans(reason="run.stopped", run_id=run_id)

    def _group_reserve(self, event: dict[str, Any]) -> None:
        span = self._start(SPAN_OF[event["event"]], event, parent=otel_trace.INVALID_SPAN)
        self._keep_open(self._groups, event["group_id"], span)

    def _group_admit(self, event: dict[str, Any]) -> None:
        span = self._groups.get(event["group_id"])
        if span is not None:
            span.add_event(SPAN_EVENT_OF[event["event"]], timestamp=_ns(event["t"]))

    def _group_end(self, event: dict[str, Any]) -> None:
        span = self._groups.pop(event["group_id"], None)
        if span is None:
            if event["event"] == "group.discard":  # a sealed group dropped from the buffer
                self._discard_sealed(event)
            return
        outcome = OUTCOME_OF[event["event"]]
        span.set_attributes({**attributes(event, _IDENTITY), "rollout.outcome": outcome})
        if event.get("reason") in ERROR_REASONS:
            span.set_status(Status(StatusCode.ERROR, event["reason"]))
        if event["event"] == "group.seal":
            self._remember(self._group_contexts, event["group_id"], span.get_span_context())
        span.end(end_time=_ns(event["t"]))

    def _discard_sealed(self, event: dict[str, Any]) -> None:
        sealed = self._group_contexts.get(event["group_id"])
        parent = otel_trace.NonRecordingSpan(sealed) if sealed is not None else None
        span = self._start(SPAN_OF[event["event"]], event, parent=parent)
        if event.get("reason") in ERROR_REASONS:
            span.set_status(Status(StatusCode.ERROR, event["reason"]))
        span.end(end_time=_ns(event["t"]))

    def _attempt_start(self, event: dict[str, Any]) -> None:
        parent = self._groups.get(event["group_id"])
        span = self._start(SPAN_OF[event["event"]], event, parent=parent)
        self._keep_open(self._attempts, event["attempt_id"], span)

    @staticmethod
    def _keep_open(spans: dict[str, otel_trace.Span], key: str, span: otel_trace.Span) -> None:
        """Hold a span until its end event; past the bound, the oldest is ended as evicted."""
        spans[key] = span
        if len(spans) > _MEMORY:
            oldest = next(iter(spans))
            evicted = spans.pop(oldest)
            evicted.set_attribute("rollout.ended_by", "evicted")
            evicted.end()

    def _attempt_end(self, event: dict[str, Any]) -> None:
        kind = event["event"]
        span = self._attempts.pop(event["attempt_id"], None)
        skip = _IDENTITY
        if span is None:  # ended before it ran: a span of no duration
            parent = self._groups.get(event["group_id"])
            span = self._start(SPAN_OF["attempt.dispatch"], event, parent=parent)
            skip = _SKIP
        span.set_attributes({**attributes(event, skip), "rollout.outcome": OUTCOME_OF[kind]})
        for call in event.get("calls") or ():
            for t_ns, attrs in self._cuts.pop(str(call[0]), ()):
                span.add_event(REFIT_EVENT, attributes=attrs, timestamp=t_ns)
        if event.get("reason") in ERROR_REASONS:
            span.set_status(Status(StatusCode.ERROR, event["reason"]))
        span.end(end_time=_ns(event["t"]))

    def _weights_sync(self, event: dict[str, Any]) -> None:
        duration = event.get("duration_s") or 0.0
        span = self._start(SPAN_OF[event["event"]], event, start=event["t"] - duration)
        span.end(end_time=_ns(event["t"]))
        t_ns = _ns(event["t"] - duration)
        for cut in event.get("cuts") or ():
            values = (str(cut[0]), cut[1], event["replaced_version"], event["new_version"])
            attrs = dict(zip(_REFIT_ATTRIBUTES, values, strict=True))
            self._remember(self._cuts, str(cut[0]), [(t_ns, attrs)], append=True)

    def _train_step(self, event: dict[str, Any]) -> None:
        links = [
            Link(self._group_contexts[g])
            for g in event.get("group_ids") or ()
            if g in self._group_contexts
        ]
        duration = event.get("duration_s") or 0.0
        name = SPAN_OF[event["event"]]
        span = self._start(name, event, start=event["t"] - duration, links=links)
        span.end(end_time=_ns(event["t"]))

    def _instant(self, event: dict[str, Any]) -> None:
        self._start(SPAN_OF[event["event"]], event).end(end_time=_ns(event["t"]))

    @staticmethod
    def _remember(store: OrderedDict[str, Any], key: str, value: Any, append: bool = False) -> None:
        if append and key in store:
            store[key].extend(value)
        else:
            store[key] = value
        if len(store) > _MEMORY:
            store.popitem(last=False)
