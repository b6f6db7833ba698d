"""The writer's drain: the compiled line buffer written without the GIL until Python is
needed, and the one write rule (``write_whole``) the log's Python path shares with it."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from errno import EBADF, EFBIG

import orjson
import pytest

from otel_rollout.reader import read_events
from otel_rollout.trace import RolloutTrace

try:
    from otel_rollout import _emit
except ImportError:  # built without a compiler
    _emit = None  # type: ignore[assignment]

pytestmark = pytest.mark.skipif(_emit is None, reason="needs the compiled _emit")

if _emit is not None:
    ASKED, REPORT, URGENT, FAILED = (
        _emit.DRAIN_ASKED, _emit.DRAIN_REPORT, _emit.DRAIN_URGENT, _emit.DRAIN_FAILED
    )
URGENT_MARKS = (b'"event":"checkpoint.publish"',)


def _line(i: int, event: str = "x") -> bytes:
    return b'{"t":%d.5,"event":"%s","i":%d}\n' % (1_000 + i, event.encode(), i)


def _drain_in_thread(buffer, fd, gather=0.001, report_after=60.0, urgent=URGENT_MARKS):
    """drain() on a thread of its own, as the writer runs it; its result in ``out``."""
    out: list = []
    thread = threading.Thread(
        target=lambda: out.append(buffer.drain(fd, gather, report_after, urgent))
    )
    thread.start()
    return thread, out


def _wait_for(predicate, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.001)
    return predicate()


def test_drain_writes_lines_as_they_come_and_an_interrupt_hands_back(tmp_path):
    """Lines appended while drain runs reach the file with no flush and no GIL taken back;
    an interrupt ends it at once, every line counted drained and none left taken."""
    path = tmp_path / "d.jsonl"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    buffer = _emit.LineBuffer()
    thread, out = _drain_in_thread(buffer, fd)
    lines = [_line(i) for i in range(300)]
    for i, line in enumerate(lines):
        buffer.append(line, 1_000 + i)
        if i % 50 == 0:  # some while it waits for a line, some while it gathers
            time.sleep(0.005)
    assert _wait_for(lambda: path.read_bytes() == b"".join(lines))
    assert thread.is_alive()  # still draining: nothing asked it to hand back
    buffer.interrupt()
    thread.join(10)
    assert not thread.is_alive()
    reason, written, chunk, _, errno, deleted = out[0]
    assert (reason, written, chunk, errno, deleted) == (ASKED, 300, None, 0, 0)
    assert buffer.drained == 300 and buffer.taken == 0 and buffer.lines == 0
    os.close(fd)


def test_an_interrupt_before_drain_is_not_lost(tmp_path):
    """An interrupt that came while the writer was elsewhere ends the next drain or wait at
    once (a flush queued then is answered), and only that one."""
    fd = os.open(tmp_path / "d.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    buffer = _emit.LineBuffer()
    buffer.interrupt()
    assert buffer.drain(fd, 0.001, 60.0, ())[0] == ASKED
    buffer.interrupt()
    buffer.wait()  # returns at once
    thread = threading.Thread(target=buffer.wait)
    thread.start()
    assert _wait_for(lambda: buffer.idle)  # this one waits: no interrupt left over
    buffer.append(_line(0), 1.0)
    thread.join(10)
    assert not thread.is_alive()
    os.close(fd)


def test_drain_hands_back_after_report_after_seconds_of_writing(tmp_path):
    """Lines that keep coming do not keep drain from handing back: it reports about
    ``report_after`` seconds after its first write, with what it wrote."""
    fd = os.open(tmp_path / "d.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    buffer = _emit.LineBuffer()
    stop = threading.Event()

    def feed():
        i = 0
        while not stop.is_set():
            buffer.append(_line(i), 1.0)
            i += 1
            time.sleep(0.0005)

    feeder = threading.Thread(target=feed)
    feeder.start()
    try:
        start = time.monotonic()
        reason, written, chunk, *_ = buffer.drain(fd, 0.002, 0.2, ())
        took = time.monotonic() - start
    finally:
        stop.set()
        feeder.join()
    assert reason == REPORT and chunk is None and written > 0
    assert 0.15 <= took < 10, took
    os.close(fd)


def test_a_checkpoint_line_is_handed_back_unwritten_for_its_sync(tmp_path):
    """A batch holding an urgent line (a checkpoint's, synced at once) is handed back
    whole and unwritten, still counted taken; the batches before it are written."""
    path = tmp_path / "d.jsonl"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    buffer = _emit.LineBuffer()
    thread, out = _drain_in_thread(buffer, fd)
    buffer.append(_line(0), 1.0)
    assert _wait_for(lambda: path.read_bytes() == _line(0))
    buffer.append(_line(1, "checkpoint.publish"), 2.0)
    thread.join(10)
    # (none of it written: not the bytes of the batch written before it, as once reported)
    reason, written, chunk, done, errno, deleted = out[0]
    assert (reason, written, done, errno, deleted) == (URGENT, 1, 0, 0, 0)
    assert chunk == (_line(1, "checkpoint.publish"), 1, 2.0)
    assert path.read_bytes() == _line(0) and buffer.taken == 1
    buffer.written()
    assert buffer.taken == 0
    os.close(fd)


def test_a_deleted_file_and_a_bad_descriptor_hand_the_batch_back(tmp_path):
    """Into a deleted file drain writes nothing and hands the batch back (the log recreates
    the file); a write that fails hands it back with its errno."""
    path = tmp_path / "d.jsonl"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    path.unlink()
    buffer = _emit.LineBuffer()
    buffer.append(_line(0), 1.0)
    result = buffer.drain(fd, 0.0, 60.0, ())
    assert result == (FAILED, 0, (_line(0), 1, 1.0), 0, 0, 1)
    os.close(fd)
    path.write_bytes(b"")
    fd = os.open(path, os.O_RDONLY)  # (open: a closed number could be another thread's file)
    buffer.written()
    buffer.append(_line(1), 2.0)
    result = buffer.drain(fd, 0.0, 60.0, ())
    assert result == (FAILED, 0, (_line(1), 1, 2.0), 0, EBADF, 0)
    os.close(fd)


_PARTLY = textwrap.dedent(
    """
    import os, resource, signal, sys
    from otel_rollout import _emit
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # past the limit: a short write, then EFBIG
    resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[2]), int(sys.argv[2])))
    fd = os.open(sys.argv[1], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    buffer = _emit.LineBuffer()
    lines = [b'{"i":%d}\\n' % i for i in range(100)]
    for line in lines:
        buffer.append(line, 1.0)
    reason, written, chunk, done, errno, deleted = buffer.drain(fd, 0.0, 60.0, ())
    print(reason, written, done, errno, deleted, chunk[1], chunk[0] == b"".join(lines))
    """
)


def test_a_write_cut_short_hands_back_the_batch_and_how_much_of_it_is_in_the_file(tmp_path):
    """A file size limit cuts the write: drain hands the whole batch back with the bytes
    that reached the file and the errno (the log counts the whole lines among them)."""
    path = tmp_path / "d.jsonl"
    limit = 25  # three whole lines of 8 bytes, and the first byte of the fourth
    out = subprocess.run(
        [sys.executable, "-c", _PARTLY, str(path), str(limit)],
        capture_output=True, text=True, check=True, timeout=60,
    ).stdout.split()  # fmt: skip
    assert out == [str(FAILED), "0", str(limit), str(EFBIG), "0", "100", "True"]
    assert path.read_bytes() == b"".join(b'{"i":%d}\n' % i for i in range(4))[:limit]


def test_write_whole_writes_all_or_says_why_not(tmp_path):
    """write_whole writes the whole data; into a deleted file it writes nothing and says
    so, and a bad descriptor is its errno."""
    path = tmp_path / "w.jsonl"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    assert _emit.write_whole(fd, b"a\n" * 100_000) == (200_000, 0, 0)
    assert _emit.write_whole(fd, b"") == (0, 0, 0)
    assert path.read_bytes() == b"a\n" * 100_000
    path.unlink()
    assert _emit.write_whole(fd, b"d\n") == (0, 0, 1)
    os.close(fd)
    path.write_bytes(b"")
    fd = os.open(path, os.O_RDONLY)
    assert _emit.write_whole(fd, b"e\n") == (0, EBADF, 0)
    os.close(fd)


def test_drain_takes_no_bad_arguments(tmp_path):
    """Negative or NaN seconds and urgent marks that are not bytes are refused up front."""
    buffer = _emit.LineBuffer()
    buffer.interrupt()  # (were one taken, the drain would end at once, not wait for a line)
    with pytest.raises(ValueError):
        buffer.drain(1, -1.0, 1.0, ())
    with pytest.raises(ValueError):
        buffer.drain(1, 0.0, float("nan"), ())
    with pytest.raises(TypeError):
        buffer.drain(1, 0.0, 1.0, ("checkpoint",))
    with pytest.raises(TypeError):
        buffer.drain(1, 0.0, 1.0, (b"",))


def test_a_trace_writes_a_checkpoint_line_after_drained_ones_once(tmp_path, monkeypatch):
    """Through a trace: lines the drain wrote, then a checkpoint's line (handed back, written
    and synced at once: the syncer's own interval is an hour), then more; each is in the
    file once, in order, and counted written once (the handed-back batch was once taken for
    part-written, and lost)."""
    monkeypatch.setenv("OTEL_ROLLOUT_FSYNC_INTERVAL", "3600")
    trace = RolloutTrace(tmp_path / "t.jsonl")
    assert trace.path is not None
    trace.emit("x", i=0)
    assert _wait_for(lambda: trace.path.read_bytes().count(b"\n") == 2)  # drained, unflushed
    trace.emit("checkpoint.publish", step=1, weight_version=1)
    assert _wait_for(lambda: trace.path.read_bytes().count(b"\n") == 3)  # at once, no flush
    assert _wait_for(lambda: trace.stats.log_syncs >= 1, 30)  # and synced, not in an hour
    trace.emit("x", i=1)
    assert trace.flush()
    kinds = [e["event"] for e in read_events(trace.path)]
    assert kinds == ["run.start", "x", "checkpoint.publish", "x"]
    assert trace.stats.written == 4 and trace.stats.dropped == 0 and trace.stats.queued == 0
    trace.close()


def test_drops_are_reported_after_the_lines_emitted_before_them(tmp_path):
    """A burst past the capacity while the writer drains: the trace.dropped line counts
    every drop, comes after every line written before it, and no later in time than the
    line after it; written and dropped add up to what was emitted."""
    trace = RolloutTrace(tmp_path / "t.jsonl", capacity=50)
    assert trace.path is not None and trace._pipeline is not None
    assert trace._pipeline.caller_encodes
    for i in range(5000):  # ~5 ms: the writer gathers for 2 ms between writes
        trace.emit("x", i=i)
    assert trace.flush()
    trace.emit("after", n=1)
    trace.close()
    events = [orjson.loads(line) for line in trace.path.read_bytes().splitlines()]
    stats = trace.stats
    assert stats.dropped_queue_full > 0
    xs = [e["i"] for e in events if e["event"] == "x"]
    assert xs == sorted(xs) and len(xs) + stats.dropped_queue_full == 5000
    [report] = [n for n, e in enumerate(events) if e["event"] == "trace.dropped"]
    assert events[report]["count"] == stats.dropped_queue_full
    times = [e["t"] for e in events]
    assert times == sorted(times), "the file's times are out of order"
    assert stats.written == len(events) - 1 and stats.queued == 0  # (the report is no event)


_CUT_BEFORE_NEWLINE = textwrap.dedent(
    """
    import os, resource, signal, sys
    from pathlib import Path
    from otel_rollout import _emit
    from otel_rollout.exporters import JsonlExporter
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    path = Path(sys.argv[1])
    log = JsonlExporter(path, fsync_interval=float("inf"))
    buffer = _emit.LineBuffer()
    lines = [b'{"i":%d}\\n' % i for i in range(10)]
    for line in lines:
        buffer.append(line, 1.0)
    data = b"".join(lines)
    hard = resource.getrlimit(resource.RLIMIT_FSIZE)[1]
    resource.setrlimit(resource.RLIMIT_FSIZE, (len(data) - 1, hard))  # all but the newline
    whole, rest = log.drain(buffer, 0.0, 60.0)
    resource.setrlimit(resource.RLIMIT_FSIZE, (hard, hard))
    buffer.written()
    lost = log.export([b'{"i":10}\\n'])
    log.shutdown()
    print(whole, rest, lost, path.read_bytes() == data + b'{"i":10}\\n')
    """
)


def test_a_drain_cut_just_before_its_last_newline_hands_back_nothing(tmp_path):
    """A file size limit stops the drain's write one byte short, at the last line's
    newline: every line counts written, nothing is handed back (it was once an empty
    batch, which broke the drop report), and the next write's newline ends the line."""
    out = subprocess.run(
        [sys.executable, "-c", _CUT_BEFORE_NEWLINE, str(tmp_path / "cut.jsonl")],
        capture_output=True, text=True, check=True, timeout=60,
    ).stdout.split()  # fmt: skip
    assert out == ["10", "None", "0", "True"]
