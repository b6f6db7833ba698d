"""What instrumentation costs a controller that does Python work: its lost throughput.

A controller loop does fixed units of pure-Python work and, paced by the
clock, emits a realistic mix of rollout events at a target rate.  The figure
is its work per second as a share of the same loop emitting into a no-op
function (the same calls, no trace), for:

* ``jsonl``: the log only (the floor: what any trace costs);
* ``inprocess``: spans and metrics made on the trainer's background thread;
* ``sidecar``: spans and metrics made by the export sidecar from the log.

Both exports send spans and metrics over OTLP (gRPC) to a receiver in a
process of its own, at nice 19: it stands for a collector on another machine,
so it should not take CPU the trainer would have had.  This VM's speed
drifts by 20-30% over seconds, so each mode runs in one process as 0.25 s
slices, no-op and traced in turn, each traced slice compared with the mean of
the no-op slices on either side; a pause after every slice lets what it
emitted be exported before the next one starts (a traced slice ends once the
trace's writer has written what it emitted: its time counts).  The log alone
and the sidecar share one process, their slices taken in turn, so that the
few points between them are measured under the same drift.  Each figure is
the median ratio over the slices, with a 95% bootstrap interval of that
median (one slice's ratio swings by ±7%; 160 slices pin the median to about
±1%).  For the
sidecar, the lag from an event to its span at the receiver and the sidecar's
own CPU and peak memory are measured in the same runs.

    python bench/controller.py [--quick] [--json out.json]   # also part of bench/run.py
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

MODES = ("jsonl", "inprocess", "sidecar")
#: Seconds of one slice of the loop, and the pause after it (not measured) in which what it
#: emitted is written and exported, so that it does not slow the next slice down.
SLICE = 0.25
PAUSE = 0.1
RATES = (1000, 10000)

_RECEIVER = """
import os, sys, time, orjson
from otel_rollout.testing import OtlpReceiver
os.nice(19)  # it stands for a collector on another machine: the trainer's cores come first
receiver = OtlpReceiver("grpc", keep=False)
print(receiver.endpoint, flush=True)
for line in sys.stdin:  # "reset" clears the lags; "lags" prints them
    if line.strip() == "lags":
        out = {"spans": receiver.span_count, "lags": receiver.lags}
        print(orjson.dumps(out).decode(), flush=True)
    receiver.lags = []
receiver.close()
"""


def work_unit() -> int:
    """A slice of controller-like Python work: dict and list churn, arithmetic (~10 us)."""
    total = 0
    rows = {}
    for i in range(60):
        rows[i] = (i * 7) % 13
        total += rows[i] * i
    return total


def _open(mode: str, endpoint: str, tmp: Path) -> tuple[Any, int | None]:
    """A trace in ``mode`` writing under ``tmp``, steady (its sidecar up and following), and
    its sidecar's pid."""
    import with_otel

    from otel_rollout.trace import RolloutTrace

    tmp.mkdir(parents=True, exist_ok=True)
    options: dict[str, Any] = {}
    if mode == "trackers":  # bench/trackers.py: all three trackers, from the sidecar
        os.environ.update(WANDB_MODE="offline", WANDB_DIR=str(tmp), WANDB_SILENT="true")
        every = "tensorboard:{tmp}/tb,mlflow:sqlite:///{tmp}/m.db,wandb"
        specs = os.environ.get("BENCH_TRACKERS", every)
        options = {"trackers": specs.format(tmp=tmp)}
    elif mode != "jsonl":
        options = {"endpoint": endpoint, "metrics": {"otlp"}, "export_mode": mode}
    trace = RolloutTrace(tmp / "t.jsonl", **options)
    sidecar_pid = None
    if mode in ("sidecar", "trackers"):  # steady state: the sidecar is up and following
        deadline = time.monotonic() + 30
        while trace._sidecar.sidecar_pid is None and time.monotonic() < deadline:
            time.sleep(0.01)
        sidecar_pid = trace._sidecar.sidecar_pid
    if mode == "trackers":  # a first step, so that the trackers' libraries are loaded before
        for kind, fields in with_otel.mixed_events(80):
            trace.emit(kind, **fields)
        time.sleep(8.0)  # importing mlflow and wandb, a W&B run's service: ~5 s here
    return trace, sidecar_pid


def one(mode: str, rate: int, seconds: float, endpoint: str, tmp: Path) -> dict[str, Any]:
    """In this process, with one trace in ``mode``: slices of the controller loop emitting
    through the trace, each between two slices emitting into a no-op (shared with the traced
    slices beside them); each traced slice's work over the mean of its two neighbours'.

    ``mode`` may name several modes joined by ``+`` (``jsonl+trackers``): one trace each,
    their slices taken in turn (no-op, first, no-op, second, no-op, ...), so that the modes
    are compared under the same drift of this VM's speed; ``ratios_by_mode`` has each."""
    import with_otel

    modes = mode.split("+")
    opened = {m: _open(m, endpoint, tmp / m if len(modes) > 1 else tmp) for m in modes}
    time.sleep(0.3)
    slices = max(int(seconds / SLICE), 1)
    per_slice = int(rate * SLICE * 1.05) + 10  # the most a slice emits, with room for overrun
    position: dict[str | None, int] = dict.fromkeys([*modes, None], 0)  # each mode's stream

    def noop(name: str, /, **fields: Any) -> None:
        pass

    def run_slice(which: str | None) -> float:
        """One slice, traced or into the no-op, emitting events made just before it.

        Made fresh for every slice of either kind, as a controller makes its fields just
        before it emits them: taken from one list made up front, the traced slices read
        events long out of the cache while the no-op slices reused the first ones, and
        the traced slices paid for those cache misses as if they were the trace's.  Each
        mode's events go on from where its last slice stopped (no group left open)."""
        events = with_otel.stream(position[which], per_slice)
        emit = opened[which][0].emit if which is not None else noop
        units = emitted = 0
        start = time.perf_counter()
        end = start + SLICE
        while (now := time.perf_counter()) < end:
            work_unit()
            units += 1
            due = int((now - start) * rate) - emitted
            for kind, fields in events[emitted : emitted + due]:
                emit(kind, **fields)
            emitted += due
        assert emitted <= len(events), "a slice emitted more events than were made for it"
        position[which] += emitted
        if which is not None:
            # The slice's time includes writing (and, in-process, exporting) what it
            # emitted: work left to the pause would slow the next no-op slice instead.
            opened[which][0].flush()
        elapsed = time.perf_counter() - start
        time.sleep(PAUSE)  # what the slice emitted is written and exported before the next
        return units / elapsed

    cpu0 = {m: _cpu_seconds(pid) for m, (_, pid) in opened.items()}
    measured = dict.fromkeys(modes, 0.0)
    ratios: dict[str, list[float]] = {m: [] for m in modes}
    before = run_slice(None)
    for _ in range(slices):  # no-op, traced, no-op, traced, ...: each no-op slice serves twice
        for m in modes:
            started = time.perf_counter()
            traced = run_slice(m)
            measured[m] += time.perf_counter() - started
            after = run_slice(None)
            ratios[m].append(traced / ((before + after) / 2))
            before = after
    result: dict[str, Any] = {"ratios": ratios[modes[0]], "ratios_by_mode": ratios}
    for m, (_, pid) in opened.items():
        if pid is not None:  # its work while its slices ran and in the pauses after them
            result["sidecar_cpu"] = (_cpu_seconds(pid) - cpu0[m]) / measured[m]
            result["sidecar_peak_mb"] = _peak_mb(pid)
    closing = time.perf_counter()
    for trace, _ in opened.values():
        trace.close()
    result["close_s"] = time.perf_counter() - closing
    return result


def _cpu_seconds(pid: int | None) -> float:
    if pid is None:
        return 0.0
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _peak_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM"):
                return int(line.split()[1]) / 1024
    return 0.0


def measure(seconds: float) -> dict[str, Any]:
    receiver = subprocess.Popen(
        [sys.executable, "-c", _RECEIVER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert receiver.stdout is not None and receiver.stdin is not None
    endpoint = receiver.stdout.readline().strip()
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env["OTEL_ROLLOUT_SIDECAR_LINGER"] = "0"
    runs: dict[str, list[dict[str, Any]]] = {}
    ratios: dict[str, list[float]] = {}
    lags: dict[int, list[float]] = {rate: [] for rate in RATES}

    try:
        for rate in RATES:
            # The log alone and the sidecar take slices in turn in one process (see one()):
            # they differ by a few points, which this VM's drift over minutes would swamp.
            for group in ("jsonl+sidecar", "inprocess"):
                print(f"  {group} at {rate:,} events/s", file=sys.stderr)
                receiver.stdin.write("reset\n")
                receiver.stdin.flush()
                with tempfile.TemporaryDirectory() as d:
                    command = [sys.executable, __file__, "--one", group, str(rate), str(seconds)]
                    out = subprocess.run(
                        [*command, endpoint, d], env=env, capture_output=True, text=True, check=True
                    )
                result = json.loads(out.stdout)
                for mode, mode_ratios in result["ratios_by_mode"].items():
                    runs[f"{mode}@{rate}"] = [result]
                    ratios[f"{mode}@{rate}"] = mode_ratios
                if "sidecar" in group:
                    receiver.stdin.write("lags\n")
                    receiver.stdin.flush()
                    lags[rate] += json.loads(receiver.stdout.readline())["lags"]
    finally:
        receiver.stdin.close()
        receiver.wait(30)
    return {"runs": runs, "ratios": ratios, "lags": lags}


_KILLED = """
import sys, time
sys.path.insert(0, sys.argv[2])
import with_otel
from otel_rollout.trace import RolloutTrace
trace = RolloutTrace(sys.argv[1])
events = with_otel.mixed_events(200_000)
start = time.perf_counter()
for i, (kind, fields) in enumerate(events):  # 5,000 events/s until killed
    while time.perf_counter() < start + i / 5000:
        time.sleep(0.0005)
    trace.emit(kind, **fields)
"""


def kill_spans(kills: int) -> list[float]:
    """Seconds from a SIGKILL of a trainer exporting through the sidecar (5,000 events/s,
    killed after 2 s) until the receiver holds a span for every attempt in the file."""
    import signal

    from otel_rollout.reader import read_events
    from otel_rollout.testing import OtlpReceiver

    ends = {"attempt.seal", "attempt.refuse", "attempt.abandon", "attempt.dispatch"}
    times = []
    for i in range(kills):
        with tempfile.TemporaryDirectory() as d, OtlpReceiver("grpc") as rx:
            path = Path(d) / "t.jsonl"
            env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
            env |= {"OTEL_EXPORTER_OTLP_ENDPOINT": rx.endpoint, "OTEL_ROLLOUT_SIDECAR_LINGER": "0"}
            child = subprocess.Popen([sys.executable, "-c", _KILLED, str(path), str(HERE)], env=env)
            time.sleep(3.0)  # the sidecar is up (about 1 s), then 2 s of events
            os.kill(child.pid, signal.SIGKILL)
            killed = time.monotonic()
            child.wait()
            attempts = {e["attempt_id"] for e in read_events(path) if e["event"] in ends}
            while time.monotonic() - killed < 30:
                got = {OtlpReceiver.attributes(s).get("rollout.attempt_id") for _, s in rx.spans()}
                if attempts <= got:
                    break
                time.sleep(0.01)
            times.append(time.monotonic() - killed)
            print(
                f"  kill {i + 1}/{kills}: {len(attempts)} attempts, all spans after "
                f"{times[-1]:.2f} s",
                file=sys.stderr,
            )
    return times


def median_ci(ratios: list[float], draws: int = 2000) -> tuple[float, float]:
    """A 95% bootstrap interval of the median of ``ratios`` (fixed seed: reruns agree)."""
    rng = random.Random(0)
    medians = sorted(statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(draws))
    return medians[int(draws * 0.025)], medians[int(draws * 0.975) - 1]


def summarize(raw: dict[str, Any]) -> dict[str, Any]:
    runs = raw["runs"]
    out: dict[str, Any] = {"share": {}, "sidecar": {}}
    for rate in RATES:
        out["share"][rate] = {
            mode: statistics.median(raw["ratios"][f"{mode}@{rate}"]) for mode in MODES
        }
        out.setdefault("spread", {})[rate] = {  # the middle half of the slices
            mode: tuple(statistics.quantiles(raw["ratios"][f"{mode}@{rate}"], n=4)[::2])
            for mode in MODES
        }
        out.setdefault("ci95", {})[rate] = {
            mode: median_ci(raw["ratios"][f"{mode}@{rate}"]) for mode in MODES
        }
        side = runs[f"sidecar@{rate}"]
        lag = sorted(raw["lags"][rate])
        out["sidecar"][rate] = {
            "cpu_share_of_a_core": statistics.median(r["sidecar_cpu"] for r in side),
            "peak_mb": max(r["sidecar_peak_mb"] for r in side),
            "lag_p50_ms": 1000 * lag[len(lag) // 2] if lag else None,
            "lag_p99_ms": 1000 * lag[int(len(lag) * 0.99)] if lag else None,
            "spans": len(lag),
            "close_wait_s": statistics.median(r["close_s"] for r in side),
        }
    return out


def table(s: dict[str, Any]) -> str:
    rows = [
        "| events/s | JSONL only | in-process export | sidecar export |",
        "|---:|---:|---:|---:|",
    ]
    for rate in RATES:
        share, ci = s["share"][rate], s["ci95"][rate]
        cells = [f"{share[m]:.1%} ({ci[m][0]:.1%}–{ci[m][1]:.1%})" for m in MODES]
        rows.append(f"| {rate:,} | " + " | ".join(cells) + " |")
    rows += [
        "",
        "| sidecar at | lag p50 | lag p99 | CPU (one core) | peak RSS | close waits |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for rate in RATES:
        c = s["sidecar"][rate]
        rows.append(
            f"| {rate:,}/s | {c['lag_p50_ms']:.0f} ms | {c['lag_p99_ms']:.0f} ms | "
            f"{c['cpu_share_of_a_core']:.0%} | {c['peak_mb']:.0f} MB | {c['close_wait_s']:.2f} s |"
        )
    return "\n".join(rows)


def figures(seconds: float, kills: int) -> dict[str, Any]:
    """Every figure of this benchmark: ``seconds`` of traced slices per mode and rate."""
    summary = summarize(measure(seconds))
    summary["kill_spans_s"] = kill_spans(kills)
    return summary


def report(summary: dict[str, Any]) -> str:
    k = summary["kill_spans_s"]
    return (
        f"{table(summary)}\n\nkill -9 at 5,000 events/s with sidecar export: a span for every "
        f"attempt in the file after {statistics.median(k):.2f} s (median of {len(k)}, at most "
        f"{max(k):.2f} s)"
    )


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--one":
        mode, rate, seconds, endpoint, tmp = sys.argv[2:7]
        print(json.dumps(one(mode, int(rate), float(seconds), endpoint, Path(tmp))))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="4 s of slices per mode and rate")
    parser.add_argument(
        "--seconds", type=float, default=40.0, help="seconds of traced slices per mode and rate"
    )
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    summary = figures(4.0 if args.quick else args.seconds, 2 if args.quick else 5)
    print(report(summary))
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
