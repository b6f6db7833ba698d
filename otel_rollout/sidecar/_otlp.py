"""Spans for the sidecar, encoded straight to OTLP protobuf bytes.

Measured on this project's event mix (bench/README.md), the SDK path costs
about 52 us an event to make ``Span`` objects and 85 us a span to encode
them (``encode_spans`` builds a protobuf message per attribute): at 10,000
events/s that is a whole core, which on a trainer's machine is a core taken
from the trainer.  Here :class:`LightTracer` makes :class:`LightSpan`
records (what :class:`~otel_rollout.spans.SpanBuilder` calls on a span, and
nothing else) and :func:`encode_request` writes the wire format by hand,
about 10 us a span.  The SDK's own OTLP exporters still send the result, so
every ``OTEL_EXPORTER_OTLP_*`` setting (headers, TLS, compression, timeout,
retries) applies as usual: :func:`send_pre_encoded` lets their encoder pass
an already encoded batch through.
"""

from __future__ import annotations

import random
import struct
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from opentelemetry import trace as otel_trace
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.trace import Link, SpanContext, Status, StatusCode, TraceFlags

__all__ = ["EncodedBatch", "LightSpan", "LightTracer", "encode_request", "send_pre_encoded"]

_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
#: Span flags as the SDK sets them (SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE: the parent is local).
_FLAGS = 0x100
_SPAN_FLAGS = b"\x85\x01" + struct.pack("<I", _FLAGS)  # field 16, fixed32
_STATUS_CODE = {StatusCode.UNSET: 0, StatusCode.OK: 1, StatusCode.ERROR: 2}


# The wire format: https://protobuf.dev/programming-guides/encoding/


def _varint_bytes(value: int) -> bytes:
    if value < 0:
        value += 1 << 64
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


# Encoding is mostly tags and short lengths: looking them up instead of computing them
# halves the cost of a span (a quarter of the time went to varints).
_SMALL = [_varint_bytes(i) for i in range(1 << 14)]
_TAG = [_varint_bytes(n << 3 | 2) for n in range(32)]  # length-delimited fields 0..31


def _varint(value: int) -> bytes:
    return _SMALL[value] if 0 <= value < 16384 else _varint_bytes(value)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited field (wire type 2)."""
    n = len(payload)
    return _TAG[number] + (_SMALL[n] if n < 16384 else _varint_bytes(n)) + payload


_U64 = (1 << 64) - 1


def _fixed64(number: int, value: int) -> bytes:
    """A fixed64 field; a time outside 0..2^64-1 (a negative or absurd ``t``) is clamped."""
    return _SMALL[number << 3 | 1] + struct.pack("<Q", min(max(value, 0), _U64))


_INT64 = range(-(2**63), 2**63)


def _any_value(value: Any) -> bytes:
    """AnyValue: string 1, bool 2, int 3, double 4, array 5."""
    cls = value.__class__
    if cls is str:
        return _field(1, value.encode("utf-8", "surrogatepass"))
    if cls is bool:
        return b"\x10\x01" if value else b"\x10\x00"
    if cls is int:
        return b"\x18" + _varint(value) if value in _INT64 else _field(1, str(value).encode())
    if cls is float:
        return b"\x21" + struct.pack("<d", value)
    if isinstance(value, (list, tuple)):
        return _field(5, b"".join(_field(1, _any_value(v)) for v in value))
    return _field(1, str(value).encode("utf-8", "surrogatepass"))


#: Encoded attribute fields by (field, key, type, value): a run's ID, outcomes, versions and
#: the like repeat on every span.  Cleared when full, so memory stays bounded.
_ENCODED: dict[tuple[int, str, type, Any], bytes] = {}
_ENCODED_MOST = 1 << 16
_HASHABLE = (str, int, bool)  # not floats: -0.0 == 0.0 would share an entry, NaN never hits


def _attribute(number: int, key: str, value: Any) -> bytes:
    """One attribute as field ``number``: a KeyValue (key 1, value 2)."""
    cls = value.__class__
    if cls not in _HASHABLE:
        return _field(number, _field(1, key.encode()) + _field(2, _any_value(value)))
    cache_key = (number, key, cls, value)
    encoded = _ENCODED.get(cache_key)
    if encoded is None:
        if len(_ENCODED) >= _ENCODED_MOST:
            _ENCODED.clear()
        kv = _field(1, key.encode()) + _field(2, _any_value(value))
        encoded = _ENCODED[cache_key] = _field(number, kv)
    return encoded


def _attributes(number: int, attributes: dict[str, Any]) -> bytes:
    return b"".join([_attribute(number, k, v) for k, v in attributes.items()])


class LightSpan(otel_trace.Span):
    """A span as :class:`~otel_rollout.spans.SpanBuilder` uses one; handed to ``on_end``.

    An ``opentelemetry.trace.Span``, so that a context holding it is its children's parent."""

    __slots__ = (
        "_context",
        "_on_end",
        "attributes",
        "end_time",
        "events",
        "links",
        "name",
        "parent_id",
        "resource",
        "span_id",
        "start",
        "status",
        "trace_id",
    )

    def __init__(
        self,
        name: str,
        resource: bytes,
        trace_id: int,
        parent_id: int | None,
        start: int,
        attributes: dict[str, Any],
        links: Sequence[Link],
        on_end: Callable[[LightSpan], None],
    ) -> None:
        self.name = name
        self.resource = resource
        self.trace_id = trace_id
        self.span_id = random.getrandbits(64) or 1
        self.parent_id = parent_id
        self.start = start
        self.end_time: int | None = None
        self.attributes = attributes
        self.events: list[tuple[str, int, dict[str, Any]]] = []
        self.links = links
        self.status: Status | None = None
        self._on_end = on_end
        self._context: SpanContext | None = None

    def get_span_context(self) -> SpanContext:
        if self._context is None:
            self._context = SpanContext(self.trace_id, self.span_id, False, _SAMPLED)
        return self._context

    def set_attribute(self, key: str, value: Any) -> None:
        self.attributes[key] = value

    def set_attributes(self, attributes: Mapping[str, Any]) -> None:
        self.attributes.update(attributes)

    def add_event(
        self, name: str, attributes: Mapping[str, Any] | None = None, timestamp: int | None = None
    ) -> None:
        self.events.append((name, timestamp or self.start, dict(attributes or {})))

    def set_status(self, status: Status | StatusCode, description: str | None = None) -> None:
        self.status = status if isinstance(status, Status) else Status(status, description)

    def is_recording(self) -> bool:
        return self.end_time is None

    def update_name(self, name: str) -> None:
        self.name = name

    def add_link(self, context: SpanContext, attributes: Any = None) -> None:
        self.links = [*self.links, Link(context, attributes)]

    def record_exception(self, exception: BaseException, *args: Any, **kwargs: Any) -> None:
        self.add_event("exception", {"exception.message": str(exception)})

    def end(self, end_time: int | None = None) -> None:
        if self.end_time is not None:
            return
        self.end_time = end_time if end_time is not None else self.start
        self._on_end(self)

    def encode(self) -> bytes:
        """This span as an OTLP ``Span`` message."""
        out = [
            _field(1, self.trace_id.to_bytes(16, "big")),
            _field(2, self.span_id.to_bytes(8, "big")),
        ]
        if self.parent_id:
            out.append(_field(4, self.parent_id.to_bytes(8, "big")))
        out.append(_field(5, self.name.encode()))
        out.append(b"\x30\x01")  # kind: INTERNAL
        out.append(_fixed64(7, self.start))
        out.append(_fixed64(8, self.end_time or self.start))
        out.append(_attributes(9, self.attributes))
        for name, t_ns, attrs in self.events:
            out.append(
                _field(11, _fixed64(1, t_ns) + _field(2, name.encode()) + _attributes(3, attrs))
            )
        for link in self.links:
            ctx = link.context
            body = _field(1, ctx.trace_id.to_bytes(16, "big")) + _field(
                2, ctx.span_id.to_bytes(8, "big")
            )
            out.append(_field(13, body + b"\x35" + struct.pack("<I", _FLAGS)))
        if self.status is not None and self.status.status_code is not StatusCode.UNSET:
            body = b""
            if self.status.description:
                body += _field(2, self.status.description.encode())
            body += b"\x18" + _varint(_STATUS_CODE[self.status.status_code])
            out.append(_field(15, body))
        out.append(_SPAN_FLAGS)
        return b"".join(out)


class LightTracer:
    """Starts :class:`LightSpan` s of one resource (one run); ended ones go to ``on_end``."""

    def __init__(
        self, resource_attributes: dict[str, Any], on_end: Callable[[LightSpan], None]
    ) -> None:
        self.resource = _attributes(1, resource_attributes)
        self._on_end = on_end

    def start_span(
        self,
        name: str,
        context: Any = None,
        attributes: dict[str, Any] | None = None,
        links: Sequence[Link] = (),
        start_time: int | None = None,
        **_: Any,
    ) -> LightSpan:
        parent = otel_trace.get_current_span(context) if context is not None else None
        parent_ctx = parent.get_span_context() if parent is not None else None
        if parent_ctx is not None and parent_ctx.is_valid:
            trace_id, parent_id = parent_ctx.trace_id, parent_ctx.span_id
        else:
            trace_id, parent_id = random.getrandbits(128) or 1, None
        return LightSpan(
            name,
            self.resource,
            trace_id,
            parent_id,
            start_time or 0,
            dict(attributes or {}),
            list(links),
            self._on_end,
        )


def encode_request(spans: Iterable[LightSpan], scope: str) -> bytes:
    """An ``ExportTraceServiceRequest``: the spans grouped by resource, one scope each."""
    by_resource: dict[bytes, list[bytes]] = {}
    for span in spans:
        by_resource.setdefault(span.resource, []).append(_field(2, span.encode()))
    scope_message = _field(1, _field(1, scope.encode()))
    return b"".join(
        _field(1, _field(1, resource) + _field(2, scope_message + b"".join(encoded)))
        for resource, encoded in by_resource.items()
    )


class EncodedBatch:
    """A batch of spans already encoded; the SDK's exporters count it by ``len``."""

    def __init__(self, spans: Sequence[LightSpan], scope: str) -> None:
        self.count = len(spans)
        self.request = ExportTraceServiceRequest.FromString(encode_request(spans, scope))

    def __len__(self) -> int:
        return self.count


def send_pre_encoded(module: Any) -> None:
    """Let ``module``'s ``encode_spans`` (the SDK exporter's) pass an :class:`EncodedBatch`
    through as it is; real spans are encoded by the SDK as before.  Done once per module."""
    original = module.encode_spans
    if getattr(original, "_passes_pre_encoded", False):
        return

    def encode_spans(spans: Any) -> Any:
        if isinstance(spans, EncodedBatch):
            return spans.request
        return original(spans)

    encode_spans._passes_pre_encoded = True  # type: ignore[attr-defined]  # a marker on the patched function
    module.encode_spans = encode_spans
