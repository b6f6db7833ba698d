"""Shared fixtures (running the real command) and the hypothesis profiles."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

# Timing on a shared 2-core VM is not a property of the code: no deadlines, no
# too_slow health check.  CI replays a fixed set of examples so that a landing
# never depends on the draw; locally every run explores new ones.
_relaxed = {"deadline": None, "suppress_health_check": [HealthCheck.too_slow]}
settings.register_profile("dev", **_relaxed)
settings.register_profile("ci", derandomize=True, **_relaxed)
settings.load_profile("ci" if os.environ.get("CI") == "true" else "dev")

# Export sidecars that tests start leave a second after their run, not thirty.
os.environ.setdefault("OTEL_ROLLOUT_SIDECAR_LINGER", "1")


@pytest.fixture(scope="session")
def demo_trace(tmp_path_factory) -> Path:
    """The demo's trace (24 steps, two kills and restores), made once a session."""
    tmp = tmp_path_factory.mktemp("demo")
    proc = subprocess.run(
        [sys.executable, "-m", "otel_rollout", "demo", "--log-dir", str(tmp / "run"), "--quiet",
         "--speed", "1000"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    return tmp / "run" / "rollout_trace.jsonl"


@pytest.fixture
def cli() -> Callable[..., subprocess.CompletedProcess[str]]:
    """Run ``otel-rollout ARGS`` as a user would; returns the finished process."""

    def run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "otel_rollout", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    return run


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without OTEL_* settings, plus ``extra``; an export sidecar started
    under it lingers one second, not thirty, after its run (tests start many)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    return env | {"OTEL_ROLLOUT_SIDECAR_LINGER": "1"} | extra


def metrics_env(port: int) -> dict[str, str]:
    """This environment without OTEL_* settings, serving Prometheus metrics on ``port``."""
    return clean_env(OTEL_METRICS_EXPORTER="prometheus", OTEL_EXPORTER_PROMETHEUS_PORT=str(port))


def simulate_command(log_dir, *args: str) -> list[str]:
    """The command line of a quiet ``otel-rollout simulate`` into ``log_dir``."""
    command = [sys.executable, "-m", "otel_rollout", "simulate", "--log-dir", str(log_dir)]
    return [*command, "--quiet", *args]


def start_simulation(log_dir, port: int, *args: str) -> subprocess.Popen[bytes]:
    """``otel-rollout simulate`` in the background, serving metrics on 127.0.0.1:``port``."""
    return subprocess.Popen(
        simulate_command(log_dir, *args),
        env=metrics_env(port),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


INSTALL = "apt-get install -y --no-install-recommends prometheus"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


def installed(name: str) -> str:
    """The path of a Prometheus tool; a skip (a failure under CI) when it is not installed."""
    path = shutil.which(name)
    if path is None:
        message = f"{name} is not installed ({INSTALL})"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    return path


@contextlib.contextmanager
def running_prometheus(tmp_path, extra_config: str = "") -> Iterator[tuple[str, int]]:
    """A real Prometheus scraping 127.0.0.1:<target> and evaluating rules every second, ready
    and with its target active; yields (its base URL, the target port)."""
    binary = installed("prometheus")
    target, web = free_port(), free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        + extra_config
        + "scrape_configs:\n  - job_name: otel-rollout\n"
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
        yield base, target
    finally:
        server.terminate()
        server.wait(10)


@pytest.fixture
def prometheus(tmp_path):
    """A Prometheus server scraping 127.0.0.1:<target> every second; yields (query, target)."""
    with running_prometheus(tmp_path) as (base, target):

        def query(expr: str) -> list:
            url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
            return get(url)["data"]["result"]

        yield query, target


@pytest.fixture(autouse=True)
def fresh_setting_warnings():
    """Each test sees its malformed settings warned of (a process warns of each once)."""
    from otel_rollout import config

    config._WARNED.clear()


class SlowExporter:
    """An exporter of the user's that takes ``seconds`` over every batch (on the writer's
    thread, as the pipeline calls it)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def export(self, events: object) -> int:
        time.sleep(self.seconds)
        return 0

    def shutdown(self) -> None:
        pass

