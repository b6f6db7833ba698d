"""The timeline drawn by the compiled path (``_hot_lanes.h``): the same bytes as the Python
path's on random busy runs written in hostile ways, with every cut, and on the bench
trace through the command."""

from __future__ import annotations

import io
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_hot import _write

from otel_rollout.analysis import hot, run_file
from otel_rollout.cost import CostAnalysis
from otel_rollout.testing import TraceBuilder, synthetic_trace
from otel_rollout.timeline import Timeline, TraceEventWriter

pytestmark = pytest.mark.skipif(
    not hot.enabled and os.environ.get("CI") != "true",  # CI builds it: a failed build fails
    reason="the compiled path was not built here (no compiler when the package was installed)",
)


def busy_runs(seed: int) -> list[dict[str, Any]]:
    """Up to three runs of overlapping attempts on several lanes: refits (some cutting a
    call, some with a duration), refusals, abandons, attempts dispatched again while in
    flight, resumed ones, and groups reserved, sealed, discarded and trained."""
    rng = random.Random(seed)
    b = TraceBuilder(run_id="r0", dt=rng.choice([0.0005, 0.004, 0.03]))
    n = 0
    for r in range(rng.randint(1, 3)):
        if r:
            b.new_run(f"r{r}", gap=rng.choice([0.001, 0.5]))
        version = rng.randint(0, 3)
        running: dict[str, str] = {}  # attempt → its group
        groups: list[str] = []
        sealed: list[str] = []
        step = 0
        if rng.random() < 0.8:
            b.event("run.start", schema=1, pid=r + 1)
        for _ in range(rng.randint(0, 120)):
            n += 1
            x = rng.random()
            if not groups or x < 0.08:
                g = f"g{n}"
                groups.append(g)
                b.event("group.reserve", group_id=g, prompt_id=n % 7, size=2,
                        weight_version=version, epoch=n % 2)  # fmt: skip
            elif running and x < 0.45:
                aid = rng.choice(sorted(running))
                g = running.pop(aid)
                ids = {"attempt_id": aid, "group_id": g, "prompt_id": 1, "generation_index": 0}
                y = rng.random()
                if y < 0.75:
                    calls = [[f"c-{aid}", version, 5]] if rng.random() < 0.3 else None
                    fields = {"calls": calls} if calls else {}
                    b.event("attempt.seal", **ids, tokens=rng.randint(0, 40), **fields)
                elif y < 0.9:
                    b.event("attempt.abandon", **ids, reason="stale", tokens=3)
                else:
                    b.event("attempt.refuse", **ids, reason="capacity")
            elif x < 0.53:
                cuts = [[f"c-{a}", 2] for a in sorted(running)[:1]] if rng.random() < 0.5 else []
                fields: dict[str, Any] = {"cuts": cuts} if cuts else {}
                if rng.random() < 0.5:
                    fields["duration_s"] = rng.choice([0.001, 0.02])
                b.event("weights.sync", replaced_version=version, new_version=version + 1,
                        **fields)  # fmt: skip
                version += 1
            elif x < 0.58 and groups:
                g = groups.pop(rng.randrange(len(groups)))
                b.event("group.seal", group_id=g, prompt_id=1, tokens=0)
                sealed.append(g)
            elif x < 0.62 and sealed:
                take = sealed[: rng.randint(1, len(sealed))]
                del sealed[: len(take)]
                b.step(step, trained_version=version, group_ids=take)
                step += 1
            elif x < 0.64 and groups:
                g = groups.pop()
                b.event("group.discard", group_id=g, prompt_id=1, reason="stale")
            elif x < 0.66 and running and rng.random() < 0.5:
                aid = rng.choice(sorted(running))  # dispatched again while in flight
                b.event("attempt.dispatch", attempt_id=aid, group_id=running[aid],
                        prompt_id=1, generation_index=0, weight_version=version)  # fmt: skip
            else:
                aid = f"a{n}"
                running[aid] = g = rng.choice(groups)
                kind = "attempt.resume" if rng.random() < 0.05 else "attempt.dispatch"
                extra = {"resumed_tokens": 4} if kind == "attempt.resume" else {}
                b.event(kind, attempt_id=aid, group_id=g, prompt_id=1, generation_index=0,
                        weight_version=version, **extra)  # fmt: skip
    return b.events


def drawn(
    monkeypatch: Any, path: Path, on: bool, *, cost: bool = False, **options: Any
) -> tuple[Any, ...]:
    """The timeline's bytes, summary and warnings (and ``cost``'s report beside it), with
    the compiled path or without."""
    monkeypatch.setattr(hot, "enabled", on)
    out = io.BytesIO()
    warned: list[Any] = []
    timeline = Timeline(TraceEventWriter(out, chunk=7), **options)  # small chunks: many flushes
    analyses: list[Any] = [CostAnalysis(), timeline] if cost else [timeline]
    found = run_file(path, analyses, on_warning=lambda n, what: warned.append((n, what)))
    monkeypatch.setattr(hot, "enabled", True)
    return out.getvalue(), found[-1], warned, found[0].report() if cost else None


@pytest.fixture
def applied(monkeypatch) -> list[int]:
    """How many lines each call of the compiled path applied."""
    counts: list[int] = []
    consume = hot._consume

    def counting(*args: Any) -> Any:
        out = consume(*args)
        counts.append(out[1])
        return out

    monkeypatch.setattr(hot, "_consume", counting)
    return counts


CUTS = st.sampled_from(["all", "second run", "a window", "first run's window"])
#: With cost beside it, some lines the timeline would draw are ones the state leaves to the
#: Python path (cost watches their rollouts): nothing of them may be drawn in C.
WITH_COST = st.booleans()
FIXTURES = [HealthCheck.function_scoped_fixture]  # each example writes its own file


@settings(max_examples=150, deadline=None, suppress_health_check=FIXTURES)
@given(st.integers(0, 2**32), st.sampled_from([0.0, 0.1, 0.5]), CUTS,
       st.sampled_from([0.0, 0.002, 0.05, 10.0]), WITH_COST)  # fmt: skip
def test_busy_runs_draw_the_same_timeline_either_way(
    tmp_path, monkeypatch, applied, seed, odd, cut, resolution, cost
):
    """Random busy runs, some lines written in hostile ways, drawn whole or cut to a run or
    a window of time, with any counter resolution, alone or beside cost: the compiled path
    writes the same bytes, summary and warnings (and cost) as the Python path."""
    events = busy_runs(seed)
    path = _write(tmp_path / f"b{seed}.jsonl", events, seed, odd)
    options: dict[str, Any] = {"counter_resolution": resolution}
    if cut == "second run":
        options["runs"] = lambda index, run_id: index == 1
    elif events and cut != "all":
        times = [e["t"] for e in events if e["run_id"] == events[0]["run_id"]]
        middle = times[len(times) // 3], times[2 * len(times) // 3]
        options["windows"] = {events[0]["run_id"]: middle if cut == "a window" else (None, 1e18)}
    on = drawn(monkeypatch, path, True, cost=cost, **options)
    off = drawn(monkeypatch, path, False, cost=cost, **options)
    assert on[0] == off[0]
    assert on[1:] == off[1:]


def test_most_lines_of_a_busy_run_are_drawn_in_c(tmp_path, monkeypatch, applied):
    """Overlapping attempts on many lanes with refits among them: the compiled path draws
    most lines, and the bytes are the Python path's."""
    events = max((busy_runs(seed) for seed in range(30)), key=len)
    path = _write(tmp_path / "b.jsonl", events, 3, 0.0)
    on, off = drawn(monkeypatch, path, True), drawn(monkeypatch, path, False)
    assert on == off and on[1].attempts > 10 and max(on[1].lanes.values()) > 1
    assert sum(applied) > 0.5 * len(events)


def test_a_timeline_that_draws_otherwise_is_drawn_in_python(tmp_path, monkeypatch, applied):
    """A subclass with its own seal handler is not drawn by the compiled path (which mirrors
    only the timeline's own): every line of its pass is read in Python."""

    class Marked(Timeline):
        def _seal(self, e: Any) -> None:
            super()._seal(e)

    path = _write(tmp_path / "b.jsonl", busy_runs(3), 3, 0.0)
    assert Timeline(TraceEventWriter(io.BytesIO())).hot_lanes() is not None
    timeline = Marked(TraceEventWriter(io.BytesIO()))
    assert timeline.hot_lanes() is None
    run_file(path, [timeline])
    assert not any(applied)


def test_the_bench_timeline_is_the_same_either_way(tmp_path):
    """``otel-rollout timeline`` of a 3-run bench trace writes the same file with the
    compiled path as with ``OTEL_ROLLOUT_COMPILED_PASS=false``."""
    trace = synthetic_trace(tmp_path / "t.jsonl", 20_000, runs=3)
    written = {}
    for value in ("true", "false"):
        out = tmp_path / f"{value}.json"
        env = {**os.environ, "OTEL_ROLLOUT_COMPILED_PASS": value}
        command = [sys.executable, "-m", "otel_rollout", "timeline", str(trace), "-o", str(out)]
        subprocess.run(command, env=env, check=True, capture_output=True)
        written[value] = out.read_bytes()
    assert written["true"] == written["false"] and len(written["true"]) > 1_000_000
