"""Build the OpenTelemetry SDK objects that :mod:`otel_rollout.otel` settings ask for."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from typing import Any

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    ConsoleMetricExporter,
    MetricReader,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.metrics.view import View
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SpanExporter,
    SpanExportResult,
)

from .exporters import EventExporter
from .metrics import MetricsExporter
from .otel import DEFAULT_SERVICE_NAME, OtelSettings
from .spans import SpanBuilder

_log = logging.getLogger("otel_rollout")

SCOPE = "otel_rollout"


#: Detected resources by settings: detection runs once per process (and not again in a
#: forked child, where the SDK's detector thread pool can deadlock).
_detected: dict[str, Resource] = {}


def resource(run_id: str, chosen: OtelSettings) -> Resource:
    """``service.instance.id`` = the run; ``service.name`` and OTEL_RESOURCE_ATTRIBUTES as set."""
    attrs: dict[str, Any] = dict(chosen.resource_attributes)
    if chosen.service_name:
        attrs["service.name"] = chosen.service_name
    environment = [os.environ.get(v) for v in ("OTEL_RESOURCE_ATTRIBUTES", "OTEL_SERVICE_NAME")]
    key = repr((sorted(attrs.items(), key=lambda kv: kv[0]), environment))
    detected = _detected.get(key)
    if detected is None:
        detected = Resource.create(attrs)
        if detected.attributes.get("service.name", "").startswith("unknown_service"):
            detected = detected.merge(Resource({"service.name": DEFAULT_SERVICE_NAME}))
        _detected[key] = detected
    return detected.merge(Resource({"service.instance.id": run_id}))


class _QueueFullDrops(logging.Filter):
    """Counts the SDK batch processor's "Queue full, dropping" warnings, letting one through.

    The SDK keeps no count of the spans it drops when its queue is full; it logs
    a warning per span, which would flood a training job's log under overload.
    """

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if not str(record.msg).startswith("Queue full, dropping"):
            return True
        self.count += 1
        if self.count == 1:
            record.msg = "Queue full, dropping %s (further drops are counted, not logged)."
            return True
        return False


QUEUE_FULL_DROPS = _QueueFullDrops()
# First in line: the SDK's own DuplicateFilter would hide repeats from a filter after it.
logging.getLogger("opentelemetry.sdk._shared_internal").filters.insert(0, QUEUE_FULL_DROPS)


class CountingSpanExporter(SpanExporter):
    """Passes spans on; counts (and logs once) the ones the backend did not take."""

    def __init__(self, inner: SpanExporter) -> None:
        self.inner = inner
        self.exported = 0
        self.failed = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        try:
            result = self.inner.export(spans)
        except Exception as exc:  # an exporter bug must not stop the batch processor
            _log.warning("otel-rollout: span export raised %s", exc)
            result = SpanExportResult.FAILURE
        if result is SpanExportResult.SUCCESS:
            self.exported += len(spans)
        else:
            if not self.failed:
                _log.warning("otel-rollout: spans could not be exported; dropping and counting")
            self.failed += len(spans)
        return result

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return self.inner.force_flush(timeout_millis)


def otlp_span_exporter(chosen: OtelSettings) -> SpanExporter:
    if chosen.protocol == "http/protobuf":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        endpoint = _http_endpoint(chosen.endpoint, "traces")
        return OTLPSpanExporter(endpoint=endpoint)
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
        OTLPSpanExporter as GrpcSpanExporter,
    )

    return GrpcSpanExporter(endpoint=chosen.endpoint, insecure=_insecure(chosen.endpoint))


def _http_endpoint(endpoint: str | None, signal: str) -> str | None:
    if endpoint is None:
        return None  # the exporter reads OTEL_EXPORTER_OTLP_ENDPOINT and appends the path
    return endpoint.rstrip("/") + f"/v1/{signal}"


def _insecure(endpoint: str | None) -> bool | None:
    return None if endpoint is None else endpoint.startswith("http://")


#: Spans per OTLP request for a live trace.  Encoding a request holds the GIL; 512 (the
#: SDK's default) stalls the JSONL writer up to ~20 ms at 10k events/s, 128 about 2-4 ms,
#: with no span dropped at that rate (bench/README.md).  OTEL_BSP_MAX_EXPORT_BATCH_SIZE wins.
LIVE_EXPORT_BATCH = 128


def _live_batch_size() -> int | None:
    return None if os.environ.get("OTEL_BSP_MAX_EXPORT_BATCH_SIZE") else LIVE_EXPORT_BATCH


def span_builder(run_id: str, chosen: OtelSettings) -> SpanBuilder:
    """A span builder exporting through the user's provider or one of ours."""
    if chosen.tracer_provider is not None:
        provider = chosen.tracer_provider
        tracer = provider.get_tracer(SCOPE)
        return SpanBuilder(lambda _: tracer, on_shutdown=lambda: provider.force_flush())
    # Not shut down at exit by the SDK (which waits out the OTLP timeout on a hung collector):
    # the trace's own close does it, within OTEL_ROLLOUT_CLOSE_TIMEOUT.
    owned = TracerProvider(resource=resource(run_id, chosen), shutdown_on_exit=False)
    exporter = ConsoleSpanExporter() if chosen.traces == "console" else otlp_span_exporter(chosen)
    counting = CountingSpanExporter(exporter)
    owned.add_span_processor(BatchSpanProcessor(counting, max_export_batch_size=_live_batch_size()))
    tracer = owned.get_tracer(SCOPE)
    dropped_before = QUEUE_FULL_DROPS.count

    def shutdown() -> None:
        owned.shutdown()
        dropped = QUEUE_FULL_DROPS.count - dropped_before
        if dropped or counting.failed:
            _log.warning(
                "otel-rollout: spans: %d sent, %d dropped (batch queue full), %d not accepted",
                counting.exported,
                dropped,
                counting.failed,
            )

    builder = SpanBuilder(lambda _: tracer, on_shutdown=shutdown)
    builder.span_exporter = counting  # type: ignore[attr-defined]
    return builder


def push_metric_readers(chosen: OtelSettings) -> list[MetricReader]:
    """The readers that push metrics (OTLP, console) as ``chosen`` asks; none for Prometheus."""
    readers: list[MetricReader] = []
    if "otlp" in chosen.metrics:
        if chosen.protocol == "http/protobuf":
            from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

            exporter: Any = OTLPMetricExporter(endpoint=_http_endpoint(chosen.endpoint, "metrics"))
        else:
            from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import (
                OTLPMetricExporter as GrpcMetricExporter,
            )

            exporter = GrpcMetricExporter(
                endpoint=chosen.endpoint, insecure=_insecure(chosen.endpoint)
            )
        readers.append(PeriodicExportingMetricReader(exporter))
    if "console" in chosen.metrics:
        readers.append(PeriodicExportingMetricReader(ConsoleMetricExporter()))
    return readers


def _metric_readers(chosen: OtelSettings) -> tuple[list[MetricReader], Callable[[], None]]:
    readers = push_metric_readers(chosen)
    stops: list[Callable[[], None]] = []
    if "prometheus" in chosen.metrics:
        reader, stop = _prometheus_reader(chosen)
        if reader is not None:
            readers.append(reader)
            stops.append(stop)

    def stop_all() -> None:
        for stop in stops:
            stop()

    return readers, stop_all


def serve_prometheus(chosen: OtelSettings) -> tuple[Any, Callable[[], None]]:
    """A registry served on host:port (127.0.0.1 by default) and its stop; (None, no-op) if the
    port cannot be bound, which is logged."""
    from prometheus_client import CollectorRegistry, start_http_server

    registry = CollectorRegistry()
    try:
        served = start_http_server(
            chosen.prometheus_port, addr=chosen.prometheus_host, registry=registry
        )
    except OSError as exc:
        _log.error(
            "otel-rollout: cannot serve Prometheus metrics on %s:%d (%s); not serving them",
            chosen.prometheus_host,
            chosen.prometheus_port,
            exc,
        )
        return None, lambda: None
    server = served[0] if isinstance(served, tuple) else None

    def stop() -> None:
        if server is not None:
            server.shutdown()
            server.server_close()

    return registry, stop


def _prometheus_reader(chosen: OtelSettings) -> tuple[MetricReader | None, Callable[[], None]]:
    """A Prometheus reader with its own registry, served on host:port."""
    from opentelemetry.exporter.prometheus import PrometheusMetricReader

    registry, stop = serve_prometheus(chosen)
    if registry is None:
        return None, stop
    return PrometheusMetricReader(registry=registry), stop


def meter_provider(run_id: str, chosen: OtelSettings, readers: list[MetricReader]) -> MeterProvider:
    """A meter provider for one run, with the views that bound the rollout metrics' labels."""
    views = [
        View(instrument_name=name, attribute_keys={"outcome", "reason"})
        for name in ("rollout.attempts", "rollout.groups")
    ] + [
        View(instrument_name="rollout.tokens.trained", attribute_keys={"age"}),
        View(instrument_name="rollout.checkpoints", attribute_keys={"kind"}),
    ]
    return MeterProvider(
        resource=resource(run_id, chosen),
        metric_readers=readers,
        views=views,
        shutdown_on_exit=False,  # whoever made it shuts it down, within their timeout
    )


def metrics_exporter(run_id: str, chosen: OtelSettings) -> MetricsExporter:
    """A metrics exporter on the user's meter provider or one of ours."""
    if chosen.meter_provider is not None:
        provider = chosen.meter_provider
        return MetricsExporter(provider.get_meter(SCOPE), on_shutdown=provider.force_flush)
    readers, stop_servers = _metric_readers(chosen)
    owned = meter_provider(run_id, chosen, readers)

    def shutdown() -> None:
        owned.shutdown()
        stop_servers()

    return MetricsExporter(owned.get_meter(SCOPE), on_shutdown=shutdown)


def build_exporters(run_id: str, chosen: OtelSettings) -> list[EventExporter]:
    """The span builder and metrics exporter for one run, as ``chosen`` asks."""
    if not chosen.active:
        return []
    exporters: list[EventExporter] = []
    if chosen.traces != "none" or chosen.tracer_provider is not None:
        exporters.append(span_builder(run_id, chosen))
    if chosen.metrics or chosen.meter_provider is not None:
        exporters.append(metrics_exporter(run_id, chosen))
    return exporters
