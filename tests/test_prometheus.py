"""A real Prometheus server (the ``prometheus`` fixture) scrapes the metrics of a simulated run."""

from __future__ import annotations

import socket
import subprocess

from conftest import metrics_env, simulate_command

from otel_rollout.batch_age import batch_age_by_step
from otel_rollout.reader import read_events


def simulate(log_dir, port: int, *args: str) -> subprocess.CompletedProcess[str]:
    """``otel-rollout simulate`` serving Prometheus metrics on 127.0.0.1:``port``."""
    return subprocess.run(
        simulate_command(log_dir, *args),
        env=metrics_env(port),
        capture_output=True,
        text=True,
        timeout=120,
    )


class TestPrometheusScrape:
    def test_batch_age_stored_for_the_last_step_equals_the_files(self, prometheus, tmp_path):
        """While simulate runs, Prometheus scrapes it; its last batch age is the file's."""
        query, port = prometheus
        proc = simulate(tmp_path / "run", port, "--steps", "6", "--speed", "6", "--hold", "4")
        assert proc.returncode == 0, proc.stderr
        events = list(read_events(tmp_path / "run" / "rollout_trace.jsonl"))
        ages = batch_age_by_step(events)
        last_step = max(ages)
        (step,) = query("last_over_time(rollout_step[1m])")
        assert float(step["value"][1]) == last_step
        (age,) = query("last_over_time(rollout_batch_age[1m])")
        assert float(age["value"][1]) == ages[last_step]
        run_id = events[0]["run_id"]
        (info,) = query("last_over_time(target_info[1m])")
        assert info["metric"]["service_instance_id"] == run_id
        sealed = sum(e["event"] == "attempt.seal" for e in events)
        (attempts,) = query('last_over_time(rollout_attempts_total{outcome="sealed"}[1m])')
        assert float(attempts["value"][1]) == sealed
        (dropped,) = query("last_over_time(rollout_trace_dropped_total[1m])")
        assert float(dropped["value"][1]) == 0

    def test_port_taken_is_logged_and_the_run_goes_on(self, tmp_path):
        """If the metrics port is busy, the run still completes and writes its trace."""
        with socket.socket() as busy:
            busy.bind(("127.0.0.1", 0))
            busy.listen()
            proc = simulate(tmp_path, busy.getsockname()[1], "--steps", "2", "--speed", "15")
        assert proc.returncode == 0, proc.stderr
        assert "cannot serve Prometheus metrics" in proc.stderr
