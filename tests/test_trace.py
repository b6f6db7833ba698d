"""RolloutTrace: the caller's side, the background writer, and what reaches the file."""

from __future__ import annotations

import enum
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import orjson
import pytest
from conftest import SlowExporter

from otel_rollout import trace as trace_module
from otel_rollout.testing import InMemoryExporter, OtlpReceiver
from otel_rollout.trace import ROLLOUT_TRACE_FILENAME, RolloutTrace, read_events


def lines(path: Path) -> list[dict]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


class Color(enum.Enum):
    RED = "red"


class BlockingExporter:
    """Holds the writer thread inside export until released, so the queue fills for real."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()

    def export(self, events):
        self.entered.set()
        self.release.wait(10)
        return 0

    def shutdown(self):
        self.release.set()


class TestOpening:
    def test_run_start_is_the_first_line(self, tmp_path):
        """Opening writes run.start with schema 1, pid and host under a fresh run_id."""
        with RolloutTrace(tmp_path / "t.jsonl") as tr:
            pass
        (first,) = lines(tmp_path / "t.jsonl")
        assert first["event"] == "run.start" and first["schema"] == 1
        assert first["pid"] == os.getpid() and first["host"] and first["run_id"] == tr.run_id

    def test_directory_gets_the_standard_file_name(self, tmp_path):
        """A directory path writes rollout_trace.jsonl inside it."""
        with RolloutTrace(tmp_path) as tr:
            assert tr.path == tmp_path / ROLLOUT_TRACE_FILENAME
        assert (tmp_path / ROLLOUT_TRACE_FILENAME).exists()

    @pytest.mark.parametrize(
        ("given", "log"),
        [
            ("new_dir", "new_dir/rollout_trace.jsonl"),  # no suffix: a log directory
            ("new/dir/", "new/dir/rollout_trace.jsonl"),
            ("lr0.5", "lr0.5/rollout_trace.jsonl"),  # a dot in a run's name
            ("trace.jsonl", "trace.jsonl"),
            ("trace.log", "trace.log"),
        ],
    )
    def test_a_new_path_is_a_directory_unless_it_names_a_file(self, tmp_path, given, log):
        """A path that does not exist yet is a log file when its suffix says so (.jsonl,
        .log, ...), and a log directory otherwise (as the README's RolloutTrace(log_dir))."""
        with RolloutTrace(f"{tmp_path}/{given}") as tr:
            assert tr.path == tmp_path / log
        assert (tmp_path / log).is_file()

    def test_an_existing_file_without_a_suffix_is_appended_to(self, tmp_path):
        """A file that exists is the log, whatever its name."""
        (tmp_path / "trace").write_text("")
        with RolloutTrace(tmp_path / "trace") as tr:
            assert tr.path == tmp_path / "trace"

    def test_missing_parents_are_created(self, tmp_path):
        """The log directory is created if it does not exist yet."""
        with RolloutTrace(tmp_path / "a" / "b" / "t.jsonl"):
            pass
        assert (tmp_path / "a" / "b" / "t.jsonl").exists()

    def test_appends_and_run_ids_differ(self, tmp_path):
        """Two traces on one file append, each under its own run_id."""
        path = tmp_path / "t.jsonl"
        for _ in range(2):
            with RolloutTrace(path) as tr:
                tr.emit("x")
        ids = [e["run_id"] for e in lines(path)]
        assert len(ids) == 4 and ids[0] == ids[1] != ids[2] == ids[3]

    def test_unwritable_path_is_a_clear_error(self, tmp_path):
        """A path that cannot be opened raises at construction, not later in emit."""
        (tmp_path / "file").write_text("")
        with pytest.raises(OSError):
            RolloutTrace(tmp_path / "file" / "t.jsonl")


class TestDisabled:
    def test_none_is_a_no_op(self, tmp_path):
        """RolloutTrace(None) writes nothing; emit and close return None, flush True."""
        tr = RolloutTrace(None)
        assert not tr.enabled and tr.path is None
        assert tr.emit("x", a=1) is None and tr.close() is None
        assert tr.flush() is True and tr.flush(durable=True) is True  # nothing to wait for
        assert list(tmp_path.iterdir()) == []

    def test_none_binds_a_no_op_once(self):
        """The disabled emit is a plain function, not a method that checks a flag."""
        assert RolloutTrace(None).emit is trace_module._noop


class TestEmit:
    def test_fields_and_order(self, tmp_path):
        """A line is t, run_id, event, then the caller's fields in the caller's order."""
        with RolloutTrace(tmp_path / "t.jsonl") as tr:
            before = time.time()
            tr.emit("attempt.dispatch", attempt_id="a", prompt_id=3)
            after = time.time()
        event = lines(tmp_path / "t.jsonl")[1]
        assert list(event) == ["t", "run_id", "event", "attempt_id", "prompt_id"]
        assert before <= event["t"] <= after

    def test_t_is_emit_time_not_write_time(self, tmp_path):
        """The timestamp is taken on the caller's thread when emit is called."""
        blocker = BlockingExporter()
        with RolloutTrace(tmp_path / "t.jsonl", exporters=[blocker]) as tr:
            blocker.entered.wait(5)  # the writer is stuck on run.start
            stamp = time.time()
            tr.emit("x")
            time.sleep(0.2)
            blocker.release.set()
        assert lines(tmp_path / "t.jsonl")[1]["t"] < stamp + 0.1

    def test_integers_past_64_bits_are_written_as_valid_events(self, tmp_path):
        """A step or version past 64 bits (valid: integers ≥ 0) is written as the exact
        number, so the line passes the schema's rules and reads back equal."""
        from otel_rollout import events

        with RolloutTrace(tmp_path / "t.jsonl") as tr:
            tr.emit("checkpoint.publish", step=2**70, weight_version=10**40)
        line = (tmp_path / "t.jsonl").read_bytes().splitlines()[1]
        event, why = events.from_line(line)
        assert why is None and (event.step, event.weight_version) == (2**70, 10**40)

    def test_values_orjson_does_not_know_are_encoded(self, tmp_path):
        """numpy scalars and arrays, Path, Enum, sets, tuples and huge ints become JSON."""
        with RolloutTrace(tmp_path / "t.jsonl") as tr:
            tr.emit(
                "x",
                n=np.int64(7),
                f=np.float32(0.5),
                arr=np.arange(3),
                p=Path("/a/b"),
                c=Color.RED,
                s={3, 1, 2},
                tup=(1, 2),
                big=2**80,
                obj=object,
                tbv={3: 100},
            )
        e = list(read_events(tmp_path / "t.jsonl"))[1]  # integers of any size read exactly
        assert (e["n"], e["f"], e["arr"], e["p"], e["c"]) == (7, 0.5, [0, 1, 2], "/a/b", "red")
        assert (e["s"], e["tup"], e["big"]) == ([1, 2, 3], [1, 2], 2**80)
        assert e["obj"] == repr(object) and e["tbv"] == {"3": 100}

    def test_reserved_keys_win_and_the_callers_value_is_kept(self, tmp_path):
        """A caller's t/run_id/event field never overwrites the trace's; it is kept as t_ etc."""
        with RolloutTrace(tmp_path / "t.jsonl") as tr:
            tr.emit("x", t=1, run_id="mine", event="other", ok=True)
            tr.flush()
            assert tr.stats.renamed_fields == 1
        e = lines(tmp_path / "t.jsonl")[1]
        assert (e["event"], e["run_id"]) == ("x", tr.run_id) and e["t"] > 1
        assert (e["t_"], e["run_id_"], e["event_"], e["ok"]) == (1, "mine", "other", True)

    def test_a_name_that_is_no_string_is_written_as_its_text(self, tmp_path, cli, caplog):
        """emit(123) raises nothing and loses nothing: the line is kind "123" with its fields,
        validate passes the file (warning of an unknown kind), and one warning says why."""
        with RolloutTrace(tmp_path / "t.jsonl") as tr:
            tr.emit(123, n=1)  # type: ignore[arg-type]
            tr.emit(None, n=2)  # type: ignore[arg-type]
            tr.flush()
            assert tr.stats.renamed_fields == 2
        events = lines(tmp_path / "t.jsonl")[1:]
        assert [(e["event"], e["n"]) for e in events] == [("123", 1), ("None", 2)]
        warned = [r.getMessage() for r in caplog.records if "takes the event's name" in r.message]
        assert len(warned) == 1 and "123 (int)" in warned[0]
        with RolloutTrace(tmp_path / "u.jsonl") as tr:
            tr.emit(7, event="mine")  # type: ignore[arg-type]  # a name and a field at fault
            tr.flush()
            assert tr.stats.renamed_fields == 1  # one event, counted once
        [e] = lines(tmp_path / "u.jsonl")[1:]
        assert (e["event"], e["event_"]) == ("7", "mine")
        proc = cli("validate", str(tmp_path / "t.jsonl"))
        assert proc.returncode == 0, proc.stdout + proc.stderr

    def test_an_enum_name_is_written_as_its_value(self, tmp_path):
        """A ``(str, Enum)`` member, or a plain Enum member with a string value, names its
        kind: written as its value and not counted as renamed (``str()`` of it is
        ``Kind.SEAL``), with a reserved field too."""
        import enum

        class Kind(str, enum.Enum):
            SEAL = "group.seal"

        class Plain(enum.Enum):
            STEP = "train.step"

        with RolloutTrace(tmp_path / "t.jsonl") as tr:
            tr.emit(Kind.SEAL, group_id="g", prompt_id=1, tokens=0)
            tr.emit(Plain.STEP, step=0, trained_version=0, group_ids=["g"])  # type: ignore[arg-type]
            tr.emit(Plain.STEP, event="mine")  # type: ignore[arg-type]
            tr.flush()
            assert tr.stats.renamed_fields == 1  # the field named event, only
        kinds = [e["event"] for e in lines(tmp_path / "t.jsonl")[1:]]
        assert kinds == ["group.seal", "train.step", "train.step"]

    def test_emit_after_close_is_a_silent_no_op(self, tmp_path):
        """After close, emit does nothing and raises nothing; close is idempotent."""
        tr = RolloutTrace(tmp_path / "t.jsonl")
        tr.close()
        tr.close()
        tr.emit("late", x=1)
        tr.flush()
        assert [e["event"] for e in lines(tmp_path / "t.jsonl")] == ["run.start"]

    def test_many_threads_lose_nothing_and_never_interleave(self, tmp_path):
        """Eight threads emitting at once: every event is written once, as a whole line."""
        with RolloutTrace(tmp_path / "t.jsonl") as tr:

            def work(n: int) -> None:
                for i in range(2000):
                    tr.emit("x", thread=n, i=i, pad="y" * (i % 50))

            threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        events = lines(tmp_path / "t.jsonl")[1:]
        assert len(events) == 16000
        for n in range(8):
            assert [e["i"] for e in events if e["thread"] == n] == list(range(2000))


class TestFlush:
    def test_flush_makes_earlier_events_readable(self, tmp_path):
        """After flush returns, everything emitted before it is in the file."""
        tr = RolloutTrace(tmp_path / "t.jsonl")
        for i in range(5000):
            tr.emit("x", i=i)
        tr.flush()
        assert len(lines(tmp_path / "t.jsonl")) == 5001
        tr.close()

    def test_events_reach_the_file_without_flush(self, tmp_path):
        """The writer appends on its own: a line appears without flush or close."""
        tr = RolloutTrace(tmp_path / "t.jsonl")
        tr.emit("x")
        deadline = time.monotonic() + 5
        while len(lines(tmp_path / "t.jsonl")) < 2 and time.monotonic() < deadline:
            time.sleep(0.001)
        assert len(lines(tmp_path / "t.jsonl")) == 2
        tr.close()


class TestBoundedQueue:
    def test_full_queue_drops_counts_and_reports(self, tmp_path):
        """With the writer stuck, emits past capacity are dropped, never block, and the count
        is written as trace.dropped once the writer moves again: written + dropped = emitted."""
        blocker = BlockingExporter()
        tr = RolloutTrace(tmp_path / "t.jsonl", capacity=100, exporters=[blocker])
        blocker.entered.wait(5)
        started = time.monotonic()
        for i in range(1000):
            tr.emit("x", i=i)
        assert time.monotonic() - started < 1.0  # never waited on the writer
        blocker.release.set()
        tr.close()
        events = lines(tmp_path / "t.jsonl")
        written = [e for e in events if e["event"] == "x"]
        dropped = sum(e["count"] for e in events if e["event"] == "trace.dropped")
        assert dropped > 0 and len(written) + dropped == 1000
        assert tr.stats.dropped_queue_full == dropped
        assert [e["i"] for e in written] == sorted(e["i"] for e in written)

    def test_the_drop_report_keeps_the_files_times_in_order(self, tmp_path):
        """A trace.dropped line takes its batch's last event's time, so that every line's
        ``t`` is at least the one before it, however often the queue overflows."""
        tr = RolloutTrace(tmp_path / "t.jsonl", capacity=20, exporters=[SlowExporter(0.002)])
        for i in range(30_000):
            tr.emit("x", i=i)
        tr.close()
        events = lines(tmp_path / "t.jsonl")
        assert sum(e["event"] == "trace.dropped" for e in events) > 1
        times = [e["t"] for e in events]
        assert times == sorted(times)

    def test_capacity_from_the_environment(self, tmp_path, monkeypatch):
        """OTEL_ROLLOUT_QUEUE_SIZE sets the capacity when no argument does."""
        monkeypatch.setenv("OTEL_ROLLOUT_QUEUE_SIZE", "5")
        blocker = BlockingExporter()
        tr = RolloutTrace(tmp_path / "t.jsonl", exporters=[blocker])
        blocker.entered.wait(5)
        for _ in range(50):
            tr.emit("x")
        blocker.release.set()
        tr.close()
        assert tr.stats.dropped_queue_full >= 40


class TestExporters:
    def test_extra_exporters_see_every_event_in_order(self, tmp_path):
        """An exporter gets the same events as the file, on the writer thread, then shutdown."""
        memory = InMemoryExporter()
        with RolloutTrace(tmp_path / "t.jsonl", exporters=[memory]) as tr:
            for i in range(100):
                tr.emit("x", i=i)
        assert memory.events == lines(tmp_path / "t.jsonl") and memory.shut_down

    def test_a_failing_exporter_does_not_stop_the_log(self, tmp_path, caplog):
        """An exporter that raises is logged once and counted; the JSONL file is complete."""

        class Broken:
            def export(self, events):
                raise RuntimeError("collector down")

            def shutdown(self):
                pass

        with RolloutTrace(tmp_path / "t.jsonl", exporters=[Broken()]) as tr:
            for i in range(10):
                tr.emit("x", i=i)
                tr.flush()
        assert len(lines(tmp_path / "t.jsonl")) == 11
        assert tr.stats.exporter_errors >= 10
        assert sum("Broken failed" in r.getMessage() for r in caplog.records) == 1


def in_forked_child(work: Callable[[], None]) -> int:
    """Run ``work`` in a forked child that then leaves with os._exit; its exit code."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        code = 1
        try:
            work()
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


class TestProcessLifetime:
    def test_fork_child_is_a_new_run_with_its_own_writer(self, tmp_path):
        """A forked child gets a new run_id and writer; the parent goes on unaffected."""
        path = tmp_path / "t.jsonl"
        tr = RolloutTrace(path)
        tr.emit("parent.before")

        def child() -> None:
            tr.emit("child.event")
            tr.close()

        assert in_forked_child(child) == 0
        tr.emit("parent.after")
        tr.close()
        events = lines(path)
        child_start = next(e for e in events if e.get("parent_run_id") == tr.run_id)
        child = next(e for e in events if e["event"] == "child.event")
        assert child["run_id"] == child_start["run_id"] != tr.run_id
        parent = [e["event"] for e in events if e["run_id"] == tr.run_id]
        assert parent == ["run.start", "parent.before", "parent.after"]

    def test_fork_child_sends_spans_as_its_own_run(self, tmp_path):
        """With OTLP on, a forked child's spans carry its own run_id as the service instance,
        and the parent's keep the parent's."""
        with OtlpReceiver() as receiver:
            tr = RolloutTrace(tmp_path, endpoint=receiver.endpoint)

            def child() -> None:
                tr.emit("checkpoint.publish", step=1, weight_version=1)
                tr.close()

            assert in_forked_child(child) == 0
            tr.emit("checkpoint.publish", step=0, weight_version=0)
            tr.close()
            spans = receiver.spans()
        owners = {
            OtlpReceiver.attributes(span)["rollout.step"]: resource["service.instance.id"]
            for resource, span in spans
        }
        child_run = next(
            e["run_id"] for e in lines(tmp_path / "rollout_trace.jsonl") if "parent_run_id" in e
        )
        assert owners == {0: tr.run_id, 1: child_run}

    def test_interpreter_exit_writes_what_was_queued(self, tmp_path):
        """A program that never closes its trace still gets every event written at exit."""
        path = tmp_path / "t.jsonl"
        program = (
            "import sys\nfrom otel_rollout.trace import RolloutTrace\n"
            "tr = RolloutTrace(sys.argv[1])\n"
            "for i in range(20000): tr.emit('x', i=i)\n"
        )
        subprocess.run([sys.executable, "-c", program, str(path)], check=True, timeout=60)
        events = list(read_events(path))
        assert [e["i"] for e in events[1:]] == list(range(20000))


def test_a_trace_made_off_the_main_thread_says_it_sets_no_sigterm_handler(tmp_path):
    """Signals are the main thread's to handle: a first trace opened on another thread says
    once that SIGTERM will not write what is queued; one on the main thread sets it."""
    script = (
        "import signal, threading\n"
        "from otel_rollout.trace import RolloutTrace\n"
        f"made = []\n"
        f"t = threading.Thread(target=lambda: made.append(RolloutTrace({str(tmp_path / 'a')!r})))\n"
        "t.start(); t.join()\n"
        f"made.append(RolloutTrace({str(tmp_path / 'b')!r}))\n"
        "print(signal.getsignal(signal.SIGTERM).__name__)\n"
        "for m in made: m.close()\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("sets no SIGTERM handler") == 1
    assert done.stdout.strip() == "_on_sigterm"


def test_a_relative_log_path_survives_a_change_of_directory(tmp_path, monkeypatch):
    """A trace opened on a relative path keeps writing the same file after the trainer
    changes directory (and reopens that file, not a new one there, if it is removed)."""
    first, second = tmp_path / "one", tmp_path / "two"
    first.mkdir()
    second.mkdir()
    monkeypatch.chdir(first)
    tr = RolloutTrace("runs/x")
    assert tr.path == first / "runs" / "x" / "rollout_trace.jsonl"
    monkeypatch.chdir(second)
    tr.emit("tick", i=1)
    tr.close()
    assert not (second / "runs").exists()
    assert b'"tick"' in (first / "runs" / "x" / "rollout_trace.jsonl").read_bytes()
