"""The caller's emit: the compiled Emitter and the Python closure make the same events, and
the lines they encode on the caller's thread are the lines the writer would have made."""

from __future__ import annotations

import enum
import os
import sys
import threading
import time
from pathlib import Path

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from otel_rollout import _pipeline
from otel_rollout.trace import RolloutTrace

compiled = pytest.mark.skipif(_pipeline._Emitter is None, reason="otel_rollout._emit not built")


class Kind(str, enum.Enum):
    SEAL = "group.seal"


class Plain(enum.Enum):
    STEP = "train.step"


def test_the_compiled_emit_is_built_under_ci(tmp_path):
    """CI builds otel_rollout._emit, and a trace emits through it: a failed build fails
    there rather than passing slower."""
    if _pipeline._Emitter is None:
        assert os.environ.get("CI") != "true", "otel_rollout._emit was not built"
        return
    with RolloutTrace(tmp_path / "t.jsonl") as trace:
        assert isinstance(trace.emit, _pipeline._Emitter)


@compiled
@pytest.mark.parametrize("capacity", [3.5, float("inf"), 2**64])
def test_a_capacity_of_any_number_is_compared_as_the_closure_does(tmp_path, capacity):
    """A capacity that is a float, infinite or past 64 bits is taken, as by the closure:
    the comparison is Python's."""
    with RolloutTrace(tmp_path / "t.jsonl", capacity=capacity) as trace:
        assert isinstance(trace.emit, _pipeline._Emitter)
        trace.emit("x", n=1)
        trace.flush()
        assert trace.stats.written == 2 and trace.stats.dropped == 0


def _emitters(
    tmp_path: Path, name: str, kinds: tuple[str, ...] = ("compiled", "closure"), limit: int = 0
) -> dict[str, RolloutTrace]:
    """Traces on files of their own, one emitting through each emit: ``compiled`` makes
    each line in C (or by the log's rule) into the line buffer, ``closure`` makes it by the
    log's rule and queues it; ``writer`` queues the event's dict for the writer thread to
    encode, as with exporters in the process.  ``limit``: the longest line, if not the
    default."""
    traces = {}
    for kind in kinds:
        trace = RolloutTrace(tmp_path / f"{name}-{kind}.jsonl")
        pipeline = trace._pipeline
        assert pipeline is not None and pipeline.caller_encodes  # the log alone: lines queued
        if kind == "writer":
            # run.start through the line buffer first: a writer thread not yet started when
            # the buffer is dropped would never take it (the file would start with an event).
            assert trace.flush()
            pipeline.lines = None  # dicts queued, as with exporters in the process
        if limit:
            pipeline.log.max_event_bytes = limit  # type: ignore[attr-defined]
        # One time for every event of every trace: the lines' lengths are the same.
        stamp = (lambda: 1.5e9 + 0.25) if limit else time.time
        trace.emit = pipeline.make_emit(compiled=kind != "closure", now=stamp)  # type: ignore[method-assign]
        traces[kind] = trace
    assert isinstance(traces["compiled"].emit, _pipeline._Emitter)  # not the closure twice
    assert traces["compiled"].emit.buffer is traces["compiled"]._pipeline.lines is not None  # type: ignore[attr-defined, union-attr]
    if "writer" in traces:
        assert traces["writer"].emit.buffer is None  # type: ignore[attr-defined]
    if "closure" in traces:
        assert not isinstance(traces["closure"].emit, _pipeline._Emitter)
    return traces


def _lines(trace: RolloutTrace) -> list[list[tuple[str, object]]]:
    """The trace's events past run.start, each as its list of items (the order of the
    keys is compared too), without the time and the run's ID (each trace's own)."""
    assert trace.path is not None
    events = [orjson.loads(line) for line in trace.path.read_bytes().splitlines()][1:]
    for event in events:
        assert isinstance(event.pop("t"), float) and event.pop("run_id") == trace.run_id
    return [list(e.items()) for e in events if e["event"] != "run.end"]


_KEYS = st.sampled_from(["t", "run_id", "event", "t_", "event_", "step", "group_id", "n", "é"])
_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False),
    st.text(max_size=5),
    st.lists(st.integers(), max_size=3),
)
_NAMES = st.one_of(
    st.text(max_size=8),
    st.integers(),
    st.none(),
    st.sampled_from([Kind.SEAL, Plain.STEP]),
)


@compiled
@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(calls=st.lists(st.tuples(_NAMES, st.dictionaries(_KEYS, _VALUES, max_size=5)), max_size=6))
def test_both_emits_write_the_same_lines_and_counts(tmp_path_factory, calls):
    """For random names (strings, numbers, enums) and fields (reserved names among them),
    the two files hold the same lines but for their times, and the counts agree."""
    tmp_path = tmp_path_factory.mktemp("emit")
    traces = _emitters(tmp_path, "t")
    for trace in traces.values():
        for name, fields in calls:
            trace.emit(name, **fields)
        trace.close()
    lines = {kind: _lines(trace) for kind, trace in traces.items()}
    assert lines["compiled"] == lines["closure"]
    assert len(lines["compiled"]) == len(calls)
    counts = {kind: trace.stats.renamed_fields for kind, trace in traces.items()}
    assert counts["compiled"] == counts["closure"]


class Opaque:
    """A value orjson cannot take by itself: written as its repr by the log's rule."""

    def __repr__(self) -> str:
        return "<opaque>"


# Values past the closure test's: what only the log's slow rule takes (sets, objects,
# integers past 64 bits, keys that are no strings) and strings that make a line long.
_HARD_VALUES = st.one_of(
    _VALUES,
    st.frozensets(st.integers(0, 9), max_size=3),
    st.builds(Opaque),
    st.integers(min_value=2**64, max_value=2**80),
    st.dictionaries(st.integers(0, 3), st.integers(), max_size=2),
    st.text(min_size=40, max_size=120),
    # What C writes itself, at its edges: escapes, line separators, floats in lists, tuples,
    # lists in lists, the extremes of 64 bits.
    st.text(
        alphabet=st.sampled_from('\x00\x01\x1f\x7f"\\/\n\t\u2028\u2029\ufeffé€😀a'), max_size=12
    ),
    st.lists(st.floats(allow_nan=False), max_size=3),
    st.tuples(st.integers(), st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=3)),
    st.lists(st.lists(st.one_of(st.integers(), st.none(), st.booleans()), max_size=3), max_size=3),
    st.sampled_from([-(2**63), 2**63 - 1, 2**63, -0.0, 5e-324, 1e15, 1e16, 0.0001, 1e-05]),
)


@compiled
@settings(
    max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    calls=st.lists(st.tuples(_NAMES, st.dictionaries(_KEYS, _HARD_VALUES, max_size=5)), max_size=6),
    limit=st.sampled_from([0, 200]),
)
def test_lines_made_on_the_callers_thread_are_the_writers_lines(tmp_path_factory, calls, limit):
    """Encoded by the caller's emit (in C, or by the closure) or by the writer thread, every
    event becomes the same line, for hard values and lines past a 200-byte limit too; the
    renamed and the oversized are counted alike."""
    traces = _emitters(
        tmp_path_factory.mktemp("lines"), "l", ("compiled", "closure", "writer"), limit
    )
    for trace in traces.values():
        for name, fields in calls:
            trace.emit(name, **fields)
        trace.close()
    lines = {kind: _lines(trace) for kind, trace in traces.items()}
    assert lines["compiled"] == lines["closure"] == lines["writer"]
    assert len(lines["writer"]) == len(calls)
    if limit:  # one time stamp for all: the very bytes agree, but for each run's ID
        raw = {
            kind: trace.path.read_bytes().split(b"\n", 1)[1].replace(trace.run_id.encode(), b"R")  # type: ignore[union-attr]
            for kind, trace in traces.items()
        }
        assert raw["compiled"] == raw["closure"] == raw["writer"]
    for count in ("renamed_fields", "events_oversized", "written"):
        values = {kind: getattr(trace.stats, count) for kind, trace in traces.items()}
        assert len(set(values.values())) == 1, (count, values)
    if limit:  # the oversized events kept their kind, as the writer writes them
        assert (
            sum(e[-1][0] == "oversized" for e in lines["writer"])
            == traces["writer"].stats.events_oversized
        )


def test_a_trace_with_exporters_in_its_process_queues_events_not_lines(tmp_path):
    """Lines are made on the caller's thread only when the log is all there is: an exporter
    in the process is handed the events as dicts, as it always was."""
    got: list[dict] = []

    class Keeping:
        def export(self, events):
            got.extend(events)
            return 0

        def shutdown(self):
            pass

    with RolloutTrace(tmp_path / "ex.jsonl", exporters=[Keeping()]) as trace:
        assert trace._pipeline is not None and not trace._pipeline.caller_encodes
        trace.emit("x", n=1)
        trace.flush()
    with RolloutTrace(tmp_path / "alone.jsonl") as alone:
        assert alone._pipeline is not None and alone._pipeline.caller_encodes
    assert [e["event"] for e in got][:2] == ["run.start", "x"]
    assert all(isinstance(e, dict) for e in got)


def test_a_line_is_made_as_the_event_is_emitted(tmp_path):
    """Encoded on the caller's thread, a field the caller changes after emit is written as
    it was when emitted."""
    with RolloutTrace(tmp_path / "m.jsonl") as trace:
        tokens = [1, 2]
        trace.emit("x", tokens=tokens)
        tokens.append(3)
    assert dict(_lines(trace)[0])["tokens"] == [1, 2]


class Raising:
    """A value whose repr raises: the log's rule still makes a line of its event."""

    def __repr__(self) -> str:
        raise ValueError("no repr")


@pytest.mark.parametrize("kind", ["compiled", "writer"])
def test_emit_never_raises_on_a_value_or_name_it_cannot_write(tmp_path, kind):
    """A name with a lone surrogate, or a value whose repr raises: emit returns, and the
    event is written as its time, run and kind with why it was unencodable."""
    traces = _emitters(tmp_path, "bad", (kind, "compiled") if kind == "writer" else (kind,))
    trace = traces[kind]
    trace.emit("bad\ud800", n=1)
    trace.emit("raises", x=Raising())
    for each in traces.values():
        each.close()
    events = [dict(e) for e in _lines(trace)]
    assert [e["event"] for e in events] == ["bad\\ud800", "raises"]
    assert all("unencodable" in e for e in events)


@compiled
def test_the_compiled_emit_keeps_the_order_of_the_fields(tmp_path):
    """The reserved keys first, then the caller's fields in the order given."""
    traces = _emitters(tmp_path, "order")
    for trace in traces.values():
        trace.emit("x", zeta=1, alpha=2, **{"mid": 3})
        trace.close()
    keys = {
        kind: list(orjson.loads(trace.path.read_bytes().splitlines()[1]))
        for kind, trace in traces.items()
    }
    assert keys["compiled"] == keys["closure"] == ["t", "run_id", "event", "zeta", "alpha", "mid"]


@compiled
@pytest.mark.parametrize(
    ("args", "kwargs"),
    [((), {}), ((), {"name": "x"}), (("a", "b"), {}), (("a", 1, 2), {"k": 1})],
)
def test_a_wrong_call_raises_the_same_type_error(tmp_path, args, kwargs):
    """No name, a name given by keyword, or more than one positional: a TypeError from
    both, saying what was wrong, and nothing enqueued."""
    traces = _emitters(tmp_path, "bad")
    messages = {}
    for kind, trace in traces.items():
        with pytest.raises(TypeError) as raised:
            trace.emit(*args, **kwargs)
        messages[kind] = str(raised.value).split("() ", 1)[1]
        trace.flush()
        assert trace.stats.written == 1  # run.start only
        trace.close()
    assert messages["compiled"] == messages["closure"]


class Blocking:
    """Holds the writer inside export until released, so the queue fills for real."""

    def __init__(self, entered: threading.Event, release: threading.Event) -> None:
        self.entered, self.release = entered, release

    def export(self, events):
        self.entered.set()
        self.release.wait(10)
        return 0

    def shutdown(self):
        pass


@compiled
def test_a_full_queue_counts_the_same_drops(tmp_path):
    """With the writer held inside an exporter, both emits queue up to the capacity and
    count the rest as dropped; every event is written or counted."""
    for compiled_emit in (True, False):
        entered, release = threading.Event(), threading.Event()
        path = tmp_path / f"full-{compiled_emit}.jsonl"
        trace = RolloutTrace(path, capacity=50, exporters=[Blocking(entered, release)])
        trace.emit = trace._pipeline.make_emit(compiled=compiled_emit)  # type: ignore[method-assign]
        entered.wait(5)
        for i in range(400):
            trace.emit("x", i=i)
        assert trace.stats.dropped_queue_full == 350, compiled_emit
        release.set()
        trace.close()
        written = [orjson.loads(line) for line in trace.path.read_bytes().splitlines()]
        assert [e["i"] for e in written if e["event"] == "x"] == list(range(50))


@compiled
def test_the_compiled_emit_holds_no_reference_it_should_not(tmp_path):
    """Once the writer has written the events, the name, the fields' values and the
    run_id are referenced no more than before (on the plain, the renamed and the
    dropped paths): nothing leaks per event."""
    trace = RolloutTrace(tmp_path / "refs.jsonl", capacity=10_000)
    trace._pipeline._capacity = 0
    full = trace._pipeline.make_emit()  # an emit whose queue is always full
    trace.flush()
    trace.flush()  # the writer lets go of a batch (run.start's) when it takes the next one
    value, name = object(), "x" + str(os.getpid())  # counted objects of our own
    before = (sys.getrefcount(value), sys.getrefcount(name), sys.getrefcount(trace.run_id))
    for _ in range(1000):
        trace.emit(name, v=value)
        trace.emit(name, t=value)  # renamed
    trace.flush()
    trace.flush()
    for _ in range(1000):
        full(name, v=value)  # dropped
    after = (sys.getrefcount(value), sys.getrefcount(name), sys.getrefcount(trace.run_id))
    assert after == before
    assert trace.stats.dropped_queue_full == 1000
    trace.close()


class Failing(Exception):
    pass


@compiled
@pytest.mark.parametrize("failing", ["now", "qsize", "put", "on_full", "rename"])
def test_an_error_inside_emit_is_raised_and_leaks_nothing(failing):
    """When a part emit calls raises, emit raises it and holds on to nothing: the time
    stamp, the name, the values and what the parts returned are referenced as before."""
    stamp, value, returned = 1.5e9 + 0.25, object(), object()

    def part(name, result):
        def call(*args):
            if name == failing:
                raise Failing(name)
            return result

        return call

    emit = _pipeline._Emitter(
        put=part("put", returned),
        qsize=part("qsize", 0),
        capacity=0 if failing == "on_full" else 1,
        now=part("now", stamp),
        on_full=part("on_full", returned),
        rename=part("rename", {"t": stamp}),
        run_id="r",
    )
    fields = {"t": value} if failing == "rename" else {"v": value}
    watched = (stamp, value, returned)
    before = [sys.getrefcount(x) for x in watched]
    for _ in range(100):
        with pytest.raises(Failing):
            emit("x", **fields)
    assert [sys.getrefcount(x) for x in watched] == before


@compiled
@pytest.mark.parametrize("case", ["c", "slow", "slow-raises", "too-long", "wakes"])
def test_a_line_is_appended_by_c_or_by_the_slow_rule_and_nothing_leaks(case):
    """Emit appends the line it makes in C, or what the log's rule (``slow``) makes of a
    value C leaves to it or of a line past the limit; an error from the rule is raised
    with nothing appended; a writer waiting for a line is woken.  Nothing is held
    on any path: the values, the time stamp, what the rule returned."""
    stamp = 1.5e9 + 0.25
    value: object = (
        object() if case.startswith("slow") else "v" * (300 if case == "too-long" else 3)
    )
    slow_line = b'{"slow":1}\n'

    def slow(event):
        assert event["t"] == stamp and event["v"] is value
        if case == "slow-raises":
            raise Failing("slow")
        return slow_line

    buffer = _pipeline._LineBuffer()
    emit = _pipeline._Emitter(
        put=None,
        qsize=None,
        capacity=10**6,
        now=lambda: stamp,
        on_full=None,
        rename=None,
        run_id="r",
        buffer=buffer,
        slow=slow,
        limit=200,
    )
    waiter = threading.Thread(target=buffer.wait)  # a writer waiting for a line
    if case == "wakes":
        waiter.start()
        deadline = time.monotonic() + 10
        while not buffer.idle and time.monotonic() < deadline:
            time.sleep(0.001)
        assert buffer.idle
    watched = (stamp, value, slow_line)
    before = [sys.getrefcount(x) for x in watched]
    for _ in range(100):
        if case == "slow-raises":
            with pytest.raises(Failing):
                emit("x", v=value)
        else:
            emit("x", v=value)
    if case == "wakes":  # woken, before the lines are taken (with none, it would wait on)
        waiter.join(10)
        assert not waiter.is_alive()
    taken = buffer.take()
    if case == "slow-raises":
        assert taken is None and buffer.lines == 0
    else:
        line = b'{"t":1500000000.25,"run_id":"r","event":"x","v":"vvv"}\n'
        assert taken == ((line if case in ("c", "wakes") else slow_line) * 100, 100, stamp)
    assert not buffer.idle
    del taken
    assert [sys.getrefcount(x) for x in watched] == before


@compiled
def test_a_name_that_is_no_string_takes_the_slow_rule_in_c(tmp_path):
    """The C encoder makes only lines whose name is a str: an int, an Enum and a str Enum
    name go to the log's rule, and are written as the writer writes them."""
    traces = _emitters(tmp_path, "names", ("compiled", "writer"))
    for trace in traces.values():
        for name in (7, Plain.STEP, Kind.SEAL, None):
            trace.emit(name, n=1)
        trace.close()
    lines = {kind: _lines(trace) for kind, trace in traces.items()}
    assert lines["compiled"] == lines["writer"]
    assert [dict(e)["event"] for e in lines["compiled"]] == [
        "7",
        "train.step",
        "group.seal",
        "None",
    ]
    assert traces["compiled"].stats.renamed_fields == traces["writer"].stats.renamed_fields == 2


def test_a_full_queue_of_lines_counts_its_drops_and_the_report_keeps_time_order(tmp_path):
    """With the writer held inside its write, a trace queuing lines holds up to the
    capacity, the line being written counted in it, and counts the rest; the trace.dropped
    line that reports them is no earlier than the line before it."""
    entered, release = threading.Event(), threading.Event()
    trace = RolloutTrace(tmp_path / "full.jsonl", capacity=50)
    pipeline = trace._pipeline
    assert pipeline is not None and pipeline.caller_encodes
    log = pipeline.log
    export = log.export

    def held(events, **hold):
        entered.set()
        release.wait(10)
        return export(events, **hold)

    log.export = held  # type: ignore[method-assign]
    assert trace.flush()  # the writer leaves its drain, and finds the log's export replaced
    trace.emit("first")
    assert entered.wait(5)  # its write is held
    for i in range(400):
        trace.emit("x", i=i)
    assert trace.stats.queued == 50  # "first", taken, and 49 lines
    assert trace.stats.dropped_queue_full == 351
    release.set()
    trace.flush()  # the queued lines are written, and the drops reported after them
    trace.emit("after", n=1)
    trace.close()
    events = [orjson.loads(line) for line in trace.path.read_bytes().splitlines()]
    assert [e["i"] for e in events if e["event"] == "x"] == list(range(49))
    report = next(i for i, e in enumerate(events) if e["event"] == "trace.dropped")
    assert events[report]["count"] == 351
    assert events[report - 1]["t"] <= events[report]["t"] <= events[report + 1]["t"]


@compiled
def test_an_idle_writer_is_woken_by_the_next_line(tmp_path):
    """A writer waiting for a line writes the next one emitted, with no flush: emit
    wakes it (without the wake it would wait for good)."""
    with RolloutTrace(tmp_path / "w.jsonl") as trace:
        lines = trace._pipeline.lines  # type: ignore[union-attr]
        assert lines is not None
        for i in range(3):
            deadline = time.monotonic() + 10
            while not lines.idle and time.monotonic() < deadline:
                time.sleep(0.001)
            assert lines.idle  # the writer waits for a line
            trace.emit("x", i=i)
            assert trace.path is not None
            while trace.path.read_bytes().count(b"\n") < 2 + i and time.monotonic() < deadline:
                time.sleep(0.001)
            assert trace.path.read_bytes().count(b"\n") == 2 + i
