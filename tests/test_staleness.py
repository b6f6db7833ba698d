"""Staleness diagnostics: token age per step, length bias by outcome, repeat waste, waits."""

from __future__ import annotations

import json
import math
from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from test_ledger import traces

from otel_rollout.analysis import run_events
from otel_rollout.cost import PENDING, TRAINED, analyze
from otel_rollout.staleness import StalenessAnalysis, quantile, staleness, weighted_quantile
from otel_rollout.testing import TraceBuilder


def attempt(b: TraceBuilder, aid: str, gid: str, prompt: int, tokens: int, end: str = "seal",
            **fields: Any) -> None:  # fmt: skip
    ids = {"attempt_id": aid, "group_id": gid, "prompt_id": prompt, "generation_index": 0}
    b.event("attempt.dispatch", **ids, weight_version=0, epoch=0)
    if end == "seal":
        b.event("attempt.seal", **ids, tokens=tokens)
    elif end == "abandon":
        b.event("attempt.abandon", **ids, tokens=tokens, **fields)
    elif end == "refuse":
        b.event("attempt.refuse", **ids, **fields)


def reserve(b: TraceBuilder, gid: str, prompt: int) -> None:
    b.event("group.reserve", group_id=gid, prompt_id=prompt, size=1, weight_version=0, epoch=0)


def long_ones_stale(trained: int) -> TraceBuilder:
    """Twenty one-attempt groups of 10..29 tokens: the shortest ``trained`` sealed and
    trained, the rest discarded as stale."""
    b = TraceBuilder(run_id="A")
    for n in range(20):
        gid = f"g{n}"
        reserve(b, gid, n)
        attempt(b, f"a{n}", gid, n, tokens=10 + n)
        if n < trained:
            b.event("group.seal", group_id=gid, prompt_id=n, tokens=10 + n)
            b.step(n, n + 1, [gid])
        else:
            b.event("group.discard", group_id=gid, prompt_id=n, reason="stale")
    return b


class TestKnownAnswers:
    def test_token_age_per_step_and_run(self):
        """A step trained at version 3 on tokens of versions 1, 2 and 3 has the ages 2, 1, 0
        weighted by tokens, and its quantiles are read off that histogram."""
        b = TraceBuilder(run_id="A")
        b.sealed_group("g1", {1: 10, 2: 30})
        b.sealed_group("g2", {3: 60})
        b.step(0, 3, ["g1", "g2"])
        record = staleness(b.events).record()
        [step] = record["steps"]
        assert step["age_tokens"] == {"0": 60, "1": 30, "2": 10}
        assert step["age"] == {"p50": 0, "p90": 1, "max": 2}
        assert record["runs"]["A"]["age_tokens"] == {"0": 60, "1": 30, "2": 10}
        assert record["file"]["tokens"] == 100

    def test_outcomes_lengths_and_the_starvation_ratio(self):
        """Short rollouts trained, long ones discarded as stale: each outcome gets its own
        lengths, the longest tenth's stale rate is 1, the shortest's 0: starvation is inf."""
        b = long_ones_stale(trained=10)
        reserve(b, "r", 99)
        attempt(b, "refused", "r", 99, tokens=0, end="refuse", reason="capacity")
        attempt(b, "gone", "r", 99, tokens=7, end="abandon", reason="error")
        bias = staleness(b.events).record()["length_bias"]
        outcomes = bias["outcomes"]
        assert outcomes["trained"]["attempts"] == 10 and outcomes["trained"]["tokens"] == 145
        assert outcomes["discarded: stale"]["length_tokens"] == {"p50": 24, "p90": 28, "max": 29}
        assert outcomes["refused"]["attempts"] == 1 and outcomes["abandoned: error"]["tokens"] == 7
        deciles = bias["deciles"]
        assert len(deciles) == 10 and deciles[0]["stale_rate"] == 0
        assert deciles[-1]["stale_rate"] == 1.0
        assert bias["long_rollout_starvation"] == math.inf

    def test_prompts_wasted_again_and_waits(self):
        """A prompt discarded twice and then trained counts as wasted twice; a group reserved
        at t and trained 2 s later waited 2 s."""
        b = TraceBuilder(run_id="A")
        for n, end in enumerate(["discard", "discard", "train"]):
            gid = f"g{n}"
            reserve(b, gid, 7)
            attempt(b, f"a{n}", gid, 7, tokens=100)
            if end == "discard":
                b.event("group.discard", group_id=gid, prompt_id=7, reason="stale")
            else:
                b.event("group.seal", group_id=gid, prompt_id=7, tokens=100,
                        tokens_by_version={"0": 100})  # fmt: skip
                b.t += 2.0
                b.step(0, 1, [gid])
        record = staleness(b.events).record()
        prompts = record["prompts"]
        assert prompts["by_times_wasted"] == {"2": 1}
        assert prompts["share_of_wasted_tokens_more_than_once"] == 1.0
        [step] = record["steps"]
        assert 2.0 <= step["wait_s"]["max"] < 2.1

    def test_the_command(self, tmp_path, cli):
        """staleness --json has a row per surviving step with its age histogram, and the
        text names the starvation ratio."""
        b = TraceBuilder(run_id="A")
        b.sealed_group("g1", {1: 10})
        b.step(0, 2, ["g1"])
        path = b.write(tmp_path / "t.jsonl")
        proc = cli("staleness", "--json", str(path))
        assert proc.returncode == 0, proc.stderr
        record = json.loads(proc.stdout)
        assert record["steps"][0]["step"] == 0 and record["steps"][0]["trained_version"] == 2
        assert record["steps"][0]["age_tokens"] == {"1": 10}
        assert record["length_bias"]["long_rollout_starvation"] is None  # nothing went stale
        text = cli("staleness", str(path)).stdout
        assert "long-rollout starvation" in text and "age   1:" in text
        # one rollout: no tenths to compare (not "no stale discards", which may be untrue)
        assert "starvation: n/a (fewer than 10 finished rollouts)" in text

    def test_no_stale_discard_at_either_end_says_so(self, tmp_path, cli):
        """Twenty rollouts, none gone stale: the ratio is n/a for that reason, in words; a
        prompt wasted once is "at most 1 time"."""
        b = long_ones_stale(trained=20)
        b.event("group.reserve", group_id="x", prompt_id=99, size=1, weight_version=0, epoch=0)
        b.event("group.discard", group_id="x", prompt_id=99, reason="error")
        text = cli("staleness", str(b.write(tmp_path / "t.jsonl"))).stdout
        assert "starvation: n/a (no stale discard in the shortest or the longest tenth)" in text
        assert "(at most 1 time," in text

    def test_the_step_table_stays_aligned_past_its_usual_width(self, tmp_path, cli):
        """A step of 10**12 and full run IDs widen their columns: the step table's header
        and rows are each as long as the others."""
        b = TraceBuilder(run_id="a-run-id-longer-than-thirty-two-characters")
        b.sealed_group("g1", {0: 10})
        b.step(1, 1, ["g1"])
        b.sealed_group("g2", {5: 10})
        b.step(10**12, 6, ["g2"])
        path = b.write(tmp_path / "t.jsonl")
        text = cli("staleness", "--full-ids", str(path)).stdout.splitlines()
        at = next(i for i, line in enumerate(text) if line.lstrip().startswith("step "))
        table = text[at : at + 3]
        assert len({len(line) for line in table}) == 1, table
        assert table[2].split()[0] == f"{10**12:,}" and table[2].endswith(b.run_id)

    def test_an_infinite_starvation_ratio_is_inf_in_json(self, tmp_path, cli):
        """Only the longest tenth gone stale: the ratio is ``"inf"`` in the JSON, as the text
        says, not ``null`` (which says nothing went stale)."""
        b = long_ones_stale(trained=19)
        path = b.write(tmp_path / "t.jsonl")
        record = json.loads(cli("staleness", "--json", str(path)).stdout)
        assert record["length_bias"]["long_rollout_starvation"] == "inf"
        assert "long-rollout starvation: inf" in cli("staleness", str(path)).stdout


def test_quantiles_are_nearest_rank():
    """p50 of 1..4 is 2, p90 is 4; a histogram gives the same as its values spelled out."""
    assert quantile([1, 2, 3, 4], 0.5) == 2 and quantile([1, 2, 3, 4], 0.9) == 4
    assert weighted_quantile({1: 1, 2: 1, 3: 1, 4: 1}, 0.5) == 2
    assert quantile([], 0.5) is None and weighted_quantile({}, 0.5) is None


@given(traces())
def test_outcomes_add_up_to_the_ledger(events):
    """On random multi-run traces, the tokens of each outcome equal the ledger's bucket of
    the same name, and all of them add up to the tokens generated."""
    record = staleness(events).record()
    ledger = analyze(events).ledger
    tokens = {o: v["tokens"] for o, v in record["length_bias"]["outcomes"].items()}
    assert tokens.pop(TRAINED, 0) == ledger["trained"]
    assert tokens.pop(PENDING, 0) == ledger["pending"]
    assert tokens.pop("refused", 0) == 0
    assert {o: n for o, n in tokens.items() if n} == ledger["wasted"]


def test_work_carried_twice_follows_the_last_group():
    """A rollout one run sealed, carried by the next run's group and by the run after's
    into a group a step trains, is trained, as in the ledger."""
    b = TraceBuilder(run_id="r1", dt=0.5)
    ids = {"prompt_id": 1, "size": 1, "weight_version": 0, "epoch": 0}
    b.event("group.reserve", group_id="A", **ids)
    attempt = {"attempt_id": "x", "group_id": "A", "prompt_id": 1, "generation_index": 0}
    b.event("attempt.dispatch", **attempt, weight_version=0)
    b.event("attempt.seal", **attempt, tokens=10)
    for run, group in (("r2", "B"), ("r3", "C")):  # each stops with its group in flight
        b.new_run(run)
        b.event("group.reserve", group_id=group, **ids)
        b.event("group.seal", group_id=group, prompt_id=1, tokens=10)
    b.step(0, trained_version=1, group_ids=["C"])
    outcomes = staleness(b.events).record()["length_bias"]["outcomes"]
    assert {o: v["tokens"] for o, v in outcomes.items()} == {TRAINED: 10}
    assert analyze(b.events).ledger["trained"] == 10


@given(traces())
def test_asking_for_the_result_again_gives_the_same(events):
    """The result is read, not consumed: a second call (as a live view would make) reports
    the same histograms, not each sealed attempt counted twice."""
    analysis = StalenessAnalysis()
    run_events(events, [analysis])
    first = analysis.result().record()
    assert analysis.result().record() == first


@st.composite
def seals_and_steps(draw: st.DrawFn) -> list[dict[str, Any]]:
    """Groups sealed (some twice) with random counts, and steps (some trained again)."""
    b = TraceBuilder(run_id="A")
    groups = [f"g{i}" for i in range(draw(st.integers(1, 8)))]
    for _ in range(draw(st.integers(1, 20))):
        if draw(st.booleans()):
            gid = draw(st.sampled_from(groups))
            counts = draw(st.dictionaries(st.integers(0, 6), st.integers(0, 50), max_size=3))
            b.event("group.seal", group_id=gid, prompt_id=1, tokens=sum(counts.values()),
                    tokens_by_version={str(v): n for v, n in counts.items()})  # fmt: skip
        else:
            step = draw(st.integers(0, 4))
            batch = draw(st.lists(st.sampled_from(groups), min_size=1, max_size=3, unique=True))
            b.step(step, draw(st.integers(0, 8)), batch)
    return b.events


@given(seals_and_steps())
def test_age_histograms_equal_a_naive_model(events):
    """Each surviving step's age histogram equals one built naively: the latest seal of each
    group, the latest train.step of each step number, ages below 0 counted as 0."""
    latest: dict[str, dict[int, int]] = {}
    steps: dict[int, dict[str, Any]] = {}
    for e in events:
        if e["event"] == "group.seal":
            latest[e["group_id"]] = {int(v): n for v, n in e["tokens_by_version"].items()}
        elif e["event"] == "train.step":
            steps[e["step"]] = e
    expected = []
    for number in sorted(steps):
        hist: dict[int, int] = {}
        for gid in steps[number]["group_ids"]:
            for version, n in latest.get(gid, {}).items():
                age = max(steps[number]["trained_version"] - version, 0)
                hist[age] = hist.get(age, 0) + n
        expected.append((number, {str(a): n for a, n in sorted(hist.items())}))
    got = [(s["step"], s["age_tokens"]) for s in staleness(events).record()["steps"]]
    assert got == expected


def test_versions_past_any_float_print_whole(tmp_path, cli):
    """Weight versions of 10**309 (valid: integers ≥ 0) give staleness and timeline output,
    not a traceback; the age prints as the whole integer."""
    big = 10**309
    b = TraceBuilder(run_id="A")
    b.sealed_group("g1", {0: 10})
    b.event("weights.sync", replaced_version=0, new_version=big)
    b.step(0, big, ["g1"])
    path = tmp_path / "t.jsonl"  # json, not orjson: it writes integers past 64 bits whole
    path.write_text("".join(json.dumps(e) + "\n" for e in b.events))
    text = cli("staleness", str(path))
    assert text.returncode == 0 and "Traceback" not in text.stderr
    assert f"{big:,}" in text.stdout
    timeline = cli("timeline", str(path), "-o", str(tmp_path / "t.json"))
    assert timeline.returncode == 0 and "Traceback" not in timeline.stderr


def test_attempts_counted_in_chunks_give_the_same_histograms(tmp_path, monkeypatch):
    """The sealed attempts are counted a few thousand groups at a time (to bound memory); any
    size of those chunks gives the same length and time histograms."""
    import otel_rollout.staleness as module
    from otel_rollout.testing import synthetic_trace

    path = synthetic_trace(tmp_path / "t.jsonl", 6000, runs=2)
    found = []
    for chunk in (1_000_000, 7, 1):
        monkeypatch.setattr(module, "_GROUPS_COUNTED", chunk)
        found.append(staleness(path).record())
    assert found[0] == found[1] == found[2]
    assert sum(o["attempts"] for o in found[0]["length_bias"]["outcomes"].values()) > 1000
