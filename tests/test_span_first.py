"""Span-first: the canonical log from rollout spans, through the real SDK's BatchSpanProcessor."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import re
import subprocess
import sys
from dataclasses import asdict
from fractions import Fraction
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from test_ledger import naive_ledger, traces

from otel_rollout import JsonlSpanExporter, batch_age_by_step, read_events, tokens_by_version
from otel_rollout.cost import analyze
from otel_rollout.span_contract import (
    SPAN_EVENT_ATTRIBUTES,
    SPAN_ONLY,
    SPANS,
    from_ns,
    markdown_reference,
    rows,
    to_ns,
)
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
        span_events: dict[tuple[str, str], set[str]] = {}  # (span, span event) → attributes
        original = exporter.export

        def spy(spans):
            for s in spans:
                seen.setdefault(s.name, set()).update(s.attributes or {})
                for e in s.events:
                    span_events.setdefault((s.name, e.name), set()).update(e.attributes or {})
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
        assert {("rollout.attempt", "refit"), ("rollout.group", "admit")} <= set(span_events)
        for (name, event), attrs in span_events.items():
            assert event in SPANS[name].span_events
            assert attrs <= set(SPAN_EVENT_ATTRIBUTES.get(event, {})), (name, event)
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
