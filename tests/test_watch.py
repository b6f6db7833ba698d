"""``otel-rollout watch``: a real terminal (tmux) following a real run killed with SIGKILL."""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from otel_rollout.cost import analyze_file
from otel_rollout.trace import batch_age_by_step, read_events

RUN = re.compile(r"│ run\s+(\w+) \(the file's run (\d+)\)")
STEP = re.compile(r"│ step\s+([\d,]+)")
AGE = re.compile(r"│ batch age\s+(\S+)")
STOPS = re.compile(r"│ stops\s+(\d+) so far")


def command(*args: str) -> list[str]:
    return [sys.executable, "-m", "otel_rollout", *args]


def last_step(path: Path) -> tuple[int, float]:
    """The file's last step and its batch age, by the reference function."""
    ages = batch_age_by_step(read_events(path))
    step = max(ages)
    return step, ages[step]


class Tmux:
    """One tmux server of our own (its socket a file in ``where``), 160×50, running one
    command."""

    def __init__(self, cmd: list[str], where: Path) -> None:
        self.socket = str(where / "tmux.sock")
        shell = f"{shlex.join(cmd)}; echo EXIT=$?; sleep 60"
        self._tmux("new-session", "-d", "-s", "w", "-x", "160", "-y", "50", shell)

    def _tmux(self, *args: str) -> str:
        done = subprocess.run(["tmux", "-S", self.socket, *args], capture_output=True,
                              text=True, check=True, timeout=10)  # fmt: skip
        return done.stdout

    def screen(self) -> str:
        return self._tmux("capture-pane", "-p", "-t", "w")

    def keys(self, *keys: str) -> None:
        self._tmux("send-keys", "-t", "w", *keys)

    def flags(self) -> str:
        return self._tmux("display", "-p", "-t", "w", "#{alternate_on} #{cursor_flag}").strip()

    def wait_for(self, what: str | re.Pattern[str], timeout: float = 15) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = self.screen()
            if what.search(text) if isinstance(what, re.Pattern) else what in text:
                return text
            time.sleep(0.1)
        raise AssertionError(f"{what!r} never appeared on the screen:\n{self.screen()}")

    def settled_run(self, number: int, timeout: float = 30) -> tuple[str, int, int]:
        """``(run shown, its number in the file, stops)`` once the screen shows run
        ``number`` the same on two captures in a row (one taken mid-redraw can be torn)."""
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            text = self.screen()
            run, stops = RUN.search(text), STOPS.search(text)
            shown = None
            if run is not None and int(run.group(2)) == number:
                shown = (run.group(1), number, int(stops.group(1)) if stops else 0)
                if shown == last:
                    return shown
            last = shown
            time.sleep(0.1)
        raise AssertionError(f"run {number} never settled on the screen:\n{self.screen()}")

    def close(self) -> None:
        subprocess.run(["tmux", "-S", self.socket, "kill-server"], capture_output=True)


def need_tmux() -> None:
    if shutil.which("tmux") is None:
        message = "tmux is not installed (apt-get install -y tmux)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)


def test_the_screen_follows_a_run_through_sigkill_and_resume_and_quits_on_ctrl_c(tmp_path):
    """Watching a live demo (killed twice with SIGKILL, resumed each time), the screen
    shows each new run and stop as it comes and ends on the step and batch age the file
    holds; Ctrl-C exits 0 with the terminal restored."""
    need_tmux()
    log_dir = tmp_path / "run"
    path = log_dir / "rollout_trace.jsonl"
    tmux = Tmux(command("watch", str(path), "--interval", "0.2"), tmp_path)
    demo = None
    try:
        tmux.wait_for("waiting for it to appear")
        # A process group of its own: the demo and the run it is running are killed together.
        demo = subprocess.Popen(
            command("demo", "--log-dir", str(log_dir), "--speed", "2", "--steps", "14",
                    "--kill-at", "4,9", "--quiet"),
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        # Each time a run starts in the file, the demo is paused (SIGSTOP to its group) until
        # the screen shows that run: however slow the machine, no run can pass unseen.
        seen: list[tuple[str, int, int]] = []  # (run shown, its number in the file, stops)
        while demo.poll() is None:
            started = path.read_bytes().count(b'"event":"run.start"') if path.exists() else 0
            if started > len(seen):
                os.killpg(demo.pid, signal.SIGSTOP)
                try:
                    seen.append(tmux.settled_run(started))
                finally:
                    os.killpg(demo.pid, signal.SIGCONT)
            time.sleep(0.05)
        assert demo.returncode == 0
        step, age = last_step(path)
        final = tmux.wait_for(re.compile(rf"│ step\s+{step}\b.*\n.*│ batch age\s+{age:.4f}"))
        assert STOPS.search(final).group(1) == "2"  # type: ignore[union-attr]
        # Three runs, seen one after another as they started, each stop as it came.
        runs_in_file = analyze_file(path).runs
        assert [(n, stops) for _, n, stops in seen] == [(1, 0), (2, 1), (3, 2)]
        assert [run for run, _, _ in seen] == [r[:8] for r in runs_in_file]
        tmux.keys("C-c")
        after = tmux.wait_for("EXIT=0")
        assert f"step {step}, batch age {age:.4f}" in after
        assert "│" not in after  # the full-screen view is gone: the shell's screen is back
        assert tmux.flags() == "0 1"  # off the alternate screen, cursor shown
    finally:
        if demo is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(demo.pid, signal.SIGKILL)
            demo.wait()
        tmux.close()


def test_a_log_directory_is_waited_for_its_log(tmp_path, demo_trace):
    """The live view of a log directory with no log yet (a run about to start) waits for
    its rollout_trace.jsonl, as for a log file, and shows the run once it appears."""
    need_tmux()
    folder = tmp_path / "run"
    folder.mkdir()
    tmux = Tmux(command("watch", str(folder), "--interval", "0.1"), tmp_path)
    try:
        screen = tmux.wait_for("waiting for it to appear")
        # The log inside, wrapped on the screen wherever the temporary path's length puts it.
        unwrapped = re.sub(r"[\s│]", "", screen)
        assert f"{folder}/rollout_trace.jsonl:waiting".replace(" ", "") in unwrapped
        (folder / "rollout_trace.jsonl").write_bytes(demo_trace.read_bytes())
        tmux.wait_for(re.compile(r"step\s+23 "))
    finally:
        tmux.close()


def test_a_directory_or_unreadable_file_at_the_path_is_one_line_on_a_restored_screen(tmp_path):
    """The live view of a path where a directory appears while it waits, and (not as
    root) of an unreadable file: one line, exit 2, no traceback, the terminal off the
    alternate screen."""
    need_tmux()
    later = tmp_path / "later.jsonl"
    cases = [(later, "is a directory")]
    if os.geteuid() != 0:  # root reads any file
        locked = tmp_path / "locked.jsonl"
        locked.write_bytes(b"")
        locked.chmod(0)
        cases.append((locked, "permission denied"))
    for n, (path, words) in enumerate(cases):
        where = tmp_path / f"tmux{n}"
        where.mkdir()
        tmux = Tmux(command("watch", str(path), "--interval", "0.1"), where)
        try:
            if path == later:
                tmux.wait_for("waiting for it to appear")
                later.mkdir()
            after = tmux.wait_for("EXIT=")
            assert "EXIT=2" in after and f"{path}: {words}" in after, after
            assert "Traceback" not in after and "│" not in after
            assert tmux.flags() == "0 1"  # off the alternate screen, cursor shown
        finally:
            tmux.close()


def test_once_prints_the_files_last_step_and_its_cost(demo_trace):
    """``--once`` on a finished demo file prints one frame: its last step, that step's
    batch age to 4 decimals, and the stops and tokens as the cost analysis counts them."""
    path = demo_trace
    done = subprocess.run(command("watch", "--once", str(path)), capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    out = done.stdout
    step, age = last_step(path)
    assert int(STEP.search(out).group(1)) == step  # type: ignore[union-attr]
    assert AGE.search(out).group(1) == f"{age:.4f}"  # type: ignore[union-attr]
    report = analyze_file(path)
    assert int(STOPS.search(out).group(1)) == len(report.boundaries) == 2  # type: ignore[union-attr]
    assert f"tokens {report.tokens_generated:,} generated" in out
    assert f"{report.tokens_trained:,} trained" in out
    assert "\x1b[" not in out  # no terminal codes into a pipe


def test_once_on_something_that_is_no_trace_and_bad_intervals_say_why(tmp_path):
    """A missing file, a file that is no trace, a gzipped one, a NaN, negative or tiny interval
    and a live view with no terminal to draw on are one line each, exit 2, no traceback."""
    text = tmp_path / "notes.txt"
    text.write_text("hello\nworld\n")
    gz = tmp_path / "rollout_trace.jsonl.gz"
    gz.write_bytes(gzip.compress(b'{"t":1.0,"run_id":"r","event":"run.start"}\n'))
    for args, words in [
        (["--once", str(tmp_path / "none.jsonl")], "no such file"),
        (["--once", str(text)], "not a trace file"),
        (["--interval", "nan", str(text)], "must be a number of seconds, at least 0.05, got 'nan'"),
        (["--interval", "-1", str(text)], "must be a number of seconds, at least 0.05, got '-1'"),
        (["--interval", "1e-9", str(text)], "at least 0.05, got '1e-9'"),  # no busy redraw loop
        ([str(text)], "the live view needs a terminal; --once prints one frame"),
        ([str(gz)], "gzipped; a live view follows a plain log as it grows"),
    ]:
        done = subprocess.run(command("watch", *args), capture_output=True, text=True)
        assert done.returncode == 2 and words in done.stderr and "Traceback" not in done.stderr


def test_once_reads_a_finished_gzipped_run_as_its_plain_log(demo_trace, tmp_path):
    """``watch --once`` on the demo's log gzipped draws the frame it draws for the plain
    log, but for the file line (its name and size)."""
    gz = tmp_path / "rollout_trace.jsonl.gz"
    gz.write_bytes(gzip.compress(demo_trace.read_bytes()))
    frames = [
        subprocess.run(command("watch", "--once", str(p)), capture_output=True, text=True)
        for p in (demo_trace, gz)
    ]
    assert [f.returncode for f in frames] == [0, 0], frames[1].stderr
    # The frame's last line is the wall clock's time when it was drawn: left out.
    plain, packed = (f.stdout.splitlines()[:-1] for f in frames)
    differ = [(a, b) for a, b in zip(plain, packed, strict=True) if a != b]
    assert len(differ) == 1 and "file" in differ[0][0] and str(gz) in differ[0][1]
    assert any("step       23" in line for line in packed)


def test_without_rich_one_line_names_the_extra(tmp_path):
    """With rich not importable, the command says which extra to install."""
    code = "import sys; sys.modules['rich'] = None; from otel_rollout.cli import main; main()"
    done = subprocess.run([sys.executable, "-c", code, "watch", "--once", str(tmp_path)],
                          capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.strip() == (
        "otel-rollout: error: otel-rollout watch needs rich: pip install 'otel-rollout[watch]'"
    )


def test_the_benchmark_runs_and_its_last_frame_is_the_files_last_step(tmp_path):
    """``bench/run.py --only watch --quick`` (never timed here) follows a file written at
    10k events/s to its end: the last frame drawn is the file's last step and batch age."""
    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed")
    out = tmp_path / "figures.json"
    bench = Path(__file__).parent.parent / "bench" / "run.py"
    args = [sys.executable, str(bench), "--only", "watch", "--quick", "--json", str(out)]
    done = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    figures = json.loads(out.read_text())["watch"]
    assert figures["last_frame_matches"] and figures["lines"] > 40_000
    assert set(figures["cpu_pct"]) == {"watch", "plain follower"}
