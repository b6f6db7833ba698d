"""The writer under a controller that keeps the GIL busy: with the compiled emit it writes
the lines without taking the GIL (its drain); on its Python path (built without a
compiler) it holds between writes, so it writes less often.  A flush, a close or an idle
controller is never kept waiting by either.

Each test runs a real trace in a child process (its own ``OTEL_ROLLOUT_WRITER_HOLD``; the
Python path by blocking the compiled module's import) and counts the child's ``write``
system calls from ``/proc/self/io`` (``syscw``) and its main thread's waits for the GIL
(voluntary context switches, from ``/proc/thread-self/status``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from conftest import clean_env

from otel_rollout._hold import Hold, PyWaker
from otel_rollout.reader import read_events

try:
    from otel_rollout import _emit
except ImportError:  # built without a compiler
    _emit = None  # type: ignore[assignment]

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/io"), reason="needs /proc/self/io")

# The busy controller every child script below runs: `rate` events/s for `seconds`, with
# pure-Python work between them (the GIL is never given up); how many it emitted.
_CONTROLLER = textwrap.dedent(
    """
    import time

    def controller(trace, rate, seconds):
        start, emitted = time.perf_counter(), 0
        while (now := time.perf_counter()) < start + seconds:
            total = 0
            for i in range(300):  # ~30 us of dict and arithmetic work
                total += (i * 7) % 13
            while emitted < (now - start) * rate:
                trace.emit("tick", seq=emitted)
                emitted += 1
        return emitted
    """
)

# As if built without a compiler: the writer's Python path, event dicts queued.
_WITHOUT_C = "import sys\nsys.modules['otel_rollout._emit'] = None\n"

# The busy controller, then the write calls made meanwhile, the controller's waits for the
# GIL (a writer taking it from a busy controller makes it wait for it back), the events in
# the file before any flush, and how long flush() and close() took.
_BUSY = _CONTROLLER + textwrap.dedent(
    """
    import json, sys, time
    from otel_rollout.trace import RolloutTrace

    def writes():
        for line in open("/proc/self/io"):
            if line.startswith("syscw"):
                return int(line.split()[1])

    def waits():
        for line in open("/proc/thread-self/status"):
            if line.startswith("voluntary_ctxt_switches"):
                return int(line.split()[1])

    trace = RolloutTrace(sys.argv[1])
    rate, seconds = float(sys.argv[2]), float(sys.argv[3])
    time.sleep(0.2)
    before, waited = writes(), waits()
    emitted = controller(trace, rate, seconds)
    during, waited = writes() - before, waits() - waited
    in_file = open(sys.argv[1], "rb").read().count(b'"tick"')
    t = time.perf_counter()
    flushed = trace.flush()
    flush_s = time.perf_counter() - t
    t = time.perf_counter()
    trace.close()
    print(json.dumps({"writes": during, "waits": waited, "emitted": emitted,
                      "in_file": in_file, "flushed": flushed, "flush_s": flush_s,
                      "close_s": time.perf_counter() - t}))
    """
)


def _busy(
    tmp: Path, hold: str, rate: float = 5000, seconds: float = 1.0, compiled: bool = False
) -> dict:
    """The busy controller's run, on the writer's Python path unless ``compiled``."""
    tmp.mkdir(exist_ok=True)
    log = tmp / f"hold{hold}-{'c' if compiled else 'py'}.jsonl"
    script = _BUSY if compiled else _WITHOUT_C + _BUSY
    out = subprocess.run(
        [sys.executable, "-c", script, str(log), str(rate), str(seconds)],
        env=clean_env(OTEL_ROLLOUT_WRITER_HOLD=hold, OTEL_ROLLOUT_CLOSE_TIMEOUT="60"),
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    result = json.loads(out.stdout)
    seqs = [e["seq"] for e in read_events(log) if e["event"] == "tick"]
    result["written"] = seqs
    return result


def test_a_busy_controller_is_written_for_less_often_and_loses_nothing(tmp_path):
    """On the writer's Python path, with the GIL kept busy, a 200 ms hold at least halves the
    writer's write calls against no hold, and every event is in the file, in order, either
    way."""
    unheld = _busy(tmp_path, "0")
    held = _busy(tmp_path, "0.2")
    for result in (unheld, held):
        assert result["written"] == list(range(result["emitted"]))
    assert held["writes"] * 2 < unheld["writes"], (held["writes"], unheld["writes"])


def test_flush_and_close_end_a_hold_at_once(tmp_path):
    """On the writer's Python path, a 60 s hold under a busy controller does not make flush()
    or close() wait it out."""
    # The hold starts only once the controller is seen to use half a core or more: on a
    # machine busy with other work it may not, so up to three tries for one that held.
    for attempt in range(3):  # (a file of its own each: a try's lines are its own)
        result = _busy(tmp_path / str(attempt), "60", seconds=0.5)
        if result["writes"] < 10:
            break
    assert result["writes"] < 10, result  # the writer was holding when flush() came
    assert result["flushed"] is True
    assert result["flush_s"] < 20 and result["close_s"] < 20, result
    assert result["written"] == list(range(result["emitted"]))


@pytest.mark.skipif(_emit is None, reason="needs the compiled _emit")
def test_a_busy_controllers_lines_are_written_without_taking_its_gil(tmp_path):
    """With the compiled emit the writer drains the lines without the GIL: the busy
    controller waits for the GIL back a few times a second (the drain hands back every
    quarter second) where the Python path's writer made it wait at every write, the lines
    reach the file while it runs, and flush() and close() end the drain at once."""
    drained = _busy(tmp_path, "0.05", compiled=True)
    python_path = _busy(tmp_path, "0", compiled=False)
    for result in (drained, python_path):
        assert result["written"] == list(range(result["emitted"]))
    assert drained["waits"] <= 60 and drained["waits"] * 4 < python_path["waits"], (
        drained["waits"], python_path["waits"]
    )  # fmt: skip
    assert drained["in_file"] >= drained["emitted"] - 1000, drained  # a fifth of a second
    assert drained["flushed"] is True
    assert drained["flush_s"] < 5 and drained["close_s"] < 5, drained


_IDLE_EVENTS = 200
_IDLE = textwrap.dedent(
    f"""
    import os, sys, time
    from otel_rollout.trace import RolloutTrace

    if sys.argv[2]:
        os.sched_setaffinity(0, {{int(sys.argv[2])}})
    trace = RolloutTrace(sys.argv[1])
    for i in range({_IDLE_EVENTS}):
        trace.emit("tick", seq=i)
        time.sleep(0.002)  # waiting on I/O: the GIL is free
    print(open(sys.argv[1], "rb").read().count(b'"tick"'), flush=True)
    time.sleep(3600)  # killed by the test before it could close
    """
)


@pytest.mark.parametrize("compiled", [True, False], ids=["drain", "python-path"])
@pytest.mark.parametrize("hog", [False, True], ids=["quiet", "core-shared-with-a-cpu-hog"])
def test_a_controller_waiting_on_io_is_never_held(tmp_path, hog, compiled):
    """With a one-hour hold, a controller that sleeps between events finds each in the file
    while it still runs, also when a CPU hog on its core makes the writer wait for the CPU."""
    if compiled and _emit is None:
        pytest.skip("needs the compiled _emit")
    log = tmp_path / "idle.jsonl"
    hogs = []
    cpu = min(os.sched_getaffinity(0))
    if hog:  # a busy process ahead of the trace's on the one core both are pinned to
        if os.geteuid() != 0:
            pytest.skip("needs root, to run the hog at a higher priority than the trace")
        spin = "import os, sys\nos.sched_setaffinity(0, {int(sys.argv[1])})\nos.nice(-15)\n"
        spin += "while True: pass"
        hogs = [subprocess.Popen([sys.executable, "-c", spin, str(cpu)])]
    script = _IDLE if compiled else _WITHOUT_C + _IDLE
    child = subprocess.Popen(
        [sys.executable, "-c", script, str(log), str(cpu) if hog else ""],
        env=clean_env(OTEL_ROLLOUT_WRITER_HOLD="3600"),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        seen = int(child.stdout.readline())
    finally:
        for p in [child, *hogs]:
            p.kill()
            p.wait()
    assert seen >= _IDLE_EVENTS - 1  # the newest may still be on its way


# A busy controller whose trace also exports in-process (an exporter of its own), with a
# one-hour hold: after the busy stretch it sleeps, then counts what the file holds.
_WITH_EXPORTER = _CONTROLLER + textwrap.dedent(
    """
    import sys, time
    from otel_rollout.trace import RolloutTrace

    class Keep:
        def __init__(self):
            self.n = 0

        def export(self, events):
            self.n += len(events)
            return 0

        def shutdown(self):
            pass

    trace = RolloutTrace(sys.argv[1], exporters=[Keep()])
    time.sleep(0.2)
    emitted = controller(trace, 5000, 0.5)
    time.sleep(1.0)  # the GIL is free: a writer that is not holding catches up
    print(emitted, open(sys.argv[1], "rb").read().count(b'"tick"'), flush=True)
    time.sleep(3600)  # killed by the test before it could close
    """
)


def test_a_writer_with_exporters_in_this_process_never_holds(tmp_path):
    """With an exporter in the trainer's process (spans made in-process, say) the writer's own
    work is what keeps the GIL busy: even with a one-hour hold, a busy controller's events are
    all in the file a second after it stops, before any close."""
    log = tmp_path / "exporter.jsonl"
    child = subprocess.Popen(
        [sys.executable, "-c", _WITH_EXPORTER, str(log)],
        env=clean_env(OTEL_ROLLOUT_WRITER_HOLD="3600"),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        emitted, written = map(int, child.stdout.readline().split())
    finally:
        child.kill()
        child.wait()
    assert written == emitted > 1000


class Clocks:
    """The wall clock, a monotonic clock and the CPU time of the process's other threads
    (the controller's), moved by the test."""

    def __init__(self) -> None:
        self.t, self.mono, self.used = 1000.0, 0.0, 0.0

    def run(self, seconds: float, cpu_share: float) -> None:
        self.t += seconds
        self.mono += seconds
        self.used += seconds * cpu_share

    def hold(self, seconds: float) -> Hold:
        return Hold(seconds, now=lambda: self.t, clock=lambda: self.mono, cpu=lambda: self.used)


def _batch(clocks: Clocks, hold: Hold, waited: float, cpu_share: float) -> None:
    """One batch: its oldest event was emitted, then the writer waited ``waited`` s for it
    while the process used ``cpu_share`` of a core; the batch is written at once."""
    emitted = clocks.t
    clocks.run(waited, cpu_share)
    hold.taken(emitted)


@pytest.mark.parametrize(
    ("waited", "cpu_share", "due"),
    [
        (0.005, 1.0, True),  # a busy GIL: the switch interval's wait, the process running
        (0.005, 0.05, False),  # the writer waited for a core while the controller slept
        (0.0001, 1.0, False),  # taken at once: the GIL was free
    ],
    ids=["gil-busy", "machine-busy", "gil-free"],
)
def test_the_hold_is_due_only_after_two_batches_that_waited_on_a_busy_gil(waited, cpu_share, due):
    """Holding starts after two batches in a row waited over 2 ms while this process used
    half a core or more, and for nothing else."""
    clocks = Clocks()
    hold = clocks.hold(0.05)
    _batch(clocks, hold, waited, cpu_share)
    assert not hold.due()  # one batch is not enough
    _batch(clocks, hold, waited, cpu_share)
    assert hold.due() is due


def test_a_free_gil_after_a_hold_ends_holding_and_zero_never_holds():
    """After a hold, the wait that counts is the GIL's return, not the events' (they waited
    the whole hold): a GIL back at once ends holding.  A hold of 0 never holds."""
    clocks = Clocks()
    hold = clocks.hold(0.01)
    for _ in range(2):
        _batch(clocks, hold, 0.005, 1.0)
    assert hold.due()
    emitted = clocks.t  # an event emitted as the hold began
    hold.wait(lambda: False)  # (10 ms of real time: it runs out)
    clocks.run(0.01, 1.0)  # the hold's time on the test's clocks
    clocks.run(0.0001, 1.0)  # the GIL came back at once
    hold.taken(emitted)
    assert not hold.due()
    never = clocks.hold(0.0)
    for _ in range(3):
        _batch(clocks, never, 0.005, 1.0)
    assert not never.due()


def test_a_wake_ends_a_hold_and_a_queued_flush_skips_it():
    """wake() ends a long hold at once (from another thread), a hold asked to skip (a flush
    or close queued) does not wait at all, and a wake left over from before does not end
    the next hold."""
    stale = Hold(0.2)
    stale.wake()
    start = time.monotonic()
    stale.wait(lambda: False)
    assert time.monotonic() - start >= 0.15
    hold = Hold(60.0)
    waker = threading.Timer(0.2, hold.wake)
    start = time.monotonic()
    waker.start()
    hold.wait(lambda: False)
    assert time.monotonic() - start < 30
    start = time.monotonic()
    hold.wait(lambda: True)
    assert time.monotonic() - start < 30


_OTHERS = textwrap.dedent(
    """
    import threading, time
    from otel_rollout._hold import others_cpu

    def spin(seconds):
        end = time.thread_time() + seconds
        while time.thread_time() < end:
            pass

    before = others_cpu()
    spin(0.05)
    own = others_cpu() - before
    before = others_cpu()
    worker = threading.Thread(target=spin, args=(0.05,))
    worker.start()
    worker.join()
    print(own, others_cpu() - before)
    """
)


def test_the_writers_own_work_is_not_the_controllers():
    """The CPU the hold counts is the other threads': a writer busy on its own thread (as
    one a higher-priority process starves, finding a backlog each time it runs) counts
    nothing, a controller busy on another thread counts (the writer once held an hour
    under a CPU hog because its own work counted).  In a fresh process: no other threads."""
    out = subprocess.run(
        [sys.executable, "-c", _OTHERS], capture_output=True, text=True, check=True
    ).stdout
    own, others = map(float, out.split())
    assert own < 0.01 and others >= 0.04, (own, others)


_wakers = [pytest.param(PyWaker, id="python")]
if _emit is not None:
    _wakers.insert(0, pytest.param(_emit.Waker, id="compiled"))


@pytest.mark.parametrize("make", _wakers)
def test_a_waker_ends_one_wait_and_a_wake_left_over_can_be_cleared(make):
    """A wake ends the next wait at once (several wakes, one wait), a wait with none runs
    out, clear() spends a wake left over, and a wake from another thread ends a long wait."""
    waker = make()
    assert waker.wait(0.01) is False
    waker.wake()
    waker.wake()
    assert waker.wait(30) is True
    start = time.monotonic()
    assert waker.wait(0.05) is False  # the two wakes ended one wait
    assert time.monotonic() - start >= 0.04
    waker.wake()
    waker.clear()
    assert waker.wait(0.01) is False
    threading.Timer(0.1, waker.wake).start()
    start = time.monotonic()
    assert waker.wait() is True
    assert time.monotonic() - start < 30
