"""A real Prometheus server scrapes the metrics endpoint of a simulated run.

The server is Debian's ``prometheus`` package (``.ci/run`` installs it), started
here on 127.0.0.1 with a 1 s scrape interval.  Under CI a missing binary fails.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request

import pytest
from conftest import metrics_env, simulate_command

from otel_rollout.batch_age import batch_age_by_step
from otel_rollout.reader import read_events

INSTALL = "apt-get install -y --no-install-recommends prometheus"


def simulate(log_dir, port: int, *args: str) -> subprocess.CompletedProcess[str]:
    """``otel-rollout simulate`` serving Prometheus metrics on 127.0.0.1:``port``."""
    return subprocess.run(
        simulate_command(log_dir, *args),
        env=metrics_env(port),
        capture_output=True,
        text=True,
        timeout=120,
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


@pytest.fixture
def prometheus(tmp_path):
    """A Prometheus server scraping 127.0.0.1:<target> every second; yields (query, target)."""
    binary = shutil.which("prometheus")
    if binary is None:
        message = f"the prometheus server is not installed ({INSTALL})"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    target, web = free_port(), free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        "scrape_configs:\n  - job_name: otel-rollout\n"
        f"    static_configs:\n      - targets: ['127.0.0.1:{target}']\n"
    )
    server = subprocess.Popen(
        [
            binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{web}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{web}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"{base}/-/ready", timeout=1)
                break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise RuntimeError("prometheus did not become ready") from None
                time.sleep(0.2)

        # Discovery hands targets to the scraper at most every 5 s: wait until ours is active.
        while not get(f"{base}/api/v1/targets")["data"]["activeTargets"]:
            if time.monotonic() > deadline:
                raise RuntimeError("prometheus never activated the scrape target")
            time.sleep(0.2)

        def query(expr: str) -> list:
            url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
            return get(url)["data"]["result"]

        yield query, target
    finally:
        server.terminate()
        server.wait(10)


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
