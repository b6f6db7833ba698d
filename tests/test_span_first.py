"""Span-first: the canonical log from rollout spans, through the real SDK's BatchSpanProcessor."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import re
import subprocess
import sys
from dataclasses import asdict
from fractions import Fraction
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    SimpleSpanProcessor,
    SpanExportResult,
)
from test_ledger import naive_ledger, traces

from otel_rollout import JsonlSpanExporter, batch_age_by_step, read_events, tokens_by_version
from otel_rollout.cost import analyze
from otel_rollout.exporters import COUNTS
from otel_rollout.schema import problems
from otel_rollout.span_contract import SPAN_ONLY, SPANS, from_ns, markdown_reference, rows, to_ns
from otel_rollout.spans import SpanBuilder
from otel_rollout.trace import RolloutTrace

ROOT = Path(__file__).parent.parent


def analyses(events: list[dict]) -> tuple:
    """What the file is for: batch age per step, tokens by version, the cost ledger."""
    return batch_age_by_step(events), tokens_by_version(events), analyze(events).ledger


#: A span-derived run.start takes the time of its run's earliest line in the first batch
#: written, not of the run's start: a line of a span still open then (a group's reserve) can
#: be earlier. The resume time and what is measured from it differ; all else must not.
_RUN_START_TIMES = ("resumed_at", "downtime_s", "catch_up_s")


def boundaries(events: list[dict]) -> list[dict]:
    """Each stop-and-restore boundary of the cost report, but its run.start-timed fields."""
    return [
        {k: v for k, v in asdict(b).items() if k not in _RUN_START_TIMES}
        for b in analyze(events).boundaries
    ]


def without_run_starts(events: list[dict]) -> list[str]:
    """Every event but run.start as sorted JSON text, to compare files as multisets."""
    return sorted(json.dumps(e, sort_keys=True) for e in events if e["event"] != "run.start")


def batch_processor(exporter: JsonlSpanExporter, batch: int) -> TracerProvider:
    provider = TracerProvider()
    provider.add_span_processor(
        BatchSpanProcessor(exporter, max_export_batch_size=batch, schedule_delay_millis=5)
    )
    return provider


def emit_runs(events: list[dict], log: Path, provider: TracerProvider) -> None:
    """Each run of ``events`` emitted through a RolloutTrace of its own, one after another in
    this process (each closed cleanly, unlike a kill), in-process spans on ``provider``."""
    runs: dict[str, list[dict]] = {}
    for e in events:
        run = runs.setdefault(e["run_id"], [])
        if e["event"] != "run.start":
            run.append(e)
    for run in runs.values():
        with RolloutTrace(log, tracer_provider=provider) as trace:
            for e in run:
                fields = {k: v for k, v in e.items() if k not in ("t", "run_id", "event")}
                trace.emit(e["event"], **fields)


@st.composite
def counted_traces(draw: st.DrawFn) -> list[dict]:
    """The ledger tests' random multi-run traces with token counts: seals carry tokens by
    version, sealed attempts their calls, and refits cut some calls first; some groups are
    admitted, some dispatches are resumes with a snapshot, some steps publish a checkpoint,
    and some sealed groups no step trains are discarded later."""
    out: list[dict] = []
    events = draw(traces())
    trained = {g for e in events if e["event"] == "train.step" for g in e["group_ids"]}
    for e in events:
        e = dict(e)
        late: dict | None = None
        if e["event"] == "group.seal":
            counts = draw(st.dictionaries(st.integers(0, 5), st.integers(0, 300), max_size=3))
            e["tokens_by_version"] = {str(v): n for v, n in counts.items()}
            e["tokens"] = sum(counts.values())
            if e["group_id"] not in trained and draw(st.booleans()):
                late = {"run_id": e["run_id"], "event": "group.discard", "reason": "stale",
                        "group_id": e["group_id"], "prompt_id": e["prompt_id"]}  # fmt: skip
        elif e["event"] == "group.reserve" and draw(st.booleans()):
            late = {"run_id": e["run_id"], "event": "group.admit",
                    "group_id": e["group_id"], "prompt_id": e["prompt_id"]}  # fmt: skip
        elif e["event"] == "attempt.dispatch" and draw(st.booleans()):
            e["event"], e["resumed_tokens"] = "attempt.resume", draw(st.integers(0, 50))
            e["snapshot"] = {"kv_blocks": draw(st.lists(st.integers(0, 9), max_size=3))}
        elif e["event"] == "train.step" and draw(st.booleans()):
            late = {"run_id": e["run_id"], "event": "checkpoint.publish",
                    "step": e["step"], "weight_version": e["trained_version"]}  # fmt: skip
        elif e["event"] == "attempt.seal":
            call, version = f"{e['attempt_id']}-c", draw(st.integers(0, 4))
            e["calls"] = [[call, version, e["tokens"]]]
            if draw(st.booleans()):
                out.append({"run_id": e["run_id"], "event": "weights.sync",
                            "replaced_version": version, "new_version": version + 1,
                            "cuts": [[call, draw(st.integers(0, e["tokens"]))]],
                            "duration_s": draw(st.sampled_from([0.0, 0.002]))})  # fmt: skip
        out.append(e)
        if late is not None:
            out.append(late)
    return out


def validated_from_spans(path: Path) -> tuple[int, str]:
    """``validate --from-spans`` on ``path``, in this process (the property runs it often):
    its exit code and what it printed."""
    from otel_rollout.cli import _validate

    args = argparse.Namespace(file=str(path), max_report=50, strict=False, json=False,
                              from_spans=True)  # fmt: skip
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = _validate.run(args)
    return code, out.getvalue()


class TestTimes:
    @given(st.floats(min_value=2**23, max_value=2**33, allow_nan=False))
    def test_seconds_survive_nanoseconds_exactly(self, t):
        """Every wall-clock time comes back from integer nanoseconds as the same float, and the
        nanoseconds are the nearest integer to the exact product (an independent model)."""
        n = to_ns(t)
        assert from_ns(n) == t
        assert abs(Fraction(n) - Fraction(t) * 10**9) <= Fraction(1, 2)

    def test_the_double_rounding_it_replaces_does_not(self):
        """round(t*1e9) misses some real times by a float step (why to_ns exists)."""
        t = 1796132486.6788807
        misses = [x for x in (t + i * 1e-6 for i in range(2000)) if round(x * 1e9) / 1e9 != x]
        assert misses and all(from_ns(to_ns(x)) == x for x in misses)


class TestContract:
    def test_docs_schema_md_has_the_generated_conventions(self):
        """docs/schema.md's span conventions are exactly what the contract table renders."""
        doc = (ROOT / "docs" / "schema.md").read_text()
        marker = "BEGIN GENERATED: otel_rollout.span_contract.markdown_reference"
        begin = doc.index("-->\n", doc.index(marker)) + 4
        end = doc.index("<!-- END GENERATED", begin)
        assert doc[begin:end] == markdown_reference()

    def test_the_builder_makes_only_contract_spans_and_attributes(self, tmp_path):
        """Every span and rollout attribute the builder makes on a simulated run with kills of
        attempts and discards is in the contract table, on that span's rows."""
        from otel_rollout.simulate import SimConfig, simulate

        exporter = JsonlSpanExporter(tmp_path / "spans.jsonl")
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        seen: dict[str, set[str]] = {}
        original = exporter.export

        def spy(spans):
            for s in spans:
                seen.setdefault(s.name, set()).update(s.attributes or {})
            return original(spans)

        exporter.export = spy  # type: ignore[method-assign]
        simulate(tmp_path / "log", SimConfig(steps=4, speed=20.0, seed=5, error_rate=0.2),
                 tracer_provider=provider)  # fmt: skip
        provider.shutdown()
        common = set(SPAN_ONLY) | {"rollout.run.id"}
        assert set(seen) <= set(SPANS) and {"rollout.group", "rollout.attempt"} <= set(seen)
        for name, attrs in seen.items():
            allowed = {r.attribute for r in rows() if r.span == name} | common
            assert {a for a in attrs if a.startswith("rollout.")} <= allowed, name
        assert exporter.counts()["spans_malformed"] == 0


class TestRoundTrip:
    @settings(max_examples=40)
    @given(counted_traces(), st.integers(1, 64))
    def test_random_multi_run_traces(self, tmp_path_factory, events, batch):
        """Runs stopped and resumed, emitted through RolloutTrace with spans on the SDK's batch
        processor: the span-first file has the same events at the same times, and the same
        batch age, tokens by version and cost ledger as the log (and the naive ledger)."""
        tmp = tmp_path_factory.mktemp("rt")
        exporter = JsonlSpanExporter(tmp / "spans.jsonl")
        provider = batch_processor(exporter, batch)
        emit_runs(events, tmp / "log.jsonl", provider)
        provider.shutdown()
        log = list(read_events(tmp / "log.jsonl"))
        spans = list(read_events(tmp / "spans.jsonl"))
        assert without_run_starts(spans) == without_run_starts(log)
        assert analyses(spans) == analyses(log)
        if spans:  # a run that made no span writes no line
            assert analyze(spans).ledger == naive_ledger(spans)
        if {e["run_id"] for e in spans} == {e["run_id"] for e in log}:
            assert boundaries(spans) == boundaries(log)
        counts = exporter.counts()
        assert counts["lines_lost"] == counts["spans_malformed"] == counts["spans_held"] == 0
        assert counts["spans_held_past_bound"] == 0
        assert counts["lines_written"] == len(spans)
        if spans:
            code, printed = validated_from_spans(tmp / "spans.jsonl")
            assert code == 0 and " error: " not in printed, printed

    def test_the_random_traces_have_batch_ages(self):
        """The generator makes traces whose steps have batch ages (so the property can fail)."""
        seen = []

        @settings(max_examples=60)
        @given(counted_traces())
        def collect(events):
            seen.append(bool(batch_age_by_step(events)))

        collect()
        assert sum(seen) >= 5, sum(seen)

    def test_the_demo_trace(self, demo_trace, tmp_path, cli):
        """The demo's file (two SIGKILLs, two resumes) through the span builder and the batch
        processor gives the same events, analyses and a file validate --from-spans passes."""
        log = list(read_events(demo_trace))
        exporter = JsonlSpanExporter(tmp_path / "spans.jsonl")
        provider = batch_processor(exporter, 37)
        builder = SpanBuilder(lambda run: provider.get_tracer("replay"))
        builder.export(log)
        builder.shutdown()
        provider.shutdown()
        spans = list(read_events(tmp_path / "spans.jsonl"))
        assert len({e["run_id"] for e in log}) == 3
        assert without_run_starts(spans) == without_run_starts(log)
        assert analyses(spans) == analyses(log)
        assert analyze(spans).ledger["wasted"]  # the kills cost something
        checked = cli("validate", "--from-spans", str(tmp_path / "spans.jsonl"))
        assert checked.returncode == 0, checked.stdout + checked.stderr


def span(tracer, name: str, attrs: dict, t0: float, t1: float) -> None:
    tracer.start_span(name, attributes=attrs, start_time=to_ns(t0)).end(end_time=to_ns(t1))


GROUP = {"rollout.group_id": "g", "rollout.prompt_id": 1, "rollout.size": 1,
         "rollout.weight_version": 0, "rollout.outcome": "sealed", "rollout.tokens": 5}  # fmt: skip
ATTEMPT = {"rollout.attempt_id": "a", "rollout.group_id": "g", "rollout.prompt_id": 1,
           "rollout.generation_index": 0, "rollout.weight_version": 0,
           "rollout.outcome": "sealed", "rollout.tokens": 5}  # fmt: skip
T = 1_800_000_000.0


def exporting(path: Path, hold_bytes: int | None = None, resource: dict | None = None):
    exporter = JsonlSpanExporter(path, hold_bytes=hold_bytes)
    provider = TracerProvider(resource=Resource.create(resource or {"service.instance.id": "r"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))  # one span per export
    return exporter, provider, provider.get_tracer("test")


class TestExporter:
    def test_attempts_wait_for_their_group(self, tmp_path):
        """An attempt span exported before its group's is written after the group's reserve,
        every line in time order, with a run.start first (the resource names the run)."""
        exporter, provider, tracer = exporting(tmp_path / "s.jsonl")
        span(tracer, "rollout.attempt", ATTEMPT, T + 1, T + 2)
        assert exporter.counts()["spans_held"] == 1
        span(tracer, "rollout.group", GROUP, T, T + 3)
        provider.shutdown()
        events = list(read_events(tmp_path / "s.jsonl"))
        kinds = [e["event"] for e in events]
        assert kinds == ["run.start", "group.reserve", "attempt.dispatch", "attempt.seal",
                         "group.seal"]  # fmt: skip
        assert [e["t"] for e in events[1:]] == [T, T + 1, T + 2, T + 3]
        assert {e["run_id"] for e in events} == {"r"}

    def test_past_the_bound_attempts_are_written_and_counted(self, tmp_path, cli):
        """With room for two held attempts (1.1 KB each, no calls), a third sends the oldest out
        as it is, counted; the validator's span mode names the line where an attempt precedes
        its group."""
        path = tmp_path / "s.jsonl"
        exporter, provider, tracer = exporting(path, hold_bytes=2_500)
        for i in range(3):
            attrs = {**ATTEMPT, "rollout.attempt_id": f"a{i}", "rollout.group_id": f"g{i}"}
            span(tracer, "rollout.attempt", attrs, T + i, T + i + 0.5)
        assert exporter.counts()["spans_held_past_bound"] == 1
        provider.shutdown()  # the rest, whose groups never came, are written too
        assert exporter.counts()["spans_held_past_bound"] == 3
        checked = cli("validate", "--from-spans", str(path))
        assert checked.returncode == 1
        assert f"{path}:2: error: attempt.dispatch of attempt a0 before the group.reserve" in (
            checked.stdout
        )
        plain = cli("validate", str(path))
        assert plain.returncode == 0, plain.stdout

    def test_the_hold_estimate_is_near_what_held_attempts_take(self, tmp_path):
        """The bytes the hold counts for attempts of 1 and 100 calls are within 25% of what
        tracemalloc sees them take (the bound is a memory bound, not a count)."""
        import tracemalloc

        for calls in (1, 100):
            exporter, provider, tracer = exporting(tmp_path / f"{calls}.jsonl", 10**12)
            tracemalloc.start()
            before = tracemalloc.get_traced_memory()[0]
            for i in range(300):
                attrs = {**ATTEMPT, "rollout.group_id": f"g{i}", "rollout.attempt_id": f"a{i}",
                         "rollout.calls.call_id": [f"a{i}-c{j}" for j in range(calls)],
                         "rollout.calls.began_version": [0] * calls,
                         "rollout.calls.tokens": [5] * calls}  # fmt: skip
                span(tracer, "rollout.attempt", attrs, T + i, T + i + 1)
            taken = tracemalloc.get_traced_memory()[0] - before
            tracemalloc.stop()
            assert exporter.counts()["spans_held"] == 300
            assert 0.75 < exporter._held_size / taken < 1.25, (calls, exporter._held_size, taken)
            provider.shutdown()

    def test_a_line_before_its_run_start_is_named(self, tmp_path, cli):
        """validate --from-spans names a line whose run has not started yet."""
        path = tmp_path / "bad.jsonl"
        lines = [
            {"t": T, "run_id": "x", "event": "checkpoint.publish", "step": 0, "weight_version": 1},
            {"t": T, "run_id": "x", "event": "run.start", "schema": 1, "pid": 1},
        ]
        path.write_text("".join(json.dumps(e) + "\n" for e in lines))
        checked = cli("validate", "--from-spans", str(path))
        assert checked.returncode == 1
        assert f"{path}:1: error: a checkpoint.publish line of run x before" in checked.stdout

    def test_a_run_id_started_twice_is_named(self, tmp_path, cli):
        """Two exporters (a pod restarted under its old name) writing one run ID to one file:
        validate --from-spans names the second run.start."""
        path = tmp_path / "s.jsonl"
        for step in (1, 2):
            _, provider, tracer = exporting(path, resource={"service.instance.id": "pod-0"})
            attrs = {"rollout.step": step, "rollout.weight_version": 1}
            span(tracer, "rollout.checkpoint.publish", attrs, T + step, T + step)
            provider.shutdown()
        checked = cli("validate", "--from-spans", str(path))
        assert checked.returncode == 1
        assert f"{path}:3: error: a second run.start of run pod-0: a run ID must be new" in (
            checked.stdout
        )

    def test_a_line_earlier_than_its_run_start_is_a_warning(self, tmp_path, cli):
        """A resumed run whose first group span ends after a sync: its reserve is written after
        the run.start the sync's batch opened, and validate --from-spans warns, naming it."""
        path = tmp_path / "s.jsonl"
        _, provider, tracer = exporting(path, resource={"service.instance.id": "b"})
        span(tracer, "rollout.weights.sync",
             {"rollout.replaced_version": 0, "rollout.new_version": 1}, T + 30, T + 31)  # fmt: skip
        span(tracer, "rollout.group", GROUP, T + 10, T + 70)
        provider.shutdown()
        checked = cli("validate", "--from-spans", str(path))
        assert checked.returncode == 0, checked.stdout
        assert (
            f"{path}:3: warning: this group.reserve line is 21.000 s earlier than its run's "
            "run.start: the downtime before run b reads at least that much too long"
        ) in checked.stdout
        assert checked.stdout.count("warning") == 1

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

    def test_concurrent_exports_write_whole_lines(self, tmp_path):
        """Spans ended on four threads at once (each export on its own thread, as a
        SimpleSpanProcessor does) all reach the file as whole, valid lines."""
        import threading

        exporter, provider, tracer = exporting(tmp_path / "s.jsonl")

        def work(k: int) -> None:
            for i in range(200):
                attrs = {"rollout.step": i, "rollout.weight_version": k}
                span(tracer, "rollout.checkpoint.publish", attrs, T + i, T + i)

        threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        provider.shutdown()
        events = list(read_events(tmp_path / "s.jsonl"))
        published = [e for e in events if e["event"] == "checkpoint.publish"]
        assert sorted((e["weight_version"], e["step"]) for e in published) == [
            (k, i) for k in range(4) for i in range(200)
        ]
        assert [e["event"] for e in events].count("run.start") == 1
        assert exporter.counts()["lines_written"] == len(events) == 801

    def test_force_flush_syncs_and_is_safe_after_shutdown(self, tmp_path):
        """exporter.force_flush() syncs the file (log_syncs goes up; the SDK's processors never
        call it), takes None, and after shutdown returns without raising; an export after
        shutdown counts the spans it drops."""
        exporter = JsonlSpanExporter(tmp_path / "s.jsonl", fsync_interval=3600.0)
        provider = TracerProvider(resource=Resource.create({"service.instance.id": "r"}))
        provider.add_span_processor(BatchSpanProcessor(exporter))
        tracer = provider.get_tracer("test")
        span(tracer, "rollout.checkpoint.publish",
             {"rollout.step": 1, "rollout.weight_version": 1}, T, T)  # fmt: skip
        assert provider.force_flush()
        before = exporter.counts()["log_syncs"]
        assert exporter.counts()["lines_written"] == 2
        assert exporter.force_flush(5_000)
        assert exporter.counts()["log_syncs"] > before
        assert exporter.force_flush(None)
        provider.shutdown()
        assert exporter.force_flush() is True
        finished = provider.get_tracer("late").start_span("rollout.checkpoint.publish")
        finished.end()
        assert exporter.export([finished]) == SpanExportResult.FAILURE
        assert exporter.counts()["spans_after_shutdown"] == 1

    def test_force_flush_gives_up_at_its_timeout_on_a_held_lock(self, tmp_path):
        """While another thread holds the exporter (an export in progress), force_flush waits
        no longer than its timeout and returns False."""
        exporter = JsonlSpanExporter(tmp_path / "s.jsonl")
        with exporter._lock:
            assert exporter.force_flush(50) is False
        assert exporter.force_flush(50) is True
        exporter.shutdown()

    def test_a_failing_file_is_counted_and_logged_once(self, caplog):
        """Writing to /dev/full loses every line: counted, one error logged, never raised."""
        exporter = JsonlSpanExporter("/dev/full")
        provider = TracerProvider(resource=Resource.create({"service.instance.id": "r"}))
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        tracer = provider.get_tracer("test")
        with caplog.at_level(logging.ERROR, logger="otel_rollout"):
            for i in range(3):
                attrs = {"rollout.step": i, "rollout.weight_version": i}
                span(tracer, "rollout.checkpoint.publish", attrs, T + i, T + i)
        provider.shutdown()
        counts = exporter.counts()
        # each batch carries the run.start again, as none reached the file: (run.start + 1) x 3
        assert counts["lines_lost"] == 6 and counts["lines_written"] == 0
        assert caplog.text.count("cannot write /dev/full") == 1


_REFUSED_THEN_TAKEN = """
import resource, signal, sys
sys.path.insert(0, {tests!r})
from test_span_first import T, exporting, span
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
exporter, provider, tracer = exporting(sys.argv[1])
publish = {{"rollout.step": 1, "rollout.weight_version": 1}}
resource.setrlimit(resource.RLIMIT_FSIZE, (0, resource.RLIM_INFINITY))
span(tracer, "rollout.checkpoint.publish", publish, T, T)
resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
span(tracer, "rollout.checkpoint.publish", {{**publish, "rollout.step": 2}}, T + 1, T + 1)
provider.shutdown()
print(exporter.counts()["lines_lost"])
"""


def test_a_run_start_the_file_refused_is_written_again(tmp_path, cli):
    """When the file refuses the batch holding a run's run.start (a real EFBIG, RLIMIT_FSIZE 0),
    the run's next line that reaches it still follows a run.start."""
    path = tmp_path / "s.jsonl"
    program = _REFUSED_THEN_TAKEN.format(tests=str(Path(__file__).parent))
    ran = subprocess.run([sys.executable, "-c", program, str(path)], capture_output=True,
                         text=True, timeout=60)  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.split() == ["2"]  # the first run.start and its publish
    events = list(read_events(path))
    assert [(e["event"], e.get("step")) for e in events] == [
        ("run.start", None), ("checkpoint.publish", 2)]  # fmt: skip
    assert cli("validate", "--from-spans", str(path)).returncode == 0


def test_a_forked_child_has_its_own_lock_and_run(tmp_path, cli):
    """Forked while another thread held the exporter's lock, the child still exports, as a run
    of its own (a new run ID, its own pid) when the exporter named the run; the parent's run
    goes on as it was."""
    import os
    import signal
    import threading

    exporter = JsonlSpanExporter(tmp_path / "s.jsonl")
    provider = TracerProvider()  # no service.instance.id: the exporter names the run
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")
    publish = {"rollout.step": 1, "rollout.weight_version": 1}
    span(tracer, "rollout.checkpoint.publish", publish, T, T)
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with exporter._lock:
            held.set()
            release.wait()

    holder = threading.Thread(target=hold)
    holder.start()
    held.wait()
    child = os.fork()
    if child == 0:  # never back into pytest
        code = 1
        try:
            signal.alarm(20)  # a lock copied while held would hang here
            span(tracer, "rollout.checkpoint.publish", {**publish, "rollout.step": 2}, T + 1, T + 1)
            code = 0
        finally:
            os._exit(code)
    release.set()
    holder.join()
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    span(tracer, "rollout.checkpoint.publish", {**publish, "rollout.step": 3}, T + 2, T + 2)
    provider.shutdown()
    events = list(read_events(tmp_path / "s.jsonl"))
    starts = {e["run_id"]: e["pid"] for e in events if e["event"] == "run.start"}
    steps = {e["step"]: e["run_id"] for e in events if e["event"] == "checkpoint.publish"}
    assert steps[1] == steps[3] != steps[2]
    assert starts == {steps[1]: os.getpid(), steps[2]: child}
    assert cli("validate", "--from-spans", str(tmp_path / "s.jsonl")).returncode == 0


def readme_example() -> str:
    """The span-first program of the README, as written there."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Span-first") :]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match is not None
    return match.group(1)


def test_the_readme_example_runs_and_batch_age_reads_it(tmp_path, cli):
    """The README's toy controller, run as written, writes a file whose batch age per step
    batch-age prints: step 0 trains its own version's tokens, later steps one version old."""
    program = tmp_path / "span_first_example.py"
    program.write_text(readme_example())
    path = tmp_path / "spans.jsonl"
    ran = subprocess.run([sys.executable, str(program), str(path)], capture_output=True,
                         text=True, timeout=60)  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    assert batch_age_by_step(read_events(path)) == {0: 0.0, 1: 1.0, 2: 1.0, 3: 1.0}
    ages = cli("batch-age", str(path))
    assert ages.returncode == 0, ages.stderr
    assert re.search(r"^\s+1\s+1\s+2\s+500\s+1\.0000", ages.stdout, re.M), ages.stdout
    assert cli("validate", "--from-spans", str(path)).returncode == 0
