"""Kill and resume for real: the simulator under SIGKILL, --resume, and the demo."""

from __future__ import annotations

import itertools

import orjson
import pytest

from otel_rollout import _blocks as blocks_module
from otel_rollout.batch_age import batch_age_by_step
from otel_rollout.cost import analyze, analyze_file
from otel_rollout.reader import read_events
from otel_rollout.schema import problems

FAST = ["--steps", "14", "--speed", "2", "--quiet"]


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """One demo run: killed after steps 5 and 10, resumed twice, then its cost report."""
    import subprocess
    import sys

    log_dir = tmp_path_factory.mktemp("demo")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "otel_rollout",
            "demo",
            "--log-dir",
            str(log_dir),
            *FAST,
            "--kill-at",
            "5,10",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    events = list(read_events(log_dir / "rollout_trace.jsonl"))
    return proc, events, log_dir


class TestKillAndResume:
    def test_three_runs_each_restoring_the_last(self, demo):
        """Two real kills: three runs in one file, each restore naming the run before it."""
        proc, events, _ = demo
        runs = [e["run_id"] for e in events if e["event"] == "run.start"]
        restores = [e for e in events if e["event"] == "checkpoint.restore"]
        assert len(runs) == 3 and len(set(runs)) == 3
        assert [r["from_run_id"] for r in restores] == runs[:2]
        assert [r["run_id"] for r in restores] == runs[1:]
        assert proc.stderr.count("SIGKILL") == 2

    def test_every_line_is_valid_but_perhaps_a_torn_one(self, demo):
        """The file of a killed and resumed run validates."""
        _, events, _ = demo
        assert [problems(e) for e in events if problems(e)] == []

    def test_partial_attempts_are_resumed_with_their_tokens(self, demo):
        """A resumed run continues partial attempts from the snapshot, with their tokens."""
        _, events, _ = demo
        resumed = [e for e in events if e["event"] == "attempt.resume"]
        assert resumed and all(e["resumed_tokens"] > 0 for e in resumed)

    def test_steps_after_the_checkpoint_are_trained_again(self, demo):
        """A kill between checkpoints makes the next run train some steps a second time."""
        _, events, _ = demo
        steps = [e["step"] for e in events if e["event"] == "train.step"]
        assert len(steps) > len(set(steps)) and set(steps) == set(range(14))

    def test_batch_age_is_defined_for_every_step_after_resumes(self, demo):
        """Every step has a batch age from the file, and the final run's live values match."""
        proc, events, _ = demo
        assert set(batch_age_by_step(events)) == set(range(14))
        assert "live batch age equals the file's" in proc.stdout


def naive_fates(events: list[dict]) -> list[tuple[int, int]]:
    """A naive model of what cost reports: for each stop, how many of the rollouts running
    at it the next run resumed from the snapshot first, and how many it dispatched anew.
    (Which ones depends on where the real kill landed; the counts must agree with it.)"""
    runs: dict[str, list[dict]] = {}
    for e in events:
        runs.setdefault(e["run_id"], []).append(e)
    order = list(runs)
    counts = []
    for old, new in itertools.pairwise(order):
        running: dict[str, tuple] = {}
        for e in runs[old]:
            if e["event"] in ("attempt.dispatch", "attempt.resume"):
                running[e["attempt_id"]] = (e["epoch"], e["prompt_id"], e["generation_index"])
            elif e["event"] in ("attempt.seal", "attempt.refuse", "attempt.abandon"):
                running.pop(e["attempt_id"], None)
        first: dict[tuple, str] = {}
        for e in runs[new]:
            if e["event"] in ("attempt.dispatch", "attempt.resume"):
                key = (e["epoch"], e["prompt_id"], e["generation_index"])
                first.setdefault(key, e["event"])
        came_back = [first.get(key) for key in set(running.values())]
        counts.append((came_back.count("attempt.resume"), came_back.count("attempt.dispatch")))
    return counts


class TestCostOfTheDemo:
    def test_cost_report_describes_both_stops(self, demo, cli):
        """cost --json: two boundaries with downtime, the restored checkpoints and fates."""
        _, events, log_dir = demo
        proc = cli("cost", "--json", str(log_dir / "rollout_trace.jsonl"))
        assert proc.returncode == 0, proc.stderr
        report = orjson.loads(proc.stdout)
        first, second = report["boundaries"]
        restores = [e for e in events if e["event"] == "checkpoint.restore"]
        for boundary, restore in zip((first, second), restores, strict=True):
            assert boundary["downtime_s"] > 0
            assert boundary["restored_checkpoint"]["step"] == restore["step"]
            fates = boundary["resumed"] + boundary["redispatched"] + boundary["never_ran_again"]
            assert fates == boundary["rollouts_interrupted"] == boundary["attempts_in_flight"] > 0
            sealed = (
                "at_risk_kept",
                "at_risk_resumed",
                "at_risk_redispatched",
                "at_risk_never_ran_again",
            )
            assert sum(boundary[k] for k in sealed) == boundary["rollouts_at_risk"]
            assert boundary["catch_up_s"] is not None
        assert [(b["resumed"], b["redispatched"]) for b in report["boundaries"]] == naive_fates(
            events
        )
        assert second["steps_retrained"] >= 1
        summary = report["summary"]
        assert 0 < summary["tokens_trained"] < summary["tokens_generated"]

    @pytest.mark.parametrize("block", [97, 1 << 12, 1 << 17])
    def test_the_fast_reading_path_gives_the_same_report(self, demo, monkeypatch, block):
        """Typed blocks (msgspec) and dicts line by line give the same report, whatever the
        block size."""
        _, _, log_dir = demo
        path = log_dir / "rollout_trace.jsonl"
        monkeypatch.setattr(blocks_module, "_CHUNK", block)
        fast = analyze_file(path)
        assert fast.report() == analyze(read_events(path)).report()
        assert fast.boundaries and fast.tokens_generated > 0

    def test_demo_prints_the_cost_report(self, demo):
        """The demo ends with the report a newcomer reads."""
        proc, _, _ = demo
        assert "What the stops cost" in proc.stdout and "stop 2" in proc.stdout
        assert "of those: kept and trained as they were" in proc.stdout


def test_resume_refuses_what_it_cannot_resume(tmp_path, demo_trace, cli):
    """--resume with no log, or of a run that trained every step, is one line, exit 2,
    and leaves the log as it was (it used to start fresh, or train the last steps again
    and make cost report a stop that never happened)."""
    proc = cli("simulate", "--log-dir", str(tmp_path / "new"), "--resume", "--steps", "3")
    assert proc.returncode == 2 and "nothing to resume" in proc.stderr
    assert not (tmp_path / "new" / "rollout_trace.jsonl").exists()
    before = demo_trace.read_bytes()
    proc = cli("simulate", "--log-dir", str(demo_trace.parent), "--resume", "--steps", "24")
    assert proc.returncode == 2 and "trained all 24 steps (its last is step 23)" in proc.stderr
    assert demo_trace.read_bytes() == before


def test_resume_without_the_checkpoints_the_log_published_is_refused(tmp_path, demo_trace, cli):
    """A log whose checkpoints are gone (copied without them) is not resumed from step 0
    without a word: --resume names the last checkpoint the log published, exit 2."""
    (tmp_path / "rollout_trace.jsonl").write_bytes(demo_trace.read_bytes())
    proc = cli("simulate", "--log-dir", str(tmp_path), "--resume", "--steps", "26")
    assert proc.returncode == 2 and "published checkpoints (the last at step" in proc.stderr
    assert (tmp_path / "rollout_trace.jsonl").read_bytes() == demo_trace.read_bytes()
