"""A minimal OTLP receiver (gRPC or HTTP/protobuf) on 127.0.0.1, for tests.

It speaks the wire protocol a collector speaks, keeps what arrives decoded,
and answers success, so an exporter under test cannot tell it from a real
collector.  Exposed as :class:`otel_rollout.testing.OtlpReceiver`.
"""

from __future__ import annotations

import gzip
import threading
import time
from collections.abc import Callable
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc


def _attrs(key_values: Any) -> dict[str, Any]:
    out = {}
    for kv in key_values:
        which = kv.value.WhichOneof("value")
        value = getattr(kv.value, which) if which else None
        if which == "array_value" and value is not None:
            value = [getattr(v, v.WhichOneof("value")) for v in value.values]
        out[kv.key] = value
    return out


class OtlpReceiver:
    """Receives OTLP spans and metrics on ``endpoint`` until closed.

    ``protocol`` is ``"grpc"`` or ``"http/protobuf"``; with ``keep=False`` it only
    counts spans (``span_count``), for long benchmarks.  For fault tests, ``delay``
    makes every answer wait that many seconds, and ``fail=True`` refuses every
    export with the retryable error a busy collector gives (gRPC UNAVAILABLE,
    HTTP 503), counting the refusals in ``refused``.  ``spans()`` gives
    ``(resource_attributes, span)`` pairs (``span`` is the protobuf message);
    ``metric_points(name)`` gives the data points of one metric.  ``lags`` holds,
    for every span received, the seconds from its end time to its arrival here.
    """

    def __init__(
        self,
        protocol: str = "grpc",
        *,
        keep: bool = True,
        delay: float = 0.0,
        fail: bool = False,
    ) -> None:
        self.protocol = protocol
        self.keep = keep
        self.delay = delay
        self.fail = fail
        self.refused = 0
        self.span_count = 0
        self.lags: list[float] = []
        self.trace_requests: list[trace_service_pb2.ExportTraceServiceRequest] = []
        self.metric_requests: list[metrics_service_pb2.ExportMetricsServiceRequest] = []
        self._lock = threading.Lock()
        if protocol == "grpc":
            self._start_grpc()
        elif protocol == "http/protobuf":
            self._start_http()
        else:
            raise ValueError(f"unknown OTLP protocol {protocol!r}")
        self.endpoint = f"http://127.0.0.1:{self.port}"

    def _accepts(self) -> bool:
        """Wait ``delay``, then say whether to accept (False: answer with an error)."""
        if self.delay:
            time.sleep(self.delay)
        if self.fail:
            with self._lock:
                self.refused += 1
        return not self.fail

    def _keep(self, store: list[Any], message: Any) -> None:
        with self._lock:
            if store is self.trace_requests:
                now = time.time_ns()
                for rs in message.resource_spans:
                    for ss in rs.scope_spans:
                        self.span_count += len(ss.spans)
                        self.lags += [(now - s.end_time_unix_nano) / 1e9 for s in ss.spans]
            if self.keep:
                store.append(message)

    def _start_grpc(self) -> None:
        import grpc

        receiver = self

        class Traces(trace_service_pb2_grpc.TraceServiceServicer):
            def Export(self, request: Any, context: Any) -> Any:
                if not receiver._accepts():
                    context.abort(grpc.StatusCode.UNAVAILABLE, "refusing (a fault test)")
                receiver._keep(receiver.trace_requests, request)
                return trace_service_pb2.ExportTraceServiceResponse()

        class Metrics(metrics_service_pb2_grpc.MetricsServiceServicer):
            def Export(self, request: Any, context: Any) -> Any:
                if not receiver._accepts():
                    context.abort(grpc.StatusCode.UNAVAILABLE, "refusing (a fault test)")
                receiver._keep(receiver.metric_requests, request)
                return metrics_service_pb2.ExportMetricsServiceResponse()

        self._grpc = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Traces(), self._grpc)
        metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(Metrics(), self._grpc)
        self.port = self._grpc.add_insecure_port("127.0.0.1:0")
        self._grpc.start()
        self._stop: Callable[[], None] = lambda: self._grpc.stop(grace=None)

    def _start_http(self) -> None:
        receiver = self
        routes: dict[str, tuple[Any, Any, list[Any]]] = {
            "/v1/traces": (
                trace_service_pb2.ExportTraceServiceRequest,
                trace_service_pb2.ExportTraceServiceResponse,
                receiver.trace_requests,
            ),
            "/v1/metrics": (
                metrics_service_pb2.ExportMetricsServiceRequest,
                metrics_service_pb2.ExportMetricsServiceResponse,
                receiver.metric_requests,
            ),
        }

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                route = routes.get(self.path)
                if route is None:
                    self.send_error(404)
                    return
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                request_type, response_type, store = route
                if not receiver._accepts():
                    self.send_error(503)
                    return
                receiver._keep(store, request_type.FromString(body))
                payload = response_type().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args: Any) -> None:
                pass

        self._http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self._http.server_address[1]
        threading.Thread(target=self._http.serve_forever, daemon=True).start()

        def stop() -> None:
            self._http.shutdown()
            self._http.server_close()

        self._stop = stop

    def spans(self) -> list[tuple[dict[str, Any], Any]]:
        """Every span received, with its resource's attributes."""
        with self._lock:
            requests = list(self.trace_requests)
        return [
            (_attrs(rs.resource.attributes), span)
            for request in requests
            for rs in request.resource_spans
            for ss in rs.scope_spans
            for span in ss.spans
        ]

    def metric_points(self, name: str) -> list[tuple[dict[str, Any], Any]]:
        """Every data point received for metric ``name``, with its resource's attributes."""
        with self._lock:
            requests = list(self.metric_requests)
        points = []
        for request in requests:
            for rm in request.resource_metrics:
                for sm in rm.scope_metrics:
                    for metric in sm.metrics:
                        if metric.name == name:
                            data = getattr(metric, metric.WhichOneof("data"))
                            points += [
                                (_attrs(rm.resource.attributes), p) for p in data.data_points
                            ]
        return points

    def close(self) -> None:
        self._stop()

    def __enter__(self) -> OtlpReceiver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @staticmethod
    def attributes(span: Any) -> dict[str, Any]:
        """A protobuf span's (or event's, or data point's) attributes as a dict."""
        return _attrs(span.attributes)
