"""What instrumentation costs a controller that does Python work: its lost throughput.

A controller loop does fixed units of pure-Python work and, paced by the
clock, emits a realistic mix of rollout events at a target rate.  The figure
is its work per second as a share of the same loop with no trace, for:

* ``jsonl``: the log only (the floor: what any trace costs);
* ``inprocess``: spans and metrics made on the trainer's background thread;
* ``sidecar``: spans and metrics made by the export sidecar from the log.

Both exports send spans and metrics over OTLP (gRPC) to a receiver in a
process of its own.  Every measurement is a fresh process.  This VM's speed
drifts by 20-30% over seconds, so each mode runs between two runs with no
trace and is compared with their mean; each figure is the median of those
ratios over the repetitions, with their range.  For the
sidecar, the lag from an event to its span at the receiver and the sidecar's
own CPU and peak memory are measured in the same runs.

    python bench/controller.py [--quick] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

MODES = ("none", "jsonl", "inprocess", "sidecar")
RATES = (1000, 10000)

_RECEIVER = """
import sys, time, orjson
from otel_rollout.testing import OtlpReceiver
receiver = OtlpReceiver("grpc", keep=False)
print(receiver.endpoint, flush=True)
for line in sys.stdin:  # "reset" clears the lags; "lags" prints them
    if line.strip() == "lags":
        out = {"spans": receiver.span_count, "lags": receiver.lags}
        print(orjson.dumps(out).decode(), flush=True)
    receiver.lags = []
"""


def work_unit() -> int:
    """A slice of controller-like Python work: dict and list churn, arithmetic (~10 us)."""
    total = 0
    rows = {}
    for i in range(60):
        rows[i] = (i * 7) % 13
        total += rows[i] * i
    return total


def one(mode: str, rate: int, seconds: float, endpoint: str, tmp: Path) -> dict[str, Any]:
    """Run the controller loop in this process; its work units and, for the sidecar, its costs."""
    import with_otel

    from otel_rollout.trace import RolloutTrace

    events = with_otel.mixed_events(int(rate * (seconds + 2)) + 100)
    trace: Any = None
    if mode == "jsonl":
        trace = RolloutTrace(tmp / "t.jsonl")
    elif mode in ("inprocess", "sidecar"):
        trace = RolloutTrace(tmp / "t.jsonl", endpoint=endpoint, metrics={"otlp"}, export_mode=mode)
    emit = trace.emit if trace is not None else None
    sidecar_pid = None
    if mode == "sidecar":  # steady state: the sidecar is up and following
        deadline = time.monotonic() + 30
        while trace._sidecar.sidecar_pid is None and time.monotonic() < deadline:
            time.sleep(0.01)
        sidecar_pid = trace._sidecar.sidecar_pid
    time.sleep(0.3)
    cpu0 = _cpu_seconds(sidecar_pid)
    units = emitted = 0
    start = time.perf_counter()
    end = start + seconds
    while (now := time.perf_counter()) < end:
        work_unit()
        units += 1
        due = int((now - start) * rate) - emitted
        if emit is not None:
            for kind, fields in events[emitted : emitted + due]:
                emit(kind, **fields)
        emitted += due
    elapsed = time.perf_counter() - start
    result: dict[str, Any] = {"units_per_s": units / elapsed, "events": emitted}
    if sidecar_pid is not None:
        result["sidecar_cpu"] = (_cpu_seconds(sidecar_pid) - cpu0) / elapsed
        result["sidecar_peak_mb"] = _peak_mb(sidecar_pid)
    if trace is not None:
        closing = time.perf_counter()
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


def measure(reps: int, seconds: float) -> dict[str, Any]:
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

    def run(mode: str, rate: int) -> dict[str, Any]:
        receiver.stdin.write("reset\n")
        receiver.stdin.flush()
        with tempfile.TemporaryDirectory() as d:
            command = [sys.executable, __file__, "--one", mode, str(rate), str(seconds)]
            out = subprocess.run(
                [*command, endpoint, d], env=env, capture_output=True, text=True, check=True
            )
        result = json.loads(out.stdout)
        runs.setdefault(f"{mode}@{rate}", []).append(result)
        if mode == "sidecar":
            receiver.stdin.write("lags\n")
            receiver.stdin.flush()
            lags[rate] += json.loads(receiver.stdout.readline())["lags"]
        return result

    try:
        for rep in range(reps):
            for rate in RATES:
                # Each mode between two runs with no trace: this VM's speed drifts by 20-30%
                # over seconds, so a mode is compared with the runs on either side of it.
                print(f"  rep {rep + 1}/{reps} at {rate:,} events/s", file=sys.stderr)
                before = run("none", rate)["units_per_s"]
                for mode in MODES[1:]:
                    units = run(mode, rate)["units_per_s"]
                    after = run("none", rate)["units_per_s"]
                    ratios.setdefault(f"{mode}@{rate}", []).append(units / ((before + after) / 2))
                    before = after
    finally:
        receiver.stdin.close()
        receiver.wait(30)
    return {"runs": runs, "ratios": ratios, "lags": lags}


def summarize(raw: dict[str, Any]) -> dict[str, Any]:
    runs = raw["runs"]
    out: dict[str, Any] = {"share": {}, "sidecar": {}}
    for rate in RATES:
        out["share"][rate] = {
            mode: statistics.median(raw["ratios"][f"{mode}@{rate}"]) for mode in MODES[1:]
        }
        out.setdefault("spread", {})[rate] = {
            mode: (min(raw["ratios"][f"{mode}@{rate}"]), max(raw["ratios"][f"{mode}@{rate}"]))
            for mode in MODES[1:]
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
        share, spread = s["share"][rate], s["spread"][rate]
        cells = [f"{share[m]:.1%} ({spread[m][0]:.0%}–{spread[m][1]:.0%})" for m in MODES[1:]]
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


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--one":
        mode, rate, seconds, endpoint, tmp = sys.argv[2:7]
        print(json.dumps(one(mode, int(rate), float(seconds), endpoint, Path(tmp))))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one repetition of 1 s")
    parser.add_argument("--reps", type=int, default=6, help="repetitions (default 6)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    raw = measure(1 if args.quick else args.reps, 1.0 if args.quick else 2.5)
    summary = summarize(raw)
    print(table(summary))
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
