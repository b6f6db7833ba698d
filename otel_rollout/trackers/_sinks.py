"""Where rows go: one :class:`Sink` per tracker run, made by the tracker's own library.

Each library is imported only here, only when a tracker of its kind is used;
without it, :class:`~._spec.MissingExtra` names the extra to install.  A sink
made by otel-rollout (from a spec) is named after the trace's ``run_id`` and
closed with it; one around your own run object only logs into it (and flushes).
"""

from __future__ import annotations

import importlib
import itertools
import os
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from ._spec import KINDS, MissingExtra, Spec

__all__ = ["LOOKED_UP", "MLFLOW_BATCH", "Sink", "already_logged", "kind_of", "opener"]

#: Most metrics in one MLflow ``log_batch`` request (the tracking server's own limit).
MLFLOW_BATCH = 1000
DEFAULT_EXPERIMENT = "otel-rollout"


class Sink(Protocol):
    def log(self, step: int, values: Mapping[str, float]) -> None: ...
    def flush(self) -> None: ...
    def close(self) -> None: ...


def _import(kind: str, module: str | None = None) -> Any:
    name, extra, _ = KINDS[kind]
    try:
        return importlib.import_module(module or name)
    except ImportError as exc:
        raise MissingExtra(
            f"the {kind} tracker needs {name}: pip install 'otel-rollout[{extra}]' ({exc})"
        ) from None


#: Event files this process has made (each gets its own name; see TensorBoardSink.make).
_EVENT_FILES = itertools.count()


class TensorBoardSink:
    """Scalars into a ``SummaryWriter`` (tensorboardX's, or ``torch.utils.tensorboard``'s)."""

    def __init__(self, writer: Any, own: bool) -> None:
        self.writer, self.own = writer, own
        self._summary: Any = None
        if own:  # one event a step, not one per value: 16 add_scalar calls took 1.5 ms a step
            self._summary = _import("tensorboard", "tensorboardX.proto.summary_pb2").Summary
            self._file = writer._get_file_writer()

    @staticmethod
    def logged(spec: Spec, run_ids: Sequence[str]) -> list[str]:
        """Those of ``run_ids`` whose directory under the spec's already holds event files."""
        assert spec.target is not None
        root = Path(spec.target).expanduser()
        return [r for r in run_ids if any((root / r).glob("events.out.tfevents.*"))]

    @classmethod
    def make(cls, spec: Spec, run_id: str) -> TensorBoardSink:
        tbx = _import("tensorboard")
        assert spec.target is not None
        logdir = Path(spec.target).expanduser() / run_id
        # Event files are named by the second and the host alone: a second writer into the
        # run's directory in the same second (a log-to --again right after another) opened
        # the first one's file with "wb" and truncated it.  The pid and a count tell them apart.
        suffix = f".{os.getpid()}.{next(_EVENT_FILES)}"
        writer = tbx.SummaryWriter(logdir=str(logdir), flush_secs=1, filename_suffix=suffix)
        return cls(writer, own=True)

    def log(self, step: int, values: Mapping[str, float]) -> None:
        summary = self._summary
        if summary is not None:
            value = summary.Value
            self._file.add_summary(
                summary(value=[value(tag=k, simple_value=v) for k, v in values.items()]), step
            )
            return
        add = self.writer.add_scalar  # yours, as you have it (a subclass, torch's)
        for name, v in values.items():
            add(name, v, step)

    def flush(self) -> None:
        self.writer.flush()

    def close(self) -> None:
        (self.writer.close if self.own else self.writer.flush)()


class MlflowSink:
    """Metrics into an MLflow run, a ``log_batch`` per flush (not a request per value).

    Rows wait here until the flush: :attr:`waiting` of them, and :attr:`sent` so
    far, so that a row counts as logged only once MLflow took it, and rows of a
    failed request count as dropped.
    """

    def __init__(self, client: Any, run_id: str, own: bool) -> None:
        self.client, self.run_id, self.own = client, run_id, own
        self._metric = _import("mlflow", "mlflow.entities").Metric
        self._pending: list[list[Any]] = []  # each row's metrics
        self.sent = 0

    @property
    def waiting(self) -> int:
        return len(self._pending)

    @staticmethod
    def logged(spec: Spec, run_ids: Sequence[str]) -> list[str]:
        """Those of ``run_ids`` that already have a run in the experiment (by the
        ``otel_rollout.run_id`` tag every run otel-rollout makes carries)."""
        client = _import("mlflow", "mlflow.tracking").MlflowClient(tracking_uri=spec.target)
        name = os.environ.get("MLFLOW_EXPERIMENT_NAME") or DEFAULT_EXPERIMENT
        experiment = client.get_experiment_by_name(name)
        if experiment is None:
            return []
        found = []
        for run_id in run_ids:
            if "'" in run_id:  # no such run_id is quoted safely in a filter: not looked for
                continue
            runs = client.search_runs(
                [experiment.experiment_id],
                filter_string=f"tags.`otel_rollout.run_id` = '{run_id}'",
                max_results=1,
            )
            if runs:
                found.append(run_id)
        return found

    @classmethod
    def make(cls, spec: Spec, run_id: str) -> MlflowSink:
        client = _import("mlflow", "mlflow.tracking").MlflowClient(tracking_uri=spec.target)
        name = os.environ.get("MLFLOW_EXPERIMENT_NAME") or DEFAULT_EXPERIMENT
        experiment = client.get_experiment_by_name(name)
        if experiment is not None:
            experiment_id = experiment.experiment_id
        else:
            try:
                experiment_id = client.create_experiment(name)
            except Exception:  # made meanwhile by another process
                experiment_id = client.get_experiment_by_name(name).experiment_id
        tags = {"otel_rollout.run_id": run_id}
        run = client.create_run(experiment_id, run_name=run_id, tags=tags)
        return cls(client, run.info.run_id, own=True)

    def log(self, step: int, values: Mapping[str, float]) -> None:
        ms = int(time.time() * 1000)
        metric = self._metric
        self._pending.append([metric(name, value, ms, step) for name, value in values.items()])

    def flush(self) -> None:
        """Send every waiting row, whole rows to a request; a failed request's rows and
        those after it are not retried (the caller counts them as dropped)."""
        pending, self._pending = self._pending, []
        batch: list[Any] = []
        rows = 0
        for metrics in pending:
            if batch and len(batch) + len(metrics) > MLFLOW_BATCH:
                self.client.log_batch(self.run_id, metrics=batch)
                self.sent += rows
                batch, rows = [], 0
            batch += metrics
            rows += 1
        if batch:
            self.client.log_batch(self.run_id, metrics=batch)
            self.sent += rows

    def close(self) -> None:
        try:
            self.flush()
        finally:  # a run left RUNNING would look alive in MLflow's UI for ever
            if self.own:
                self.client.set_terminated(self.run_id)


class WandbSink:
    """History rows into a W&B run, against ``rollout/step`` (``restore/*`` too).

    Your own run keeps its step counter: a row is added to the step you are logging
    (``commit=False``), one row a step, as your next ``log`` commits it.  A row that
    comes while the one before still waits for your commit waits its turn here (two
    in one step would overwrite each other); any left at the trace's close are
    committed then.
    """

    def __init__(self, run: Any, own: bool) -> None:
        self.run, self.own = run, own
        self._waiting: deque[dict[str, float]] = deque()
        self._held_at: int | None = None  # the run's step our last row was added to
        run.define_metric("rollout/step", hidden=True)
        run.define_metric("rollout/*", step_metric="rollout/step")
        run.define_metric("restore/*", step_metric="rollout/step")

    @classmethod
    def make(cls, spec: Spec, run_id: str) -> WandbSink:
        wandb = _import("wandb")
        project = spec.target or os.environ.get("WANDB_PROJECT") or DEFAULT_EXPERIMENT
        settings = wandb.Settings(silent=True, console="off", x_disable_stats=True)
        run = wandb.init(project=project, name=run_id, reinit="create_new", settings=settings)
        return cls(run, own=True)

    def log(self, step: int, values: Mapping[str, float]) -> None:
        row = {**values, "rollout/step": step}
        if self.own:  # our run: the step is its own
            self.run.log(row, step=step)
        else:
            self._waiting.append(row)
            self._add()

    def _add(self) -> None:
        """Add the oldest waiting row to your run's current step, if none of ours is there."""
        if self._waiting:
            now = self.run.step
            if now != self._held_at:
                self.run.log(self._waiting.popleft(), commit=False)
                self._held_at = now

    def flush(self) -> None:
        if not self.own:
            self._add()  # wandb sends on its own process

    def close(self) -> None:
        if self.own:
            self.run.finish()
            return
        self._add()
        if self._waiting:  # the trace is over: commit the rest (your step moves past them)
            if self.run.step == self._held_at:
                self.run.log({}, commit=True)  # our row of this step, before the next
            while self._waiting:
                self.run.log(self._waiting.popleft())


def kind_of(target: Any) -> str:
    """Which tracker a spec or a run object of yours is (``TypeError`` if none)."""
    if isinstance(target, Spec):
        return target.kind
    module = type(target).__module__ or ""
    if hasattr(target, "add_scalar"):
        return "tensorboard"
    if module.startswith("mlflow") and hasattr(getattr(target, "info", None), "run_id"):
        return "mlflow"
    if module.startswith("wandb") and hasattr(target, "log") and hasattr(target, "define_metric"):
        return "wandb"
    raise TypeError(
        f"trackers: {type(target).__name__} is no tracker spec or run (pass 'tensorboard:DIR', "
        "'mlflow[:URI]', 'wandb', a SummaryWriter, an MLflow run or a wandb run)"
    )


_MAKERS: dict[str, Callable[[Spec, str], Sink]] = {
    "tensorboard": TensorBoardSink.make,
    "mlflow": MlflowSink.make,
    "wandb": WandbSink.make,
}


#: How each tracker whose runs can be looked up finds them (W&B's offline runs cannot).
_LOGGED: dict[str, Callable[[Spec, Sequence[str]], list[str]]] = {
    "tensorboard": TensorBoardSink.logged,
    "mlflow": MlflowSink.logged,
}
#: The trackers whose runs can be looked up.
LOOKED_UP = frozenset(_LOGGED)


def already_logged(spec: Spec, run_ids: Sequence[str]) -> list[str]:
    """Those of ``run_ids`` the tracker of ``spec`` already holds a run of (none for a
    tracker not in :data:`LOOKED_UP`)."""
    check = _LOGGED.get(spec.kind)
    return check(spec, run_ids) if check is not None else []


def opener(target: Any) -> Callable[[str], Sink]:
    """``open(run_id)`` → the sink for that run: a new tracker run for a spec, or the one
    sink around your own run object whatever the run_id (it follows one process)."""
    if isinstance(target, Spec):
        make = _MAKERS[target.kind]
        return lambda run_id: make(target, run_id)
    kind = kind_of(target)
    made: list[Sink] = []

    def one(run_id: str) -> Sink:  # made on the tracker's own thread, once: a slow
        if not made:  # MlflowClient() or define_metric never holds the caller
            if kind == "tensorboard":
                made.append(TensorBoardSink(target, own=False))
            elif kind == "mlflow":
                client = _import("mlflow", "mlflow.tracking").MlflowClient()
                made.append(MlflowSink(client, target.info.run_id, own=False))
            else:
                made.append(WandbSink(target, own=False))
        return made[0]

    return one
