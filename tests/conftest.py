"""Shared fixtures (running the real command) and the hypothesis profiles."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, settings

# Timing on a shared 2-core VM is not a property of the code: no deadlines, no
# too_slow health check.  CI replays a fixed set of examples so that a landing
# never depends on the draw; locally every run explores new ones.
_relaxed = {"deadline": None, "suppress_health_check": [HealthCheck.too_slow]}
settings.register_profile("dev", **_relaxed)
settings.register_profile("ci", derandomize=True, **_relaxed)
settings.load_profile("ci" if os.environ.get("CI") == "true" else "dev")


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


def metrics_env(port: int) -> dict[str, str]:
    """This environment without OTEL_* settings, serving Prometheus metrics on ``port``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    return env | {"OTEL_METRICS_EXPORTER": "prometheus", "OTEL_EXPORTER_PROMETHEUS_PORT": str(port)}


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
