"""Durability against a node crash: the writer's fdatasync calls, seen by strace.

Every test runs a real writer process under ``strace -f -e trace=write,fdatasync,fsync``
and reads the system calls it made: which thread, when, on which file descriptor,
and what each write carried.
"""

from __future__ import annotations

import itertools
import os
import re
import shutil
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace")

_LINE = re.compile(r"^(\d+)\s+(\d+):(\d+):(\d+\.\d+) (?:<\.\.\. )?(\w+)(?:\(| resumed>)(.*)$")


@dataclass
class Call:
    """One system call: the thread that made it, when (seconds), its name and its text."""

    tid: int
    t: float
    name: str
    text: str

    @property
    def fd(self) -> int | None:
        match = re.match(r"(\d+)", self.text)
        return int(match.group(1)) if match else None


def traced(tmp_path: Path, code: str, env: dict[str, str]) -> tuple[int, list[Call], str]:
    """Run ``code`` (argv[1] = the log) under strace; its pid, its calls, its stdout."""
    out = tmp_path / "strace.txt"
    log = tmp_path / "rollout_trace.jsonl"
    code = "import os; print(os.getpid(), flush=True)\n" + textwrap.dedent(code)
    strace = ["strace", "-f", "-tt", "-s", "160", "-o", str(out)]
    proc = subprocess.run(
        [*strace, "-e", "trace=write,fdatasync,fsync", sys.executable, "-c", code, str(log)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **env},
    )
    assert proc.returncode == 0, proc.stderr
    calls = []
    for line in out.read_text().splitlines():
        match = _LINE.match(line)
        if match is None:
            continue
        tid, h, m, s, name, text = match.groups()
        if "unfinished" in text:  # the call's start; its "resumed" half ends it
            continue
        calls.append(Call(int(tid), int(h) * 3600 + int(m) * 60 + float(s), name, text))
    pid, _, stdout = proc.stdout.partition("\n")
    return int(pid), calls, stdout


def log_calls(calls: list[Call]) -> list[Call]:
    """The writes to the log and the syncs, in order (the log is what run.start went to)."""
    log_fd = next(c.fd for c in calls if c.name == "write" and "run.start" in c.text)
    return [c for c in calls if c.fd == log_fd and c.name in ("write", "fdatasync", "fsync")]


PACED = """
    import sys, time
    from otel_rollout import RolloutTrace
    tr = RolloutTrace(sys.argv[1])
    start = time.monotonic()
    i = 0
    while time.monotonic() - start < {seconds}:
        tr.emit("x", i=i)
        i += 1
        {checkpoint}
        time.sleep(0.005)
    tr.close()
"""


class TestSyncs:
    def test_syncs_come_at_the_interval_on_the_writer_thread(self, tmp_path):
        """With a 0.25 s interval and a steady trickle of events, fdatasync comes every
        0.25 s or a little later, from the writer thread, never from the caller's."""
        code = PACED.format(seconds=2.0, checkpoint="")
        pid, calls, _ = traced(tmp_path, code, {"OTEL_ROLLOUT_FSYNC_INTERVAL": "0.25"})
        ours = log_calls(calls)
        syncs = [c for c in ours if c.name == "fdatasync"]
        assert not [c for c in ours if c.name == "fsync"]
        assert {c.tid for c in syncs} and pid not in {c.tid for c in syncs}
        # The first sync follows run.start at once and the last is close's: the rest are timed.
        gaps = [b.t - a.t for a, b in itertools.pairwise(syncs[1:-1])]
        assert 5 <= len(syncs) <= 12, [round(g, 3) for g in gaps]
        assert all(0.24 <= g <= 0.4 for g in gaps), [round(g, 3) for g in gaps]
        writes = [c for c in ours if c.name == "write"]
        assert len(writes) > 3 * len(syncs)  # many batches share one sync
        # Nothing written waits longer than the interval (plus scheduling) for its sync.
        for write in writes:
            after = [s.t for s in syncs if s.t >= write.t]
            assert after and after[0] - write.t <= 0.4

    def test_a_checkpoint_line_is_synced_at_once(self, tmp_path):
        """Right after the write that carries a checkpoint.publish or checkpoint.restore
        line, the writer thread's next call is fdatasync, whatever the interval."""
        checkpoint = (
            "i % 40 in (20, 30) and tr.emit("
            "'checkpoint.publish' if i % 40 == 20 else 'checkpoint.restore',"
            " step=i, weight_version=i)"
        )
        code = PACED.format(seconds=1.5, checkpoint=checkpoint)
        _, calls, _ = traced(tmp_path, code, {"OTEL_ROLLOUT_FSYNC_INTERVAL": "10"})
        ours = log_calls(calls)
        marked = [i for i, c in enumerate(ours) if c.name == "write" and "checkpoint." in c.text]
        assert len(marked) >= 6
        for i in marked:
            assert ours[i + 1].name == "fdatasync", ours[i : i + 2]
            assert ours[i + 1].tid == ours[i].tid
        syncs = [c for c in ours if c.name == "fdatasync"]
        # The 10 s interval adds only the first write's and close's syncs to the checkpoints'.
        assert len(syncs) <= len(marked) + 2

    def test_interval_zero_syncs_every_batch(self, tmp_path):
        """OTEL_ROLLOUT_FSYNC_INTERVAL=0: every write to the log is followed by fdatasync."""
        code = PACED.format(seconds=0.5, checkpoint="")
        _, calls, _ = traced(tmp_path, code, {"OTEL_ROLLOUT_FSYNC_INTERVAL": "0"})
        ours = log_calls(calls)
        for a, b in itertools.pairwise(ours):
            if a.name == "write":
                assert b.name == "fdatasync"

    def test_off_never_syncs(self, tmp_path):
        """OTEL_ROLLOUT_FSYNC_INTERVAL=off: no fdatasync or fsync at all, checkpoints or not."""
        checkpoint = 'tr.emit("checkpoint.publish", step=i, weight_version=i)'
        code = PACED.format(seconds=0.5, checkpoint=checkpoint)
        _, calls, _ = traced(tmp_path, code, {"OTEL_ROLLOUT_FSYNC_INTERVAL": "off"})
        ours = log_calls(calls)
        assert [c.name for c in ours if c.name != "write"] == []

    def test_durable_flush_returns_after_the_sync(self, tmp_path):
        """flush(durable=True) returns only once the writer thread's fdatasync of the
        lines before it has finished (with automatic syncs off, the only one)."""
        code = """
            import os, sys, time
            from otel_rollout import RolloutTrace
            tr = RolloutTrace(sys.argv[1])
            for i in range(100):
                tr.emit("x", i=i)
            tr.flush(durable=True)
            os.write(1, b"flushed\\n")
            tr.emit("x", i=100)
            tr.close()
        """
        pid, calls, stdout = traced(tmp_path, code, {"OTEL_ROLLOUT_FSYNC_INTERVAL": "off"})
        assert stdout == "flushed\n"
        ours = log_calls(calls)
        syncs = [c for c in ours if c.name == "fdatasync"]
        assert len(syncs) == 1 and syncs[0].tid != pid
        flushed = next(c for c in calls if c.name == "write" and "flushed" in c.text)
        assert syncs[0].t <= flushed.t
        before = [c for c in ours if c.name == "write" and c.t < syncs[0].t]
        assert sum(c.text.count('\\"event\\":\\"x\\"') for c in before) >= 1
        written = (tmp_path / "rollout_trace.jsonl").read_bytes().splitlines()
        assert len(written) == 102
