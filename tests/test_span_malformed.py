"""JsonlSpanExporter given spans that cannot make a valid line: each is counted, alone."""

from __future__ import annotations

import json
import logging

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from test_span_exporter import ATTEMPT, GROUP, T, exporting, span

from otel_rollout import JsonlSpanExporter, read_events
from otel_rollout.exporters import COUNTS
from otel_rollout.schema import problems


class TestMalformed:
    def test_other_spans_are_ignored_and_bad_ones_counted(self, tmp_path, caplog):
        """Spans that are not rollout spans are counted as ignored; a rollout span missing a
        required attribute is counted, logged once, and writes nothing."""
        exporter, provider, tracer = exporting(tmp_path / "s.jsonl")
        with caplog.at_level(logging.WARNING, logger="otel_rollout"):
            span(tracer, "http.request", {"http.method": "GET"}, T, T + 1)
            for _ in range(2):
                span(tracer, "rollout.checkpoint.publish", {"rollout.step": 1}, T, T)
            span(tracer, "rollout.checkpoint.publish",
                 {"rollout.step": 1, "rollout.weight_version": 2, "rollout.run.id": "own"},
                 T + 1, T + 1)  # fmt: skip
        provider.shutdown()
        counts = exporter.counts()
        assert set(counts) <= set(COUNTS)  # every name it reports is documented
        assert counts["spans_ignored"] == 1 and counts["spans_malformed"] == 2
        assert caplog.text.count("makes no valid line") == 1
        assert "weight_version" in caplog.text
        events = list(read_events(tmp_path / "s.jsonl"))
        assert [(e["event"], e["run_id"]) for e in events] == [
            ("run.start", "own"), ("checkpoint.publish", "own")]  # fmt: skip
        assert all(problems(e) == [] for e in events)

    def test_one_bad_span_costs_itself_not_its_batch(self, tmp_path):
        """In one batch, a snapshot nested 100,000 deep (RecursionError) and a time past a
        float (OverflowError) are counted malformed; the good spans around them are written."""
        exporter = JsonlSpanExporter(tmp_path / "s.jsonl")
        provider = TracerProvider(resource=Resource.create({"service.instance.id": "r"}))
        provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=60_000))
        tracer = provider.get_tracer("test")
        good = {"rollout.step": 1, "rollout.weight_version": 1}
        span(tracer, "rollout.checkpoint.publish", good, T, T)
        nested = "[" * 10**5 + "]" * 10**5
        deep = {**ATTEMPT, "rollout.resumed_tokens": 3, "rollout.snapshot": nested}
        span(tracer, "rollout.attempt", deep, T, T + 1)
        huge = 10**330
        tracer.start_span("rollout.checkpoint.publish", attributes=good, start_time=huge).end(
            end_time=huge
        )
        span(tracer, "rollout.group", GROUP, T, T + 3)
        provider.shutdown()  # one export of all four
        counts = exporter.counts()
        assert counts["spans_malformed"] == 2
        kinds = [e["event"] for e in read_events(tmp_path / "s.jsonl")]
        assert kinds == ["run.start", "group.reserve", "checkpoint.publish", "group.seal"]

    def test_an_attempt_that_ran_without_its_version_is_malformed(self, tmp_path):
        """A sealed attempt span missing rollout.weight_version is counted malformed and writes
        no seal without its dispatch; a refused one without it writes the refusal alone."""
        exporter, provider, tracer = exporting(tmp_path / "s.jsonl")
        span(tracer, "rollout.group", GROUP, T, T + 3)
        sealed = {k: v for k, v in ATTEMPT.items() if k != "rollout.weight_version"}
        span(tracer, "rollout.attempt", sealed, T + 1, T + 2)
        refused = {**sealed, "rollout.attempt_id": "b", "rollout.outcome": "refused",
                   "rollout.reason": "stale"}  # fmt: skip
        span(tracer, "rollout.attempt", refused, T + 2, T + 2)
        provider.shutdown()
        assert exporter.counts()["spans_malformed"] == 1
        kinds = [e["event"] for e in read_events(tmp_path / "s.jsonl")]
        assert kinds == ["run.start", "group.reserve", "group.seal", "attempt.refuse"]

    def test_an_outcome_of_no_end_line_is_malformed(self, tmp_path, caplog):
        """A group span whose rollout.outcome is a typo ("seal") is counted malformed and logged
        by the value, not written as a reserve whose seal went missing."""
        exporter, provider, tracer = exporting(tmp_path / "s.jsonl")
        with caplog.at_level(logging.WARNING, logger="otel_rollout"):
            span(tracer, "rollout.group", {**GROUP, "rollout.outcome": "seal"}, T, T + 3)
            span(tracer, "rollout.group", {**GROUP, "rollout.group_id": "h"}, T, T + 3)
        provider.shutdown()
        assert exporter.counts()["spans_malformed"] == 1
        assert "rollout.outcome 'seal' is none of sealed, discarded" in caplog.text
        events = list(read_events(tmp_path / "s.jsonl"))
        assert [(e["event"], e.get("group_id")) for e in events] == [
            ("run.start", None), ("group.reserve", "h"), ("group.seal", "h")]  # fmt: skip

    def test_integers_past_64_bits_are_malformed(self, tmp_path):
        """An integer the encoder cannot write as a number (2**70, in a field, an array, JSON
        text or a field beyond the contract) is counted malformed; 2**64 - 1 is written."""
        exporter, provider, tracer = exporting(tmp_path / "s.jsonl")
        publish = {"rollout.step": 1, "rollout.weight_version": 1}
        for wide in ({"rollout.step": 2**70}, {"rollout.loss": 2**70}):
            span(tracer, "rollout.checkpoint.publish", {**publish, **wide}, T, T)
        calls = {"rollout.calls.call_id": ["c"], "rollout.calls.began_version": [0],
                 "rollout.calls.tokens": [-(2**63) - 1]}  # fmt: skip
        span(tracer, "rollout.group", GROUP, T, T + 3)
        span(tracer, "rollout.attempt", {**ATTEMPT, **calls}, T + 1, T + 2)
        resumed = {**ATTEMPT, "rollout.attempt_id": "b", "rollout.resumed_tokens": 1,
                   "rollout.snapshot": json.dumps({"x": [2**70]})}  # fmt: skip
        span(tracer, "rollout.attempt", resumed, T + 1, T + 2)
        span(tracer, "rollout.checkpoint.publish", {**publish, "rollout.step": 2**64 - 1}, T, T)
        provider.shutdown()
        assert exporter.counts()["spans_malformed"] == 4
        events = list(read_events(tmp_path / "s.jsonl"))
        assert all(problems(e) == [] for e in events)
        assert [e["step"] for e in events if e["event"] == "checkpoint.publish"] == [2**64 - 1]

    def test_a_contract_attribute_of_another_span_is_kept(self, tmp_path):
        """rollout.tokens is a group's and an attempt's attribute; on a train.step span it is
        a field beyond that span's contract, kept on its line as any other."""
        _, provider, tracer = exporting(tmp_path / "s.jsonl")
        step = {"rollout.step": 0, "rollout.trained_version": 0, "rollout.group_ids": [],
                "rollout.tokens": 123, "rollout.loss": 0.5}  # fmt: skip
        span(tracer, "rollout.train.step", step, T, T + 1)
        provider.shutdown()
        (trained,) = [e for e in read_events(tmp_path / "s.jsonl") if e["event"] == "train.step"]
        assert trained["tokens"] == 123 and trained["loss"] == 0.5
