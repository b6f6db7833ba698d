"""Durability against a node crash: the writer's fdatasync calls, seen by strace.

Every test runs a real writer process under ``strace -f -e trace=write,fdatasync,fsync``
and reads the system calls it made: which thread, when each began and ended, on which
file descriptor, and what each write carried.  Slow disks are made by strace itself
(``inject=fdatasync:delay_enter``), so the syncs really take that long.
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

# Without strace these tests are skipped, and under CI (which installs it) they fail.
pytestmark = pytest.mark.skipif(
    shutil.which("strace") is None and os.environ.get("CI") != "true", reason="needs strace"
)

_LINE = re.compile(r"^(\d+)\s+(\d+):(\d+):(\d+\.\d+) (?:<\.\.\. )?(\w+)(?:\(| resumed>)(.*)$")


@dataclass
class Call:
    """One system call: the thread that made it, when it began and ended (seconds), its name
    and its text (a call another thread's interrupted is put back together)."""

    tid: int
    t: float
    end: float
    name: str
    text: str

    @property
    def result(self) -> int:
        """What the call returned (bytes written, for a write)."""
        return int(self.text.rsplit("= ", 1)[1].split()[0])

    @property
    def fd(self) -> int | None:
        match = re.match(r"(\d+)", self.text)
        return int(match.group(1)) if match else None


def traced(
    tmp_path: Path,
    code: str,
    env: dict[str, str],
    sync_delay: float = 0.0,
    sync_error: str | None = None,
) -> tuple[int, list[Call], str]:
    """Run ``code`` (argv[1] = the log) under strace, each fdatasync held ``sync_delay``
    seconds or failing with ``sync_error`` (an errno name); its pid, calls and stdout."""
    out = tmp_path / "strace.txt"
    log = tmp_path / "rollout_trace.jsonl"
    code = "import os; print(os.getpid(), flush=True)\n" + textwrap.dedent(code)
    # Each write's whole text (-s): a batch of several lines, on a loaded machine, put its
    # checkpoint line past the 160 bytes shown before, and its sync looked uncalled for.
    strace = ["strace", "-f", "-tt", "-s", "1000000", "-o", str(out)]
    if sync_delay:
        strace += ["-e", f"inject=fdatasync:delay_enter={int(sync_delay * 1e6)}"]
    if sync_error:
        strace += ["-e", f"inject=fdatasync:error={sync_error}"]
    proc = subprocess.run(
        [*strace, "-e", "trace=write,fdatasync,fsync", sys.executable, "-c", code, str(log)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **env},
    )
    assert proc.returncode == 0, proc.stderr
    calls = []
    begun: dict[tuple[int, str], tuple[float, str]] = {}  # calls another thread interrupted
    for line in out.read_text().splitlines():
        match = _LINE.match(line)
        if match is None:
            continue
        tid, h, m, s, name, text = match.groups()
        t = int(h) * 3600 + int(m) * 60 + float(s)
        if text.endswith("<unfinished ...>"):  # the call's start; its "resumed" half ends it
            begun[int(tid), name] = (t, text.removesuffix("<unfinished ...>"))
            continue
        start, head = begun.pop((int(tid), name), (t, ""))
        calls.append(Call(int(tid), start, t, name, head + text))
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


def writer_tids(ours: list[Call]) -> set[int]:
    """The threads that wrote lines to the log (the writer)."""
    return {c.tid for c in ours if c.name == "write"}


def covering_sync(write: Call, syncs: list[Call]) -> Call | None:
    """The first sync that began after ``write`` ended (so it made that write durable)."""
    return next((s for s in syncs if s.t >= write.end), None)


class TestSyncs:
    def test_syncs_come_at_the_interval_on_a_thread_of_their_own(self, tmp_path):
        """With a 0.25 s interval and a steady trickle of events, fdatasync comes every
        0.25 s or a little later, from a thread that is neither the caller's nor the writer's."""
        code = PACED.format(seconds=2.0, checkpoint="")
        pid, calls, _ = traced(tmp_path, code, {"OTEL_ROLLOUT_FSYNC_INTERVAL": "0.25"})
        ours = log_calls(calls)
        syncs = [c for c in ours if c.name == "fdatasync"]
        assert not [c for c in ours if c.name == "fsync"]
        sync_tids = {c.tid for c in syncs}
        assert sync_tids and pid not in sync_tids and not sync_tids & writer_tids(ours)
        # The first sync follows run.start at once and the last is close's: the rest are timed.
        gaps = [b.t - a.end for a, b in itertools.pairwise(syncs[1:-1])]
        assert 5 <= len(syncs) <= 12, [round(g, 3) for g in gaps]
        assert all(0.24 <= g <= 0.4 for g in gaps), [round(g, 3) for g in gaps]
        writes = [c for c in ours if c.name == "write"]
        assert len(writes) > 3 * len(syncs)  # many batches share one sync
        # Nothing written waits longer than the interval (plus scheduling) for its sync.
        for write in writes:
            sync = covering_sync(write, syncs)
            assert sync is not None and sync.t - write.end <= 0.4

    def test_a_checkpoint_line_is_synced_at_once(self, tmp_path):
        """A sync begins right after each write that carries a checkpoint.publish or
        checkpoint.restore line, whatever the interval."""
        checkpoint = (
            "i % 40 in (20, 30) and tr.emit("
            "'checkpoint.publish' if i % 40 == 20 else 'checkpoint.restore',"
            " step=i, weight_version=i)"
        )
        code = PACED.format(seconds=1.5, checkpoint=checkpoint)
        _, calls, _ = traced(tmp_path, code, {"OTEL_ROLLOUT_FSYNC_INTERVAL": "10"})
        ours = log_calls(calls)
        marked = [c for c in ours if c.name == "write" and "checkpoint." in c.text]
        assert len(marked) >= 6
        syncs = [c for c in ours if c.name == "fdatasync"]
        for write in marked:
            sync = covering_sync(write, syncs)
            assert sync is not None and sync.t - write.end < 2.0, write  # not the 10 s interval
        # The 10 s interval adds only the first write's and close's syncs to the checkpoints'.
        assert len(syncs) <= len(marked) + 2

    def test_interval_zero_syncs_every_batch(self, tmp_path):
        """OTEL_ROLLOUT_FSYNC_INTERVAL=0: every write to the log is covered by a sync that
        begins at once (writes made during a sync share the next one)."""
        code = PACED.format(seconds=0.5, checkpoint="")
        _, calls, _ = traced(tmp_path, code, {"OTEL_ROLLOUT_FSYNC_INTERVAL": "0"})
        ours = log_calls(calls)
        syncs = [c for c in ours if c.name == "fdatasync"]
        writes = [c for c in ours if c.name == "write"]
        assert len(syncs) >= len(writes) // 2
        for write in writes:
            assert covering_sync(write, syncs) is not None, write

    def test_off_never_syncs(self, tmp_path):
        """OTEL_ROLLOUT_FSYNC_INTERVAL=off: no fdatasync or fsync at all, checkpoints or not."""
        checkpoint = 'tr.emit("checkpoint.publish", step=i, weight_version=i)'
        code = PACED.format(seconds=0.5, checkpoint=checkpoint)
        _, calls, _ = traced(tmp_path, code, {"OTEL_ROLLOUT_FSYNC_INTERVAL": "off"})
        ours = log_calls(calls)
        assert [c.name for c in ours if c.name != "write"] == []

    def test_durable_flush_returns_after_the_sync(self, tmp_path):
        """flush(durable=True) returns only once an fdatasync that began after the lines
        before it were written has finished (with automatic syncs off, the only one)."""
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
        assert syncs[0].end <= flushed.t
        written = (tmp_path / "rollout_trace.jsonl").read_bytes().splitlines(keepends=True)
        assert len(written) == 102
        # Every byte of run.start and the 100 lines was written before the sync began.
        before = [c for c in ours if c.name == "write" and c.end <= syncs[0].t]
        assert sum(c.result for c in before) == sum(map(len, written[:101]))


class TestSlowDisk:
    def test_the_writer_goes_on_writing_while_a_sync_runs(self, tmp_path):
        """With every fdatasync held 0.3 s, lines are still written during each sync (the
        writer never waits for the disk), and every line is synced by a later sync."""
        code = PACED.format(seconds=1.5, checkpoint="")
        _, calls, _ = traced(tmp_path, code, {"OTEL_ROLLOUT_FSYNC_INTERVAL": "0"}, sync_delay=0.3)
        ours = log_calls(calls)
        syncs = [c for c in ours if c.name == "fdatasync"]
        writes = [c for c in ours if c.name == "write"]
        assert len(syncs) >= 3
        during = [s for s in syncs[:-1] if any(s.t < w.t < s.end for w in writes)]
        assert len(during) >= len(syncs) - 2, "the writer waited for a sync"
        assert all(covering_sync(w, syncs) is not None for w in writes)
        # Writes go on at the caller's pace: more writes than syncs, where a writer that
        # waited for each 0.3 s sync would make one write per sync.
        assert len(writes) > 2 * len(syncs)

    @pytest.mark.parametrize("interval", ["0", "1", "10"])
    def test_a_durable_flush_after_a_checkpoint_waits_for_its_sync(self, tmp_path, interval):
        """flush(durable=True) right after a checkpoint line returns only after a sync that
        began once that line was written, even while an earlier, slow sync was running."""
        code = """
            import os, sys, time
            from otel_rollout import RolloutTrace
            tr = RolloutTrace(sys.argv[1])
            for i in range(50):
                tr.emit("x", i=i)
                time.sleep(0.004)
            tr.emit("checkpoint.publish", step=1, weight_version=1)
            tr.flush(durable=True)
            os.write(1, b"flushed\\n")
            tr.close()
        """
        _, calls, stdout = traced(
            tmp_path, code, {"OTEL_ROLLOUT_FSYNC_INTERVAL": interval}, sync_delay=0.3
        )
        assert stdout == "flushed\n"
        ours = log_calls(calls)
        marked = next(c for c in ours if c.name == "write" and "checkpoint." in c.text)
        syncs = [c for c in ours if c.name == "fdatasync"]
        sync = covering_sync(marked, syncs)
        flushed = next(c for c in calls if c.name == "write" and "flushed" in c.text)
        assert sync is not None and sync.end <= flushed.t


class TestFailures:
    def test_a_failed_sync_is_counted_and_a_durable_flush_says_so(self, tmp_path):
        """With every fdatasync failing (EIO), flush(durable=True) returns False, the
        failures are counted in trace.stats, the error is logged once, and every line is
        still written."""
        code = """
            import sys
            from otel_rollout import RolloutTrace
            tr = RolloutTrace(sys.argv[1])
            for i in range(50):
                tr.emit("x", i=i)
            ok = tr.flush(durable=True)
            again = tr.flush(durable=True)
            stats = tr.stats
            print(ok, again, stats.log_syncs, stats.log_sync_errors >= 2, flush=True)
            tr.close()
        """
        _, calls, stdout = traced(
            tmp_path, code, {"OTEL_ROLLOUT_FSYNC_INTERVAL": "off"}, sync_error="EIO"
        )
        assert stdout.split() == ["False", "False", "0", "True"]
        assert [c for c in log_calls(calls) if c.name == "fdatasync"]
        written = (tmp_path / "rollout_trace.jsonl").read_bytes().splitlines()
        assert len(written) == 51

    def test_a_forked_child_syncs_its_own_lines(self, tmp_path):
        """A child forked while the parent's syncer runs gets a syncer of its own: its
        durable flush returns True after an fdatasync made by one of its own threads, and
        its sync count starts from zero."""
        code = """
            import os, sys, time
            from otel_rollout import RolloutTrace
            tr = RolloutTrace(sys.argv[1])
            for i in range(20):
                tr.emit("x", i=i)
            tr.flush(durable=True)
            pid = os.fork()
            if pid == 0:
                tr.emit("x", child=True)
                ok = tr.flush(durable=True)
                os.write(1, f"child {os.getpid()} {ok} {tr.stats.log_syncs}\\n".encode())
                tr.close()
                os._exit(0)
            os.waitpid(pid, 0)
            tr.close()
        """
        _, calls, stdout = traced(tmp_path, code, {"OTEL_ROLLOUT_FSYNC_INTERVAL": "off"})
        _, _, ok, syncs = stdout.split()
        assert ok == "True" and syncs == "1"  # a syncer that thought the parent's thread
        # was its own would never sync: the flush would wait out its timeout and say False
        assert len([c for c in calls if c.name == "fdatasync"]) >= 2  # parent's and child's
