"""The benchmark script keeps working (it is run for figures, never timed here)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).parent.parent / "bench" / "run.py"


class TestBenchScript:
    def test_quick_run_prints_every_row(self, tmp_path):
        """A smoke run prints the full table with the yardstick beside otel-rollout."""
        out = tmp_path / "figures.json"
        proc = subprocess.run(
            [sys.executable, str(BENCH), "--quick", "--lines", "3000", "--json", str(out)],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert proc.returncode == 0, proc.stderr
        for row in (
            "emit, caller ns/event",
            "drain, events/s",
            "p99 ms @ 10,000/s",
            "batch age per step, lines/s",
            "peak memory",
        ):
            assert row in proc.stdout
        assert out.exists()
