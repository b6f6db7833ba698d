"""Faults a week-long run meets: a full or read-only disk, a deleted log directory,
producers faster than the disk, a hung or refusing collector, SIGTERM and os._exit.

The rule under every test: emit never raises, and every event handed over is either
in the file or counted as dropped, exactly.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import orjson
import pytest
from conftest import SlowExporter
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from otel_rollout import RolloutTrace, _writer
from otel_rollout.exporters import JsonlExporter
from otel_rollout.reader import EventReader
from otel_rollout.testing import BlackHole, InMemoryExporter, OtlpReceiver


def tally(path: Path) -> tuple[list[dict], int, int]:
    """The file's ``x`` events, the drops it reports, and the lines the reader skipped."""
    reader = EventReader(path, on_skip=lambda *a: None)
    events = list(reader)
    xs = [e for e in events if e["event"] == "x"]
    dropped = sum(e["count"] for e in events if e["event"] == "trace.dropped")
    return xs, dropped, reader.skipped


def mount_tmpfs(where: Path, size: str) -> None:
    """Mount a tmpfs of ``size`` at ``where``, or skip the test (mounting needs root)."""
    command = ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)]
    result = subprocess.run(command, capture_output=True)
    if result.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {result.stderr.decode().strip()}")


@pytest.fixture(scope="class")
def tmpfs_once(tmp_path_factory):
    """One small tmpfs for a whole class of examples."""
    where = tmp_path_factory.mktemp("disk")
    mount_tmpfs(where, "256k")
    yield where
    subprocess.run(["umount", "-l", str(where)], check=False)


@pytest.fixture
def tmpfs(tmp_path):
    """Small tmpfs mounts for one test: ``mount(size)`` returns the next one's path."""
    mounted: list[Path] = []

    def mount(size: str) -> Path:
        where = tmp_path / f"disk{len(mounted)}"
        where.mkdir()
        mount_tmpfs(where, size)
        mounted.append(where)
        return where

    yield mount
    for where in mounted:
        subprocess.run(["umount", "-l", str(where)], check=False)


def fill(where: Path, leave: int) -> Path:
    """Fill the file system at ``where`` until ``leave`` bytes are free."""
    filler = where / "filler"
    stat = os.statvfs(where)
    free = stat.f_bavail * stat.f_frsize
    filler.write_bytes(b"\0" * max(free - leave, 0))
    return filler


class TestDiskFaults:
    def test_dev_full_never_raises_and_close_is_bounded(self, monkeypatch, caplog):
        """Every write fails: emit still returns at once, the error is logged once,
        close gives up within its timeout, and every event is counted as dropped."""
        monkeypatch.setenv("OTEL_ROLLOUT_CLOSE_TIMEOUT", "1")
        tr = RolloutTrace("/dev/full", capacity=500)
        assert all(tr.emit("x", i=i) is None for i in range(5000))
        started = time.monotonic()
        tr.close()
        assert time.monotonic() - started < 2.0
        assert tr.stats.written == 0 and tr.stats.dropped == 5001  # with run.start
        assert caplog.text.count("cannot write /dev/full") == 1

    def test_a_full_disk_that_clears_loses_nothing(self, tmpfs, caplog):
        """Events that meet a full disk wait in the queue and are all written, once and in
        order, when space comes back; the cut line the fault leaves is one skipped line."""
        disk = tmpfs("1m")
        filler = fill(disk, leave=8 << 10)
        tr = RolloutTrace(disk / "t.jsonl")
        for i in range(3000):
            tr.emit("x", i=i, pad="p" * 64)
        time.sleep(0.3)  # the writer meets ENOSPC and retries
        filler.unlink()
        tr.close()
        xs, dropped, skipped = tally(disk / "t.jsonl")
        assert [e["i"] for e in xs] == list(range(3000)) and dropped == 0
        assert skipped <= 1 and tr.stats.written == 3001 and tr.stats.dropped == 0
        assert caplog.text.count("cannot write") == 1 and "writing" in caplog.text

    def test_a_file_made_immutable_then_writable_again(self, tmp_path):
        """The log made immutable under the writer (chattr +i: every write fails with
        EPERM): nothing is lost once the flag is cleared."""
        path = tmp_path / "t.jsonl"
        tr = RolloutTrace(path)
        for i in range(100):
            tr.emit("x", i=i)
        tr.flush()
        if subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode:
            tr.close()
            pytest.skip("chattr +i is not supported on this file system")
        try:
            for i in range(100, 600):
                tr.emit("x", i=i)
            time.sleep(0.3)
        finally:
            subprocess.run(["chattr", "-i", str(path)], check=True)
        for i in range(600, 700):
            tr.emit("x", i=i)
        tr.close()
        xs, dropped, _ = tally(path)
        assert [e["i"] for e in xs] == list(range(700)) and dropped == 0

    def test_a_deleted_log_directory_is_recreated(self, tmp_path, caplog):
        """Deleting the log directory under a running trace: the next events go to a new
        file at the same path, not into the deleted one."""
        logs = tmp_path / "logs" / "run1"
        logs.mkdir(parents=True)
        tr = RolloutTrace(logs)
        for i in range(10):
            tr.emit("x", i=i)
        tr.flush()
        shutil.rmtree(tmp_path / "logs")
        for i in range(10, 20):
            tr.emit("x", i=i)
        tr.close()
        xs, _, _ = tally(logs / "rollout_trace.jsonl")
        assert [e["i"] for e in xs] == list(range(10, 20))
        assert tr.stats.dropped == 0 and "was deleted" in caplog.text

    def test_a_partly_written_batch_is_counted_line_by_line(self, tmpfs):
        """When the disk takes only part of a batch, the lines that made it count as
        written, and the next write ends the cut line."""
        disk = tmpfs("1m")
        filler = fill(disk, leave=4 << 10)
        log = JsonlExporter(disk / "t.jsonl")
        batch = [
            {"t": 1.0, "run_id": "r", "event": "x", "i": i, "pad": "p" * 100} for i in range(200)
        ]
        lost = log.export(batch)
        assert 0 < lost < 200 and log.retryable
        filler.unlink()
        assert log.export(batch[200 - lost :]) == 0 and not log.retryable
        log.shutdown()
        xs, _, skipped = tally(disk / "t.jsonl")
        assert [e["i"] for e in xs] == list(range(200)) and skipped <= 1


    def test_a_line_cut_just_before_its_newline_is_written_once(self, tmpfs):
        """A disk with one page of room takes a 4,097-byte line all but its newline: that line
        counts as written (the next write's lead ends it), so it is not written twice."""
        disk = tmpfs("1m")
        filler = fill(disk, leave=4096)
        log = JsonlExporter(disk / "t.jsonl")
        first = {"t": 1.0, "run_id": "r", "event": "x", "i": 0, "pad": ""}
        first["pad"] = "p" * (4096 - len(orjson.dumps(first)))
        assert len(orjson.dumps(first)) + 1 == 4097
        batch = [first, {"t": 1.0, "run_id": "r", "event": "x", "i": 1}]
        assert log.export(batch) == 1 and log.retryable
        assert (disk / "t.jsonl").read_bytes() == orjson.dumps(first)
        filler.unlink()
        assert log.export(batch[1:]) == 0
        log.shutdown()
        xs, _, skipped = tally(disk / "t.jsonl")
        assert [e["i"] for e in xs] == [0, 1] and skipped == 0


class TestPartialWrites:
    @settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
    @given(
        sizes=st.lists(st.integers(0, 3000), min_size=1, max_size=40),
        room=st.integers(0, 3),
        buffered=st.booleans(),
    )
    def test_what_a_full_disk_took_is_counted_exactly(self, tmpfs_once, sizes, room, buffered):
        """Whatever room the disk has, export reports as written exactly the lines that
        reached the file whole (the last of them perhaps all but its newline, which the next
        write's lead adds), whether it was handed the events or, as the writer hands
        it the line buffer, their lines joined in one item and a last event (the drop
        report's place); the rest of the file is at most the start of the next line, which
        the next export of the lost lines ends, so every event reads back once, in order."""
        path = tmpfs_once / "t.jsonl"
        path.unlink(missing_ok=True)
        filler = fill(tmpfs_once, leave=room * 4096)
        log = JsonlExporter(path)
        batch = [
            {"t": 1.0, "run_id": "r", "event": "x", "i": i, "pad": "p" * n}
            for i, n in enumerate(sizes)
        ]
        lines = [orjson.dumps(e) + b"\n" for e in batch]
        items: list = [b"".join(lines[:-1]), batch[-1]] if buffered and len(batch) > 1 else batch
        whole = len(batch) - log.export(items)
        content = path.read_bytes()
        done = b"".join(lines[:whole])
        # A line cut just before its newline counts as written: the next export's lead ends it.
        unended = whole > 0 and content == done[:-1]
        cut = b"" if unended else content[len(done) :]
        assert content.startswith(done) or unended
        assert cut == b"" or (lines[whole].startswith(cut) and cut != lines[whole])
        filler.unlink()
        tail = _writer._last_lines(items, len(batch) - whole)  # what the writer retries
        assert len(tail) == len(batch) - whole
        assert log.export(tail) == 0
        log.shutdown()
        xs, _, skipped = tally(path)
        assert [e["i"] for e in xs] == list(range(len(batch))) and skipped == (1 if cut else 0)


class TestOverload:
    def test_threads_and_asyncio_outrun_a_slow_disk(self, tmp_path):
        """Six threads and an asyncio loop emit faster than a slow reader drains a FIFO:
        the queue never holds more than its capacity, every line is whole and unique,
        and what is missing is exactly what trace.dropped reports."""
        fifo = tmp_path / "slow.jsonl"
        os.mkfifo(fifo)
        received = bytearray()
        slow = threading.Event()
        slow.set()

        def drain() -> None:
            with open(fifo, "rb", buffering=0) as f:
                while chunk := f.read(4096):
                    received.extend(chunk)
                    if slow.is_set():
                        time.sleep(0.002)  # ~2 MB/s: slower than the producers

        reader = threading.Thread(target=drain)
        reader.start()
        capacity = 2000
        tr = RolloutTrace(fifo, capacity=capacity)
        most = [0]
        producing = threading.Event()
        producing.set()

        def watch() -> None:
            while producing.is_set():
                most[0] = max(most[0], tr.stats.queued)
                time.sleep(0.0005)

        def thread_producer(p: int) -> None:
            for i in range(5000):
                tr.emit("x", p=p, i=i)

        async def task_producer(p: int) -> None:
            for i in range(5000):
                tr.emit("x", p=p, i=i)
                if i % 100 == 0:
                    await asyncio.sleep(0)

        async def loop_producers() -> None:
            await asyncio.gather(task_producer(100), task_producer(101))

        watcher = threading.Thread(target=watch)
        watcher.start()
        threads = [threading.Thread(target=thread_producer, args=(p,)) for p in range(6)]
        threads.append(threading.Thread(target=lambda: asyncio.run(loop_producers())))
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        producing.clear()
        watcher.join()
        slow.clear()
        tr.close()
        reader.join(timeout=30)

        lines = bytes(received).split(b"\n")
        assert lines[-1] == b""
        events = [orjson.loads(line) for line in lines[:-1]]  # raises on a torn or mixed line
        xs = [e for e in events if e["event"] == "x"]
        dropped = sum(e["count"] for e in events if e["event"] == "trace.dropped")
        keys = [(e["p"], e["i"]) for e in xs]
        assert len(keys) == len(set(keys))
        for p in [*range(6), 100, 101]:
            mine = [i for q, i in keys if q == p]
            assert mine == sorted(mine)
        assert len(xs) + dropped == 8 * 5000 and dropped == tr.stats.dropped_queue_full > 0
        assert most[0] <= capacity + 2  # plus run.start and the close marker


@pytest.fixture(params=["grpc", "http/protobuf"])
def protocol(request):
    return request.param


class TestExporterFaults:
    def test_a_black_hole_collector_delays_nothing(self, tmp_path, monkeypatch, protocol):
        """A collector that accepts and never answers: the file gets every event, and
        close returns within OTEL_ROLLOUT_CLOSE_TIMEOUT."""
        monkeypatch.setenv("OTEL_ROLLOUT_CLOSE_TIMEOUT", "2")
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "1")  # abandoned exporters end soon
        with BlackHole() as hole:
            tr = RolloutTrace(tmp_path, endpoint=hole.endpoint, protocol=protocol, metrics={"otlp"})
            for i in range(2000):
                tr.emit("x", i=i)
            started = time.monotonic()
            tr.close()
            assert time.monotonic() - started < 3.0
            assert hole.connections >= 1
        xs, _, _ = tally(tmp_path / "rollout_trace.jsonl")
        assert len(xs) == 2000 and tr.stats.dropped == 0

    def test_a_refusing_collector_costs_only_spans(self, tmp_path, caplog, monkeypatch, protocol):
        """Every export answered with an error: spans are dropped and counted, the file
        is complete."""
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "1")  # the SDK retries until then
        with OtlpReceiver(protocol, fail=True) as receiver:
            tr = RolloutTrace(tmp_path, endpoint=receiver.endpoint, protocol=protocol)
            for i in range(300):
                tr.emit("group.reserve", group_id=f"g{i}", prompt_id=i, size=1, weight_version=0)
            tr.close()
            assert receiver.refused >= 1 and receiver.spans() == []
        assert "spans could not be exported" in caplog.text
        events = list(EventReader(tmp_path / "rollout_trace.jsonl"))
        assert len(events) == 301

    def test_a_slow_collector_gets_its_spans_and_delays_nothing(self, tmp_path, protocol):
        """A collector that takes a second to answer still receives the spans; the file
        is complete and close is bounded."""
        with OtlpReceiver(protocol, delay=1.0) as receiver:
            tr = RolloutTrace(tmp_path, endpoint=receiver.endpoint, protocol=protocol)
            for i in range(300):
                tr.emit("group.reserve", group_id=f"g{i}", prompt_id=i, size=1, weight_version=0)
            tr.close()
            assert len(receiver.spans()) >= 1
        assert len(list(EventReader(tmp_path / "rollout_trace.jsonl"))) == 301


def run_child(
    code: str, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


class TestProcessFaults:
    def test_sigterm_writes_what_was_queued_then_dies_of_it(self, tmp_path):
        """SIGTERM right after a burst: every queued event is in the file, and the process
        still ends as killed by SIGTERM."""
        proc = run_child(
            """
            import os, signal, sys, time
            from otel_rollout import RolloutTrace
            tr = RolloutTrace(sys.argv[1])
            for i in range(50_000):
                tr.emit("x", i=i)
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(30)
            """,
            str(tmp_path),
        )
        assert proc.returncode == -signal.SIGTERM, proc.stderr
        xs, _, _ = tally(tmp_path / "rollout_trace.jsonl")
        assert [e["i"] for e in xs] == list(range(50_000))

    def test_a_programs_own_sigterm_handler_is_left_alone(self, tmp_path):
        """If the program set a SIGTERM handler first, the trace does not replace it."""
        proc = run_child(
            """
            import signal, sys
            def mine(*a):
                pass
            signal.signal(signal.SIGTERM, mine)
            from otel_rollout import RolloutTrace
            tr = RolloutTrace(sys.argv[1])
            print(signal.getsignal(signal.SIGTERM) is mine)
            tr.close()
            """,
            str(tmp_path),
        )
        assert proc.stdout.strip() == "True", proc.stderr

    def test_sigterm_handling_can_be_turned_off(self, tmp_path):
        """OTEL_ROLLOUT_HANDLE_SIGTERM=false leaves SIGTERM's default action."""
        proc = run_child(
            """
            import signal, sys
            from otel_rollout import RolloutTrace
            tr = RolloutTrace(sys.argv[1])
            print(signal.getsignal(signal.SIGTERM) is signal.SIG_DFL)
            tr.close()
            """,
            str(tmp_path),
            env={**os.environ, "OTEL_ROLLOUT_HANDLE_SIGTERM": "false"},
        )
        assert proc.stdout.strip() == "True", proc.stderr

    def test_sigterm_while_emit_counts_drops_does_not_deadlock(self, tmp_path):
        """A real SIGTERM lands while the main thread floods emit past a full queue (each
        emit counting a drop under the pipeline's lock); the handler's close on that same
        thread still finishes, and the process dies of SIGTERM with whole lines written."""
        for attempt in range(3):
            path = tmp_path / f"flood-{attempt}.jsonl"
            proc = run_child(
                """
                import os, signal, sys, threading, time
                from otel_rollout import RolloutTrace
                tr = RolloutTrace(sys.argv[1], capacity=1)

                def kill_soon():
                    time.sleep(0.3)
                    os.kill(os.getpid(), signal.SIGTERM)

                threading.Thread(target=kill_soon, daemon=True).start()
                while True:
                    tr.emit("x", i=0)
                """,
                str(path),
            )
            assert proc.returncode == -signal.SIGTERM, proc.stderr
            _, dropped, skipped = tally(path)
            assert skipped == 0 and dropped > 0

    def test_a_second_close_waits_for_the_first(self, tmp_path):
        """close from a SIGTERM handler, while the main thread is already closing, returns
        only when the first close's work is done (so the process cannot die half-way)."""

        class SlowToShutDown(InMemoryExporter):
            def shutdown(self) -> None:
                time.sleep(0.5)
                super().shutdown()

        slow = SlowToShutDown()
        tr = RolloutTrace(tmp_path, exporters=[slow])
        tr.emit("x", i=0)
        first = threading.Thread(target=tr.close)
        first.start()
        time.sleep(0.1)
        tr.close()
        assert slow.shut_down
        first.join()

    def test_os_exit_loses_only_an_unwritten_tail(self, tmp_path):
        """os._exit skips every cleanup: what reached the file is a gap-free prefix of what
        was emitted, and the file reads cleanly."""
        proc = run_child(
            """
            import os, sys, time
            from otel_rollout import RolloutTrace
            tr = RolloutTrace(sys.argv[1])
            for i in range(20_000):
                tr.emit("x", i=i)
                if i % 1000 == 0:
                    time.sleep(0.005)
            os._exit(3)
            """,
            str(tmp_path),
        )
        assert proc.returncode == 3, proc.stderr
        xs, _, skipped = tally(tmp_path / "rollout_trace.jsonl")
        assert [e["i"] for e in xs] == list(range(len(xs))) and len(xs) > 0 and skipped <= 1


class Unencodable:
    def __repr__(self) -> str:
        return "<unencodable>"


class TestCallerFields:
    def test_every_emit_becomes_one_line_by_the_documented_rules(self, tmp_path, caplog):
        """Values orjson cannot take, huge values and reserved keys: emit never raises and
        each call is one valid line, by the rules the README states."""
        loop: list = []
        loop.append(loop)
        deep: list = []
        for _ in range(5000):
            deep = [deep]
        calls = {
            "object": {"v": Unencodable()},
            "set": {"v": {3, 1, 2}},
            "bytes": {"v": b"\xff\x00ab"},
            "nan": {"v": float("nan"), "w": float("inf")},
            "huge_int": {"v": 10**100},
            "int_keys": {"v": {1: "a", (2, 3): "b"}},
            "cycle": {"v": loop},
            "deep": {"v": deep},
            "oversized": {"v": "x" * (5 << 20)},
            "reserved": {"t": "mine", "run_id": "mine", "event": "mine"},
        }
        tr = RolloutTrace(tmp_path)
        for name, fields in calls.items():
            assert tr.emit(name, **fields) is None
        tr.close()
        events = {e["event"]: e for e in EventReader(tmp_path / "rollout_trace.jsonl")}
        assert set(calls) <= set(events)
        assert events["object"]["v"] == "<unencodable>"
        assert events["set"]["v"] == [1, 2, 3]
        assert events["nan"]["v"] is None and events["nan"]["w"] is None
        assert events["huge_int"]["v"] == 10**100  # the exact number, as readers keep it
        assert events["int_keys"]["v"] == {"1": "a", "(2, 3)": "b"}
        for name in ("cycle", "deep"):
            assert "v" not in events[name] and "Recursion" in events[name]["unencodable"]
        assert events["oversized"]["oversized"]["fields"] == ["v"]
        assert events["reserved"]["t_"] == "mine" and events["reserved"]["event_"] == "mine"
        assert tr.stats.renamed_fields == 1 and tr.stats.dropped == 0


def test_a_line_the_writer_cut_to_its_kind_is_named_as_such(tmp_path, cli, monkeypatch):
    """An event over OTEL_ROLLOUT_MAX_EVENT_BYTES, or one no JSON holds, is written as its
    kind and time; validate and the readers say the writer left its fields out, once, not
    that every required field is missing."""
    monkeypatch.setenv("OTEL_ROLLOUT_MAX_EVENT_BYTES", "200")
    loop: list = []
    loop.append(loop)
    tr = RolloutTrace(tmp_path)
    tr.emit("group.reserve", group_id="g" * 300, prompt_id=1, size=1, weight_version=0)
    tr.emit("group.admit", group_id="g", prompt_id=loop)
    tr.close()
    checked = cli("validate", str(tmp_path)).stdout
    assert ":2: error: written without its fields by the writer: " in checked
    assert ":3: error: written without its fields by the writer, which could not encode" in checked
    assert "missing required field" not in checked
    read = cli("cost", str(tmp_path)).stderr  # (run.start too was cut to its kind, here)
    said = "written without its fields by the writer"
    assert read.count(said) == checked.count(said) >= 2 and "not a trace" not in read


def test_an_exporter_that_outlasts_close_leaves_its_events_counted_as_queued(
    tmp_path, monkeypatch
):
    """A user exporter that sleeps past OTEL_ROLLOUT_CLOSE_TIMEOUT holds the writer: what it
    had not written is counted as queued, so written + dropped + queued = accepted (the
    stop marker in the queue is no event)."""
    monkeypatch.setenv("OTEL_ROLLOUT_CLOSE_TIMEOUT", "1")
    tr = RolloutTrace(tmp_path, exporters=[SlowExporter(3)])
    time.sleep(0.3)  # the run.start is written; the writer is now in Slow.export
    for i in range(3):
        tr.emit("tick", i=i)
    tr.close()
    s = tr.stats
    assert (s.written, s.dropped, s.queued) == (1, 0, 3)


def test_a_callers_own_t_underscore_is_not_written_over(tmp_path):
    """``emit("x", t_=9, t=1)``: the caller's ``t_`` keeps its name and value, and the
    renamed ``t`` takes ``t__``."""
    tr = RolloutTrace(tmp_path)
    tr.emit("x", t_=9, t=1)
    tr.emit("y", t=1, t_=9)
    tr.close()
    events = {e["event"]: e for e in EventReader(tmp_path / "rollout_trace.jsonl")}
    for name in ("x", "y"):
        assert (events[name]["t_"], events[name]["t__"]) == (9, 1)
