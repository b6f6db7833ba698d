"""Shared fixtures: running the real command in a subprocess."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable

import pytest


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
