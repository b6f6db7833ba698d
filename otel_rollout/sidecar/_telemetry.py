"""Spans and metrics made from a file's events, for every run in it, outside the trainer.

The same :class:`~otel_rollout.spans.SpanBuilder` and
:class:`~otel_rollout.metrics.MetricsExporter` as the in-process pipeline, so
a span or a gauge made here equals one made live.  What differs is where the
work happens and how spans leave: no SDK batch queue that drops when full, but
a :class:`SpanShipper` whose bounded hand-off blocks the file reader instead.
The file is the buffer; a slow collector makes the sidecar lag, never lose.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from queue import Full, Queue
from typing import Any

from opentelemetry.context import Context
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricReader
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SpanExporter

from .. import _providers, config
from ..live_age import LiveBatchAge
from ..metrics import MetricsExporter
from ..otel import OtelSettings
from ..spans import SpanBuilder
from ..trackers import hub_for
from . import _otlp
from ._scrape import ServedRun, SpanCounts

__all__ = ["CollectingProcessor", "SpanShipper", "Telemetry"]

_log = logging.getLogger("otel_rollout")

#: Spans per export request: the SDK's default batch.  The sidecar's encoding competes
#: with nothing of the trainer's, so there is no reason for the live path's 128.
EXPORT_BATCH = 512
#: Batches waiting for the exporter thread before the file reader waits for it.
_QUEUED_BATCHES = 64


class CollectingProcessor(SpanProcessor):
    """Keeps ended spans until the sidecar's loop takes them: no timer, no queue to overflow."""

    def __init__(self) -> None:
        self._ended: list[Any] = []

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        pass

    def on_end(self, span: Any) -> None:  # a ReadableSpan, or a LightSpan
        self._ended.append(span)

    def take(self) -> list[Any]:
        """The spans ended since the last call."""
        spans, self._ended = self._ended, []
        return spans

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return True


class SpanShipper:
    """Exports spans on its own thread, ``EXPORT_BATCH`` at a time, counting every result.

    :meth:`submit` blocks while ``_QUEUED_BATCHES`` batches wait, so memory is
    bounded and nothing is dropped: the caller (the file reader) slows down.
    """

    def __init__(
        self,
        exporter: SpanExporter,
        encode: Callable[[list[Any]], Any] | None = None,
        run_of: Callable[[Any], Any] = lambda span: span.resource.attributes.get(
            "service.instance.id"
        ),
    ) -> None:
        self.counting = _providers.CountingSpanExporter(exporter)
        self._run_of = run_of  # a span → its run's ID
        self._encode = encode  # spans → what the exporter takes (an EncodedBatch), if not SDK spans
        self._queue: Queue[Any] = Queue(maxsize=_QUEUED_BATCHES)
        #: Spans sent and not sent, by run (``service.instance.id``): a batch holds any runs'
        #: spans, and a trainer's close asks for its own.  Read after :meth:`flush`.
        self.sent_by_run: Counter[str] = Counter()
        self.failed_by_run: Counter[str] = Counter()
        self._thread = threading.Thread(target=self._run, name="otel-rollout-ship", daemon=True)
        self._thread.start()

    @property
    def sent(self) -> int:
        return self.counting.exported

    @property
    def failed(self) -> int:
        return self.counting.failed

    def submit(self, spans: list[ReadableSpan]) -> None:
        for i in range(0, len(spans), EXPORT_BATCH):
            self._queue.put(spans[i : i + EXPORT_BATCH])

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every span submitted before this call has been exported (or refused)."""
        done = threading.Event()
        try:
            self._queue.put(done, timeout=timeout)
        except Full:
            return False
        return done.wait(timeout)

    def close(self, timeout: float | None = None) -> None:
        """Export what is queued (within ``timeout``), then stop."""
        if self.flush(timeout):
            self._queue.put(None)
            self._thread.join(timeout)
        else:
            _log.warning("otel-rollout: spans still queued after %ss are not sent", timeout)
        self.counting.shutdown()

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            if isinstance(item, threading.Event):
                item.set()
                continue
            # Nothing may end this thread: a flush() waits on it (a trainer's close, at most
            # its timeout; the sidecar's own end, for good).
            runs: Counter[str] = Counter()
            try:
                runs.update(map(self._run_of, item))
                batch = self._encode(item) if self._encode is not None else item
            except Exception:  # a span the encoder cannot take: count the batch, go on
                _log.exception("otel-rollout: %d spans could not be encoded", len(item))
                self.counting.failed += len(item)
                self.failed_by_run.update(runs)
                continue
            before = self.counting.exported
            self.counting.export(batch)  # (counts what it cannot send; never raises)
            (self.sent_by_run if self.counting.exported > before else self.failed_by_run).update(
                runs
            )


@dataclass
class _Run:
    """One run's providers and state."""

    run_id: str
    tracer_provider: TracerProvider | None = None
    tracer: Any = None
    meter_provider: MeterProvider | None = None
    metrics: MetricsExporter | None = None
    push_readers: list[MetricReader] = field(default_factory=list)
    #: Its metrics as a scrape would see them (a private registry: see Telemetry._serve).
    scrape: Any = None
    prometheus: bool = False  # this run's metrics are the ones the scrape endpoint serves
    ended: bool = False
    spans_made: int = 0  # spans started from this run's events
    start: dict[str, Any] = field(default_factory=dict)  # its run.start event, once seen


class Telemetry:
    """Spans and metrics for every run of a file, as ``chosen`` asks.

    ``prometheus_registry`` (a ``prometheus_client.CollectorRegistry`` being
    served) receives the metrics of one run at a time: the newest, once the
    one before it has ended, so a scrape never sees two runs' series at once
    and the endpoint keeps serving the last run's values after it stops.
    """

    def __init__(
        self,
        chosen: OtelSettings,
        prometheus_registry: Any = None,
        *,
        end_other_runs: bool = False,
        path: Path | None = None,
        start: int = 0,
    ) -> None:
        self.chosen = chosen
        #: The experiment trackers the specs name, fed the same events (the log's runs before
        #: ``start``, the byte this sidecar follows from, are read once for the restore rows);
        #: None without specs or path.
        self.trackers = hub_for(chosen.trackers, path, start) if path and chosen.trackers else None
        self.runs: dict[str, _Run] = {}
        self.events = 0
        self._registry = prometheus_registry
        self._live_age = LiveBatchAge()  # shared: a resumed run trains groups sealed before
        self._processor = CollectingProcessor()
        self._run_by_resource: dict[bytes, str] = {}  # a LightTracer's encoded resource → run
        self._family: dict[str, str] = {}  # a forked child's run_id → its first ancestor's
        self.shipper: SpanShipper | None = None
        self.builder: SpanBuilder | None = None
        #: OTLP spans are LightSpans encoded by hand (_otlp.py); the console gets SDK spans.
        self._light = chosen.traces == "otlp"
        if chosen.traces != "none":
            if self._light:
                exporter = _providers.otlp_span_exporter(chosen)
                _otlp.send_pre_encoded(sys.modules[type(exporter).__module__])
                self.shipper = SpanShipper(
                    exporter,
                    lambda spans: _otlp.EncodedBatch(spans, _providers.SCOPE),
                    lambda span: self._run_by_resource.get(span.resource),
                )
            else:
                self.shipper = SpanShipper(ConsoleSpanExporter())
            self.builder = SpanBuilder(self._tracer_for, end_other_runs=end_other_runs)
        self._wants_metrics = bool(chosen.metrics)
        self._served: _Run | None = None  # the run whose metrics the endpoint serves
        if prometheus_registry is not None:
            prometheus_registry.register(ServedRun(self._served_registry))
            if self.shipper is not None:
                prometheus_registry.register(
                    SpanCounts(lambda: (self.spans_made, self.spans_sent, self.spans_failed))
                )

    # Runs.

    def _run(self, run_id: str) -> _Run:
        run = self.runs.get(run_id)
        if run is None:
            run = self.runs[run_id] = _Run(run_id)
        return run

    def _tracer_for(self, run_id: str) -> Any:
        run = self.runs.get(run_id)
        if run is not None and run.tracer is not None:
            return run.tracer  # get_tracer compares scopes each call: a quarter of the work
        run = self._run(run_id)
        resource = _providers.resource(run_id, self.chosen)
        if self._light:
            run.tracer = _otlp.LightTracer(dict(resource.attributes), self._processor.on_end)
            self._run_by_resource[run.tracer.resource] = run_id
        else:
            run.tracer_provider = TracerProvider(resource=resource, shutdown_on_exit=False)
            run.tracer_provider.add_span_processor(self._processor)
            run.tracer = run.tracer_provider.get_tracer(_providers.SCOPE)
        return run.tracer

    def _metrics_for(self, run: _Run) -> MetricsExporter:
        if run.metrics is None:
            readers: list[MetricReader] = _providers.push_metric_readers(self.chosen)
            run.push_readers = list(readers)
            if self._registry is not None:
                # Every run's metrics are kept scrapable in a registry of its own; the
                # endpoint serves one of them (_scrape.ServedRun), so that a run that starts while
                # the one served is alive can take over when it ends, its values intact.
                from opentelemetry.exporter.prometheus import PrometheusMetricReader
                from prometheus_client import CollectorRegistry

                run.scrape = CollectorRegistry(auto_describe=False)
                readers.append(PrometheusMetricReader(registry=run.scrape))
            run.meter_provider = _providers.meter_provider(run.run_id, self.chosen, readers)
            meter = run.meter_provider.get_meter(_providers.SCOPE)
            run.metrics = MetricsExporter(meter, live=self._live_age)
            served = self._served
            if run.scrape is not None and (served is None or served.ended):
                self._serve(run)
        return run.metrics

    def _serve(self, run: _Run) -> None:
        """Let the scrape endpoint serve ``run`` (the newest run, once the one served ended)."""
        old, self._served = self._served, run
        run.prometheus = True
        if old is not None and old is not run:
            old.prometheus = False
        self._retire_stale()

    def _served_registry(self) -> Any:
        """The registry of the run served, if any (asked at each scrape, on its thread)."""
        served = self._served
        return served.scrape if served is not None else None

    def _retire_stale(self) -> None:
        """Retire every ended run whose metrics no scrape will show: all but the one served
        and the newest (served next, once the one served ends)."""
        newest = self._newest_with_metrics()
        for run in list(self.runs.values()):
            kept = run is newest or run is self._served
            if run.ended and run.meter_provider is not None and not kept:
                self._retire(run)

    def _retire(self, run: _Run) -> None:
        """Shut an ended run's meter provider down (a last push; off the scrape endpoint)."""
        if run is self._served:
            self._served = None
        if run.meter_provider is not None:
            run.meter_provider.shutdown()
        run.meter_provider, run.metrics, run.prometheus, run.scrape = None, None, False, None

    # Events in.

    def export(self, events: Sequence[dict[str, Any]]) -> None:
        """Make the spans and metric updates of ``events`` (one run's or many, in file order)."""
        self.events += len(events)
        if self.trackers is not None:
            self.trackers.export(events)
        family = self._family
        for event in events:
            if event.get("event") == "run.start" and event.get("run_id").__class__ is str:
                self._run(event["run_id"]).start = event
                parent = event.get("parent_run_id")
                if parent.__class__ is str and event["run_id"] not in family:
                    family[event["run_id"]] = family.get(parent, parent)
        builder, metrics = self.builder, self._wants_metrics
        i, n = 0, len(events)
        while i < n:  # one export call per stretch of one run's events
            run_id = events[i].get("run_id")
            j = i + 1
            while j < n and events[j].get("run_id") == run_id:
                j += 1
            run = self._run(run_id) if run_id.__class__ is str else None
            if builder is not None:
                before = builder.spans_started
                builder.export(events[i:j])
                if run is not None:  # each run's own count, for its trainer's close
                    run.spans_made += builder.spans_started - before
            if metrics and run is not None:
                # A forked child's metrics are its first ancestor's run's, as every reader of
                # the file counts them (its spans keep its own run_id, as its trainer's).
                root = family.get(run.run_id)
                counted = self._run(root) if root is not None else run
                if not counted.ended:
                    self._metrics_for(counted).export(events[i:j])
            i = j
        self.ship()

    def ship(self) -> None:
        """Hand the spans ended so far to the exporter thread."""
        if self.shipper is not None:
            spans = self._processor.take()
            if spans:
                self.shipper.submit(spans)

    def end_run(self, run_id: str, reason: str) -> None:
        """End what ``run_id`` left open (``rollout.ended_by=reason``) and push its metrics."""
        run = self._run(run_id)
        if run.ended:
            return
        run.ended = True
        if self.trackers is not None:
            self.trackers.end_run(run_id)
        if self.builder is not None:
            self.builder.end_open_spans(reason=reason, run_id=run_id)
            self.ship()
        run.tracer_provider = run.tracer = None  # spans all ended; a late event makes a new one
        if run.meter_provider is None:
            return
        if run.scrape is None:  # pushed only: its last push is its provider's shutdown
            self._retire(run)
            return
        newest = self._newest_with_metrics()
        if run.prometheus and newest is not None and newest is not run:
            self._serve(newest)  # a later run began meanwhile: it is served now, this retired
            return
        if run.prometheus or run is newest:
            # Kept: the scrape endpoint serves its values (or will, if the run served ends
            # before it).  Its last push now; not the provider's force_flush: that would
            # queue a second copy of every series in the Prometheus reader, and the next
            # scrape would show both.
            for reader in run.push_readers:
                reader.force_flush()
        self._retire_stale()

    def _newest_with_metrics(self) -> _Run | None:
        """The run that began last in the file among those whose metrics are kept."""
        return next((r for r in reversed(self.runs.values()) if r.meter_provider), None)

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every span made so far has been exported (or refused)."""
        self.ship()
        flushed = self.shipper.flush(timeout) if self.shipper is not None else True
        if self.trackers is not None:
            # Half the trainer's close timeout: a hung tracker must not keep the trainer from
            # hearing the counts (it waits for them that long at most).
            limit = config.CLOSE_TIMEOUT.resolve() / 2
            flushed = self.trackers.flush(limit if timeout is None else timeout) and flushed
        return flushed

    def open_runs(self) -> list[str]:
        return [r.run_id for r in self.runs.values() if not r.ended]

    def finish(self, reason: str, timeout: float | None = None) -> None:
        """End every run still open, export everything (within ``timeout`` seconds), shut
        every provider down."""
        for run_id in self.open_runs():
            self.end_run(run_id, reason)
        if self.shipper is not None:
            self.shipper.close(timeout)
        if self.trackers is not None:
            self.trackers.close(config.CLOSE_TIMEOUT.resolve() if timeout is None else timeout)
        for run in self.runs.values():
            self._retire(run)

    # Counts.

    @property
    def spans_made(self) -> int:
        return self.builder.spans_started if self.builder is not None else 0

    @property
    def spans_sent(self) -> int:
        return self.shipper.sent if self.shipper is not None else 0

    @property
    def spans_failed(self) -> int:
        return self.shipper.failed if self.shipper is not None else 0
