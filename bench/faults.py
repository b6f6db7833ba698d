"""What each fault costs: events accepted, written and dropped, the caller's emit cost
during the fault, and the time to recover once it clears.

    python bench/faults.py            # every fault this machine can stage (about a minute)
    python bench/faults.py --quick    # shorter phases

Each scenario runs one trace with a paced emitter (``--rate`` events/s): a healthy
phase, the fault, then the fault cleared.  "written + dropped = accepted" is checked
twice: by the trace's own counters and by reading the file back (its ``x`` lines plus
the ``trace.dropped`` counts it reports).  Disk faults that need root (a tmpfs, chattr)
are skipped, with a note, where they cannot be staged.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _stages import (  # noqa: E402
    Stage,
    deleted_dir,
    disk_full,
    immutable,
    otlp,
    port_taken,
    slow_disk,
)

from otel_rollout import RolloutTrace  # noqa: E402
from otel_rollout.reader import EventReader  # noqa: E402

# Faults are the point here: keep the logs quiet, but let records be made, since
# otel-rollout counts the SDK's queue-full drops from them.
for _name in ("otel_rollout", "opentelemetry"):
    logging.getLogger(_name).addHandler(logging.NullHandler())
    logging.getLogger(_name).propagate = False


@dataclass
class Row:
    fault: str
    accepted: int = 0
    written: int = 0
    dropped: int = 0
    file_written: int = 0
    file_dropped: int = 0
    p99_us: float | None = None
    p99_healthy_us: float | None = None
    recovery_s: float | None = None
    backlog: int = 0
    lag_p99_ms: float | None = None
    note: str = ""

    @property
    def exact(self) -> bool:
        """Counters and file agree, and account for every accepted event."""
        return (
            self.written + self.dropped == self.accepted
            and self.file_written == self.written
            and self.file_written + self.file_dropped <= self.accepted
        )


def percentile(values: list[int], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(int(q * len(values)), len(values) - 1)] / 1000


def file_counts(path: Path) -> tuple[int, int]:
    """Events in the file (run.start included), and the drops it reports."""
    written = dropped = 0
    for e in EventReader(path, on_skip=lambda *a: None):
        if e["event"] == "trace.dropped":
            dropped += e["count"]
        else:
            written += 1
    return written, dropped


def rollout_events(i: int) -> tuple[str, dict[str, Any]]:
    """The i-th event of a stream of two-attempt groups: spans to build, as in a real run."""
    group, step = divmod(i, 6)
    ids = {"group_id": f"g{group}", "prompt_id": group}
    if step == 0:
        return "group.reserve", {**ids, "size": 2, "weight_version": 0}
    if step == 5:
        return "group.seal", {**ids, "tokens": 1024, "tokens_by_version": {"0": 1024}}
    attempt = {**ids, "attempt_id": f"g{group}-a{step % 2}", "generation_index": step % 2}
    if step < 3:
        return "attempt.dispatch", {**attempt, "weight_version": 0}
    return "attempt.seal", {**attempt, "tokens": 512}


def newest_t(path: Path) -> float:
    """The time stamp of the last whole line of ``path`` (0 if none)."""
    try:
        with open(path, "rb") as f:
            f.seek(max(os.fstat(f.fileno()).st_size - 4096, 0))
            lines = f.read().split(b"\n")
    except OSError:
        return 0.0
    for line in reversed(lines[:-1]):
        at = line.find(b'"t":')
        if at >= 0:
            try:
                return float(line[at + 4 : line.index(b",", at)])
            except ValueError:
                continue
    return 0.0


def watch_lag(path: Path, until: threading.Event, lags: list[float]) -> None:
    """Every 2 ms, how old the newest line of ``path`` is: the log's lag behind ``emit``."""
    while not until.is_set():
        newest = newest_t(path)
        if newest:
            lags.append(time.time() - newest)
        time.sleep(0.002)


def span_note(tr: RolloutTrace) -> str:
    """What became of the spans (for the OTLP rows), as the trace's stats count them."""
    s = tr.stats
    if not s.spans_made:
        return ""
    return (
        f"spans: {s.spans_made:,} made, {s.spans_sent:,} sent, {s.spans_failed:,} refused"
        f" or timed out, {s.spans_dropped:,} dropped (queue full), {s.spans_queued:,} queued"
        " at close"
    )


def watch_recovery(path: Path, cleared_at: float, result: list[float]) -> None:
    """Poll the log until a line emitted after ``cleared_at`` is in it."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if newest_t(path) >= cleared_at:
            result.append(time.time() - cleared_at)
            return
        time.sleep(0.001)


def run_stage(name: str, stage: Stage, rate: int, phases: tuple[float, float, float]) -> Row:
    """Emit at ``rate`` through a healthy phase, the fault, and after it clears."""
    healthy, faulty, after = phases
    tr = RolloutTrace(stage.target, **stage.options)
    path = tr.path
    assert path is not None
    clock = time.perf_counter_ns
    costs: dict[str, list[int]] = {"healthy": [], "fault": [], "after": []}
    per_tick = max(rate // 1000, 1)
    started = time.monotonic()
    i = backlog = 0
    phase = "healthy"
    recovered: list[float] = []
    watcher = None
    lags: list[float] = []
    fault_over = threading.Event()
    lag_watcher = threading.Thread(target=watch_lag, args=(path, fault_over, lags))
    while True:
        now = time.monotonic() - started
        if phase == "healthy" and now >= healthy:
            stage.inject(tr)
            phase = "fault"
            if not stage.log_faults and path.is_file():
                lag_watcher.start()  # the log itself is healthy: how far behind is it?
        elif phase == "fault" and now >= healthy + faulty:
            stage.clear()
            fault_over.set()
            phase = "after"
            if stage.log_faults:
                args = (path, time.time(), recovered)
                watcher = threading.Thread(target=watch_recovery, args=args)
                watcher.start()
        elif phase == "after" and now >= healthy + faulty + after:
            break
        bucket = costs[phase]
        for _ in range(per_tick):
            kind, fields = rollout_events(i)
            t0 = clock()
            tr.emit(kind, **fields)
            bucket.append(clock() - t0)
            i += 1
        if phase == "fault":
            backlog = max(backlog, tr.stats.queued)
        time.sleep(max(0.001 - (time.monotonic() - started - now), 0))
    if watcher is not None:
        watcher.join()
    if lag_watcher.is_alive():
        lag_watcher.join()
    tr.close()
    row = Row(name, accepted=i + 1, written=tr.stats.written, dropped=tr.stats.dropped)
    row.note = span_note(tr)
    if lags:
        row.lag_p99_ms = sorted(lags)[int(0.99 * (len(lags) - 1))] * 1000
    stage.cleanup()
    row.file_written, row.file_dropped = file_counts(stage.readback or path)
    row.file_written += stage.vanished
    row.p99_us = percentile(costs["fault"], 0.99)
    row.p99_healthy_us = percentile(costs["healthy"], 0.99)
    row.recovery_s = recovered[0] if recovered else None
    row.backlog = backlog
    return row


#: The child sleeps in short naps, not one of 60 s: a SIGTERM the kernel hands to one of
#: the trace's threads rather than the main one does not cut the main thread's sleep short,
#: and Python runs the handler only when that sleep ends (once it outlived the 60 s wait).
SIGTERM_CHILD = textwrap.dedent(
    """
    import sys, time
    from otel_rollout import RolloutTrace
    tr = RolloutTrace(sys.argv[1])
    clock = time.perf_counter_ns
    costs = []
    for i in range(int(sys.argv[2])):
        t0 = clock()
        tr.emit("x", i=i, group_id="g-0f3a9c1e", prompt_id=81234, tokens=512)
        costs.append(clock() - t0)
    costs.sort()
    print(costs[int(0.99 * len(costs))], flush=True)
    for _ in range(600):
        time.sleep(0.1)
    """
)


def sigterm(tmp: Path, count: int) -> Row:
    """A burst of ``count`` events, then SIGTERM from outside while most are queued."""
    path = tmp / "sigterm.jsonl"
    child = subprocess.Popen(
        [sys.executable, "-c", SIGTERM_CHILD, str(path), str(count)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    p99_ns = int(child.stdout.readline())
    child.send_signal(signal.SIGTERM)
    child.wait(timeout=60)
    row = Row("SIGTERM after a burst", accepted=count + 1)
    row.file_written, row.file_dropped = file_counts(path)
    row.written, row.dropped = row.file_written, row.file_dropped  # the child's counters died
    row.p99_us = p99_ns / 1000
    row.note = f"exit {child.returncode} (killed by SIGTERM)"
    return row


def table(rows: list[Row | tuple[str, str]]) -> str:
    out = [
        "| fault | accepted | written | dropped | written + dropped = accepted | "
        "peak backlog | caller p99 emit during fault, µs (healthy) | log lag p99 during fault "
        "| time to recover |",
        "|---|---:|---:|---:|:---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        if isinstance(row, tuple):
            out.append(f"| {row[0]} | — | — | — | skipped: {row[1]} | — | — | — | — |")
            continue
        p99 = f"{row.p99_us:.1f}" if row.p99_us is not None else "—"
        if row.p99_healthy_us is not None:
            p99 += f" ({row.p99_healthy_us:.1f})"
        recovery = f"{row.recovery_s * 1000:.0f} ms" if row.recovery_s is not None else "n/a"
        lag = f"{row.lag_p99_ms:.1f} ms" if row.lag_p99_ms is not None else "n/a"
        check = "✓ exact" if row.exact else "✗"
        if row.note:
            check += f"; {row.note}"
        out.append(
            f"| {row.fault} | {row.accepted:,} | {row.written:,} | {row.dropped:,} | {check} "
            f"| {row.backlog:,} | {p99} | {lag} | {recovery} |"
        )
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="shorter phases (a smoke run)")
    parser.add_argument("--rate", type=int, default=20_000, help="events/s (20,000)")
    args = parser.parse_args()
    phases = (0.3, 0.5, 0.3) if args.quick else (1.0, 2.0, 1.0)
    scenarios: list[tuple[str, Callable[[Path], Stage | str]]] = [
        ("none (baseline)", lambda tmp: Stage(tmp / "baseline.jsonl")),
        ("disk full (tmpfs), then space freed", disk_full),
        ("log made immutable (chattr +i), then writable", immutable),
        ("log directory deleted", deleted_dir),
        ("slow disk: a pipe drained at 256 KB/s", slow_disk),
        ("OTLP collector black-holes (never answers)", otlp("black hole")),
        ("OTLP collector refuses (UNAVAILABLE)", otlp("refusing")),
        ("OTLP collector answers after 1 s", otlp("slow")),
        ("Prometheus port already taken", port_taken),
    ]
    rows: list[Row | tuple[str, str]] = []
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        for name, make in scenarios:
            print(f"{name} ...", file=sys.stderr, flush=True)
            stage = make(tmp)
            if isinstance(stage, str):
                rows.append((name, stage))
                continue
            rows.append(run_stage(name, stage, args.rate, phases))
        print("SIGTERM ...", file=sys.stderr, flush=True)
        rows.append(sigterm(tmp, 20_000 if args.quick else 100_000))
    print(f"\npaced at up to {args.rate:,} events/s; healthy/fault/after phases {phases} s\n")
    print(table(rows))


if __name__ == "__main__":
    main()
