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

import msgspec

from .. import events
from ..constants import ROLLOUT_TRACE_FILENAME
from ..render.text import write_cost, write_steps
from ..simulate import CHECKPOINTS, SimConfig, SimStatus, latest_checkpoint, simulate
from . import _demo
from ._batch_age import load_steps
from ._common import CliError, at_least, non_negative_int, positive_int, seconds, trace_reader
from ._cost import load_report

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
            "Spans and metrics follow the standard OTEL_* variables (see the README): an "
            "export sidecar makes them from the log and stays OTEL_ROLLOUT_SIDECAR_LINGER "
            "seconds (30) after the run, for a resumed run to continue with."
        ),
    )
    _add_options(sim)
    sim.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an existing trace (and checkpoints) in LOG_DIR instead of refusing to run",
    )
    sim.add_argument(
        "--resume",
        action="store_true",
        help="continue a killed run: restore the latest checkpoint and rollout snapshot in "
        "LOG_DIR, resume partial attempts, re-train the steps after the checkpoint, and "
        "append to the same trace under a new run_id",
    )
    # The demo's own runs: they keep its mark on LOG_DIR (any other run takes it away).
    sim.add_argument("--for-demo", action="store_true", help=argparse.SUPPRESS)
    sim.set_defaults(handler=run_simulate)
    demo = commands.add_parser(
        "demo",
        help="the guided tour: simulate a run into a fresh directory and explain the output",
        description=(
            "Simulate a run into a fresh LOG_DIR (default runs/demo) as a child process, kill "
            "it with SIGKILL part-way (twice by default), resume it from its checkpoint and "
            "rollout snapshot each time, and show batch age per step and what the stops cost."
        ),
    )
    # Rollout snapshots ride on checkpoints; the demo takes them often, so a stop finds a
    # recent one and partial attempts are resumed rather than redone.
    _add_options(demo, default_dir="runs/demo", defaults={"checkpoint_every": 2})
    _demo.add_arguments(demo)
    demo.set_defaults(handler=run_demo)


def _add_options(
    parser: argparse.ArgumentParser,
    default_dir: str = "runs/sim",
    defaults: dict[str, Any] | None = None,
) -> None:
    """The simulator's options, each with its default (the simulator's, or ``defaults``')."""
    parser.add_argument(
        "--log-dir",
        type=Path,
        default=Path(default_dir),
        help=f"where to write (default {default_dir})",
    )
    for name, parse, text in _SIM_OPTIONS:
        default = (defaults or {}).get(name, getattr(_DEFAULTS, name))
        parser.add_argument(
            "--" + name.replace("_", "-"), type=parse, default=default, help=f"{text} ({default})"
        )
    parser.add_argument("--quiet", action="store_true", help="no progress display")
    parser.add_argument(
        "--hold",
        type=seconds,
        default=0.0,
        metavar="SECONDS",
        help="keep the trace and its metrics endpoint open this long after the run, "
        "so Prometheus scrapes the final values",
    )


def _fraction(text: str) -> float:
    value = float(text)
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"must be in [0, 1), got {text}")
    return value


def _speed(text: str) -> float:
    value = float(text)
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
    return value


#: The most of one thing a simulated run holds at once (a group of 10**20 generations took
#: memory without end).
_MOST_AT_ONCE = 100_000

_SIM_OPTIONS: tuple[tuple[str, Callable[[str], Any], str], ...] = (
    ("steps", positive_int, "optimizer steps"),
    ("groups_per_step", at_least(1, _MOST_AT_ONCE), "groups per training batch"),
    ("group_size", at_least(1, _MOST_AT_ONCE), "generations per prompt"),
    ("max_lag", non_negative_int, "staleness limit: most updates a group may lag the trained one"),
    (
        "max_groups_in_flight",
        at_least(1, _MOST_AT_ONCE),
        "admission capacity: groups reserved and not yet taken into a training batch",
    ),
    ("engine_slots", at_least(1, _MOST_AT_ONCE), "concurrent engine calls"),
    ("checkpoint_every", non_negative_int, "steps between checkpoints, 0 for none"),
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
            f"steps done {s.step:>4}/{self.total}  version {s.version:>4}  "
            f"groups in flight {s.groups_in_flight:>3}  attempts running {s.attempts_running:>3}  "
            f"tokens {s.tokens:>9,}  last step's batch age {age:>6}  "
            f"{time.monotonic() - self.started:5.1f}s"
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
        result = simulate(
            args.log_dir,
            config,
            on_progress=progress,
            hold=args.hold,
            resume=getattr(args, "resume", False),
        )
    except OSError as exc:
        raise CliError(f"cannot write to {args.log_dir}: {exc.strerror or exc}") from exc
    finally:
        progress.done()
    rows = load_steps(str(result.trace_path), progress=False)
    write_steps(rows, sys.stdout)
    offline = {r.step: r.batch_age for r in rows if r.batch_age is not None}
    live = result.live_batch_age  # this run's steps; earlier runs' steps are theirs
    agree = all(offline.get(step) == age for step, age in live.items())
    print(f"trace: {result.trace_path}  (run {result.run_id})")
    if not agree:
        print(
            "error: the live batch age differs from the one read back from the file",
            file=sys.stderr,
        )
        return 1
    print(f"live batch age equals the file's for all {len(live)} steps this run trained")
    return 0


def run_simulate(args: argparse.Namespace) -> int:
    trace = args.log_dir / ROLLOUT_TRACE_FILENAME
    if args.resume and args.overwrite:
        raise CliError("--resume continues the run in LOG_DIR; --overwrite would delete it")
    if trace.exists() and not (args.overwrite or args.resume):
        raise CliError(
            f"{trace} exists; pass --resume to continue it, --overwrite to replace it, "
            "or choose another --log-dir"
        )
    if args.resume:
        _check_resumable(trace, args.steps)
    if args.overwrite:
        _clear(args.log_dir)
    if not args.for_demo:  # a run of the user's own: the next demo must not replace it
        (args.log_dir / _DEMO_MARK).unlink(missing_ok=True)
    return _run(args)


def _check_resumable(trace: Path, steps: int) -> None:
    """Refuse a --resume with nothing to resume: no log, or a run that trained every step
    (resuming it would train the steps after its last checkpoint again, and cost would
    report a stop that never happened)."""
    if not trace.exists():
        raise CliError(f"nothing to resume: {trace} does not exist (start without --resume)")
    trained = load_steps(str(trace), progress=False, quiet=True)  # the run reads it again
    last = max((row.step for row in trained), default=None)
    if last is not None and last >= steps - 1:
        raise CliError(
            f"the run in {trace.parent} trained all {steps} steps (its last is step {last}): "
            "nothing to resume; give a larger --steps to train further, or --overwrite"
        )
    if latest_checkpoint(trace.parent) is None:
        quiet = trace_reader(trace, kinds={"checkpoint.publish"}, progress=False,
                             on_skip=lambda *_: None)  # fmt: skip
        published = [e["step"] for e in quiet]
        if published:
            raise CliError(
                f"the log published checkpoints (the last at step {published[-1]}), but "
                f"{trace.parent / CHECKPOINTS} holds none with its rollout snapshot: nothing "
                "to restore from (--overwrite starts again)"
            )
        print("(no checkpoint yet: the resumed run starts from step 0, appended to the log)",
              file=sys.stderr)  # fmt: skip


def _clear(log_dir: Path) -> None:
    """Remove a previous run: its trace, checkpoints and rollout snapshots."""
    (log_dir / ROLLOUT_TRACE_FILENAME).unlink(missing_ok=True)
    for sub in ("checkpoints", "rollouts"):
        shutil.rmtree(log_dir / sub, ignore_errors=True)


#: The file a demo leaves in its log directory: the next demo may replace what is there.
_DEMO_MARK = ".otel-rollout-demo"


def _replace_demo(log_dir: Path) -> None:
    """Clear a log directory for a demo: one a demo wrote, or one holding none of a run's
    files; a trace, checkpoints or snapshots the demo did not write are never deleted."""
    trace = log_dir / ROLLOUT_TRACE_FILENAME
    held = [p for p in (trace, log_dir / CHECKPOINTS, log_dir / "rollouts") if p.exists()]
    if held:
        if not (log_dir / _DEMO_MARK).exists() and not _demo_wrote(trace):
            raise CliError(
                f"{held[0]} exists and no demo wrote it: give the demo another --log-dir, "
                "or remove it (the demo replaces only a demo's own files)"
            )
        print(f"(replacing the demo already in {log_dir})", file=sys.stderr)
    _clear(log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    (log_dir / _DEMO_MARK).write_text("written by otel-rollout demo; the next demo replaces it\n")


def _demo_wrote(trace: Path) -> bool:
    """Whether a trace without the demo's mark is a demo's all the same (one written
    before demos left their mark): its first run's command line is the one the demo
    starts, ``simulate --log-dir DIR`` then every option of the simulator as
    ``--name=value`` in the demo's order (no one types that)."""
    try:
        with open(trace, "rb") as f:
            first = events.decode_plain(f.readline(65536))
    except (OSError, msgspec.DecodeError):
        return False
    argv = first.get("argv") if isinstance(first, dict) else None
    if not isinstance(argv, list) or argv[1:3] != ["simulate", "--log-dir"] or len(argv) < 4:
        return False
    options = [a for a in argv[4:] if a not in ("--quiet", "--for-demo")]
    names = [f"--{name.replace('_', '-')}=" for name, _, _ in _SIM_OPTIONS]
    return len(options) == len(names) and all(
        isinstance(a, str) and a.startswith(n) for a, n in zip(options, names, strict=True)
    )


def run_demo(args: argparse.Namespace) -> int:
    kills = args.kill_at
    if not kills:
        raise CliError("--kill-at names no step: give the steps to kill after, like 7,16")
    if kills[-1] >= args.steps - 1:
        # A kill after the last step finds the run finished; say so before it runs.
        raise CliError(
            f"--kill-at {','.join(map(str, kills))}: every kill must come before the last "
            f"step ({args.steps - 1} with --steps {args.steps}); lower --kill-at or raise --steps"
        )
    _replace_demo(args.log_dir)
    print(
        "otel-rollout demo: a simulated async GRPO run. The controller logs every rollout\n"
        "event through RolloutTrace; the engine keeps generating while new weights are\n"
        "installed, so a call's tokens are split by the weight version that made them.\n"
        "Batch age = trained version - token-weighted version of the batch's tokens.\n"
        f"The run is killed with SIGKILL after step{'s' * (len(args.kill_at) > 1)} "
        f"{', '.join(map(str, args.kill_at))} "
        "and resumed each time, from its latest checkpoint if it published one.\n",
        flush=True,
    )
    options = [
        f"--{name.replace('_', '-')}={getattr(args, name)}" for name, _, _ in _SIM_OPTIONS
    ] + (["--quiet"] if args.quiet else [])
    _demo.run_demo(args, options)
    trace = str(args.log_dir / ROLLOUT_TRACE_FILENAME)
    print("\nWhat the stops cost (otel-rollout cost " + trace + "):\n")
    write_cost(load_report(trace, progress=False), sys.stdout)
    return 0
