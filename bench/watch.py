"""``otel-rollout watch`` following a file that grows at 10k events/s, beside a plain follower.

A writer process re-emits a synthetic trace's events through ``RolloutTrace`` at a
steady rate (two runs, one after the other, so the file holds a stop and the
screen shows its cost). Two readers follow the file in the same run:

* ``otel-rollout watch FILE`` in a real terminal (a tmux pane, 160×50), drawing
  every ``interval`` seconds;
* the yardstick: a plain follower (the same ``FileFollower``) that parses every
  appended line with ``orjson`` at the same interval and keeps nothing.

Each one's CPU (user + system, from ``/proc/PID/stat``) over the writing, as a
share of one core; then the watch's last frame against the file's last step and
its batch age (``batch_age_by_step``).

    python bench/watch.py [--rate 10000] [--seconds 20] [--interval 0.5]
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

from otel_rollout.batch_age import batch_age_by_step
from otel_rollout.follow import FileFollower
from otel_rollout.reader import read_events
from otel_rollout.testing import synthetic_trace

_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


def write(source: Path, path: Path, rate: int) -> None:
    """Re-emit ``source``'s events into ``path`` at ``rate`` events/s, one RolloutTrace per run."""
    from otel_rollout.trace import RolloutTrace

    runs: dict[str, list[dict[str, Any]]] = {}
    for line in source.read_bytes().splitlines():
        event = orjson.loads(line)
        if event["event"] != "run.start":
            runs.setdefault(event.pop("run_id"), []).append(event)
    tick = 0.01
    per_tick = max(1, int(rate * tick))
    for events in runs.values():
        trace = RolloutTrace(path)
        start = time.monotonic()
        for i in range(0, len(events), per_tick):
            for e in events[i : i + per_tick]:
                e.pop("t")
                trace.emit(e.pop("event"), **e)
            ahead = start + (i // per_tick + 1) * tick - time.monotonic()
            if ahead > 0:
                time.sleep(ahead)
        trace.close()


def plain_follow(path: Path, interval: float, until: Path) -> None:
    """The yardstick: read appended lines every ``interval`` and parse each; keep nothing."""
    follower = FileFollower(path)
    while not until.exists() and until.parent.is_dir():  # its directory gone: the bench failed
        for line in follower.read().lines:
            orjson.loads(line)
        time.sleep(interval)


def tmux(socket: str, *args: str) -> str:
    done = subprocess.run(["tmux", "-S", socket, *args], capture_output=True, text=True)
    return done.stdout


def shown_step(screen: str) -> tuple[int | None, str | None]:
    """The step and batch age a captured screen shows."""
    step = re.search(r"│ step\s+([\d,]+)", screen)
    age = re.search(r"│ batch age\s+(\S+)", screen)
    return int(step.group(1).replace(",", "")) if step else None, age.group(1) if age else None


def figures(rate: int, seconds: float, interval: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        source = synthetic_trace(tmp / "source.jsonl", int(rate * seconds), runs=2)
        path, done = tmp / "rollout_trace.jsonl", tmp / "done"
        socket = str(tmp / "tmux.sock")  # a socket of our own, gone with the directory
        watch = [
            sys.executable,
            "-m",
            "otel_rollout",
            "watch",
            str(path),
            "--interval",
            str(interval),
        ]
        tmux(
            socket,
            "new-session",
            "-d",
            "-s",
            "w",
            "-x",
            "160",
            "-y",
            "50",
            f"exec {shlex.join(watch)}",
        )
        children: list[subprocess.Popen[bytes]] = []
        try:
            watch_pid = int(tmux(socket, "display", "-p", "-t", "w", "#{pane_pid}"))
            here = Path(__file__).resolve()
            plain = subprocess.Popen(
                [sys.executable, str(here), "--plain", str(path), str(interval), str(done)]
            )
            children.append(plain)
            time.sleep(1.0)  # both started and idle
            cpu0 = {"watch": cpu_seconds(watch_pid), "plain follower": cpu_seconds(plain.pid)}
            began = time.monotonic()
            writer = subprocess.Popen(
                [sys.executable, str(here), "--write", str(source), str(path), str(rate)]
            )
            children.append(writer)
            writer.wait()
            wall = time.monotonic() - began
            time.sleep(2 * interval + 0.5)  # the last lines read and drawn
            cpu = {
                "watch": cpu_seconds(watch_pid) - cpu0["watch"],
                "plain follower": cpu_seconds(plain.pid) - cpu0["plain follower"],
            }
            done.touch()
            plain.wait()
            ages = batch_age_by_step(read_events(path))
            last = max(ages)
            # On a loaded machine the last frame can come later than the fixed wait above:
            # look until it shows the file's last step, or give up after a deadline.
            deadline = time.monotonic() + 30
            while True:
                screen = tmux(socket, "capture-pane", "-p", "-t", "w")
                shown = shown_step(screen)
                if shown == (last, f"{ages[last]:.4f}") or time.monotonic() > deadline:
                    break
                time.sleep(interval / 2)
        finally:  # nothing left running when something failed
            for child in children:
                child.kill()
                child.wait()
            tmux(socket, "kill-server")
        lines = sum(1 for _ in path.open("rb"))
        return {
            "rate": rate,
            "lines": lines,
            "events_per_s": lines / wall,
            "wall_s": wall,
            "interval_s": interval,
            "cpu_pct": {name: 100 * s / wall for name, s in cpu.items()},
            "file_last_step": [last, f"{ages[last]:.4f}"],
            "screen_last_step": list(shown),
            "last_frame_matches": shown == (last, f"{ages[last]:.4f}"),
            "screen": screen.rstrip(),
        }


def report(f: dict[str, Any]) -> str:
    cpu = f["cpu_pct"]
    return "\n".join(
        [
            f"watch following {f['lines']:,} lines written at {f['events_per_s']:,.0f} events/s "
            f"for {f['wall_s']:.1f} s, drawn every {f['interval_s']} s:",
            f"  CPU, % of one core: watch {cpu['watch']:.1f}%, "
            f"plain follower (orjson every line) {cpu['plain follower']:.1f}%",
            f"  last frame: step {f['screen_last_step'][0]}, batch age {f['screen_last_step'][1]}; "
            f"file: step {f['file_last_step'][0]}, batch age {f['file_last_step'][1]} "
            f"({'equal' if f['last_frame_matches'] else 'DIFFERENT'})",
        ]
    )


def main() -> None:
    if sys.argv[1:2] == ["--plain"]:
        plain_follow(Path(sys.argv[2]), float(sys.argv[3]), Path(sys.argv[4]))
        return
    if sys.argv[1:2] == ["--write"]:
        write(Path(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4]))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=int, default=10_000)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--interval", type=float, default=0.5)
    args = parser.parse_args()
    f = figures(args.rate, args.seconds, args.interval)
    print(f["screen"])
    print(report(f))


if __name__ == "__main__":
    main()
