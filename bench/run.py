"""otel-rollout benchmarks, with the plain queue-and-thread design as the yardstick in the same run.

    python bench/run.py            # the full table (about two minutes on 2 cores)
    python bench/run.py --quick    # a smoke run with small sizes

Figures: emit cost on the caller's thread (median ns/event while the writer
drains), drain throughput (events/s, emit N then flush), emit-to-file latency
p50/p99 at 1k and 10k events/s (tailed by a separate process), reader
throughput on a synthetic multi-run trace (lines/s), the peak memory of
``batch_age_by_step`` on it (a fresh process, RSS above its baseline), and
(``controller.py``) what a Python controller keeps of its throughput with the
log only, in-process export and the export sidecar, with the sidecar's lag,
CPU and memory, and how soon a killed trainer's spans all arrive.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import controller  # noqa: E402
import measure  # noqa: E402
import read_side  # noqa: E402
import spanfirst  # noqa: E402
import watch  # noqa: E402
import with_otel  # noqa: E402
from measure import latency  # noqa: E402
from yardstick import PlainWriter, plain_read  # noqa: E402

from otel_rollout.batch_age import batch_age_by_step  # noqa: E402
from otel_rollout.cost import analyze, analyze_file  # noqa: E402
from otel_rollout.reader import read_events  # noqa: E402
from otel_rollout.testing import kill_loss_window, synthetic_trace  # noqa: E402
from otel_rollout.trace import RolloutTrace  # noqa: E402

FIELDS = measure.FIELDS

Writer = measure.Writer
DESIGNS: dict[str, Writer] = {"yardstick": PlainWriter, "otel-rollout": RolloutTrace}


# Writes a checkpoint-sized file beside the log, over and over, each time synced: the
# writeback a trainer's checkpoint puts in front of the log's own fdatasync.
_CHECKPOINT_WRITER = """
import os, sys
block = os.urandom(4 << 20)
while True:
    with open(sys.argv[1], "wb") as f:
        for _ in range(32):  # 128 MB
            f.write(block)
        f.flush()
        os.fsync(f.fileno())
"""


class BesideACheckpoint:
    """A writer whose log shares its disk with a checkpoint being written (from its start to
    its close), as a trainer's does while it saves."""

    def __init__(self, path: Path, make: Writer) -> None:
        self._writer = subprocess.Popen(
            [sys.executable, "-c", _CHECKPOINT_WRITER, str(path.with_suffix(".ckpt"))]
        )
        try:
            time.sleep(0.5)  # its writeback is under way
            self._inner = make(path)
        except BaseException:
            self._stop_writer()
            raise
        self.emit = self._inner.emit

    def close(self) -> None:
        try:
            self._inner.close()
        finally:
            self._stop_writer()

    def _stop_writer(self) -> None:
        self._writer.kill()
        self._writer.wait()


#: The log synced to disk at the default interval, beside never and after every batch.
FSYNC_DESIGNS: dict[str, Writer] = {
    "fsync off": lambda p: RolloutTrace(p, fsync_interval=math.inf),
    "fsync every 1 s (default)": lambda p: RolloutTrace(p, fsync_interval=1.0),
    "fsync every batch": lambda p: RolloutTrace(p, fsync_interval=0.0),
}
#: Latency beside a checkpoint being written: the yardstick syncing after every batch on
#: its writer thread (as otel-rollout did before its syncer thread), and otel-rollout.
FSYNC_BESIDE_A_CHECKPOINT: dict[str, Writer] = {
    "yardstick, fdatasync after every batch on its writer thread": lambda p: BesideACheckpoint(
        p, lambda q: PlainWriter(q, sync_each_batch=True)
    ),
    "fsync every batch, a checkpoint being written": lambda p: BesideACheckpoint(
        p, lambda q: RolloutTrace(q, fsync_interval=0.0)
    ),
    "fsync every 1 s, a checkpoint being written": lambda p: BesideACheckpoint(
        p, lambda q: RolloutTrace(q, fsync_interval=1.0)
    ),
}


def fsync_cost(events: list[tuple[str, dict[str, Any]]], seconds: float) -> dict[str, Any]:
    """What syncing the log to disk costs: drain events/s and emit→file p99 at 10k/s.  The
    files go beside this script, on the disk the code is on: /tmp may be a tmpfs, where
    fdatasync costs nothing."""
    with tempfile.TemporaryDirectory(dir=HERE) as d:
        tmp = Path(d)
        return {
            "drain_events_per_s": measure.throughput(tmp, FSYNC_DESIGNS, events, reps=5),
            "latency_ms_10000": latency(tmp, 10000, seconds, FSYNC_DESIGNS),
            "latency_beside_a_checkpoint_ms_10000": latency(
                tmp, 10000, seconds, FSYNC_BESIDE_A_CHECKPOINT
            ),
        }


def _fsync_table(f: dict[str, dict[str, Any]]) -> None:
    print("\n| the log synced to disk | drain, events/s | emit→file p99 ms @ 10,000/s |")
    print("|---|---:|---:|")
    for name in FSYNC_DESIGNS:
        drain, (_, p99) = f["drain_events_per_s"][name], f["latency_ms_10000"][name]
        print(f"| {name} | {drain:,.0f} | {p99:.2f} |")
    for name, (_, p99) in f.get("latency_beside_a_checkpoint_ms_10000", {}).items():
        print(f"| {name} | | {p99:.2f} |")


def reader_throughput(path: Path, lines: int) -> dict[str, float]:
    """Lines per second: read every event; compute batch age per step (best of three)."""

    def timed(fn: Callable[[], Any]) -> float:
        best = float("inf")
        for _ in range(3):
            start = time.perf_counter()
            fn()
            best = min(best, time.perf_counter() - start)
        return lines / best

    return {
        "yardstick read (loads every line)": timed(lambda: sum(1 for _ in plain_read(path))),
        "read_events": timed(lambda: sum(1 for _ in read_events(path))),
        "yardstick batch age (loads every line)": timed(
            lambda: batch_age_by_step(plain_read(path))
        ),
        "batch_age_by_step(read_events(path))": timed(lambda: batch_age_by_step(read_events(path))),
        "yardstick cost (loads every line)": timed(lambda: analyze(plain_read(path))),
        "cost": timed(lambda: analyze_file(path)),
    }


_YARDSTICK_WRITER = (
    f"sys.path.insert(0, {str(HERE)!r})\n"
    "from pathlib import Path\nfrom yardstick import PlainWriter\n"
    "trace = PlainWriter(Path(sys.argv[1]))"
)


def kill_windows(tmp: Path, kills: int, endpoint: str) -> dict[str, float]:
    """Median ms between a SIGKILL and the newest event in the file, at 5,000 events/s."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    cases: dict[str, dict[str, Any]] = {
        "yardstick": {"writer": _YARDSTICK_WRITER, "env": clean},
        "otel-rollout": {"env": clean},
        "otel-rollout + spans + metrics": {  # the export sidecar, as the variable alone gives
            "env": clean
            | {"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_ROLLOUT_SIDECAR_LINGER": "0"}
        },
    }
    windows: dict[str, list[float]] = {name: [] for name in cases}
    for i in range(kills):
        for name, options in cases.items():
            result = kill_loss_window(
                tmp / f"kill-{i}-{len(windows[name])}-{name}.jsonl", **options
            )
            windows[name].append(result.window * 1000)
    return {name: statistics.median(w) for name, w in windows.items()}


_PEAK = """
import sys
from otel_rollout.batch_age import batch_age_by_step
from otel_rollout.reader import EventReader, read_events

def high_water_mb():  # VmHWM, unlike ru_maxrss, is not inherited across exec
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM"):
            return int(line.split()[1]) / 1024

base = high_water_mb()
if sys.argv[2] == "cost":
    from otel_rollout.cost import analyze_file
    steps = analyze_file(sys.argv[1]).boundaries
else:
    steps = batch_age_by_step(read_events(sys.argv[1]))
print(high_water_mb() - base, base, len(steps))
"""


def peak_memory(path: Path, what: str = "batch-age") -> tuple[float, float, int]:
    """MB of resident memory an analysis adds in a fresh process, its baseline, and the
    number of steps (batch age) or boundaries (cost) it found."""
    out = subprocess.run(
        [sys.executable, "-c", _PEAK, str(path), what], capture_output=True, text=True, check=True
    )
    added, base, steps = out.stdout.split()
    return float(added), float(base), int(steps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    parser.add_argument("--lines", type=int, help="lines in the reader benchmark's trace")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    parser.add_argument(
        "--only",
        choices=["fsync", "read", "watch", "spanfirst", "trackers"],
        help="measure only this part (fsync: the cost of syncing; read: the read commands; "
        "watch: the live view following a file growing at 10k events/s; spanfirst: what "
        "making the log from spans costs the caller, and loses at a kill -9; trackers: a "
        "controller's throughput and the log's lag with the trackers on)",
    )
    args = parser.parse_args()
    lines = args.lines or (20_000 if args.quick else 1_000_000)
    rounds = 20 if args.quick else 400
    drain_n = 20_000 if args.quick else 300_000
    seconds = 0.3 if args.quick else 3.0
    dispatches = [("attempt.dispatch", {"i": i, **FIELDS}) for i in range(drain_n)]
    if args.only == "fsync":
        figures = {"fsync": fsync_cost(dispatches, seconds)}
        _fsync_table(figures["fsync"])
        if args.json:
            args.json.write_text(json.dumps(figures, indent=2))
        return

    if args.only == "watch":
        figures = {"watch": watch.figures(10_000, 5.0 if args.quick else 20.0, 0.5)}
        print(watch.report(figures["watch"]))
        if args.json:
            args.json.write_text(json.dumps(figures, indent=2))
        return

    if args.only == "trackers":
        import trackers

        figures = {"trackers": trackers.figures(2.0 if args.quick else 40.0)}
        print(trackers.report(figures["trackers"]))
        if args.json:
            args.json.write_text(json.dumps(figures, indent=2))
        return

    if args.only == "spanfirst":
        spanfirst.run(rounds, 3 if args.quick else 10, args.json)
        return

    if args.only == "read":
        with tempfile.TemporaryDirectory() as d:
            trace = synthetic_trace(Path(d) / "big.jsonl", lines, runs=3)
            figures = {"read_side": read_side.figures(trace, lines, 1 if args.quick else 3)}
            print(read_side.report(figures["read_side"], lines, trace.stat().st_size / 1e6))
        if args.json:
            args.json.write_text(json.dumps(figures, indent=2))
        return

    figures: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        print(f"python {sys.version.split()[0]}; trace of {lines:,} lines", file=sys.stderr)
        print("emit cost ...", file=sys.stderr)
        figures["emit_ns"] = measure.emit_cost(tmp, DESIGNS, dispatches, rounds)
        print("drain throughput ...", file=sys.stderr)
        figures["drain_events_per_s"] = measure.throughput(tmp, DESIGNS, dispatches, reps=7)
        for rate in (1000, 10000):
            print(f"latency at {rate}/s ...", file=sys.stderr)
            figures[f"latency_ms_{rate}"] = latency(tmp, rate, seconds, DESIGNS)
        print("the cost of syncing the log to disk ...", file=sys.stderr)
        figures["fsync"] = fsync_cost(dispatches, seconds)
        print("with spans and metrics over OTLP ...", file=sys.stderr)
        receiver = with_otel.Receiver()
        try:
            makers = with_otel.designs(receiver.endpoint)
            mix = with_otel.mixed_events(max(rounds * 1000 // 5, drain_n // 3))
            figures["otel_emit_ns"] = measure.emit_cost(tmp, makers, mix, rounds, tag="-otel")
            figures["otel_events_per_s"] = measure.throughput(
                tmp, makers, mix[: drain_n // 3], reps=3, tag="-otel"
            )
            mix = with_otel.mixed_events(int(seconds * 1000) * 10)
            figures["otel_latency_ms_10000"] = latency(tmp, 10000, seconds, makers, mix)
            print("kill -9 loss window ...", file=sys.stderr)
            figures["kill_window_ms"] = kill_windows(
                tmp, 3 if args.quick else 20, receiver.endpoint
            )
        finally:
            figures["otel_spans_received"] = receiver.close()
        print("writing the synthetic trace ...", file=sys.stderr)
        trace = synthetic_trace(tmp / "big.jsonl", lines, runs=3)
        size_mb = trace.stat().st_size / 1e6
        print("reader throughput ...", file=sys.stderr)
        figures["reader_lines_per_s"] = reader_throughput(trace, lines)
        figures["peak_mb"], figures["baseline_mb"], steps = peak_memory(trace)
        figures["cost_peak_mb"], _, figures["boundaries"] = peak_memory(trace, "cost")
        print("the read commands as whole processes ...", file=sys.stderr)
        figures["read_side"] = read_side.figures(trace, lines, 1 if args.quick else 3)
    print("a controller's lost throughput, by export mode ...", file=sys.stderr)
    figures["controller"] = controller.figures(1.0 if args.quick else 40.0, 1 if args.quick else 5)
    _table(figures, lines, size_mb, steps)
    _fsync_table(figures["fsync"])
    print()
    print(read_side.report(figures["read_side"], lines, size_mb))
    print("\nA Python controller's throughput, as a share of the same loop with no trace:\n")
    print(controller.report(figures["controller"]))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))


def _table(f: dict[str, Any], lines: int, size_mb: float, steps: int) -> None:
    y, o = "yardstick", "otel-rollout"
    rows = [
        ("emit, caller ns/event (median)", f["emit_ns"][y], f["emit_ns"][o], "{:,.0f}", "lower"),
        (
            "drain, events/s",
            f["drain_events_per_s"][y],
            f["drain_events_per_s"][o],
            "{:,.0f}",
            "higher",
        ),
    ]
    for rate in (1000, 10000):
        lat = f[f"latency_ms_{rate}"]
        rows.append((f"emit→file p50 ms @ {rate:,}/s", lat[y][0], lat[o][0], "{:.2f}", "lower"))
        rows.append((f"emit→file p99 ms @ {rate:,}/s", lat[y][1], lat[o][1], "{:.2f}", "lower"))
    r = f["reader_lines_per_s"]
    rows.append(
        (
            "read every event, lines/s",
            r["yardstick read (loads every line)"],
            r["read_events"],
            "{:,.0f}",
            "higher",
        )
    )
    rows.append(
        (
            "stop/restore cost, lines/s",
            r["yardstick cost (loads every line)"],
            r["cost"],
            "{:,.0f}",
            "higher",
        )
    )
    rows.append(
        (
            "batch age per step, lines/s",
            r["yardstick batch age (loads every line)"],
            r["batch_age_by_step(read_events(path))"],
            "{:,.0f}",
            "higher",
        )
    )
    o2 = "otel-rollout + spans + metrics"
    rows.append(
        (
            "with OTLP spans+metrics in-process: emit ns/event (median)",
            f["otel_emit_ns"][y],
            f["otel_emit_ns"][o2],
            "{:,.0f}",
            "lower",
        )
    )
    rows.append(
        (
            "with OTLP spans+metrics in-process: events/s through the pipeline",
            f["otel_events_per_s"][y],
            f["otel_events_per_s"][o2],
            "{:,.0f}",
            "higher",
        )
    )
    kill = f["kill_window_ms"]
    rows.append(
        (
            "kill -9 at 5,000/s: newest event's age at the kill, ms (median)",
            kill[y],
            kill["otel-rollout"],
            "{:.2f}",
            "lower",
        )
    )
    rows.append(
        (
            "kill -9 with OTLP spans+metrics on (sidecar), ms (median)",
            kill[y],
            kill[o2],
            "{:.2f}",
            "lower",
        )
    )
    lat = f["otel_latency_ms_10000"]
    rows.append(
        (
            "with OTLP spans+metrics in-process: emit→file p99 ms @ 10,000/s",
            lat[y][1],
            lat[o2][1],
            "{:.2f}",
            "lower",
        )
    )
    print("\n| measure | yardstick | otel-rollout | otel-rollout / yardstick |")
    print("|---|---:|---:|---:|")
    for name, yv, ov, fmt, _better in rows:
        print(f"| {name} | {fmt.format(yv)} | {fmt.format(ov)} | {ov / yv:.2f}× |")
    print(
        f"\nbatch_age_by_step on {lines:,} lines ({size_mb:,.0f} MB, {steps:,} steps): "
        f"peak memory +{f['peak_mb']:.1f} MB above a fresh interpreter's "
        f"{f['baseline_mb']:.0f} MB"
    )
    print(
        f"cost on the same trace ({f['boundaries']} stops): peak memory +{f['cost_peak_mb']:.1f} MB"
    )
    print(f"spans received by the OTLP receiver process: {f['otel_spans_received']:,}")


if __name__ == "__main__":
    main()
