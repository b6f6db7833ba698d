"""Experiment trackers: each training step's batch age and rollout counts, and each
restore's cost, logged into TensorBoard, MLflow and Weights & Biases.

Turned on by ``OTEL_ROLLOUT_TRACKERS`` (``tensorboard:DIR,mlflow[:URI],wandb``),
``otel_rollout.configure(trackers=…)`` or ``RolloutTrace(path, trackers=…)``.
Specs are logged from by the export sidecar, from the log; run objects of your
own (a ``SummaryWriter``, an MLflow run, a wandb run) by the training process's
background pipeline.  ``otel-rollout log-to SPEC FILE`` backfills a finished run.

* :mod:`._spec` — the one spec parser;
* :mod:`._rows` — events → rows (the batch-age code of the gauge and the file);
* :mod:`._hub` — the hub's thread and one worker thread per tracker;
* :mod:`._sinks` — TensorBoard, MLflow and W&B, each imported only when used.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

# Only the spec parser is imported with the package: ``config`` parses OTEL_ROLLOUT_TRACKERS
# with it, and the hub imports ``config`` (a cycle, were the hub imported here too).
from ._spec import (
    KINDS,
    MissingExtra,
    Spec,
    TrackerSpecError,
    missing_extra,
    parse_specs,
    wandb_login_missing,
)

if TYPE_CHECKING:
    from ._hub import TrackerHub, Worker
    from ._rows import RESTORE_METRICS, STEP_METRICS, RowBuilder

_LAZY = {"TrackerHub": "_hub", "Worker": "_hub", "RESTORE_METRICS": "_rows",
         "STEP_METRICS": "_rows", "RowBuilder": "_rows"}  # fmt: skip


def __getattr__(name: str) -> Any:
    """The hub's names, imported when first asked for."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


__all__ = [
    "KINDS",
    "RESTORE_METRICS",
    "STEP_METRICS",
    "MissingExtra",
    "RowBuilder",
    "Spec",
    "TrackerHub",
    "TrackerSpecError",
    "Worker",
    "hub_for",
    "missing_extra",
    "parse_specs",
    "split",
    "usable",
    "wandb_login_missing",
]


def split(trackers: Iterable[Any]) -> tuple[tuple[str, ...], tuple[Any, ...]]:
    """``(specs, run objects)``: text goes to the sidecar; objects cannot leave the process."""
    specs = tuple(t for t in trackers if isinstance(t, str))
    return specs, tuple(t for t in trackers if not isinstance(t, str))


def usable(specs: Iterable[str], warn: Any) -> list[Spec]:
    """The specs whose library is installed; ``warn(message)`` for each that is not."""
    kept = []
    for spec in parse_specs(list(specs)):
        problem = missing_extra(spec.kind)
        if problem is None:
            kept.append(spec)
        else:
            warn(f"otel-rollout: {problem}; {spec} is off")
    return kept


def hub_for(
    targets: Iterable[Any], path: Path | None, start: int | None = None
) -> TrackerHub | None:
    """A hub for the usable ``targets`` (specs, as text or :class:`Spec`, and run objects),
    fed the events of the log ``path`` from byte ``start`` (None: from its end now)."""
    import logging

    from ._hub import TrackerHub

    log = logging.getLogger("otel_rollout")
    from ._sinks import kind_of

    specs, objects = split(targets)
    chosen: list[Any] = usable(specs, log.error)
    for target in objects:  # one that is no tracker's run costs only itself
        try:
            kind_of(target)
        except TypeError as exc:
            log.error("otel-rollout: %s; it is off", exc)
        else:
            chosen.append(target)
    return TrackerHub(chosen, path, start=start) if chosen else None
