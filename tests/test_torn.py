"""A writer killed mid-line, and the run that resumes into its file.

The tear is real: a writer process emitting multi-megabyte events is killed
with SIGKILL until one write is caught half-way.  The resumed run must end the
fragment before writing, so its own run.start is whole; readers and
``validate`` then call the fragment a torn line of the killed run, a warning.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import orjson
import pytest

from otel_rollout import trace
from otel_rollout.reader import EventReader, read_events

FRAGMENT = b'{"t":1,"run_id":"x","event":"attempt.se'

# Events of 3 MB (under OTEL_ROLLOUT_MAX_EVENT_BYTES), one write each: the kernel copies
# such a write page by page and stops at a pending SIGKILL, so a kill can land inside it.
BIG_WRITER = textwrap.dedent(
    """
    import sys
    from otel_rollout import RolloutTrace
    tr = RolloutTrace(sys.argv[1], capacity=4)
    payload = "w" * (3 << 20)
    print(tr.run_id, flush=True)
    i = 0
    while True:
        tr.emit("attempt.dispatch", attempt_id=f"a{i}", group_id="g", prompt_id=i,
                generation_index=0, weight_version=0, blob=payload)
        tr.flush()
        i += 1
    """
)


def validate(path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "otel_rollout", "validate", str(path), *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def kill_mid_write(path: Path, attempts: int = 60) -> str:
    """Kill writers of ``path`` with SIGKILL until one leaves a torn last line; its run_id."""
    for attempt in range(attempts):
        path.unlink(missing_ok=True)
        child = subprocess.Popen(
            [sys.executable, "-c", BIG_WRITER, str(path)], stdout=subprocess.PIPE, text=True
        )
        assert child.stdout is not None
        run_id = child.stdout.readline().strip()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and (not path.exists() or path.stat().st_size < 4 << 20):
            time.sleep(0.001)
        time.sleep(0.0007 * (attempt % 17))  # a different phase of the writes each time
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
        child.stdout.close()
        data = path.read_bytes()
        if data and not data.endswith(b"\n"):
            return run_id
    pytest.fail(f"no SIGKILL of {attempts} tore a line")


def lines(path: Path) -> list[bytes]:
    return path.read_bytes().split(b"\n")


class TestResumeAfterATear:
    def test_resume_ends_the_fragment_so_run_start_is_whole(self, tmp_path):
        """The hand-made fragment after a closed trace stays one line; the resumed run's
        run.start is the next line, whole, and the reader skips only the fragment."""
        p = tmp_path / "rollout_trace.jsonl"
        first = trace.RolloutTrace(p)
        first.close()
        with open(p, "ab") as f:
            f.write(FRAGMENT)
        second = trace.RolloutTrace(p)
        second.close()
        raw = lines(p)
        assert raw[1] == FRAGMENT and raw[-1] == b""
        start = orjson.loads(raw[2])
        assert start["event"] == "run.start" and start["run_id"] == second.run_id
        reader = EventReader(p, on_skip=lambda *a: None)
        runs = [e["run_id"] for e in reader if e["event"] == "run.start"]
        assert runs == [first.run_id, second.run_id] and reader.skipped == 1

    def test_readers_warn_naming_the_line_and_the_killed_run(self, tmp_path, caplog):
        """read_events skips the fragment with a warning: its line, a torn line, run x."""
        p = tmp_path / "rollout_trace.jsonl"
        trace.RolloutTrace(p).close()
        with open(p, "ab") as f:
            f.write(FRAGMENT)
        trace.RolloutTrace(p).close()
        with caplog.at_level(logging.WARNING, logger="otel_rollout"):
            events = list(read_events(p))
        assert len(events) == 2
        assert f"{p}:2: torn line: the writer of run x was killed mid-line" in caplog.text

    def test_validate_exits_0_with_a_warning_and_strict_makes_it_an_error(self, tmp_path):
        """validate: the torn line is a warning naming the killed run and the run that
        resumed after it (exit 0); with --strict it is an error (exit 1)."""
        p = tmp_path / "rollout_trace.jsonl"
        trace.RolloutTrace(p).close()
        with open(p, "ab") as f:
            f.write(FRAGMENT)
        resumed = trace.RolloutTrace(p)
        resumed.close()
        proc = validate(p)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert f"{p}:2: warning: torn line: the writer of run x was killed mid-line" in proc.stdout
        assert f"run {resumed.run_id} (line 3) resumed after it" in proc.stdout
        assert "0 errors, 1 warning" in proc.stderr
        strict = validate(p, "--strict")
        assert strict.returncode == 1 and f"{p}:2: error: torn line" in strict.stdout

    def test_a_cut_line_the_same_run_goes_on_after_is_still_an_error(self, tmp_path):
        """Only a new run's start after it makes a cut line a killed writer's tear."""
        p = tmp_path / "rollout_trace.jsonl"
        tr = trace.RolloutTrace(p)
        tr.close()
        good = (
            b'{"t":2,"run_id":"%s","event":"checkpoint.publish","step":1,"weight_version":1}\n'
            % tr.run_id.encode()
        )
        with open(p, "ab") as f:
            f.write(FRAGMENT + b"\n" + good)
        proc = validate(p)
        assert proc.returncode == 1
        said = f"{p}:2: error: a line cut short, though no new run starts after it (not a killed"
        assert said in proc.stdout and "was killed mid-line" not in proc.stdout

    def test_a_real_sigkill_tear_then_resume_then_validate(self, tmp_path):
        """A writer of 3 MB events killed mid-write leaves a torn last line; a resumed run
        ends it, writes whole lines after it, and validate exits 0 naming the killed run."""
        p = tmp_path / "rollout_trace.jsonl"
        killed = kill_mid_write(p)
        torn_at = len(lines(p))  # the fragment's line number
        before = EventReader(p, on_skip=lambda *a: None)
        assert len(list(before)) >= 1 and before.skipped == 1
        resumed = trace.RolloutTrace(p)
        resumed.emit("checkpoint.restore", step=0, weight_version=0)
        resumed.close()
        raw = lines(p)
        start = orjson.loads(raw[torn_at])
        assert start["event"] == "run.start" and start["run_id"] == resumed.run_id
        assert orjson.loads(raw[torn_at + 1])["event"] == "checkpoint.restore"
        proc = validate(p)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr
        torn = f"{p}:{torn_at}: warning: torn line: the writer of run {killed} was killed"
        assert torn in proc.stdout
        assert f"run {resumed.run_id} (line {torn_at + 1}) resumed after it" in proc.stdout
        assert "0 errors, 1 warning" in proc.stderr
