"""SpanBuilder: rollout lifecycles as spans, checked with the SDK's in-memory exporter."""

from __future__ import annotations

from collections import Counter
from fractions import Fraction

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from otel_rollout.reader import read_events
from otel_rollout.simulate import SimConfig, simulate
from otel_rollout.spans import SpanBuilder, attributes
from otel_rollout.testing import TraceBuilder
from otel_rollout.trace import RolloutTrace


def ns(t: float) -> int:
    """Nanoseconds the independent way: the exact product, rounded half up."""
    return int((Fraction(t) * 10**9 + Fraction(1, 2)) // 1)


def build(events):
    """Feed events to a SpanBuilder; return the finished spans."""
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    builder = SpanBuilder(lambda run_id: provider.get_tracer("test"))
    builder.export(events)
    builder.shutdown()
    return memory.get_finished_spans()


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    """A simulated run with a user TracerProvider: the spans it made and its file."""
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    log_dir = tmp_path_factory.mktemp("spans")
    config = SimConfig(steps=6, speed=15.0, seed=3, error_rate=0.2)
    result = simulate(log_dir, config, tracer_provider=provider)
    return memory.get_finished_spans(), list(read_events(result.trace_path))


class TestLiveRun:
    def test_one_group_span_per_reserved_group(self, live):
        """Every reserved group is one root span, ending at its seal or discard."""
        spans, events = live
        groups = {s.attributes["rollout.group_id"]: s for s in spans if s.name == "rollout.group"}
        reserved = {e["group_id"]: e for e in events if e["event"] == "group.reserve"}
        assert groups.keys() == reserved.keys()
        for gid, span in groups.items():
            assert span.parent is None and span.start_time == ns(reserved[gid]["t"])
            end = next(
                e
                for e in events
                if e.get("group_id") == gid and e["event"] in ("group.seal", "group.discard")
            )
            assert span.end_time == ns(end["t"])

    def test_attempts_are_children_of_their_group(self, live):
        """Each attempt span has its group's span as parent, in the group's trace."""
        spans, _ = live
        groups = {s.attributes["rollout.group_id"]: s for s in spans if s.name == "rollout.group"}
        attempts = [s for s in spans if s.name == "rollout.attempt"]
        assert attempts
        for a in attempts:
            group = groups[a.attributes["rollout.group_id"]]
            assert a.parent.span_id == group.context.span_id
            assert a.context.trace_id == group.context.trace_id

    def test_outcomes_and_error_status(self, live):
        """Attempts carry their outcome; failures (reason error) have an error status."""
        spans, events = live
        attempts = [s for s in spans if s.name == "rollout.attempt"]
        outcomes = Counter(s.attributes["rollout.outcome"] for s in attempts)
        assert outcomes["sealed"] == sum(e["event"] == "attempt.seal" for e in events)
        errors = [s for s in attempts if s.attributes.get("rollout.reason") == "error"]
        assert errors and all(s.status.status_code is StatusCode.ERROR for s in errors)
        sealed = [s for s in attempts if s.attributes["rollout.outcome"] == "sealed"]
        assert all(s.attributes["gen_ai.usage.output_tokens"] > 0 for s in sealed)

    def test_refits_are_events_on_the_attempts_they_paused(self, live):
        """Every cut of a sealed attempt's call is a refit event at the refit's time."""
        spans, events = live
        cut_calls = {str(c[0]) for e in events if e["event"] == "weights.sync" for c in e["cuts"]}
        refits = [(s, ev) for s in spans for ev in s.events if ev.name == "refit"]
        assert refits
        syncs = {e["new_version"]: e for e in events if e["event"] == "weights.sync"}
        for span, ev in refits:
            assert span.name == "rollout.attempt" and ev.attributes["rollout.call.id"] in cut_calls
            sync = syncs[ev.attributes["rollout.refit.new_version"]]
            assert ev.timestamp == ns(sync["t"] - sync["duration_s"])

    def test_train_steps_link_to_their_groups(self, live):
        """A train.step span links to the span of every group it trained."""
        spans, _ = live
        groups = {s.attributes["rollout.group_id"]: s for s in spans if s.name == "rollout.group"}
        steps = [s for s in spans if s.name == "rollout.train.step"]
        assert len(steps) == 6
        for s in steps:
            linked = {link.context.span_id for link in s.links}
            wanted = {groups[g].context.span_id for g in s.attributes["rollout.group_ids"]}
            assert linked == wanted and s.attributes["rollout.batch_age"] is not None

    def test_every_span_time_is_an_event_time(self, live):
        """Span starts and ends are the events' t (in ns), not the time the builder ran."""
        spans, events = live
        times = {ns(e["t"]) for e in events}
        times |= {ns(e["t"] - e.get("duration_s", 0)) for e in events if "duration_s" in e}
        for s in spans:
            assert s.start_time in times and s.end_time in times


class TestBuilder:
    def test_refused_attempt_is_a_span_of_no_duration(self):
        """An attempt refused before it ran still shows up, as an instant."""
        b = TraceBuilder()
        b.event("group.reserve", group_id="g", prompt_id=0, size=1, weight_version=0)
        b.event(
            "attempt.refuse",
            attempt_id="a",
            group_id="g",
            prompt_id=0,
            generation_index=0,
            reason="capacity",
        )
        (attempt,) = [s for s in build(b.events) if s.name == "rollout.attempt"]
        assert attempt.start_time == attempt.end_time
        assert attempt.attributes["rollout.outcome"] == "refused"

    def test_open_spans_end_with_the_run_that_left_them(self):
        """A group still open when its run stopped ends at that run's last event, marked so."""
        b = TraceBuilder()
        b.event("group.reserve", group_id="g", prompt_id=0, size=1, weight_version=0)
        last = b.event("group.admit", group_id="g", prompt_id=0)
        b.new_run("run-2", gap=30)
        b.event("group.reserve", group_id="h", prompt_id=0, size=1, weight_version=0)
        spans = {s.attributes["rollout.group_id"]: s for s in build(b.events)}
        assert spans["g"].attributes["rollout.ended_by"] == "run.stopped"
        assert spans["g"].end_time == ns(last["t"])
        assert spans["h"].attributes["rollout.ended_by"] == "trace.close"

    def test_attributes_namespace(self):
        """Fields become rollout.* attributes; calls and tokens by version parallel arrays (calls
        counted too); other nested values JSON text."""
        attrs = attributes(
            {
                "t": 1.0,
                "run_id": "r",
                "event": "attempt.seal",
                "tokens": 5,
                "calls": [["c", 1, 5]],
                "tokens_by_version": {"1": 5},
                "snapshot": {"k": 1},
            }
        )
        assert attrs == {
            "rollout.run.id": "r",
            "rollout.tokens": 5,
            "gen_ai.usage.output_tokens": 5,
            "rollout.calls.count": 1,
            "rollout.calls.call_id": ["c"],
            "rollout.calls.began_version": [1],
            "rollout.calls.tokens": [5],
            "rollout.tokens_by_version.version": [1],
            "rollout.tokens_by_version.tokens": [5],
            "rollout.snapshot": '{"k": 1}',
        }

    def test_closing_a_trace_ends_open_groups(self, tmp_path):
        """When the trace closes, groups of the run that never ended are ended and marked."""
        memory = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(memory))
        with RolloutTrace(tmp_path / "t.jsonl", tracer_provider=provider) as tr:
            tr.emit("group.reserve", group_id="g", prompt_id=0, size=1, weight_version=0)
        (span,) = memory.get_finished_spans()
        assert span.attributes["rollout.ended_by"] == "trace.close"


class TestPipelineWithSpans:
    def test_jsonl_is_the_same_bytes_with_opentelemetry_on_or_off(self, tmp_path):
        """With a span builder on the pipeline, the file holds exactly the encoded events."""
        from otel_rollout.exporters import encode_event
        from otel_rollout.testing import InMemoryExporter

        b = TraceBuilder()
        b.sealed_group("g", {1: 5})
        b.step(0, 2, ["g"], batch_age=1.0)
        for name, provider in (("off", None), ("on", TracerProvider())):
            memory = InMemoryExporter()
            options = {} if provider is None else {"tracer_provider": provider}
            with RolloutTrace(tmp_path / f"{name}.jsonl", exporters=[memory], **options) as tr:
                for e in b.events[1:]:
                    tr.emit(
                        e["event"],
                        **{k: v for k, v in e.items() if k not in ("t", "run_id", "event")},
                    )
            written = (tmp_path / f"{name}.jsonl").read_bytes()
            assert written == b"".join(encode_event(e) for e in memory.events)

    def test_a_dead_collector_does_not_slow_the_log(self, tmp_path, monkeypatch):
        """With the OTLP endpoint refusing connections, every event still reaches the file
        promptly, and the spans that could not be sent are counted."""
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            dead = s.getsockname()[1]  # closed when the block ends: connections are refused
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "1")
        monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
        tr = RolloutTrace(
            tmp_path / "t.jsonl",
            endpoint=f"http://127.0.0.1:{dead}",
            metrics=set(),
            export_mode="inprocess",
        )
        for i in range(2000):
            tr.emit("checkpoint.publish", step=i, weight_version=i)
        tr.flush()
        assert len((tmp_path / "t.jsonl").read_bytes().splitlines()) == 2001
        tr.close()
        s = tr.stats
        assert s.spans_failed > 0 and s.spans_sent == 0
        assert s.spans_made == s.spans_sent + s.spans_failed + s.spans_dropped + s.spans_queued


class TestCounts:
    def test_a_full_span_queue_is_counted_not_logged(self, tmp_path, monkeypatch, caplog):
        """With the SDK's batch queue at 16 spans and a collector that never answers, the
        spans turned away are counted in trace.stats, each span is accounted for once,
        and the drop is logged once, not per span."""
        from otel_rollout.testing import BlackHole

        monkeypatch.setenv("OTEL_BSP_MAX_QUEUE_SIZE", "16")
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "1")
        monkeypatch.setenv("OTEL_ROLLOUT_CLOSE_TIMEOUT", "3")
        with BlackHole() as hole:
            tr = RolloutTrace(
                tmp_path / "t.jsonl", endpoint=hole.endpoint, metrics=set(), export_mode="inprocess"
            )
            for i in range(500):
                tr.emit("checkpoint.publish", step=i, weight_version=i)
            tr.close()
        s = tr.stats
        assert s.spans_made == 500 and s.spans_dropped > 400 and s.spans_sent == 0
        assert s.spans_made == s.spans_sent + s.spans_failed + s.spans_dropped + s.spans_queued
        assert caplog.text.count("span queue is full") == 1
        assert "Queue full, dropping" not in caplog.text  # the SDK's own never fills

    def test_failed_metric_exports_are_counted(self, tmp_path, monkeypatch):
        """Metrics pushed over OTLP to a receiver that refuses every export count as failed
        in trace.stats (the last export, at close, at least)."""
        from otel_rollout.testing import OtlpReceiver

        monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "1")
        with OtlpReceiver("http/protobuf", fail=True) as rx:
            tr = RolloutTrace(
                tmp_path / "t.jsonl",
                endpoint=rx.endpoint,
                protocol="http/protobuf",
                traces="none",
                metrics={"otlp"},
                export_mode="inprocess",
            )
            tr.emit("checkpoint.publish", step=1, weight_version=1)
            tr.close()
        assert tr.stats.metric_exports_failed >= 1 and tr.stats.spans_made == 0
