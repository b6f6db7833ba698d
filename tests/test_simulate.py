"""The simulated async GRPO run: it drives the real API and its trace is self-consistent."""

from __future__ import annotations

from collections import Counter

import pytest

from otel_rollout.batch_age import RefitCuts, batch_age_by_step, step_ages
from otel_rollout.reader import read_events
from otel_rollout.schema import problems
from otel_rollout.simulate import SimConfig, simulate

CONFIG = SimConfig(steps=12, speed=12.0, seed=7, error_rate=0.1)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    log_dir = tmp_path_factory.mktemp("sim")
    result = simulate(log_dir, CONFIG)
    return result, list(read_events(result.trace_path))


class TestSimulatedRun:
    def test_live_batch_age_equals_the_files(self, run):
        """The batch age logged live through pop_batch_age equals batch_age_by_step, exactly."""
        result, events = run
        assert len(result.live_batch_age) == CONFIG.steps
        assert batch_age_by_step(events) == result.live_batch_age

    def test_every_line_is_valid(self, run):
        """Every event the simulator emits passes the schema."""
        _, events = run
        assert [(e["event"], problems(e)) for e in events if problems(e)] == []

    def test_trained_groups_recompute_from_calls_and_cuts(self, run):
        """Replaying weights.sync cuts and attempt.seal calls through RefitCuts gives each
        trained group exactly the tokens_by_version its seal logged."""
        _, events = run
        cuts = RefitCuts()
        calls: dict[str, list] = {}
        sealed: dict[str, dict[int, int]] = {}
        for e in events:
            if e["event"] == "weights.sync":
                cuts.record(e["replaced_version"], e["new_version"], e["cuts"])
            elif e["event"] == "attempt.seal":
                calls.setdefault(e["group_id"], []).extend(tuple(c) for c in e["calls"])
            elif e["event"] == "group.seal":
                sealed[e["group_id"]] = {int(v): n for v, n in e["tokens_by_version"].items()}
        trained = [g for e in events if e["event"] == "train.step" for g in e["group_ids"]]
        assert trained
        for group_id in trained:
            assert cuts.tokens_by_version(calls[group_id]) == sealed[group_id]

    def test_staleness_limit_holds_for_every_trained_token(self, run):
        """No trained token is older than max_lag policy updates."""
        _, events = run
        for row in step_ages(events):
            assert max(row.tokens_by_age, default=0) <= CONFIG.max_lag

    def test_refits_cut_running_calls(self, run):
        """The engine keeps generating across refits: some refits pause running calls."""
        _, events = run
        syncs = [e for e in events if e["event"] == "weights.sync"]
        assert len(syncs) == CONFIG.steps and any(s["cuts"] for s in syncs)

    def test_every_attempt_and_group_ends_once(self, run):
        """Each dispatched attempt ends in one seal or abandon; each group in a seal or discard."""
        _, events = run
        ends = Counter(
            e["attempt_id"] for e in events if e["event"] in ("attempt.seal", "attempt.abandon")
        )
        dispatched = [e["attempt_id"] for e in events if e["event"] == "attempt.dispatch"]
        assert all(ends[a] == 1 for a in dispatched) and set(ends) == set(dispatched)
        groups = {e["group_id"] for e in events if e["event"] == "group.reserve"}
        closed = {e["group_id"] for e in events if e["event"] in ("group.seal", "group.discard")}
        assert groups == closed

    def test_outcomes_the_demo_should_show(self, run):
        """A run shows errors retried, stale discards and checkpoints, not only the happy path."""
        _, events = run
        reasons = Counter(e.get("reason") for e in events if e["event"] == "attempt.abandon")
        kinds = Counter(e["event"] for e in events)
        assert reasons["error"] > 0 and kinds["checkpoint.publish"] == 2
        assert kinds["group.discard"] > 0


class TestSimulateCommand:
    def test_runs_and_checks_itself(self, cli, tmp_path):
        """The command writes a trace, prints the table and confirms live equals file."""
        proc = cli("simulate", "--log-dir", str(tmp_path), "--steps", "5", "--speed", "15")
        assert proc.returncode == 0, proc.stderr
        assert "live batch age equals the file's for all 5 steps this run trained" in proc.stdout
        assert (tmp_path / "rollout_trace.jsonl").exists()

    def test_refuses_to_append_to_an_existing_trace(self, cli, tmp_path):
        """An existing trace is not silently mixed with a new run: exit 2 unless --overwrite."""
        (tmp_path / "rollout_trace.jsonl").write_text("{}\n")
        proc = cli("simulate", "--log-dir", str(tmp_path), "--steps", "2", "--speed", "15")
        assert proc.returncode == 2 and "--overwrite" in proc.stderr
        proc = cli(
            "simulate", "--log-dir", str(tmp_path), "--steps", "2", "--speed", "15", "--overwrite"
        )
        assert proc.returncode == 0, proc.stderr

    def test_bad_parameters_are_usage_errors(self, cli, tmp_path):
        """Out-of-range parameters are refused with exit 2."""
        for bad in (
            ["--steps", "0"],
            ["--speed", "-1"],
            ["--error-rate", "1.5"],
            ["--max-lag", "-1"],
        ):
            proc = cli("simulate", "--log-dir", str(tmp_path), *bad)
            assert proc.returncode == 2 and "Traceback" not in proc.stderr

    def test_a_batch_larger_than_admission_is_refused(self, cli, tmp_path):
        """A batch that admission can never fill is a usage error, not a hang."""
        proc = cli("simulate", "--log-dir", str(tmp_path), "--groups-per-step", "20")
        assert proc.returncode == 2 and "can never be met" in proc.stderr
