"""The stop/restore cost analysis on traces whose answers are known by construction."""

from __future__ import annotations

import pytest

from otel_rollout.cost import LOST_AT_STOP, analyze
from otel_rollout.testing import TraceBuilder


def attempt(b: TraceBuilder, kind: str, aid: str, gid: str, prompt: int, gen: int, **f) -> None:
    b.event(kind, attempt_id=aid, group_id=gid, prompt_id=prompt, generation_index=gen, **f)


@pytest.fixture
def two_runs():
    """Run A trains step 0, checkpoints, then dies with one attempt running and one sealed in
    an unfinished group; run B restores, resumes the running one and trains step 1."""
    b = TraceBuilder(run_id="A")
    b.event("group.reserve", group_id="g0", prompt_id=0, size=2, weight_version=0, epoch=0)
    for gen in (0, 1):
        attempt(b, "attempt.dispatch", f"a0{gen}", "g0", 0, gen, weight_version=0, epoch=0)
        attempt(b, "attempt.seal", f"a0{gen}", "g0", 0, gen, tokens=10)
    b.event("group.seal", group_id="g0", prompt_id=0, tokens=20, tokens_by_version={"0": 20})
    b.step(0, 1, ["g0"], batch_age=1.0)
    b.event("checkpoint.publish", step=0, weight_version=1)
    b.event("group.reserve", group_id="g1", prompt_id=1, size=2, weight_version=1, epoch=0)
    attempt(b, "attempt.dispatch", "a10", "g1", 1, 0, weight_version=1, epoch=0)
    attempt(b, "attempt.seal", "a10", "g1", 1, 0, tokens=100)
    attempt(b, "attempt.dispatch", "a11", "g1", 1, 1, weight_version=1, epoch=0)
    stopped = b.t
    b.new_run("B", gap=5.0)
    resumed_at = b.t
    b.event("checkpoint.restore", step=0, weight_version=1, from_run_id="A")
    restore_t = b.t
    b.event("group.reserve", group_id="h1", prompt_id=1, size=2, weight_version=1, epoch=0)
    attempt(b, "attempt.resume", "b11", "h1", 1, 1, weight_version=1, resumed_tokens=30)
    attempt(b, "attempt.seal", "b11", "h1", 1, 1, tokens=80)
    b.event("group.seal", group_id="h1", prompt_id=1, tokens=180, tokens_by_version={"1": 180})
    b.step(1, 2, ["h1"], batch_age=1.0)
    return b.events, stopped, resumed_at, restore_t


class TestBoundary:
    def test_known_answers(self, two_runs):
        """Every reported number of the one boundary equals its value by construction."""
        events, stopped, resumed_at, restore_t = two_runs
        report = analyze(events)
        assert report.runs == ["A", "B"]
        (b,) = report.boundaries
        assert (b.old_run, b.new_run) == ("A", "B")
        assert b.downtime_s == pytest.approx(resumed_at - stopped)
        assert b.old_last_step == 0 and b.old_last_checkpoint == {"step": 0, "weight_version": 1}
        assert b.restored_checkpoint["from_run_id"] == "A"
        assert (b.attempts_in_flight, b.groups_in_flight, b.sealed_groups_untrained) == (1, 1, 0)
        assert b.tokens_at_risk == 100
        assert (b.resumed, b.redispatched, b.never_ran_again) == (1, 0, 0)
        assert b.rollouts_at_risk == 1  # a10, sealed in the group the stop left untrained
        assert (b.at_risk_kept, b.at_risk_resumed, b.at_risk_redispatched) == (0, 0, 0)
        assert b.at_risk_never_ran_again == 1
        assert (b.tokens_recovered, b.tokens_regenerated, b.steps_retrained) == (30, 0, 0)
        assert b.catch_up_s == pytest.approx(restore_t - resumed_at)
        assert b.batch_age_before == b.batch_age_after == 1.0

    def test_summary(self, two_runs):
        """Generated tokens count each token once (resumed ones at their seal); a10's 100,
        sealed into a group the stop left in flight, were carried into h1 (its seal of 180
        counts them beside b11's 80) and trained with it, so nothing was lost."""
        report = analyze(two_runs[0])
        assert report.tokens_generated == 10 + 10 + 100 + 80
        assert report.tokens_trained == 10 + 10 + 100 + 80
        assert report.waste == {} and report.tokens_pending == 0
        assert report.steps == 2

    def test_work_carried_into_a_new_group_is_lost_when_the_seal_does_not_add_up(self, two_runs):
        """h1's seal naming 170 tokens (not its own 80 plus a10's 100) explains nothing: a10's
        100 stay with g1, lost at the stop."""
        events = [
            {**e, "tokens": 170, "tokens_by_version": {"1": 170}}
            if e["event"] == "group.seal" and e["group_id"] == "h1"
            else e
            for e in two_runs[0]
        ]
        report = analyze(events)
        assert report.tokens_trained == 10 + 10 + 80
        assert report.waste == {LOST_AT_STOP: 100}

    def test_redispatched_and_retrained(self):
        """A rollout redone from scratch counts its tokens as generated again; a step the
        new run trains again counts, and catch-up ends at the old run's last step."""
        b = TraceBuilder(run_id="A")
        b.event("group.reserve", group_id="g", prompt_id=7, size=1, weight_version=0, epoch=2)
        attempt(b, "attempt.dispatch", "a", "g", 7, 0, weight_version=0, epoch=2)
        b.step(0, 0, [])
        b.step(1, 1, [])
        b.new_run("B", gap=1.0)
        start = b.t
        b.event("group.reserve", group_id="h", prompt_id=7, size=1, weight_version=0, epoch=2)
        attempt(b, "attempt.dispatch", "x", "h", 7, 0, weight_version=0, epoch=2)
        attempt(b, "attempt.seal", "x", "h", 7, 0, tokens=40)
        b.step(1, 1, [])
        back = b.t
        (boundary,) = analyze(b.events).boundaries
        assert (boundary.redispatched, boundary.tokens_regenerated) == (1, 40)
        assert boundary.steps_retrained == 1
        assert boundary.catch_up_s == pytest.approx(back - start)

    def test_sealed_groups_the_snapshot_kept_are_trained_as_they_were(self):
        """A sealed, untrained group the new run trains under its old ID counts its rollouts
        as kept; a sealed rollout of a group that is not trained again is not run again."""
        b = TraceBuilder(run_id="A")
        for gid, prompt in (("g", 1), ("u", 2)):
            b.event("group.reserve", group_id=gid, prompt_id=prompt, size=2, weight_version=0)
            for gen in (0, 1):
                aid = f"{gid}{gen}"
                attempt(b, "attempt.dispatch", aid, gid, prompt, gen, weight_version=0, epoch=0)
                attempt(b, "attempt.seal", aid, gid, prompt, gen, tokens=10)
        b.event("group.seal", group_id="g", prompt_id=1, tokens=20, tokens_by_version={"0": 20})
        b.new_run("B", gap=1.0)
        b.step(0, 1, ["g"])
        (boundary,) = analyze(b.events).boundaries
        assert boundary.rollouts_at_risk == 4
        assert (boundary.at_risk_kept, boundary.at_risk_never_ran_again) == (2, 2)

    def test_a_single_run_has_no_boundary(self):
        """A file of one run reports no stop, only the summary."""
        b = TraceBuilder()
        b.event("group.reserve", group_id="g", prompt_id=0, size=1, weight_version=0)
        attempt(b, "attempt.seal", "a", "g", 0, 0, tokens=5)
        b.sealed_group("g", {0: 5}, prompt_id=0)
        b.step(0, 1, ["g"])
        report = analyze(b.events)
        assert report.boundaries == [] and report.tokens_trained == 5


class TestDamagedFiles:
    def test_a_torn_last_line_changes_nothing(self, two_runs, tmp_path):
        """A killed writer's half line at the end is skipped; the report is the same."""
        from otel_rollout.reader import read_events

        b = TraceBuilder()
        b.events = two_runs[0]
        path = b.write(tmp_path / "t.jsonl")
        whole = analyze(read_events(path)).report()
        with open(path, "ab") as f:
            f.write(b'{"t": 9e9, "run_id": "B", "event": "attempt.dispa')
        assert analyze(read_events(path)).report() == whole
