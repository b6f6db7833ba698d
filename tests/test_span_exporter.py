"""JsonlSpanExporter on the real SDK: the order it promises, its bound, flush, a failing
file, a fork."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExportResult

from otel_rollout import JsonlSpanExporter, read_events
from otel_rollout.span_contract import to_ns


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
        its group's reserve (an error once the reserve comes)."""
        path = tmp_path / "s.jsonl"
        exporter, provider, tracer = exporting(path, hold_bytes=2_500)
        for i in range(3):
            attrs = {**ATTEMPT, "rollout.attempt_id": f"a{i}", "rollout.group_id": f"g{i}"}
            span(tracer, "rollout.attempt", attrs, T + i, T + i + 0.5)
        assert exporter.counts()["spans_held_past_bound"] == 1
        for i in range(3):
            span(tracer, "rollout.group", {**GROUP, "rollout.group_id": f"g{i}"}, T + i, T + 9)
        provider.shutdown()
        assert exporter.counts()["spans_held_past_bound"] == 1
        checked = cli("validate", "--from-spans", str(path))
        assert checked.returncode == 1
        assert f"{path}:2: error: attempt.dispatch of attempt a0 before the group.reserve" in (
            checked.stdout
        )
        assert "1 warning" not in checked.stderr and "2 errors" in checked.stderr  # a0's two
        plain = cli("validate", str(path))
        assert plain.returncode == 0, plain.stdout

    def test_attempts_of_a_group_open_at_shutdown_are_written_and_only_warned_of(
        self, tmp_path, cli
    ):
        """A group span still open at shutdown (a controller stopped with groups in flight):
        its ended attempts are written at shutdown, counted, and ``validate --from-spans``
        warns of them (their group has no reserve at all) without failing the file."""
        path = tmp_path / "s.jsonl"
        exporter, provider, tracer = exporting(path)
        open_group = tracer.start_span("rollout.group", attributes=GROUP, start_time=to_ns(T))
        span(tracer, "rollout.attempt", ATTEMPT, T + 1, T + 2)
        provider.shutdown()
        assert exporter.counts()["spans_held_past_bound"] == 1
        kinds = [e["event"] for e in read_events(path)]
        assert kinds == ["run.start", "attempt.dispatch", "attempt.seal"]
        checked = cli("validate", "--from-spans", str(path))
        assert checked.returncode == 0, checked.stdout
        assert f"{path}:2: warning: attempt.dispatch of attempt a: its group g has no " in (
            checked.stdout
        )
        assert "0 errors, 2 warnings" in checked.stderr
        open_group.end()

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
from test_span_exporter import T, exporting, span
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
