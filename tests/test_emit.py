"""The caller's emit: the compiled Emitter and the Python closure make the same events."""

from __future__ import annotations

import enum
import os
import sys
import threading
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


def _emitters(tmp_path: Path, name: str) -> dict[str, RolloutTrace]:
    """Two traces on files of their own, one emitting through each emit."""
    traces = {}
    for kind in ("compiled", "closure"):
        trace = RolloutTrace(tmp_path / f"{name}-{kind}.jsonl")
        trace.emit = trace._pipeline.make_emit(compiled=kind == "compiled")  # type: ignore[method-assign]
        traces[kind] = trace
    assert isinstance(traces["compiled"].emit, _pipeline._Emitter)  # not the closure twice
    assert not isinstance(traces["closure"].emit, _pipeline._Emitter)
    return traces


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
    lines = {}
    for kind, trace in traces.items():
        events = [orjson.loads(line) for line in trace.path.read_bytes().splitlines()][1:]
        for event in events:  # the time and the run's ID are each trace's own
            assert isinstance(event.pop("t"), float) and event.pop("run_id") == trace.run_id
        # As lists of items: the order of the keys is compared too.
        lines[kind] = [list(e.items()) for e in events if e["event"] != "run.end"]
    assert lines["compiled"] == lines["closure"]
    assert len(lines["compiled"]) == len(calls)
    counts = {kind: trace.stats.renamed_fields for kind, trace in traces.items()}
    assert counts["compiled"] == counts["closure"]


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
