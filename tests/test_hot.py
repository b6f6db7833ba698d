"""The pass's compiled path (``_hot.c``) gives exactly what the Python path gives."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_ledger import naive_ledger, traces

from otel_rollout.analysis import Analysis, StepAges, hot, run_file
from otel_rollout.analysis.history import History, flat_pairs
from otel_rollout.analysis.records import FLIGHT_COUNT
from otel_rollout.cost import CostAnalysis, analyze, analyze_file
from otel_rollout.report import ReportData, ReportSeries
from otel_rollout.staleness import StalenessAnalysis
from otel_rollout.testing import synthetic_trace

pytestmark = pytest.mark.skipif(
    not hot.enabled and os.environ.get("CI") != "true",  # CI builds it: a failed build fails
    reason="the compiled path was not built here (no compiler when the package was installed)",
)


class Probe(Analysis):
    """Reads nothing itself: what the shared state holds at the end is the result."""

    def result(self) -> Any:
        state = self.state
        return {
            "attempts": dict(state.attempts),
            "groups": {g: dataclasses.asdict(group) for g, group in state.groups.items()},
            "epochs": dict(state.epochs),
            "sealed_tokens": state.sealed_tokens,
            "runs": [dataclasses.asdict(run) for run in state.runs],
            "histories": {
                g: (h.run, h.reason, h.epoch, h.prompt_id, h.reserved, sealed(h))
                for g, h in (state.histories or {}).items()
            },
        }


def sealed(history: History) -> list[int] | None:
    return None if history.sealed is None else list(flat_pairs([history.sealed]))


@pytest.fixture
def applied(monkeypatch) -> list[tuple[int, int]]:
    """``(kinds, lines)`` of each call of the compiled path: the flags of the kinds it was
    given, and how many lines it applied (so a test can tell it ran)."""
    counts: list[tuple[int, int]] = []
    consume = hot._consume

    def counting(*args: Any) -> Any:
        out = consume(*args)
        counts.append((args[8], out[1]))
        return out

    monkeypatch.setattr(hot, "_consume", counting)
    return counts


def both_paths(monkeypatch, path: Path, make: Any) -> tuple[Any, Any, list, list]:
    """The results and warnings of a pass over ``path`` with the compiled path and without."""
    found = []
    for on in (True, False):
        monkeypatch.setattr(hot, "enabled", on)
        warnings: list[tuple[Any, str]] = []
        tell = warnings.append
        results = run_file(path, make(), on_warning=lambda n, what, tell=tell: tell((n, what)))
        found.append((results, warnings))
    monkeypatch.setattr(hot, "enabled", True)
    return found[0][0], found[1][0], found[0][1], found[1][1]


def reports(results: list[Any]) -> list[Any]:
    return [
        r.report() if hasattr(r, "report") else r.record() if hasattr(r, "record") else r
        for r in results
    ]


def test_the_bench_trace_gives_the_same_cost_either_way(tmp_path, monkeypatch, applied):
    """On a synthetic 3-run trace, cost, batch age, the staleness diagnostics and the state
    (every group's history too) are the same with the compiled path as without, and the
    compiled path applied most lines."""
    path = synthetic_trace(tmp_path / "t.jsonl", 30_000, runs=3)
    make = lambda: [CostAnalysis(), StepAges(), StalenessAnalysis(), Probe()]  # noqa: E731
    on, off, warned_on, warned_off = both_paths(monkeypatch, path, make)
    assert reports(on) == reports(off)
    assert warned_on == warned_off
    assert sum(n for _, n in applied) > 0.8 * 30_000


class SealTokens(Analysis):
    """Handles every attempt's seal itself, and says nothing of which it needs."""

    def __init__(self) -> None:
        self.tokens = 0

    def handlers(self) -> Any:
        return {"attempt.seal": self.seal}

    def seal(self, e: Any) -> None:
        self.tokens += e.tokens

    def result(self) -> int:
        return self.tokens


def test_an_analysis_that_needs_every_attempt_turns_the_compiled_path_off(
    tmp_path, monkeypatch, applied
):
    """A pass with an analysis that handles attempts and gives no hot_keys reads every
    line in Python, with the same results as with the compiled path allowed; cost alone
    lets the compiled path read the attempts."""
    path = synthetic_trace(tmp_path / "t.jsonl", 5_000, runs=2)
    make = lambda: [CostAnalysis(), SealTokens()]  # noqa: E731
    on, off, _, _ = both_paths(monkeypatch, path, make)
    assert reports(on) == reports(off) and 0 < on[1] <= on[0].tokens_generated
    assert not applied  # the few lines it could take would only cut the rest up
    attempts = hot.HOT_KINDS["attempt.dispatch"] | hot.HOT_KINDS["attempt.seal"]
    run_file(path, [CostAnalysis()])
    assert all(kinds & attempts == attempts for kinds, _ in applied)
    assert sum(n for _, n in applied) > 0.8 * 5_000


def test_the_reports_whole_pass_takes_the_compiled_path_with_the_same_page(
    tmp_path, monkeypatch, applied
):
    """The report's pass (cost, its series of attempts in flight, batch age, staleness)
    reads most lines in C, and every series it draws is the same as without."""
    path = synthetic_trace(tmp_path / "t.jsonl", 30_000, runs=3)

    def make() -> list[Analysis]:
        return [CostAnalysis(), ReportSeries(ReportData(str(path))), StepAges(),
                StalenessAnalysis()]  # fmt: skip

    on, off, warned_on, warned_off = both_paths(monkeypatch, path, make)
    assert on[1].in_flight == off[1].in_flight and len(on[1].in_flight) > 100
    assert on[1].steps == off[1].steps and on[1].runs == off[1].runs
    assert reports(on[2:]) == reports(off[2:]) and warned_on == warned_off
    assert sum(n for _, n in applied) > 0.8 * 30_000


# Hostile ways to write an event of a hot kind: each is valid JSON, and each is either a
# line the compiled path must leave to the Python path or one it must read as it would.
def _written(event: dict[str, Any], how: str, rnd: random.Random) -> bytes:
    e = dict(event)
    if how == "shuffled":
        items = list(e.items())
        rnd.shuffle(items)
        return json.dumps(dict(items), separators=(",", ":")).encode()
    if how == "spaced":
        return json.dumps(e, separators=(" , ", " : ")).replace("{", "{ \t").encode() + b" \r"
    if how == "escaped":
        key = rnd.choice([k for k in e if isinstance(e[k], str)])
        text = json.dumps(e, separators=(",", ":"))
        value = json.dumps(e[key])
        escaped = '"' + "".join(f"\\u{ord(c):04x}" for c in e[key]) + '"'
        return text.replace(value, escaped, 1).encode()
    if how == "extra":
        e["note"] = {"nested": [1, 2.5, None]}
    elif how == "null":
        e[rnd.choice(["epoch", "calls", "tokens", "weight_version"])] = None
    elif how == "negative":
        for k in ("tokens", "generation_index", "weight_version", "size"):
            if k in e:
                e[k] = -e[k] - 1
                break
    elif how == "float":
        for k in ("tokens", "generation_index", "prompt_id", "size"):
            if k in e:
                e[k] = float(e[k])
                break
    elif how == "huge":
        for k in ("tokens", "prompt_id", "generation_index"):
            if k in e:
                e[k] = 10**rnd.choice([15, 16, 19, 20, 400])
                break
    elif how == "t":
        e["t"] = rnd.choice([0, -0.0, 1e-320, 12345678901234567890, 1e22, 1.5e300, 2**53 + 1])
    elif how == "versions" and "tokens" in e:
        n = e["tokens"]
        e["tokens_by_version"] = rnd.choice(
            [{}, {"-0": n}, {"00": n}, {"+1": n}, {" 1": n}, {"1": n + 1}, {"0": n, "1": 0},
             {str(v): 0 for v in range(9)} | {"9": n}, {"1": 2**63, "2": 2**63 + n}, None]
        )  # fmt: skip
    elif how == "empty":
        e["group_id"] = ""
    elif how == "accent":
        e["group_id"] = str(e["group_id"]) + "é"
    elif how == "string":
        e["prompt_id"] = str(e.get("prompt_id"))
    elif how == "calls":
        e["calls"] = rnd.choice([[], [["c", 0, 1], [7, 1, 2]], [["c", -1, 1]], [["c", 0]], "x"])
    elif how == "missing":
        e.pop(rnd.choice(["t", "prompt_id", "group_id", "run_id"]))
    elif how == "twice":
        text = json.dumps(e, separators=(",", ":"))
        return text[:-1].encode() + b',"group_id":"other"}'
    elif how == "trailing":
        return json.dumps(e, separators=(",", ":")).encode() + b" x"
    return json.dumps(e, separators=(",", ":")).encode()


HOW = ["plain", "plain", "plain", "shuffled", "spaced", "escaped", "extra", "null", "negative",
       "float", "huge", "t", "empty", "accent", "string", "calls", "missing", "twice",
       "trailing", "versions"]  # fmt: skip
HOT = {"attempt.dispatch", "attempt.seal", "group.reserve", "group.admit", "group.seal"}


def _write(path: Path, events: list[dict[str, Any]], seed: int, odd: float) -> Path:
    rnd = random.Random(seed)
    lines = []
    for e in events:
        if e["event"] == "group.reserve" and rnd.random() < 0.5:
            lines.append(json.dumps(e).encode())
            admit = {k: e[k] for k in ("t", "run_id", "group_id", "prompt_id")}
            e = {**admit, "event": "group.admit"}
        if e["event"] == "group.seal" and e["tokens"] and rnd.random() < 0.5:
            first = rnd.randint(0, e["tokens"])  # counts of two versions, as a refit makes
            e = {**e, "tokens_by_version": {"0": first, "1": e["tokens"] - first}}
        how = rnd.choice(HOW) if e["event"] in HOT and rnd.random() < odd else "plain"
        lines.append(_written(e, how, rnd))
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


FIXTURES = [HealthCheck.function_scoped_fixture]  # each example writes its own file


@settings(max_examples=150, deadline=None, suppress_health_check=FIXTURES)
@given(traces(), st.integers(0, 2**32), st.sampled_from([0.0, 0.1, 0.5]))
def test_hostile_files_give_the_same_results_either_way(tmp_path, monkeypatch, events, seed, odd):
    """Random multi-run traces, some of their lines written in hostile ways: cost (ledger,
    boundaries), batch age, the staleness diagnostics, the report's series, the shared
    state (every group's history too) and every warning with its line number are the
    same with the compiled path as without; where no line is odd, the ledger is the
    naive model's."""
    path = _write(tmp_path / f"h{seed}.jsonl", events, seed, odd)

    def make() -> list[Analysis]:
        series = ReportSeries(ReportData(str(path)))
        return [CostAnalysis(), StepAges(), StalenessAnalysis(), series, Probe()]

    on, off, warned_on, warned_off = both_paths(monkeypatch, path, make)
    assert reports(on) == reports(off)
    assert warned_on == warned_off  # in the same order: the first ten are what is shown
    if odd == 0.0:
        assert on[0].ledger == naive_ledger(events) == analyze(events).ledger


def test_the_ledger_property_holds_through_a_file(tmp_path):
    """The ledger property test's traces, read from a file by the compiled path, give the
    naive model's ledger."""

    @settings(max_examples=100, deadline=None)
    @given(traces())
    def check(events):
        path = tmp_path / "p.jsonl"
        path.write_text("".join(json.dumps(e) + "\n" for e in events))
        assert analyze_file(path).ledger == naive_ledger(events)

    check()


def _dispatches(path: Path, times: list[str]) -> Path:
    lines = ['{"t":1,"run_id":"r","event":"run.start","schema":1,"pid":1}']
    for i, t in enumerate(times):
        lines.append(
            f'{{"t":{t},"run_id":"r","event":"attempt.dispatch","group_id":"g",'
            f'"prompt_id":1,"attempt_id":"a{i}","generation_index":0,"weight_version":0}}'
        )
    path.write_text("\n".join(lines) + "\n")
    return path


def _decimal(digits: int, point: int, exponent: int | None, negative: bool) -> str:
    text = str(digits)
    if point:
        text = text.rjust(point + 1, "0")
        text = text[:-point] + "." + text[-point:]
    if exponent is not None:
        text += f"e{exponent:+d}"
    return ("-" if negative else "") + text


@settings(max_examples=60, deadline=None, suppress_health_check=FIXTURES)
@given(
    st.lists(
        st.one_of(
            st.floats(allow_nan=False, allow_infinity=False).map(repr),
            st.floats(min_value=1e9, max_value=3e9).map(repr),
            st.builds(
                _decimal,
                st.integers(0, 10**20),
                st.integers(0, 22),
                st.one_of(st.none(), st.integers(-30, 30)),
                st.booleans(),
            ),
        ),
        min_size=1,
        max_size=40,
    )
)
def test_every_time_is_read_as_the_nearest_double(tmp_path, monkeypatch, applied, times):
    """A dispatch's t, written any way JSON allows, is the nearest double to its decimal
    (what float() gives; an integer is read as one first, so "-0" is 0.0) with the
    compiled path and without."""
    path = _dispatches(tmp_path / "t.jsonl", times)
    on, off, _, _ = both_paths(monkeypatch, path, lambda: [Probe()])
    value = {t: float(int(t)) if t.lstrip("-").isdigit() else float(t) for t in times}
    expected = {f"a{i}": value[t] for i, t in enumerate(times) if math.isfinite(value[t])}
    for result in (on, off):
        got = {a: record[2] for a, record in result[0]["attempts"].items()}
        assert got == expected
        assert all(repr(got[a]) == repr(expected[a]) for a in got)  # the sign of a zero too
    if any(len(t) <= 24 and math.isfinite(float(t)) for t in times):
        assert sum(n for _, n in applied) > 0


def test_its_variable_turns_it_off_with_the_same_output(tmp_path):
    """OTEL_ROLLOUT_COMPILED_PASS=false reads every line in Python, and `cost --json` prints
    the same report as with the compiled path."""
    path = synthetic_trace(tmp_path / "t.jsonl", 8_000, runs=3)
    outputs = {}
    for value in ("true", "false"):
        env = {**os.environ, "OTEL_ROLLOUT_COMPILED_PASS": value}
        probe = "from otel_rollout.analysis import hot; print(hot.enabled)"
        used = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True,
                              text=True, check=True)  # fmt: skip
        assert used.stdout.strip() == str(value == "true")
        cost = [sys.executable, "-m", "otel_rollout", "cost", "--json", str(path)]
        outputs[value] = subprocess.run(cost, env=env, capture_output=True, check=True).stdout
    assert outputs["true"] == outputs["false"] and b'"ledger"' in outputs["true"]


def test_group_seals_the_python_path_must_see_keep_their_warnings(tmp_path, monkeypatch, applied):
    """A seal of a group a step already trained, one whose counts do not add up, one with
    a version key "-0" and one with carried work to find are left to the Python path: the
    same warnings, ledger and counts as without the compiled path, which read the rest."""
    lines = ['{"t":1,"run_id":"r","event":"run.start","schema":1,"pid":1}']
    t = 1.0

    def add(kind: str, **fields: Any) -> None:
        nonlocal t
        t += 0.5
        lines.append(json.dumps({"t": t, "run_id": "r", "event": kind, **fields}))

    for g in range(4):
        add("group.reserve", group_id=f"g{g}", prompt_id=g, size=1, weight_version=0)
        ids = {"group_id": f"g{g}", "prompt_id": g, "attempt_id": f"a{g}", "generation_index": 0}
        add("attempt.dispatch", **ids, weight_version=0)
        add("attempt.seal", **ids, tokens=10)
    add("group.seal", group_id="g0", prompt_id=0, tokens=10, tokens_by_version={"0": 10})
    add("train.step", step=0, trained_version=1, group_ids=["g0"])
    add("group.seal", group_id="g0", prompt_id=0, tokens=10, tokens_by_version={"0": 10})
    add("group.seal", group_id="g1", prompt_id=1, tokens=10, tokens_by_version={"0": 4, "1": 5})
    lines.append(lines[-1].replace('"0": 4', '"-0": 4').replace('"1": 5', '"1": 6'))
    add("group.seal", group_id="g2", prompt_id=2, tokens=10, tokens_by_version={"1": 7, "0": 3})
    add("train.step", step=1, trained_version=2, group_ids=["g2", "g3"])
    path = tmp_path / "s.jsonl"
    path.write_text("\n".join(lines) + "\n")
    on, off, warned_on, warned_off = both_paths(monkeypatch, path, lambda: [CostAnalysis(),
                                                                            StepAges(), Probe()])
    assert reports(on) == reports(off)
    assert warned_on == warned_off
    said = " ".join(what for _, what in warned_on)
    assert "sealed after a train.step" in said and "not the sum" in said and "g3" in said
    assert on[1][1].tokens_by_age == {1: 7, 2: 3}  # g2's counts, as written
    assert sum(n for _, n in applied) > 0


class GroupsAtSteps(Analysis):
    """Reads only steps, and the groups in flight the shared state holds at each."""

    kinds = frozenset({"train.step", "weights.sync", "checkpoint.restore", "trace.dropped"})

    def __init__(self) -> None:
        self.seen: list[Any] = []

    def handlers(self) -> Any:
        return {"train.step": lambda e: self.seen.append(sorted(self.state.groups))}

    def stop(self, stop: Any) -> None:
        self.seen.append(("stop", sorted(stop.groups)))

    def result(self) -> Any:
        return self.seen, len(self.state.groups), self.state.sealed_tokens


def test_a_pass_that_follows_no_attempts_gets_none_from_the_compiled_path(tmp_path, monkeypatch):
    """A pass over kinds that put nothing in flight (more than the reader searches for, or
    through a reader of every kind) keeps no groups or attempts either way."""
    path = synthetic_trace(tmp_path / "t.jsonl", 20_000, runs=2)
    for make in (lambda: [GroupsAtSteps()], lambda: [GroupsAtSteps(), StepAges()]):
        on, off, _, _ = both_paths(monkeypatch, path, make)
        assert reports(on) == reports(off)
        assert on[0][1:] == (0, 0)
    from otel_rollout.reader import EventReader

    [(seen, groups, tokens)] = run_file(EventReader(path, typed=True), [GroupsAtSteps()])
    assert (groups, tokens) == (0, 0) and seen and not any(seen[0])


def test_warnings_come_in_file_order_whichever_path(tmp_path, cli):
    """A pass's own warning and skipped lines are told in file order, so the first ten a
    command shows are the same with the compiled path and without."""
    head = [
        '{"t":1,"run_id":"r","event":"run.start","schema":1,"pid":1}',
        '{"t":2,"run_id":"r","event":"group.reserve","group_id":"g","prompt_id":1,"size":1,'
        '"weight_version":0}',
        '{"t":3,"run_id":"r","event":"attempt.dispatch","group_id":"g","prompt_id":1,'
        '"attempt_id":"a","generation_index":0,"weight_version":0}',
        '{"t":4,"run_id":"r","event":"train.step","step":0,"trained_version":1,'
        '"group_ids":["nosuch"]}',
        '{"t":5,"run_id":"r","event":"attempt.dispatch","group_id":"g","prompt_id":1,'
        '"attempt_id":"b","generation_index":1,"weight_version":0}',
    ]
    path = tmp_path / "w.jsonl"
    path.write_text("\n".join(head + ["not json"] * 10) + "\n")
    said = {}
    for value in ("true", "false"):
        env = {**os.environ, "OTEL_ROLLOUT_COMPILED_PASS": value}
        cost = [sys.executable, "-m", "otel_rollout", "cost", str(path)]
        said[value] = subprocess.run(cost, env=env, capture_output=True, text=True).stderr
    assert said["true"] == said["false"]
    assert said["true"].index(":4:") < said["true"].index(":6:")  # the step's warning first


def test_lines_it_refuses_stay_together_in_one_batch(tmp_path, applied):
    """A file whose every line carries a field the compiled path does not know is read in
    a call or two a block, not one a line (each call a batch of the Python path)."""
    plain = synthetic_trace(tmp_path / "t.jsonl", 20_000, runs=1)
    odd = tmp_path / "odd.jsonl"
    odd.write_bytes(plain.read_bytes().replace(b"}\n", b',"host":"h"}\n'))
    generated = analyze_file(plain).tokens_generated
    applied.clear()
    [report] = run_file(odd, [CostAnalysis()])
    assert report.tokens_generated == generated
    blocks = odd.stat().st_size // (1 << 17) + 1
    assert sum(n for _, n in applied) == 0 and len(applied) <= 2 * blocks + 2


def test_a_reader_of_a_few_kinds_tells_skips_in_file_order(tmp_path):
    """`batch-age` finds its lines by name; a skipped line among them is told after the
    pass's warning about an earlier line, as it stands in the file."""
    lines = [
        '{"t":1,"run_id":"r","event":"run.start","schema":1,"pid":1}',
        '{"t":2,"run_id":"r","event":"train.step","step":0,"trained_version":1,"group_ids":["x"]}',
        '{"t":3,"run_id":"r","event":"group.seal","group_id":"g","prompt_id":1,"tokens":-1}',
    ]
    path = tmp_path / "b.jsonl"
    path.write_text("\n".join(lines) + "\n")
    warned: list[Any] = []
    run_file(path, [StepAges()], on_warning=lambda n, what: warned.append(n))
    assert warned == [2, 3]


def test_a_blank_first_line_then_events_is_a_trace_either_way(tmp_path, monkeypatch):
    """A file whose line 1 is blank and line 2 its first event proves a trace with the
    compiled path as without it."""
    body = synthetic_trace(tmp_path / "t.jsonl", 3_000, runs=1).read_bytes()
    path = tmp_path / "blank.jsonl"
    path.write_bytes(b"\n" + body + b"not json\n")
    from otel_rollout.reader import EventReader

    seen = []
    for on in (True, False):
        monkeypatch.setattr(hot, "enabled", on)
        reader = EventReader(path, typed=True, on_skip=lambda n, why: None)
        run_file(reader, [CostAnalysis()])
        seen.append((reader.first_line_is_event, reader.events, reader.lines, reader.skipped))
    assert seen[0] == seen[1] and seen[0][0] is True


def test_a_group_sealed_into_by_the_next_run_belongs_to_that_run_either_way(
    tmp_path, monkeypatch, applied
):
    """A group one run reserved and the next run's attempt sealed into is the later run's
    in its history, with the attempt's length and time in flight, on both paths; the
    compiled path reads the new run's lines once the engine has begun it."""
    a = '"run_id":"a"'
    b = '"run_id":"b"'
    ids = '"group_id":"g","prompt_id":7'
    lines = [
        f'{{"t":1,{a},"event":"run.start","schema":1,"pid":1}}',
        f'{{"t":2,{a},"event":"group.reserve",{ids},"size":1,"weight_version":0,"epoch":3}}',
        f'{{"t":3,{b},"event":"run.start","schema":1,"pid":2}}',
        f'{{"t":4,{b},"event":"attempt.dispatch",{ids},"attempt_id":"x","generation_index":0,'
        '"weight_version":0}',
        f'{{"t":4.5,{b},"event":"attempt.seal",{ids},"attempt_id":"x","generation_index":0,'
        '"tokens":9}',
    ]
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(lines) + "\n")
    on, off, _, _ = both_paths(monkeypatch, path, lambda: [StalenessAnalysis(), Probe()])
    assert applied[-1][1] == 2  # run b's dispatch and seal: the compiled path's, once b began
    assert on[1]["histories"] == off[1]["histories"] == {"g": ("b", None, 3, 7, 2.0, [9, 500])}


def test_a_file_of_attempts_and_no_step_keeps_its_flight_counts_bounded(tmp_path, monkeypatch):
    """A file of dispatches and seals with no step: the report's series takes the changes
    of attempts in flight whenever they pass the bound, on both paths, and draws the same
    buckets as with the bound out of reach."""
    from otel_rollout.analysis import state as state_module

    lines = ['{"t":1,"run_id":"r","event":"run.start","schema":1,"pid":1}']
    ids = '"group_id":"g","prompt_id":1,"generation_index":0'
    for i in range(3_000):
        t = 2 + i / 100
        lines.append(f'{{"t":{t},"run_id":"r","event":"attempt.dispatch","attempt_id":"a{i}",'
                     f'{ids},"weight_version":0}}')  # fmt: skip
        lines.append(f'{{"t":{t + 0.005},"run_id":"r","event":"attempt.seal","attempt_id":"a{i}",'
                     f'{ids},"tokens":3}}')  # fmt: skip
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(lines) + "\n")
    drawn = {}
    for held in (1 << 40, 1024):
        monkeypatch.setattr(state_module, "FLIGHT_COUNTS_HELD", held)
        monkeypatch.setattr(hot, "FLIGHT_COUNTS_HELD", held)
        for on in (True, False):
            monkeypatch.setattr(hot, "enabled", on)
            series = ReportSeries(ReportData(str(path)))
            taken: list[int] = []
            take = series.take_flight_counts
            series.take_flight_counts = lambda c, take=take, taken=taken: (  # type: ignore
                taken.append(len(c)), take(c)
            )[1]
            run_file(path, [series])
            drawn[held, on] = series.data.in_flight
            # at most a block's (or a batch's) worth past the bound: ~1,000 lines, 16 KB
            assert max(taken) < held + 32_000 and (held > 1024 or len(taken) > 3), taken
    monkeypatch.setattr(hot, "enabled", True)
    assert len({str(v) for v in drawn.values()}) == 1 and len(drawn[1024, True]) > 100


def test_one_analysis_of_a_pass_may_keep_the_flight_counts():
    """Two would split the changes between them: the engine refuses the second."""
    from otel_rollout.analysis import Engine

    with pytest.raises(ValueError, match="one analysis"):
        Engine([ReportSeries(ReportData("a")), ReportSeries(ReportData("b"))], print)


@settings(max_examples=100, deadline=None)
@given(
    st.integers(0, 2**32),
    st.integers(0, 12_000),
    st.sampled_from([0.001, 1.0, 1e5]),
    st.sampled_from([0.0, 0.1, 0.3, 0.5]),
)
def test_the_folded_flight_counts_are_the_same_either_way(seed, changes, scale, back):
    """The report's buckets of attempts in flight, folded in C or in Python from the same
    packed changes (past the point where the buckets coarsen, times sometimes going back
    or odd: NaN, infinite, -0.0, taken in calls of any size) are the same, with the same
    types."""
    assert hot._fold is not None  # (the module is skipped where nothing was built)
    rng = random.Random(seed)
    t, points = 0.0, []
    for _ in range(changes):
        t += scale * (rng.random() - back)
        odd = rng.random() < 0.002
        at = rng.choice([math.nan, math.inf, -math.inf, -0.0, 0.0]) if odd else t
        points.append((at, rng.choice([0, 1, rng.randrange(2**40)])))
    cuts = sorted(rng.sample(range(changes + 1), min(changes + 1, rng.randrange(1, 50))))
    found, was = [], hot.enabled
    for on in (True, False):
        hot.enabled = on
        try:
            series = ReportSeries(ReportData(""))
            for a, b in zip([0, *cuts], [*cuts, changes], strict=True):
                counts = bytearray(b"".join(FLIGHT_COUNT.pack(*p) for p in points[a:b]))
                series.take_flight_counts(counts)
                assert not counts
        finally:
            hot.enabled = was
        found.append((series.data.in_flight, series._geometry))
    assert repr(found[0]) == repr(found[1])  # NaN too, and -0.0 apart from 0.0
    for buckets, _ in found:
        assert all(type(v) is float for b in buckets for v in b[:2])
        assert all(type(v) is int for b in buckets for v in b[2:])
