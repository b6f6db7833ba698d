"""``otel-rollout log-to SPEC FILE``: backfill a finished (or crashed) run's trace into an
experiment tracker, through the same exporter a live run uses."""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from pathlib import Path
from typing import Any

from ..render.words import counted
from ._common import CliError, checked_batches, some_seconds, trace_argument, trace_reader


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "log-to",
        help="log a trace file's batch age per step, rollout counts and restore costs into "
        "TensorBoard, MLflow or Weights & Biases (one tracker run per run in the file)",
        description=(
            "Read a finished or crashed run's trace file and log, for each training step at "
            "its step number, the batch age, token-age shares, tokens trained and the rollout "
            "counts; and for each restore, what the stop cost (as 'otel-rollout cost' reports "
            "it). Every run in the file becomes a tracker run of its own, named after its "
            "run_id. The same exporter a live run's sidecar uses, so the values are the ones "
            "it would have logged."
        ),
        epilog=(
            "SPEC is comma-separated: tensorboard:DIR (event files in DIR/RUN_ID), "
            "mlflow[:TRACKING_URI] (experiment MLFLOW_EXPERIMENT_NAME, default otel-rollout), "
            "wandb[:PROJECT] (WANDB_PROJECT, WANDB_MODE and the rest apply). Each needs its "
            "extra: pip install 'otel-rollout[tensorboard]', '[mlflow]' or '[wandb]'."
        ),
    )
    parser.add_argument(
        "spec",
        help="where to log: tensorboard:DIR, mlflow[:URI] or wandb[:PROJECT] (comma-separated)",
    )
    parser.add_argument(
        "file", type=trace_argument, help="a rollout_trace.jsonl (or .jsonl.gz), or its directory"
    )
    parser.add_argument(
        "--again",
        action="store_true",
        help="log runs the tracker already holds a run of too (by default they are left "
        "out: a second copy doubles every series)",
    )
    parser.add_argument(
        "--timeout",
        type=some_seconds,
        default=120.0,
        metavar="SECONDS",
        help="most seconds to wait for the trackers: for room while reading (a batch not "
        "taken in time is dropped, counted), and to finish after the file is read (120)",
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from ..trackers import TrackerSpecError, missing_extra, parse_specs

    try:
        specs = parse_specs(args.spec)
    except TrackerSpecError as exc:
        raise CliError(str(exc)) from None
    if not specs:
        raise CliError("no tracker named: pass tensorboard:DIR, mlflow[:URI] or wandb")
    for spec in specs:
        problem = missing_extra(spec.kind)
        if problem is not None:
            raise CliError(problem)
        target = Path(spec.target) if spec.kind == "tensorboard" and spec.target else None
        if target is not None and target.exists() and not target.is_dir():
            raise CliError(f"{spec}: {target} is not a directory")  # each run would fail alone
    with _one_at_a_time(specs):
        return _log(args, specs)


def _log(args: argparse.Namespace, specs: Sequence[Any]) -> int:
    from ..trackers import TrackerHub

    held = [] if args.again else _held_runs(specs, args.file, args.timeout)
    reader = trace_reader(args.file, validate=True)
    hub = TrackerHub(list(specs), reader.path, backfill=True, wait=args.timeout, start=0, held=held)
    started = time.monotonic()
    events = 0
    runs: dict[str, None] = {}
    for batch in checked_batches(reader):
        hub.export(batch)
        for event in batch:
            runs.setdefault(event.get("run_id"))
        events += len(batch)
    # Every run's tracker run stays open to the end: a forked child's lines may interleave.
    print(f"read {counted(events, 'event')}; waiting for the trackers to finish…", file=sys.stderr)
    hub.close(args.timeout)
    counts = hub.counts()
    print(
        f"{args.file}: {events:,} events from {counted(len(runs), 'run')} → "
        f"{counted(hub.rows, 'row')} in {time.monotonic() - started:.1f}s; "
        + "; ".join(_tracker_summary(worker) for worker in hub.workers),
        file=sys.stderr,
    )
    failed = (counts["tracker_errors"] + counts["tracker_rows_dropped"]
              + counts["trackers_hung"] + counts["tracker_events_dropped"])  # fmt: skip
    if failed:
        raise CliError(
            f"{counts['tracker_errors']} tracker calls failed, "
            f"{counts['tracker_rows_dropped']} rows not logged, "
            f"{counts['tracker_events_dropped']} events not read in time "
            "(see the messages above)",
            exit_code=1,
        )
    return 0


def _tracker_summary(worker: Any) -> str:
    """What one tracker took: the rows logged, and any failed, dropped or left out."""
    said = [f"{worker.logged:,} logged"]
    if worker.failed:
        said.append(f"{counted(worker.failed, 'call')} failed")
    if worker.dropped:
        said.append(f"{worker.dropped:,} not logged")
    if worker.hung:
        said.append("hung")
    if worker.held:
        said.append(f"{counted(len(worker.held), 'run')} it already held left out")
    return f"{worker.name}: " + ", ".join(said)


@contextlib.contextmanager
def _one_at_a_time(specs: Sequence[Any]) -> Iterator[None]:
    """Hold, for the whole command, a lock per tracker whose runs are looked up: a second
    ``log-to`` into the same tracker, started meanwhile (on this machine), waits for this
    one and then finds its runs held, instead of both finding none and logging every run
    twice.  The locks are ``flock``s on files in the temporary directory, taken in one
    order (no deadlock), released by the kernel however the process ends."""
    try:
        import fcntl
    except ImportError:  # no flock (Windows): each log-to looks up alone, as before
        yield
        return
    from ..trackers._sinks import LOOKED_UP

    keys = {_lock_key(spec): spec for spec in specs if spec.kind in LOOKED_UP}
    with contextlib.ExitStack() as held:
        for key, spec in sorted(keys.items()):
            name = hashlib.sha256(key.encode()).hexdigest()[:20]
            path = os.path.join(tempfile.gettempdir(), f"otel-rollout-log-to-{name}.lock")
            fd, writable = _open_lock(path)
            if fd is None:  # no lock to be had (a read-only /tmp, another user's 0600 file)
                print(f"cannot lock {path}: a log-to into {spec} started meanwhile could "
                      "log its runs too", file=sys.stderr)  # fmt: skip
                continue
            held.callback(os.close, fd)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                who = os.pread(fd, 32, 0).decode(errors="replace").strip() if writable else ""
                whose = f"pid {who}" if who else "in another process"
                print(
                    f"waiting for another log-to into {spec} ({whose}) to finish "
                    "(Ctrl-C stops waiting)…",
                    file=sys.stderr,
                )
                fcntl.flock(fd, fcntl.LOCK_EX)
            if writable:
                with contextlib.suppress(OSError):
                    os.ftruncate(fd, 0)
                    os.pwrite(fd, str(os.getpid()).encode(), 0)
        yield


def _open_lock(path: str) -> tuple[int | None, bool]:
    """The lock file open for writing (it then holds the holder's pid), or for reading
    (another user's file can still be locked), or None."""
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT, 0o666), True
    except OSError:
        try:
            return os.open(path, os.O_RDONLY), False
        except OSError:
            return None, False


def _lock_key(spec: Any) -> str:
    """What two specs name the same store by (a TensorBoard directory is absolute already;
    ``mlflow`` alone is the tracking URI of the environment)."""
    target = spec.target
    if spec.kind == "mlflow" and target is None:
        target = os.environ.get("MLFLOW_TRACKING_URI", "mlruns")
    return f"{spec.kind}:{target}"


def _held_runs(specs: Sequence[Any], path: str, timeout: float) -> list[list[str]]:
    """For each spec, the file's runs its tracker already holds (a second log-to, or a
    backfill of a run whose trackers were on), said on stderr: they are left out, since a
    second copy would double every series; the file's other runs (a resumed one, say) are
    logged.  A store that gives no answer within ``timeout`` seconds is an error (an MLflow
    server that accepts and never answers held the command for its client's ~10 minutes of
    retries)."""
    from ..trackers._sinks import LOOKED_UP, already_logged

    looked_up = [spec for spec in specs if spec.kind in LOOKED_UP]
    if not looked_up:
        return []
    # Its run IDs, quietly: the read that logs the file warns about its bad lines.
    starts = trace_reader(path, kinds={"run.start"}, progress=False, on_skip=lambda *_: None)
    run_ids = list(dict.fromkeys(str(e["run_id"]) for e in starts))
    held: list[list[str]] = []
    for spec in specs:
        logged = _within(timeout, spec, partial(already_logged, spec, run_ids))
        held.append(logged)
        if logged:
            more = f" and {len(logged) - 3} more" if len(logged) > 3 else ""
            shown = ", ".join(logged[:3]) + more
            print(
                f"{spec} already holds {counted(len(logged), 'run')} of this file ({shown}): "
                "not logged again (a second copy doubles every series; --again logs them)",
                file=sys.stderr,
            )
    return held


def _within(timeout: float, spec: Any, look: Callable[[], list[str]]) -> list[str]:
    """``look()`` on a thread of its own, waited for ``timeout`` seconds (a daemon: one
    stuck in a store's retries does not hold the exit)."""
    answer: list[Any] = []

    def run() -> None:
        try:
            answer.append(look())
        except Exception as exc:  # the store cannot be read: logging would fail too
            answer.append(exc)

    thread = threading.Thread(target=run, name="otel-rollout-lookup", daemon=True)
    thread.start()
    thread.join(timeout)
    if not answer:
        raise CliError(
            f"no answer from {spec} in {timeout:g} s while looking for the runs it already "
            "holds (--timeout waits longer; --again logs without looking)"
        )
    if isinstance(answer[0], Exception):
        raise CliError(f"cannot look into {spec}: {answer[0]}")
    found: list[str] = answer[0]
    return found
