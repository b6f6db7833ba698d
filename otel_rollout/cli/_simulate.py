"""``otel-rollout simulate`` and ``demo``: a simulated async-RL run against the real API."""

from __future__ import annotations

import argparse
import dataclasses
import math
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..simulate import SimConfig, SimStatus, simulate
from ..trace import ROLLOUT_TRACE_FILENAME
from ._batch_age import load_steps, write_table
from ._common import CliError

_DEFAULTS = SimConfig()


def add_parser(commands: Any) -> None:
    sim = commands.add_parser(
        "simulate",
        help="run a simulated async GRPO training run that writes a trace",
        description=(
            "Simulate an asynchronous GRPO run: a controller reserves and admits prompt groups, "
            "dispatches multi-turn attempts to a fake engine that generates tokens over time, "
            "refits the engine after every optimizer step while calls keep running, discards "
            "groups past the staleness limit, trains steps and publishes checkpoints. Every "
            "event goes through RolloutTrace into LOG_DIR/rollout_trace.jsonl; at the end the "
            "per-step batch age table is printed and checked against the live values. "
            "Spans and metrics follow the standard OTEL_* variables (see the README)."
        ),
    )
    _add_options(sim)
    sim.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an existing trace in LOG_DIR instead of refusing to run",
    )
    sim.set_defaults(handler=run_simulate)
    demo = commands.add_parser(
        "demo",
        help="the guided tour: simulate a run into a fresh directory and explain the output",
        description="Simulate a run into a fresh LOG_DIR (default runs/demo) and explain it.",
    )
    _add_options(demo, default_dir="runs/demo")
    demo.set_defaults(handler=run_demo)


def _add_options(parser: argparse.ArgumentParser, default_dir: str = "runs/sim") -> None:
    parser.add_argument(
        "--log-dir",
        type=Path,
        default=Path(default_dir),
        help=f"where to write (default {default_dir})",
    )
    for name, parse, text in _SIM_OPTIONS:
        default = getattr(_DEFAULTS, name)
        parser.add_argument(
            "--" + name.replace("_", "-"), type=parse, default=default, help=f"{text} ({default})"
        )
    parser.add_argument("--quiet", action="store_true", help="no progress display")
    parser.add_argument(
        "--hold",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="keep the trace and its metrics endpoint open this long after the run, "
        "so Prometheus scrapes the final values",
    )


def _non_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value


def _fraction(text: str) -> float:
    value = float(text)
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"must be in [0, 1), got {text}")
    return value


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _speed(text: str) -> float:
    value = float(text)
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
    return value


_SIM_OPTIONS: tuple[tuple[str, Callable[[str], Any], str], ...] = (
    ("steps", _positive, "optimizer steps"),
    ("groups_per_step", _positive, "groups per training batch"),
    ("group_size", _positive, "generations per prompt"),
    ("max_lag", _non_negative, "staleness limit: most updates a group may lag the trained version"),
    ("max_groups_in_flight", _positive, "admission capacity: groups reserved, not yet trained"),
    ("engine_slots", _positive, "concurrent engine calls"),
    ("checkpoint_every", _non_negative, "steps between checkpoints, 0 for none"),
    ("error_rate", _fraction, "share of attempts that fail and are retried"),
    ("seed", int, "random seed"),
    ("speed", _speed, "run this many times faster than real time"),
)


def _config(args: argparse.Namespace) -> SimConfig:
    names = {f.name for f in dataclasses.fields(SimConfig)}
    return dataclasses.replace(
        _DEFAULTS, **{k: v for k, v in vars(args).items() if k in names and v is not None}
    )


class _ProgressLine:
    """One status line on stderr: redrawn in place on a terminal, every few steps otherwise."""

    def __init__(self, total_steps: int, quiet: bool) -> None:
        self.total = total_steps
        self.quiet = quiet
        self.tty = sys.stderr.isatty()
        self.started = time.monotonic()
        self.every = max(1, total_steps // 6)

    def __call__(self, s: SimStatus) -> None:
        if self.quiet or (not self.tty and s.step % self.every and s.step != self.total):
            return
        age = "-" if s.last_batch_age is None else f"{s.last_batch_age:.3f}"
        line = (
            f"step {s.step:>4}/{self.total}  version {s.version:>4}  "
            f"groups in flight {s.groups_in_flight:>3}  attempts running {s.attempts_running:>3}  "
            f"tokens {s.tokens:>9,}  batch age {age:>6}  {time.monotonic() - self.started:5.1f}s"
        )
        sys.stderr.write(("\r" + line + "\033[K") if self.tty else line + "\n")
        sys.stderr.flush()

    def done(self) -> None:
        if self.tty and not self.quiet:
            sys.stderr.write("\n")


def _run(args: argparse.Namespace) -> int:
    config = _config(args)
    if config.groups_per_step > config.max_groups_in_flight:
        raise CliError(
            f"--groups-per-step {config.groups_per_step} can never be met with "
            f"--max-groups-in-flight {config.max_groups_in_flight}"
        )
    progress = _ProgressLine(config.steps, args.quiet)
    try:
        result = simulate(args.log_dir, config, on_progress=progress, hold=args.hold)
    except OSError as exc:
        raise CliError(f"cannot write to {args.log_dir}: {exc.strerror or exc}") from exc
    finally:
        progress.done()
    rows = load_steps(str(result.trace_path), progress=False)
    write_table(rows, sys.stdout)
    offline = {r.step: r.batch_age for r in rows if r.batch_age is not None}
    agree = offline.keys() == result.live_batch_age.keys() and all(
        offline[s] == result.live_batch_age[s] for s in offline
    )
    print(f"trace: {result.trace_path}  (run {result.run_id})")
    if not agree:
        print(
            "error: the live batch age differs from the one read back from the file",
            file=sys.stderr,
        )
        return 1
    print(f"live batch age equals the file's for all {len(offline)} steps")
    return 0


def run_simulate(args: argparse.Namespace) -> int:
    trace = args.log_dir / ROLLOUT_TRACE_FILENAME
    if trace.exists() and not args.overwrite:
        raise CliError(
            f"{trace} exists; pass --overwrite to replace it or choose another --log-dir"
        )
    if trace.exists():
        trace.unlink()
    return _run(args)


def run_demo(args: argparse.Namespace) -> int:
    if args.log_dir.exists():
        shutil.rmtree(args.log_dir / "checkpoints", ignore_errors=True)
        (args.log_dir / ROLLOUT_TRACE_FILENAME).unlink(missing_ok=True)
    print(
        "otel-rollout demo: a simulated async GRPO run. The controller logs every rollout\n"
        "event through RolloutTrace; the engine keeps generating while new weights are\n"
        "installed, so a call's tokens are split by the weight version that made them.\n"
        "Batch age = trained version - token-weighted version of the batch's tokens.\n"
    )
    return _run(args)
