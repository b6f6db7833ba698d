"""The sidecar's hand-written OTLP encoding against the SDK's, on the same events."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_rollout._receiver import _attrs
from otel_rollout.reader import read_events
from otel_rollout.sidecar._otlp import LightTracer, encode_request
from otel_rollout.spans import SpanBuilder

RESOURCE = {"service.name": "otel-rollout", "service.instance.id": "run-1", "n": 3, "ok": True}


def sdk_request(events: list[dict[str, Any]]) -> ExportTraceServiceRequest:
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource(RESOURCE))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("otel_rollout")
    builder = SpanBuilder(lambda _: tracer)
    builder.export(events)
    builder.end_open_spans("run.stopped")
    return encode_spans(memory.get_finished_spans())


def light_request(events: list[dict[str, Any]]) -> ExportTraceServiceRequest:
    ended: list[Any] = []
    tracer = LightTracer(RESOURCE, ended.append)
    builder = SpanBuilder(lambda _: tracer)  # type: ignore[arg-type, return-value]
    builder.export(events)
    builder.end_open_spans("run.stopped")
    return ExportTraceServiceRequest.FromString(encode_request(ended, "otel_rollout"))


def described(request: ExportTraceServiceRequest) -> list[tuple]:
    """Every span as plain values, with IDs replaced by the names of what they point at."""
    spans = [
        (rs, span)
        for rs in request.resource_spans
        for ss in rs.scope_spans
        for span in ss.spans
        if ss.scope.name == "otel_rollout"
    ]
    names: dict[bytes, tuple] = {}
    for _, span in spans:
        a = _attrs(span.attributes)
        names[span.span_id] = (span.name, a.get("rollout.attempt_id") or a.get("rollout.group_id"))
    out = []
    for rs, span in spans:
        out.append(
            (
                tuple(sorted(_attrs(rs.resource.attributes).items())),
                span.name,
                span.kind,
                span.start_time_unix_nano,
                span.end_time_unix_nano,
                tuple(sorted((k, repr(v)) for k, v in _attrs(span.attributes).items())),
                names.get(span.parent_span_id),
                len(span.trace_id),
                tuple(
                    (e.name, e.time_unix_nano, tuple(sorted(_attrs(e.attributes).items())))
                    for e in span.events
                ),
                tuple(sorted(names.get(link.span_id, ("?",)) for link in span.links)),
                (span.status.code, span.status.message),
                span.flags,
            )
        )
    return sorted(out, key=repr)


@pytest.fixture(scope="module")
def simulated(tmp_path_factory) -> list[dict[str, Any]]:
    from otel_rollout.cli import run

    log_dir = tmp_path_factory.mktemp("sim")
    args = ["simulate", "--log-dir", str(log_dir), "--quiet", "--steps", "6", "--speed", "50"]
    assert run([*args, "--error-rate", "0.2"]) == 0
    return list(read_events(log_dir / "rollout_trace.jsonl"))


def test_a_simulated_run_encodes_as_the_sdk_encodes_it(simulated):
    """Groups, attempts with refit events and error status, train steps with links, syncs
    and checkpoints: every field of every span is what the SDK's encoder writes."""
    sdk, light = described(sdk_request(simulated)), described(light_request(simulated))
    assert len(light) > 100
    assert light == sdk


values = st.one_of(
    st.text(max_size=20),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=False),
    st.lists(st.integers(min_value=-(2**63), max_value=2**63 - 1), max_size=4),
    st.lists(st.text(max_size=5), max_size=4),
)


@given(fields=st.dictionaries(st.from_regex(r"[a-z_]{1,12}", fullmatch=True), values, max_size=8))
def test_any_attribute_values_encode_as_the_sdk_encodes_them(fields):
    """Strings, booleans, 64-bit integers, floats and lists of them, as attributes."""
    fields = {k: v for k, v in fields.items() if k not in ("t", "event", "run_id", "checkpoint")}
    event = {"t": 1.5, "run_id": "run-1", "event": "checkpoint.publish", **fields}
    results = [described(make([event])) for make in (sdk_request, light_request)]
    assert results[0] == results[1]
