"""The benchmark script keeps working (it is run for figures, never timed here)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).parent.parent / "bench" / "run.py"
FAULTS = BENCH.with_name("faults.py")


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
            "| events/s | JSONL only | in-process export | sidecar export |",
            "a span for every attempt in the file after",
            "| the log synced to disk | drain, events/s |",
        ):
            assert row in proc.stdout
        assert out.exists()

    def test_span_first_rows(self, tmp_path):
        """--only spanfirst prints span-first beside emit and the yardstick, and the kill rows
        with a file that really lost something under span-first."""
        out = tmp_path / "figures.json"
        proc = subprocess.run(
            [sys.executable, str(BENCH), "--quick", "--only", "spanfirst", "--json", str(out)],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert proc.returncode == 0, proc.stderr
        assert "| measure | yardstick | emit | span-first |" in proc.stdout
        assert "kill -9 at 5,000 events/s" in proc.stdout
        figures = json.loads(out.read_text())["spanfirst"]
        assert set(figures["emit_ns"]) == {"yardstick", "emit", "span-first"}
        assert figures["kill_span-first"]["lost_pct_median"] > 0
        assert figures["exporter_ns_per_span"] > 0
        assert "the exporter's thread: ns per span" in proc.stdout


class TestFaultsScript:
    def test_quick_run_accounts_for_every_event(self):
        """A smoke run of the fault table: every fault staged here balances exactly."""
        proc = subprocess.run(
            [sys.executable, str(FAULTS), "--quick"],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert proc.returncode == 0, proc.stderr
        rows = [
            line for line in proc.stdout.splitlines() if line.startswith("| ") and "---" not in line
        ]
        faults = rows[1:]
        assert len(faults) == 10
        for row in faults:
            assert "✓ exact" in row or "skipped:" in row, row
        slow = next(row for row in faults if "slow disk" in row)
        assert slow.split("|")[4].strip() != "0"  # the overload really dropped events


class TestInstructionsScript:
    def test_counts_each_command_beside_the_yardstick(self):
        """A smoke run under callgrind prints the yardstick and the command asked for, each
        with a whole-process count larger than its per-line count times the lines."""
        script = str(BENCH.with_name("instructions.py"))
        proc = subprocess.run(
            [sys.executable, script, "--lines", "1500", "--only", "batch-age"],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert proc.returncode == 0, proc.stderr
        rows = [line.split("|") for line in proc.stdout.splitlines() if line.startswith("| ")]
        named = {r[1].strip(): r for r in rows[1:]}
        assert set(named) == {"yardstick: orjson every line", "otel-rollout batch-age --json"}
        lines = int(proc.stdout.split("-line")[0].rsplit(" ", 1)[1].replace(",", ""))
        for r in named.values():
            whole, per_line = float(r[2].replace(",", "")) * 1e6, float(r[4].replace(",", ""))
            assert 0 < per_line * lines < whole
