"""Build the OpenTelemetry SDK objects that :mod:`otel_rollout.otel` settings ask for."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from typing import Any

from opentelemetry.context import Context
from opentelemetry.sdk.environment_variables import OTEL_BSP_MAX_QUEUE_SIZE
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    ConsoleMetricExporter,
    MetricExporter,
    MetricExportResult,
    MetricReader,
    MetricsData,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.metrics.view import View
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor, TracerProvider
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
        if str(detected.attributes.get("service.name", "")).startswith("unknown_service"):
            detected = detected.merge(Resource({"service.name": DEFAULT_SERVICE_NAME}))
        _detected[key] = detected
    return detected.merge(Resource({"service.instance.id": run_id}))


class CountingSpanExporter(SpanExporter):
    """Passes spans on; counts (and logs once) the ones the backend did not take."""

    def __init__(self, inner: SpanExporter) -> None:
        self.inner = inner
        self.taken = 0  # spans handed to export (out of the batch queue)
        self.exported = 0
        self.failed = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.taken += len(spans)
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


class BoundedSpanProcessor(SpanProcessor):
    """Hands ended spans to a batch processor while its queue has room, and counts the rest.

    The SDK's batch processor keeps no count of what it drops when its queue is
    full (it logs a warning per span).  Spans in its queue are those handed to
    it and not yet taken by its exporter (counted by ``counting``), so this
    wrapper keeps the queue from ever filling and counts each span it turns
    away.  Taken is counted when ``export`` starts, just after the SDK empties
    the queue into the batch: at worst a span is turned away a moment early.
    """

    def __init__(self, counting: CountingSpanExporter, capacity: int, **options: Any) -> None:
        self.counting = counting
        self.capacity = capacity
        self.inner = BatchSpanProcessor(counting, max_queue_size=capacity, **options)
        self.handed = 0
        self.dropped = 0

    @property
    def queued(self) -> int:
        """Spans handed on whose export has not ended: in the queue, or being sent."""
        return self.handed - self.counting.exported - self.counting.failed

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        self.inner.on_start(span, parent_context)

    def on_end(self, span: ReadableSpan) -> None:
        if self.handed - self.counting.taken >= self.capacity:
            self.dropped += 1
            if self.dropped == 1:
                _log.warning(
                    "otel-rollout: the span queue is full (%d, OTEL_BSP_MAX_QUEUE_SIZE); "
                    "dropping spans, counted, not logged one by one",
                    self.capacity,
                )
            return
        self.handed += 1
        self.inner.on_end(span)

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return self.inner.force_flush(timeout_millis)


def _span_queue_size() -> int:
    """The batch queue's size: ``OTEL_BSP_MAX_QUEUE_SIZE``, or the SDK's default of 2048."""
    raw = os.environ.get(OTEL_BSP_MAX_QUEUE_SIZE, "").strip()
    try:
        size = int(raw) if raw else 2048
    except ValueError:
        size = 0
    if size <= 0:
        _log.warning("ignoring %s=%r; using 2048", OTEL_BSP_MAX_QUEUE_SIZE, raw)
        size = 2048
    return size


class CountingMetricExporter(MetricExporter):
    """Passes metric exports on; counts (and logs once) the ones that failed."""

    def __init__(self, inner: MetricExporter) -> None:
        # The periodic reader reads the exporter's preferences from these attributes.
        super().__init__(inner._preferred_temporality, inner._preferred_aggregation)
        self.inner = inner
        self.failed = 0

    def export(
        self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any
    ) -> MetricExportResult:
        try:
            result = self.inner.export(metrics_data, timeout_millis=timeout_millis, **kwargs)
        except Exception as exc:  # an exporter bug must not stop the periodic reader
            _log.warning("otel-rollout: metric export raised %s", exc)
            result = MetricExportResult.FAILURE
        if result is not MetricExportResult.SUCCESS:
            if not self.failed:
                _log.warning("otel-rollout: metrics could not be exported; counting the failures")
            self.failed += 1
        return result

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return self.inner.force_flush(timeout_millis)

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        self.inner.shutdown(timeout_millis=timeout_millis, **kwargs)


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
    capacity = _span_queue_size()
    batch = _live_batch_size()  # no bigger than the queue, which the SDK would refuse
    batch = None if batch is None else min(batch, capacity)
    processor = BoundedSpanProcessor(counting, capacity, max_export_batch_size=batch)
    owned.add_span_processor(processor)
    tracer = owned.get_tracer(SCOPE)

    def counts() -> dict[str, int]:
        return {
            "spans_sent": counting.exported,
            "spans_failed": counting.failed,
            "spans_dropped": processor.dropped,
            "spans_queued": processor.queued,
        }

    def shutdown() -> None:
        owned.shutdown()
        if processor.dropped or counting.failed or processor.queued:
            _log.warning(
                "otel-rollout: spans: %d sent, %d not accepted, %d dropped (batch queue full), "
                "%d queued at close",
                counting.exported,
                counting.failed,
                processor.dropped,
                processor.queued,
            )

    return SpanBuilder(lambda _: tracer, on_shutdown=shutdown, counts=counts)


def push_metric_readers(
    chosen: OtelSettings, counted: list[CountingMetricExporter] | None = None
) -> list[MetricReader]:
    """The readers that push metrics (OTLP, console) as ``chosen`` asks; none for Prometheus.
    Each exporter is wrapped to count failed exports, and the wrappers added to ``counted``."""
    readers: list[MetricReader] = []
    wrapped: list[CountingMetricExporter] = [] if counted is None else counted
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
        wrapped.append(CountingMetricExporter(exporter))
        readers.append(PeriodicExportingMetricReader(wrapped[-1]))
    if "console" in chosen.metrics:
        wrapped.append(CountingMetricExporter(ConsoleMetricExporter()))
        readers.append(PeriodicExportingMetricReader(wrapped[-1]))
    return readers


def _metric_readers(
    chosen: OtelSettings, counted: list[CountingMetricExporter]
) -> tuple[list[MetricReader], Callable[[], None]]:
    readers = push_metric_readers(chosen, counted)
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
    counted: list[CountingMetricExporter] = []
    readers, stop_servers = _metric_readers(chosen, counted)
    owned = meter_provider(run_id, chosen, readers)

    def shutdown() -> None:
        owned.shutdown()
        stop_servers()

    def counts() -> dict[str, int]:
        return {"metric_exports_failed": sum(c.failed for c in counted)}

    return MetricsExporter(owned.get_meter(SCOPE), on_shutdown=shutdown, counts=counts)


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
