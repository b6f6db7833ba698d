"""One rollout span as its JSONL lines, by the contract of :mod:`otel_rollout.span_contract`.

:func:`span_events` is the conversion :class:`~otel_rollout.span_exporter.JsonlSpanExporter`
makes of every span it takes; :class:`Malformed` is its refusal of a span whose attributes
cannot make a valid line.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan

from .events import from_object
from .schema import EVENTS
from .span_contract import (
    ARRAYS,
    RUN_ATTRIBUTE,
    SPAN_ONLY,
    SPANS,
    SpanConvention,
    attribute_name,
    decode_arrays,
    from_ns,
    rows,
)

__all__ = ["Malformed", "span_events"]

#: Per span, the attributes of its contract: the rest of its ``rollout.*`` go on its last
#: line (so a contract attribute of another span, ``rollout.tokens`` on a step, is kept).
_KNOWN = {
    name: frozenset({r.attribute for r in rows() if r.span == name} | {*SPAN_ONLY, RUN_ATTRIBUTE})
    for name in SPANS
}
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
    beyond = attrs.keys() - _KNOWN[convention.name]
    if out and beyond:  # fields beyond the contract: the last line keeps them, as readers do
        for key in beyond:
            if key.startswith("rollout."):
                value = _fitting(key, attrs[key])
                out[-1].setdefault(key[8:], list(value) if isinstance(value, tuple) else value)
    for event in out:
        # The readers' check (in C; by the validator's rules where C cannot take a value
        # from Python), whose words name what is wrong.
        error = from_object(event)[1]
        if error is not None:
            raise Malformed(error)
    return out
