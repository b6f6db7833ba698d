"""A tracker that hangs or fails costs only itself: the log is written on time, the other
trackers get every row, close is bounded, and what was lost is counted."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from _tracker_readers import tensorboard_runs
from conftest import clean_env
from tensorboardX import SummaryWriter
from test_trackers import assert_equals_file, emit_steps, wait_for_sidecar

from otel_rollout.exporters import COUNTS
from otel_rollout.testing import BlackHole
from otel_rollout.trace import RolloutTrace

STEPS = 1500  # past a worker's queue of 1024 rows, so the hung one drops some


class HungWriter(SummaryWriter):
    """A real writer whose every call waits, like a tracker behind a dead mount."""

    def __init__(self, logdir: str, release: threading.Event) -> None:
        super().__init__(logdir)
        self.release = release

    def add_scalar(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        self.release.wait()


class FailingWriter(SummaryWriter):
    """A real writer whose every call fails, like a tracker whose disk is gone."""

    def add_scalar(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        raise OSError("No space left on device")


def lines(path: Path) -> int:
    return path.read_bytes().count(b"\n")


def sidecar_tracker_counts(log: Path) -> dict[str, int]:
    """The trackers' final counts, from the finished sidecar's log."""
    words = log.with_name(log.name + ".sidecar.log").read_text()
    line = next(x for x in words.splitlines() if "otel-rollout: trackers: " in x)
    pairs = line.split("otel-rollout: trackers: ", 1)[1].split(", ")
    return {name: int(n) for name, n in (p.rsplit(" ", 1) for p in pairs)}


def test_hung_and_failing_trackers_cost_only_themselves(tmp_path, monkeypatch) -> None:
    """In the pipeline: the file and a good tracker get everything; close is bounded."""
    monkeypatch.setenv("OTEL_ROLLOUT_CLOSE_TIMEOUT", "2")
    release = threading.Event()
    hung = HungWriter(str(tmp_path / "hung"), release)
    failing = FailingWriter(str(tmp_path / "failing"))
    good = SummaryWriter(str(tmp_path / "tb" / "good"))
    log = tmp_path / "log.jsonl"
    try:
        trace = RolloutTrace(log, trackers=[hung, failing, good])
        deadline = time.monotonic() + 60
        for done in range(100, STEPS + 1, 100):  # paced as a run's steps are, not in one burst
            emit_steps(trace, 100, first=done - 100)
            trace.flush()
            assert lines(log) == 1 + 3 * done  # written while one tracker hangs
            while trace.stats.other.get("tracker_rows_logged", 0) < done:
                assert time.monotonic() < deadline, trace.stats.other
                time.sleep(0.02)
        started = time.monotonic()
        trace.close()
        assert time.monotonic() - started < 60  # bounded: the hung tracker waits for ever
        counts = trace.stats.other
        assert counts["tracker_rows_logged"] == STEPS  # the good one's; the others' are lost
        assert counts["tracker_errors"] == STEPS  # every row of the failing one, counted
        assert counts["trackers_hung"] == 1
        # The hung one's: every row but the one it hangs on (past its queue, or left in it;
        # the wake-up in its queue is no row)
        assert counts["tracker_rows_dropped"] == STEPS - 1
        good.flush()
        assert_equals_file({trace.run_id: tensorboard_runs(tmp_path / "tb")["good"]}, log,
                           float32=True)  # fmt: skip
    finally:
        release.set()


def test_a_hung_tracker_in_the_sidecar_delays_nothing(tmp_path, monkeypatch) -> None:
    """An MLflow server that never answers: the log, TensorBoard and close go on without it."""
    hole = BlackHole()
    env = clean_env(
        OTEL_ROLLOUT_TRACKERS=f"mlflow:{hole.endpoint},tensorboard:{tmp_path / 'tb'}",
        OTEL_ROLLOUT_CLOSE_TIMEOUT="3",
        OTEL_ROLLOUT_SIDECAR_LINGER="0",
        MLFLOW_HTTP_REQUEST_TIMEOUT="600",
    )
    for name in [k for k in list(__import__("os").environ) if k.startswith("OTEL_")]:
        monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    log = tmp_path / "log.jsonl"
    trace = RolloutTrace(log)
    emit_steps(trace, 50)
    trace.flush()
    assert lines(log) == 1 + 3 * 50
    started = time.monotonic()
    trace.close()
    assert time.monotonic() - started < 60  # not the MLflow client's 600 s: it was not waited on
    wait_for_sidecar(log)
    counts = sidecar_tracker_counts(log)  # final, once it has exited
    assert counts["tracker_rows_logged"] == 50  # TensorBoard's
    assert counts["trackers_hung"] == 1
    assert hole.connections >= 1  # the MLflow client did try, and was left waiting
    assert_equals_file(tensorboard_runs(tmp_path / "tb"), log, float32=True)
    words = log.with_name(log.name + ".sidecar.log").read_text()
    assert "tracker mlflow" in words and "did not finish" in words


def test_a_failed_mlflow_batch_counts_its_rows_dropped_and_the_run_still_ends(tmp_path) -> None:
    """Rows MLflow refused count as dropped, not logged; the run is set FINISHED all the same."""
    from mlflow.tracking import MlflowClient

    from otel_rollout.trackers._hub import Worker
    from otel_rollout.trackers._sinks import MlflowSink, Spec

    uri = f"sqlite:///{tmp_path / 'm.db'}"
    sink = MlflowSink.make(Spec("mlflow", uri), "r")
    worker = Worker("mlflow", lambda run_id: sink)
    for s in range(3):
        worker.put(("row", "r", s, {"rollout/batch_age": float(s)}), wait=True)
    assert worker.flush(time.monotonic() + 60)
    assert (worker.logged, worker.dropped) == (3, 0)  # counted once MLflow took them
    worker.put(("row", "r", 3, {"rollout/batch_age": 3.0}), wait=True)
    worker.put(("row", "r", 4, {"no*such?name": 4.0}), wait=True)  # MLflow refuses the batch
    worker.close(time.monotonic() + 60)
    assert (worker.logged, worker.dropped, worker.failed, worker.hung) == (3, 2, 1, False)
    client = MlflowClient(tracking_uri=uri)
    assert client.get_run(sink.run_id).info.status == "FINISHED"
    history = client.get_metric_history(sink.run_id, "rollout/batch_age")
    assert sorted(m.step for m in history) == [0, 1, 2]


def test_a_busy_hub_at_close_leaves_the_trackers_time_to_end(tmp_path, monkeypatch) -> None:
    """Owed rows that take the hub past its share of the close timeout cost those rows only:
    the trackers still log what they have, close their runs and are not reported hung."""
    from otel_rollout.testing import TraceBuilder
    from otel_rollout.trackers import TrackerHub
    from otel_rollout.trackers._rows import RowBuilder

    stuck = threading.Event()
    monkeypatch.setattr(RowBuilder, "end_all", lambda self: stuck.wait() and [])
    writer = SummaryWriter(str(tmp_path / "tb" / "mine"))
    hub = TrackerHub([writer], None)
    b = TraceBuilder("r")
    b.sealed_group("g", {0: 5})
    b.step(0, 1, ["g"])
    hub.export(b.events)
    try:
        hub.close(8)
        assert hub.counts()["trackers_hung"] == 0
        assert hub.counts()["tracker_rows_logged"] == 1
        assert tensorboard_runs(tmp_path / "tb")["mine"]["rollout/batch_age"] == {0: 1.0}
    finally:
        stuck.set()


def test_a_hung_worker_counts_only_rows_as_dropped(tmp_path) -> None:
    """Given up on at close, a hung tracker counts the rows it left, not the wake-up and flush
    requests queued beside them."""
    from otel_rollout.trackers._hub import Worker
    from otel_rollout.trackers._sinks import TensorBoardSink

    release = threading.Event()
    sink = TensorBoardSink(HungWriter(str(tmp_path / "hung"), release), own=False)
    worker = Worker("hung", lambda run_id: sink)
    try:
        for s in range(3):
            worker.put(("row", "r", s, {"rollout/batch_age": 1.0}))
        assert not worker.flush(time.monotonic() + 0.2)  # a flush request left queued
        worker.close(time.monotonic() + 0.5)
        assert worker.hung and (worker.logged, worker.dropped) == (0, 2)  # one it hangs on
    finally:
        release.set()


def test_after_dropped_events_a_run_logs_no_batch_age(tmp_path, monkeypatch) -> None:
    """Events past the inbox are dropped and counted, and the run's later steps carry no batch
    age (their seals may be among those lost) instead of a wrong one."""
    from otel_rollout.testing import TraceBuilder
    from otel_rollout.trackers import TrackerHub, _hub
    from otel_rollout.trackers._rows import RowBuilder

    monkeypatch.setattr(_hub, "INBOX_EVENTS", 10)
    busy, release, feed = threading.Event(), threading.Event(), RowBuilder.feed

    def slow_feed(self, events):  # type: ignore[no-untyped-def]
        busy.set()
        release.wait()
        return feed(self, events)

    monkeypatch.setattr(RowBuilder, "feed", slow_feed)
    writer = SummaryWriter(str(tmp_path / "tb" / "mine"))
    hub = TrackerHub([writer], None)
    b = TraceBuilder("r")
    parts = []
    for s in range(4):
        start = len(b.events)
        b.sealed_group(f"g{s}", {0: 5})
        b.step(s, 1, [f"g{s}"])
        parts.append(b.events[start:])
    hub.export(b.events[:1] + parts[0])
    assert busy.wait(30)  # the hub's thread holds the first batch
    hub.export(parts[1])  # queued: 4 events
    hub.export(parts[2] * 2)  # 8 more: past the inbox, dropped
    release.set()
    hub.export(parts[3])
    hub.close(30)
    counts = hub.counts()
    assert set(counts) <= set(COUNTS)  # every name it reports is documented
    assert counts["tracker_events_dropped"] == 8
    assert counts["tracker_steps_without_age"] == 1 and counts["tracker_rows_logged"] == 3
    ages = tensorboard_runs(tmp_path / "tb")["mine"]["rollout/batch_age"]
    assert ages == {0: 1.0, 1: 1.0}  # step 3 logged without it; step 2 never reached


def test_a_backfill_into_a_hung_tracker_gives_up_after_its_timeout(tmp_path, monkeypatch) -> None:
    """log-to's waits for room are bounded by its timeout: a hung tracker costs the rows and
    events it could not take (counted), never a reader stuck for ever."""
    from otel_rollout.testing import TraceBuilder
    from otel_rollout.trackers import TrackerHub, _hub

    monkeypatch.setattr(_hub, "INBOX_EVENTS", 8)
    monkeypatch.setattr(_hub, "WORKER_QUEUE", 2)
    release = threading.Event()
    hub = TrackerHub([HungWriter(str(tmp_path / "hung"), release)], None, backfill=True, wait=0.2)
    b = TraceBuilder("r")
    for s in range(12):
        b.sealed_group(f"g{s}", {0: 5})
        b.step(s, 1, [f"g{s}"])
    reader = threading.Thread(target=lambda: [hub.export(b.events[i : i + 4])
                                              for i in range(0, len(b.events), 4)])  # fmt: skip
    try:
        reader.start()
        reader.join(60)
        assert not reader.is_alive()
        hub.close(1)
        counts = hub.counts()
        assert counts["tracker_rows_dropped"] > 0 and counts["trackers_hung"] == 1
    finally:
        release.set()


def test_log_to_an_mlflow_server_that_never_answers_ends_at_its_timeout(tmp_path) -> None:
    """Looking up the runs an MLflow server already holds waits ``--timeout`` seconds, then
    says which server gave no answer: one line, no traceback, the command ended."""
    import subprocess
    import sys

    from otel_rollout.testing import TraceBuilder

    b = TraceBuilder("r")
    b.sealed_group("g0", {0: 5})
    b.step(0, 1, ["g0"])
    path = b.write(tmp_path / "rollout_trace.jsonl")
    hole = BlackHole()
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "otel_rollout", "log-to", f"mlflow:{hole.endpoint}", str(path),
         "--timeout", "2"],
        capture_output=True, text=True, timeout=120, env=clean_env(),
    )  # fmt: skip
    took = time.monotonic() - started
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert f"no answer from mlflow:{hole.endpoint} in 2 s" in done.stderr
    assert hole.connections >= 1  # it did ask the server
    assert took < 60  # the client's own retries run for minutes
