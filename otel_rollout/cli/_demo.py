"""``otel-rollout demo``: a simulated run really killed with SIGKILL, resumed, and its cost.

The simulator runs as a child process.  This parent watches the trace file
and, when the child has trained a chosen step, sends it ``SIGKILL`` (no flag,
no warning: what a pre-empted node does), then starts ``simulate --resume``
into the same log directory, twice, and prints what the stops cost.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson

from ..constants import ROLLOUT_TRACE_FILENAME
from ..follow import FileFollower
from ._common import CliError

_POLL = 0.02


def kill_points(text: str) -> list[int]:
    """``--kill-at 7,16`` → [7, 16]: the steps after which the run is killed."""
    try:
        steps = [int(s) for s in text.split(",") if s.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected steps like 7,16, got {text!r}") from exc
    if steps != sorted(set(steps)) or any(s < 0 for s in steps):
        raise argparse.ArgumentTypeError("kill steps must be increasing and ≥ 0")
    return steps


class _TraceWatcher:
    """Follows a trace file as it grows; knows the newest step each run has trained."""

    def __init__(self, path: Path) -> None:
        self.follower = FileFollower(path)
        self.runs: list[str] = []
        self.steps: dict[str, int] = {}

    def poll(self) -> None:
        while lines := self.follower.read().lines:
            for line in lines:
                if b'"run.start"' in line or b'"train.step"' in line:
                    event = orjson.loads(line)
                    if event["event"] == "run.start":
                        self.runs.append(event["run_id"])
                    elif event["event"] == "train.step":
                        self.steps[event["run_id"]] = event["step"]


def _child(log_dir: Path, options: list[str], resume: bool) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "otel_rollout", "simulate", "--log-dir", str(log_dir)]
    command += [*options, "--for-demo"] + (["--resume"] if resume else [])
    # The child imports this otel_rollout, not one in the directory the demo runs from
    # (python -m puts that first on sys.path; PYTHONSAFEPATH, from Python 3.11, does not).
    return subprocess.Popen(command, env={**os.environ, "PYTHONSAFEPATH": "1"})


def run_with_kills(
    log_dir: Path,
    options: list[str],
    kills: list[int],
    timeout: float = 300.0,
    delay: float = 0.25,
    last_step: int | None = None,
) -> list[tuple[str, int]]:
    """Run the simulator, SIGKILL it after each step in ``kills``, resume; returns
    ``(run_id, step)`` for every kill.  The last run goes to completion; a kill that lands
    once the run trained ``last_step`` (a fast run outpaced it) ends the demo there."""
    watcher = _TraceWatcher(log_dir / ROLLOUT_TRACE_FILENAME)
    killed: list[tuple[str, int]] = []
    for stage in range(len(kills) + 1):
        runs_before = len(watcher.runs)
        child = _child(log_dir, options, resume=stage > 0)
        deadline = time.monotonic() + timeout
        target = kills[stage] if stage < len(kills) else None
        while child.poll() is None:
            watcher.poll()
            run = watcher.runs[-1] if len(watcher.runs) > runs_before else None
            if target is not None and run and watcher.steps.get(run, -1) >= target:
                time.sleep(delay)  # part-way into the next step, not on a boundary
                os.kill(child.pid, signal.SIGKILL)
                child.wait()
                watcher.poll()
                killed.append((run, watcher.steps[run]))
                print(
                    f"\n*** SIGKILL: run {run[:8]} killed after step {watcher.steps[run]} "
                    f"(pid {child.pid}) ***\n",
                    file=sys.stderr,
                    flush=True,
                )
                if last_step is not None and watcher.steps[run] >= last_step:
                    print(
                        f"(the run had trained its last step, {last_step}, when the kill "
                        "landed: nothing is left to resume)\n",
                        file=sys.stderr,
                        flush=True,
                    )
                    return killed
                break
            if time.monotonic() > deadline:
                child.kill()
                raise CliError(f"the simulated run did not reach step {target} in {timeout:.0f}s")
            time.sleep(_POLL)
        else:
            if child.returncode != 0:
                raise CliError(f"the simulated run exited with code {child.returncode}")
            if target is not None:
                raise CliError(f"the run finished before step {target}; lower --kill-at")
    return killed


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--kill-at",
        type=kill_points,
        default=[7, 16],
        metavar="STEPS",
        help="kill the run with SIGKILL a moment after these steps, resuming after each "
        "(default 7,16: one right after a checkpoint, one between checkpoints)",
    )


def run_demo(args: argparse.Namespace, options: list[str]) -> list[tuple[str, int]]:
    """The demo's kill-and-resume part; the caller prints the report."""
    return run_with_kills(
        args.log_dir, options, args.kill_at, delay=0.25 / args.speed, last_step=args.steps - 1
    )
