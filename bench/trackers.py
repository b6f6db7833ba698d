"""What the experiment trackers cost a controller: throughput and the log's lag.

With TensorBoard, MLflow (a local sqlite store) and W&B (offline) all on, logged
from by the export sidecar, a Python controller's work per second as a share of
the same loop with no trace, at 1,000 and 10,000 events/s (the slices of
``controller.py``, the log alone measured in the same run as the yardstick);
and the p99 from emit to the line in the file at 10,000 events/s, with and
without trackers (``measure.latency``, tailed by another process).  The event mix
is ``with_otel.mixed_events``: a train.step every 77 events, so 130 steps/s at
10k events/s, far more rows than a real run's few steps a second.

    python bench/trackers.py [--quick] [--json out.json]   # or: bench/run.py --only trackers
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import controller  # noqa: E402
import measure  # noqa: E402
import with_otel  # noqa: E402

MODES = ("jsonl", "trackers")


#: Each tracker alone (``--each``), to see which one costs what.
EACH = {
    "tensorboard": "tensorboard:{tmp}/tb",
    "mlflow": "mlflow:sqlite:///{tmp}/m.db",
    "wandb": "wandb",
}


def throughput(
    seconds: float, rates: tuple[int, ...] = controller.RATES, specs: str | None = None
) -> dict[str, Any]:
    """Median share (and the middle half) of the no-trace loop, per mode and rate, with the
    sidecar's CPU while the trackers log."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "WANDB_", "MLFLOW_"))}
    env["OTEL_ROLLOUT_SIDECAR_LINGER"] = "0"
    if specs is not None:
        env["BENCH_TRACKERS"] = specs
    out: dict[str, Any] = {}
    for rate in rates:
        # One process, the log alone and the trackers taking slices in turn (controller.one):
        # this VM's speed drifts by several points over minutes, which separate runs of the
        # two modes measured as a difference between them.
        print(f"  the log alone and trackers on, in turn, at {rate:,} events/s", file=sys.stderr)
        with tempfile.TemporaryDirectory() as d:
            paired = "+".join(MODES)
            command = [sys.executable, str(HERE / "controller.py"), "--one", paired, str(rate)]
            done = subprocess.run(
                [*command, str(seconds), "unused", d],
                env=env,
                capture_output=True,
                text=True,
                check=True,
                cwd=d,
            )
            rows = _rows_logged(Path(d) / "trackers")
        result = json.loads(done.stdout)
        for mode in MODES:
            ratios = result["ratios_by_mode"][mode]
            out[f"{mode}@{rate}"] = {
                "share": statistics.median(ratios),
                "ci95": controller.median_ci(ratios),
                "sidecar_cpu": result.get("sidecar_cpu") if mode == "trackers" else None,
                "sidecar_peak_mb": result.get("sidecar_peak_mb") if mode == "trackers" else None,
                "close_s": result["close_s"],
                "tensorboard_steps": rows if mode == "trackers" else 0,
            }
    return out


def _rows_logged(tmp: Path) -> int:
    """Steps the TensorBoard event files hold (all three trackers get the same rows)."""
    tb = tmp / "tb"
    if not tb.exists():
        return 0
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    steps = 0
    for run in tb.iterdir():
        acc = EventAccumulator(str(run), size_guidance={"scalars": 0})
        acc.Reload()
        if "rollout/tokens_trained" in acc.Tags()["scalars"]:
            steps += len(acc.Scalars("rollout/tokens_trained"))
    return steps


@contextlib.contextmanager
def environ(**values: str) -> Iterator[None]:
    """``os.environ`` with ``values`` for the block only."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def per_step(rows: int = 500) -> dict[str, float]:
    """CPU time a step's row costs each tracker (ms; MLflow's queueing and its log_batch
    apart) and building the rows (µs an event), from the mixed events' first ``rows`` steps.
    W&B's figure is this process's only: its wandb-core process works besides."""
    from otel_rollout.trackers import RowBuilder
    from otel_rollout.trackers._sinks import MlflowSink, Spec, TensorBoardSink, WandbSink

    events = [{"t": 1.0 + i, "run_id": "bench", "event": kind, **fields}
              for i, (kind, fields) in enumerate(with_otel.mixed_events(rows * 77))]  # fmt: skip
    builder = RowBuilder()
    started = time.process_time()
    built = [r for i in range(0, len(events), 1000) for r in builder.feed(events[i : i + 1000])]
    out = {"rows_us_an_event": (time.process_time() - started) / len(events) * 1e6}
    built = built[:rows]

    def each(sink: Any) -> float:
        started = time.process_time()
        for _, step, values in built:
            sink.log(step, values)
        return (time.process_time() - started) / len(built) * 1e3

    with tempfile.TemporaryDirectory() as d, environ(
        WANDB_MODE="offline", WANDB_DIR=d, WANDB_SILENT="true", MLFLOW_EXPERIMENT_NAME="bench"
    ):
        tb = TensorBoardSink.make(Spec("tensorboard", f"{d}/tb"), "bench")
        out["tensorboard_ms_a_step"] = each(tb)
        tb.close()
        ml = MlflowSink.make(Spec("mlflow", f"sqlite:///{d}/m.db"), "bench")
        out["mlflow_queue_ms_a_step"] = each(ml)
        started = time.process_time()
        ml.close()
        out["mlflow_log_batch_ms_a_step"] = (time.process_time() - started) / len(built) * 1e3
        wb = WandbSink.make(Spec("wandb"), "bench")
        out["wandb_ms_a_step"] = each(wb)
        wb.close()
    return out


def lag(seconds: float) -> dict[str, Any]:
    """emit → line in the file, p50/p99 ms at 10,000 events/s, without and with trackers."""
    from otel_rollout.trace import RolloutTrace

    with tempfile.TemporaryDirectory() as d, environ(
        WANDB_MODE="offline", WANDB_DIR=d, WANDB_SILENT="true", OTEL_ROLLOUT_SIDECAR_LINGER="0"
    ):
        tmp = Path(d)
        specs = f"tensorboard:{tmp}/tb,mlflow:sqlite:///{tmp}/m.db,wandb"

        def with_trackers(path: Path) -> Any:
            trace = RolloutTrace(path, trackers=specs)
            time.sleep(2.0)  # the sidecar is up and its trackers opened: the steady state
            return trace

        makers = {"log only": RolloutTrace, "trackers on": with_trackers}
        events = with_otel.mixed_events(int(10_000 * seconds) + 100)
        waiting = measure.latency(tmp, 10_000, seconds, makers, events)
        busy = measure.latency(tmp, 10_000, seconds, makers, events, busy=True)
        return {
            **{f"{name}, waiting on I/O": v for name, v in waiting.items()},
            **{f"{name}, GIL kept busy": v for name, v in busy.items()},
        }


def figures(seconds: float) -> dict[str, Any]:
    return {"throughput": throughput(seconds), "lag_ms_10000": lag(max(seconds / 4, 1.0))}


def report(f: dict[str, Any]) -> str:
    rows = [
        "| events/s | log only | trackers on (sidecar) | sidecar CPU | steps in TensorBoard |",
        "|---:|---:|---:|---:|---:|",
    ]
    for rate in controller.RATES:
        log, on = f["throughput"][f"jsonl@{rate}"], f["throughput"][f"trackers@{rate}"]
        cells = [f"{r['share']:.1%} ({r['ci95'][0]:.1%}–{r['ci95'][1]:.1%})" for r in (log, on)]
        rows.append(
            f"| {rate:,} | {cells[0]} | {cells[1]} | {on['sidecar_cpu']:.0%} of a core | "
            f"{on['tensorboard_steps']:,} |"
        )
    rows += ["", "| at 10,000 events/s | emit→file p50 | p99 |", "|---|---:|---:|"]
    for name, (p50, p99) in f["lag_ms_10000"].items():
        rows.append(f"| {name} | {p50:.2f} ms | {p99:.2f} ms |")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 s of slices per mode and rate")
    parser.add_argument("--seconds", type=float, default=40.0, help="traced seconds per mode")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument(
        "--each", nargs="*", choices=sorted(EACH), help="each tracker alone at 10,000 events/s"
    )
    parser.add_argument(
        "--per-step", action="store_true", help="CPU a step's row costs each tracker, in process"
    )
    args = parser.parse_args()
    if args.per_step:
        for name, value in per_step().items():
            print(f"{name}: {value:.3g}")
        return
    seconds = 2.0 if args.quick else args.seconds
    if args.each is not None:
        chosen = args.each or sorted(EACH)
        each = {name: throughput(seconds, (10_000,), EACH[name]) for name in chosen}
        for name, r in each.items():
            log, on = r["jsonl@10000"], r["trackers@10000"]
            print(f"| {name} alone | {log['share']:.1%} | {on['share']:.1%} | "
                  f"{on['sidecar_cpu']:.0%} of a core |")  # fmt: skip
        if args.json:
            args.json.write_text(json.dumps(each, indent=2))
        return
    f = figures(seconds)
    print(report(f))
    if args.json:
        args.json.write_text(json.dumps(f, indent=2))


if __name__ == "__main__":
    main()
