"""The one pass: the analysis protocol, the shared state, and warnings named by line."""

from __future__ import annotations

import orjson
import pytest

from otel_rollout.analysis import Analysis, StepAges, run_events, run_file
from otel_rollout.cost import CostAnalysis
from otel_rollout.reader import read_events
from otel_rollout.testing import TraceBuilder, synthetic_trace


class PausedCalls(Analysis):
    """Running calls each refit paused, per run (the README's example, as written there)."""

    kinds = frozenset({"weights.sync"})  # the pass reads only what its analyses need

    def __init__(self):
        self.paused = {}

    def handlers(self):
        return {"weights.sync": self.sync}

    def sync(self, e):
        self.paused[e.run_id] = self.paused.get(e.run_id, 0) + len(e.cuts or ())

    def result(self):
        return self.paused


class Recorder(Analysis):
    """Records what each handler saw of the shared state, before the state applied it."""

    kinds = None

    def __init__(self):
        self.seen: list[tuple] = []
        self.stops: list = []

    def handlers(self):
        return {
            "attempt.seal": lambda e: self.seen.append(
                ("seal", e.attempt_id, e.attempt_id in self.state.attempts)
            ),
            "train.step": lambda e: self.seen.append(
                ("step", e.step, all(g in self.state.groups for g in e.group_ids))
            ),
        }

    def stop(self, stop):
        self.stops.append(stop)

    def result(self):
        return self


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    return synthetic_trace(tmp_path_factory.mktemp("a") / "t.jsonl", 30_000, runs=3)


class TestProtocol:
    def test_the_readme_example_counts_what_the_file_says(self, trace):
        """PausedCalls, run beside batch age in one pass, counts every cut of every refit."""
        expected: dict[str, int] = {}
        for e in read_events(trace):
            if e["event"] == "weights.sync":
                expected[e["run_id"]] = expected.get(e["run_id"], 0) + len(e.get("cuts") or ())
        paused, steps = run_file(trace, [PausedCalls(), StepAges()])
        assert paused == expected and sum(expected.values()) > 0
        assert steps and all(s.batch_age is not None for s in steps)

    def test_handlers_see_the_state_before_the_event(self, trace):
        """A seal's attempt is still in flight and a step's groups still held when handlers run."""
        [rec] = run_file(trace, [Recorder()])
        seals = [ok for kind, _, ok in rec.seen if kind == "seal"]
        steps = [ok for kind, _, ok in rec.seen if kind == "step"]
        assert seals and all(seals)
        assert steps and sum(steps) > len(steps) * 0.9  # groups a resumed run kept: not held

    def test_each_stop_is_heard_with_its_work_in_flight(self):
        """The stop hook gets the old and new run and the attempts running at the stop."""
        b = TraceBuilder(run_id="A")
        b.event("group.reserve", group_id="g", prompt_id=1, size=2, weight_version=0)
        for i in (0, 1):
            b.event("attempt.dispatch", attempt_id=f"a{i}", group_id="g", prompt_id=1,
                    generation_index=i, weight_version=0)  # fmt: skip
        b.event("attempt.seal", attempt_id="a0", group_id="g", prompt_id=1,
                generation_index=0, tokens=5)  # fmt: skip
        b.new_run("B")
        [rec] = run_events(b.events, [Recorder()])
        [stop] = rec.stops
        assert (stop.old.run_id, stop.new.run_id) == ("A", "B")
        assert [key for _, key, _ in stop.attempts] == [(0, 1, 1)]
        [(_, _, started)] = stop.attempts  # the dispatch's time
        assert started == next(e["t"] for e in b.events if e.get("attempt_id") == "a1")
        assert stop.groups["g"].attempts == {(0, 1, 0): 5}

    def test_an_analysis_of_a_few_kinds_reads_only_those(self, tmp_path):
        """With kinds named, lines of other kinds are not read: a broken one costs no warning."""
        path = tmp_path / "t.jsonl"
        b = TraceBuilder()
        b.sealed_group("g", {0: 10})
        b.step(0, 1, ["g"])
        lines = [orjson.dumps(e) for e in b.events]
        lines.insert(1, b'{"t":1,"run_id":"r","event":"attempt.dispatch","attempt_id":5}')
        path.write_bytes(b"\n".join(lines) + b"\n")
        warned: list = []
        [steps] = run_file(path, [StepAges()], on_warning=lambda *w: warned.append(w))
        assert [s.batch_age for s in steps] == [1.0] and warned == []
        run_file(path, [CostAnalysis()], on_warning=lambda *w: warned.append(w))
        assert [w[0] for w in warned] == [2]


class TestWarnings:
    @pytest.mark.parametrize("analysis", [StepAges, CostAnalysis])
    def test_a_step_naming_unsealed_groups_is_named_by_its_line(self, trace, tmp_path, analysis):
        """Deep in a large file (many read blocks), the warning names the step's exact line."""
        path = tmp_path / "t.jsonl"
        data = trace.read_bytes()
        step = b'{"t":2e9,"run_id":"z","event":"train.step","step":99999,"trained_version":1,'
        step += b'"group_ids":["nope","never"]}\n'
        path.write_bytes(data + step)
        line = data.count(b"\n") + 1
        warned: list = []
        run_file(path, [analysis()], on_warning=lambda where, why: warned.append((where, why)))
        assert (line, "train.step 99999 names groups that were never sealed: nope, never") in warned

    def test_events_in_memory_are_named_by_position(self):
        """A dict that breaks a rule is reported as its position in the input, and skipped."""
        b = TraceBuilder()
        b.sealed_group("g", {0: 10})
        b.event("train.step", step=0, trained_version=-1, group_ids=["g"])
        b.step(1, 1, ["g"])
        warned: list = []
        [steps] = run_events(b.events, [StepAges()], on_warning=lambda *w: warned.append(w))
        assert [s.step for s in steps] == [1]
        [(where, why)] = warned
        assert (
            where == f"event {len(b.events) - 1}"
            and "trained_version" in why
            and why.endswith("skipped")
        )
