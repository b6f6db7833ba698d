"""The rollout span conventions: which span, attribute and span event becomes which JSONL line.

:data:`SPANS` is the contract both ways.  :class:`~otel_rollout.spans.SpanBuilder`
makes these spans from events; :class:`~otel_rollout.span_exporter.JsonlSpanExporter`
turns spans that follow them (made by the builder, or by a training stack's
own ``tracer.start_as_current_span`` calls) back into the canonical log.  The
attributes of each span are derived from the JSONL schema (:mod:`otel_rollout.schema`):
a field ``f`` of an event the span stands for is the attribute ``rollout.f``;
the three nested fields travel as parallel arrays (:data:`ARRAYS`).
:func:`markdown_reference` renders the contract for docs/schema.md.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .schema import EVENTS, FieldType

__all__ = [
    "ARRAYS",
    "KIND_ORDER",
    "NOTES",
    "OUTCOME_OF",
    "REFIT_EVENT",
    "RESOURCE_ATTRIBUTES",
    "RUN_ATTRIBUTE",
    "SPANS",
    "SPAN_EVENT_ATTRIBUTES",
    "SPAN_EVENT_OF",
    "SPAN_OF",
    "SPAN_ONLY",
    "AttributeRow",
    "SpanConvention",
    "attribute_name",
    "decode_arrays",
    "encode_arrays",
    "from_ns",
    "markdown_reference",
    "rows",
    "to_ns",
]

_NS = 1_000_000_000


def to_ns(t: float) -> int:
    """Seconds since the epoch as integer nanoseconds, the nearest to ``t`` exactly.

    ``round(t * 1e9)`` rounds twice (the product, then the integer) and 7% of
    today's wall-clock times then come back from :func:`from_ns` one float step
    off; the exact product of the float's integer ratio does not.
    """
    num, den = float(t).as_integer_ratio()
    return (2 * num * _NS + den) // (2 * den)


def from_ns(ns: int) -> float:
    """Integer nanoseconds as float seconds: ``from_ns(to_ns(t)) == t`` for every wall-clock
    ``t`` (any ``t`` ≥ 2**23 s, where one float step is more than a nanosecond)."""
    return ns / _NS  # int / int: one correctly rounded division


#: The attribute that names the run of a span (else: the resource's ``service.instance.id``).
RUN_ATTRIBUTE = "rollout.run.id"


@dataclass(frozen=True)
class SpanConvention:
    """One rollout span: the JSONL events it stands for, and when each is written."""

    name: str
    doc: str
    #: Written at the span's start (for an attempt: ``attempt.resume`` when the span has
    #: ``rollout.resumed_tokens``, else ``attempt.dispatch``); none for a span that is one event.
    opens: tuple[str, ...] = ()
    #: ``rollout.outcome`` → the event written at the span's end; without an outcome
    #: (the span was ended when its run stopped) no end line is written; an outcome not
    #: listed makes the span malformed.
    closes: Mapping[str, str] = field(default_factory=dict)
    #: The one event of a span that is one event, at the span's end; a span that lasted
    #: has it with ``duration_s`` = end − start unless the attribute says otherwise.
    single: str | None = None
    #: Span event name → the JSONL event it becomes (None: for viewing only).
    span_events: Mapping[str, str | None] = field(default_factory=dict)

    @property
    def kinds(self) -> tuple[str, ...]:
        """Every JSONL event kind this span can become."""
        ends = tuple(self.closes.values())
        spans = tuple(k for k in self.span_events.values() if k is not None)
        return (*self.opens, *spans, *ends, *((self.single,) if self.single else ()))


#: The span event of an attempt for each refit that paused one of its calls (for viewers).
REFIT_EVENT = "refit"

SPANS: Mapping[str, SpanConvention] = {
    s.name: s
    for s in (
        SpanConvention(
            "rollout.group",
            "Root of one trace per prompt group.",
            opens=("group.reserve",),
            closes={"sealed": "group.seal", "discarded": "group.discard"},
            span_events={"admit": "group.admit"},
        ),
        SpanConvention(
            "rollout.attempt",
            "Child of its group's span. A refused or abandoned attempt without "
            "`rollout.weight_version` ended before it ran: its span writes that end line only "
            "(any other attempt without it is malformed).",
            opens=("attempt.dispatch", "attempt.resume"),
            closes={
                "sealed": "attempt.seal",
                "refused": "attempt.refuse",
                "abandoned": "attempt.abandon",
            },
            span_events={REFIT_EVENT: None},
        ),
        SpanConvention(
            "rollout.group.discard",
            "A sealed group dropped later (from the buffer: stale, stop), after its group span "
            "ended; a child of that span.",
            single="group.discard",
        ),
        SpanConvention(
            "rollout.train.step", "Links to the group spans it trained.", single="train.step"
        ),
        SpanConvention(
            "rollout.weights.sync", "From the refit's start to its end.", single="weights.sync"
        ),
        SpanConvention("rollout.checkpoint.publish", "An instant.", single="checkpoint.publish"),
        SpanConvention("rollout.checkpoint.restore", "An instant.", single="checkpoint.restore"),
    )
}

#: Each event kind that starts a span, or is one → that span's name.
SPAN_OF: Mapping[str, str] = {
    kind: s.name for s in SPANS.values() for kind in (*s.opens, *((s.single,) if s.single else ()))
}
#: Each event kind that ends a span → the ``rollout.outcome`` it ends with.
OUTCOME_OF: Mapping[str, str] = {
    kind: outcome for s in SPANS.values() for outcome, kind in s.closes.items()
}
#: Each event kind that is a span event → that span event's name.
SPAN_EVENT_OF: Mapping[str, str] = {
    kind: name for s in SPANS.values() for name, kind in s.span_events.items() if kind is not None
}

#: Nested JSONL fields as parallel arrays: field → the attribute of each position.
ARRAYS: Mapping[str, tuple[str, ...]] = {
    "calls": ("rollout.calls.call_id", "rollout.calls.began_version", "rollout.calls.tokens"),
    "cuts": ("rollout.cuts.call_id", "rollout.cuts.tokens_so_far"),
    "tokens_by_version": ("rollout.tokens_by_version.version", "rollout.tokens_by_version.tokens"),
}
_ARRAY_TYPES = {"call_id": "string[] or int[]"}

#: Attributes the builder sets for viewers and dashboards, that no JSONL field comes from.
SPAN_ONLY: Mapping[str, str] = {
    "rollout.outcome": "how the span ended: chooses its end line (see above)",
    "rollout.ended_by": "`trace.close`, `run.stopped`, `evicted`: ended without an end event",
    "gen_ai.usage.output_tokens": "a copy of `rollout.tokens`",
    "rollout.calls.count": "how many calls `rollout.calls.*` list",
    "rollout.refit.paused_calls": "how many calls `rollout.cuts.*` list",
}

#: Attributes whose presence or absence decides more than their own field.
NOTES: Mapping[str, str] = {
    "rollout.resumed_tokens": "present: the span opens with `attempt.resume`, else "
    "`attempt.dispatch`",
    "rollout.duration_s": "absent: end − start, for a span that lasted",
}

#: The attributes of the span events the builder adds for viewers (they write no line).
SPAN_EVENT_ATTRIBUTES: Mapping[str, Mapping[str, str]] = {
    REFIT_EVENT: {  # in the order the builder fills them: call, tokens, replaced, new
        "rollout.call.id": "the call the refit cut (one event per cut call)",
        "rollout.refit.tokens_so_far": "its tokens at the cut",
        "rollout.refit.replaced_version": "the version replaced",
        "rollout.refit.new_version": "the version loaded",
    },
}

#: The resource attributes the exporter reads.
RESOURCE_ATTRIBUTES: Mapping[str, str] = {
    "service.instance.id": "the run, for spans without `rollout.run.id` (new at each process "
    "start: a pod's name is not)",
    "process.pid": "`run.start`'s `pid` (else the exporter's process)",
    "host.name": "`run.start`'s `host` (else the exporter's host)",
}

#: The order of events of equal time in a written batch: a lifecycle's order.
KIND_ORDER: Mapping[str, int] = {
    kind: rank
    for rank, kind in enumerate(
        (
            "run.start",
            "checkpoint.restore",
            "group.reserve",
            "group.admit",
            "attempt.dispatch",
            "attempt.resume",
            "weights.sync",
            "attempt.seal",
            "attempt.refuse",
            "attempt.abandon",
            "group.seal",
            "group.discard",
            "train.step",
            "checkpoint.publish",
        )
    )
}


def attribute_name(name: str) -> str:
    """The attribute of a JSONL field."""
    return RUN_ATTRIBUTE if name == "run_id" else f"rollout.{name}"


def _attribute_type(ftype: FieldType) -> str:
    kind = ftype.schema.get("type")
    if kind == "array":
        return "string[]"
    if kind in ("object", None) or ftype.name == "any":
        return "string (JSON)"
    if kind == "integer" or "const" in ftype.schema:
        return "int"
    if kind == "string":
        return "string"
    return "double"  # number, or number or null (null: the attribute is absent)


@dataclass(frozen=True)
class AttributeRow:
    """One attribute of one span: its type, the events that require it, the field it becomes."""

    span: str
    attribute: str
    type: str
    required_by: tuple[str, ...]
    field: str
    events: tuple[str, ...]


def rows() -> list[AttributeRow]:
    """Every attribute of every rollout span, derived from the schema's fields."""
    out: list[AttributeRow] = []
    for span in SPANS.values():
        found: dict[str, dict[str, Any]] = {}
        for kind in span.kinds:
            spec = EVENTS[kind]
            for fields, required in ((spec.required, True), (spec.optional, False)):
                for name, ftype in fields.items():
                    row = found.setdefault(name, {"type": ftype, "req": [], "events": []})
                    row["events"].append(kind)
                    if required:
                        row["req"].append(kind)
        for name, row in found.items():
            events = tuple(row["events"])
            if name in ARRAYS:
                for i, attr in enumerate(ARRAYS[name]):
                    kind = _ARRAY_TYPES.get(attr.rsplit(".", 1)[1], "int[]")
                    where = (
                        f"{name} {('keys', 'values')[i]}"
                        if name == "tokens_by_version"
                        else (f"{name}[n][{i}]")
                    )
                    out.append(AttributeRow(span.name, attr, kind, (), where, events))
                continue
            attr, attr_type = attribute_name(name), _attribute_type(row["type"])
            out.append(AttributeRow(span.name, attr, attr_type, tuple(row["req"]), name, events))
    return out


def encode_arrays(name: str, value: Any) -> dict[str, Any] | None:
    """A nested field as its parallel-array attributes, or None when its shape is not the
    schema's (the builder then keeps it as JSON text)."""
    attrs = ARRAYS[name]
    try:
        if name == "tokens_by_version":
            items = sorted((int(k), v) for k, v in value.items())
            columns: list[list[Any]] = [[k for k, _ in items], [v for _, v in items]]
        else:
            if any(len(item) != len(attrs) for item in value):
                return None
            columns = [[item[i] for item in value] for i in range(len(attrs))]
    except (TypeError, ValueError, AttributeError, KeyError):
        return None
    if any(v.__class__ is not int for column in columns[1:] for v in column):
        return None
    if name != "tokens_by_version":
        ids = columns[0]
        if not all(i.__class__ is str for i in ids) and not all(i.__class__ is int for i in ids):
            columns[0] = [str(i) for i in ids]  # mixed IDs: one type, as an attribute must be
    return dict(zip(attrs, columns, strict=True))


def decode_arrays(name: str, attributes: Mapping[str, Any]) -> Any:
    """A nested field back from its parallel arrays; None when absent; ValueError when the
    arrays differ in length."""
    columns = [attributes.get(attr) for attr in ARRAYS[name]]
    if all(c is None for c in columns):
        return None
    lists = [list(c) if isinstance(c, (list, tuple)) else _json_list(c) for c in columns]
    if len({len(c) for c in lists}) != 1:
        raise ValueError(f"the arrays of {name} differ in length")
    if name == "tokens_by_version":
        return {str(v): n for v, n in zip(*lists, strict=True)}
    return [list(item) for item in zip(*lists, strict=True)]


def _json_list(value: Any) -> list[Any]:
    """A list attribute an SDK could only keep as JSON text (an empty one, say)."""
    decoded = json.loads(value) if isinstance(value, str) else None
    if not isinstance(decoded, list):
        raise ValueError(f"expected an array, got {value!r}")
    return decoded


def markdown_reference() -> str:
    """The span conventions as docs/schema.md shows them, rendered from :data:`SPANS`."""
    lines = [
        "| span | JSONL lines it becomes | span events |",
        "|---|---|---|",
    ]
    for span in SPANS.values():
        if span.single:
            becomes = f"`{span.single}` at its end"
        else:
            opens = " / ".join(f"`{k}`" for k in span.opens)
            closes = ", ".join(f"`{o}` → `{k}`" for o, k in span.closes.items())
            becomes = f"{opens} at its start; at its end by `rollout.outcome`: {closes}"
        events = "<br>".join(
            f"`{n}` → " + (f"`{k}` at its time" if k else "none (for viewing)")
            for n, k in span.span_events.items()
        )
        lines.append(f"| `{span.name}` | {becomes}. {span.doc} | {events or '—'} |")
    lines += [
        "",
        "| span | attribute | type | required by | JSONL field | of events |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows():
        required = ", ".join(f"`{k}`" for k in row.required_by) or "optional"
        events = ", ".join(f"`{k}`" for k in row.events)
        note = f" ({NOTES[row.attribute]})" if row.attribute in NOTES else ""
        lines.append(
            f"| `{row.span}` | `{row.attribute}` | {row.type} | {required} | `{row.field}`{note} "
            f"| {events} |"
        )
    lines += [
        "",
        "Any other `rollout.*` attribute of a span (one of another span's rows included) is "
        "a field of the span's last line: `rollout.loss` is `loss`.",
        "",
        "| attribute (any rollout span) | meaning |",
        "|---|---|",
    ]
    lines.append(f"| `{RUN_ATTRIBUTE}` | the run (else the resource's `service.instance.id`) |")
    lines += [f"| `{name}` | {doc} |" for name, doc in SPAN_ONLY.items()]
    lines += ["", "| span event | attribute | meaning |", "|---|---|---|"]
    for event, attributes in SPAN_EVENT_ATTRIBUTES.items():
        lines += [f"| `{event}` | `{name}` | {doc} |" for name, doc in attributes.items()]
    lines += ["", "| resource attribute | meaning |", "|---|---|"]
    lines += [f"| `{name}` | {doc} |" for name, doc in RESOURCE_ATTRIBUTES.items()]
    return "\n".join(lines) + "\n"
