"""The sidecar renices its own session's scheduling group, never the one it was run from."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import clean_env

from otel_rollout import otel
from otel_rollout.sidecar._control import encode_settings


@pytest.mark.skipif(not Path("/proc/self/autogroup").exists(), reason="no autogroups")
def test_run_by_hand_it_leaves_the_shells_session_alone(tmp_path) -> None:
    """Run by hand from a shell (here a shell leading a session of its own, so that this
    test's session is never touched), the sidecar leaves the shell's autogroup nice value."""
    log = tmp_path / "log.jsonl"
    log.touch()
    sidecar = [sys.executable, "-m", "otel_rollout.sidecar", str(log), "--linger", "0",
               "--settings", encode_settings(otel.settings())]  # fmt: skip
    shell = 'cat /proc/self/autogroup; "$@" >/dev/null 2>&1; cat /proc/self/autogroup'
    out = subprocess.run(
        ["sh", "-c", shell, "sh", *sidecar],
        start_new_session=True,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.splitlines()
    assert len(out) == 2 and out[0] == out[1], out
