"""Events → the rows a tracker logs: one per training step, one per restore.

A step's batch age and token-age shares come from
:class:`~otel_rollout.live_age.LiveBatchAge` (the code behind the Prometheus gauge
and ``batch_age_by_step``), so the three agree exactly.  A restore's row is
``cost``'s own :class:`~otel_rollout.cost.Boundary`, from a
:class:`~otel_rollout.cost.CostAnalysis` fed the same events as they come (as
``watch`` feeds it; the log is never read again), once the resumed run has
trained again the step the stopped run had reached (or when it ends, if
sooner); and again when it ends, if the work it redid since changed any
value, so that the last value of each ``restore/*`` metric is what ``cost``
reports.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..age import AGE_BUCKETS, StepAge
from ..analysis import Engine
from ..cost import CostAnalysis
from ..live_age import LiveBatchAge
from ..metric_values import indexable_step, metric_value
from ..reader import EventReader

__all__ = ["RESTORE_METRICS", "STEP_METRICS", "Row", "RowBuilder", "restore_values"]

_log = logging.getLogger("otel_rollout")

Row = tuple[str, int, dict[str, float]]  # (run_id, step, {metric: value})

_TOP = AGE_BUCKETS[-1]
SHARE_NAMES = {a: f"rollout/token_share_age{a}" for a in AGE_BUCKETS[:-1]} | {
    _TOP: f"rollout/token_share_age{_TOP}plus"
}

#: Counted per run, as the Prometheus counters are: each event kind → its row name.
_COUNTED = {
    "attempt.seal": "rollout/attempts_sealed",
    "attempt.refuse": "rollout/attempts_refused",
    "attempt.abandon": "rollout/attempts_abandoned",
    "group.seal": "rollout/groups_sealed",
    "group.discard": "rollout/groups_discarded",
}

#: Every metric of a step's row and what it is (README's table is this one).
STEP_METRICS: dict[str, str] = {
    "rollout/batch_age": "the step's batch age (absent when its groups carry no counts)",
    **{
        name: f"share of the step's tokens at age {a}{'+' if a == _TOP else ''}"
        for a, name in SHARE_NAMES.items()
    },
    "rollout/tokens_trained": "tokens the step trained (of groups with counts)",
    "rollout/groups_trained": "groups the step trained",
    "rollout/trained_version": "the policy version the step updated",
    **{name: f"{kind} events so far in the run" for kind, name in _COUNTED.items()},
    "rollout/refits": "weight syncs into the engine so far in the run",
    "rollout/refit_paused_calls": "running calls those refits paused",
    "rollout/trace_dropped": "trace events dropped so far in the run (trace.dropped)",
}

#: The restore row: cost's boundary fields (``otel-rollout cost --json``), numbers only.
RESTORE_METRICS: dict[str, str] = {
    "restore/downtime_s": "the old run's last event → the new run's first (seconds)",
    "restore/restored_step": "the step of the checkpoint restored",
    "restore/old_last_step": "the stopped run's last step",
    "restore/steps_retrained": "steps trained again",
    "restore/catch_up_s": "new run's start → trained the old run's last step again (seconds)",
    "restore/attempts_in_flight": "attempts running at the stop",
    "restore/groups_in_flight": "groups reserved and not sealed at the stop",
    "restore/sealed_groups_untrained": "groups sealed but not trained at the stop",
    "restore/tokens_at_risk": "tokens of finished attempts not yet trained at the stop",
    "restore/rollouts_interrupted": "rollouts running at the stop",
    "restore/resumed": "…of those, resumed from a snapshot",
    "restore/redispatched": "…dispatched again from scratch",
    "restore/never_ran_again": "…never run again",
    "restore/tokens_recovered": "tokens recovered from snapshots",
    "restore/tokens_regenerated": "tokens generated again",
    "restore/batch_age_before": "mean batch age of the last 5 steps before the stop",
    "restore/batch_age_after": "mean batch age of the first 5 steps after",
}


def restore_values(boundary: Any) -> dict[str, float]:
    """A :class:`~otel_rollout.cost.Boundary` as a row: the fields of :data:`RESTORE_METRICS`
    that have a value, as ``cost`` reports them."""
    values = {
        f"restore/{k}": float(metric_value(v))
        for k, v in boundary.report().items()
        if f"restore/{k}" in RESTORE_METRICS and isinstance(v, (int, float))
    }
    restored = boundary.restored_checkpoint
    if restored is not None and isinstance(restored.get("step"), int):
        values["restore/restored_step"] = float(metric_value(restored["step"]))
    return values


def step_values(row: StepAge, counts: dict[str, float]) -> dict[str, float]:
    """A step's row: :class:`StepAge`'s numbers and the run's counts so far."""
    values: dict[str, float] = {}
    if row.batch_age is not None:
        values["rollout/batch_age"] = row.batch_age
    if row.tokens:
        for age, name in SHARE_NAMES.items():
            values[name] = row.share(age)
    values["rollout/tokens_trained"] = float(metric_value(row.tokens))
    values["rollout/groups_trained"] = float(row.groups)
    values["rollout/trained_version"] = float(metric_value(row.trained_version))
    values.update(counts)
    return values


#: What a step's row leaves out once events of its run were dropped.
_AGE_METRICS = frozenset({"rollout/batch_age", "rollout/tokens_trained", *SHARE_NAMES.values()})

_COUNTS_NAMES = (*_COUNTED.values(), "rollout/refits", "rollout/refit_paused_calls",
                 "rollout/trace_dropped")  # fmt: skip


@dataclass
class _Run:
    counts: dict[str, float] = field(default_factory=lambda: dict.fromkeys(_COUNTS_NAMES, 0.0))
    last_step: int | None = None
    restore: _Pending | None = None
    logged: dict[str, float] | None = None  # the restore row logged when it caught up
    blind: bool = False  # events of the run were dropped: its batch age is not known


@dataclass
class _Pending:
    """A restore whose row is not logged yet: due at ``due_step`` (the old run's last)."""

    restored_step: int | None
    due_step: int | None = None


#: Kinds that change no row: passed over at the cost of one set lookup.
_PASSED = frozenset({"attempt.dispatch", "attempt.resume", "group.reserve", "group.admit",
                     "run.start"})  # fmt: skip


class RowBuilder:
    """Rows from events (in file order; one run's or many), for every tracker alike.

    One builder follows a whole file, as the sidecar's gauge does: a resumed run
    trains groups that a run before it sealed.  ``path`` is the log and ``start``
    the byte where the events fed begin (None: where the log ends now, as a
    training process's own do): the runs before it are read once, on the first
    feed, into cost's pass, for the boundary before the first run fed.
    """

    def __init__(self, path: Path | None = None, start: int | None = 0) -> None:
        self._live = LiveBatchAge()
        self._runs: dict[str, _Run] = {}
        #: Steps logged without batch age and restore rows withheld, after dropped events.
        self.withheld = 0
        #: Rows at a step number past int64, which no tracker can take as its step.
        self.unindexable = 0
        self._cost = CostAnalysis()
        self._engine = Engine([self._cost], _quiet, in_memory=True)
        self._prime: tuple[Path, int] | None = None
        if path is not None and start != 0:
            with contextlib.suppress(OSError):  # no log yet: nothing before these events
                self._prime = (path, path.stat().st_size if start is None else start)

    def _read_prime(self) -> None:
        """The runs the log held when this builder was made, read once into cost's pass."""
        assert self._prime is not None
        path, size = self._prime
        self._prime = None
        reader = EventReader(path, typed=True, end=size, on_skip=lambda line, why: None)
        try:
            self._engine.feed(reader.numbered_batches())
        except OSError:  # an unreadable log costs its earlier runs' restore rows, nothing else
            _log.exception("otel-rollout: trackers: cannot read %s for the restore", path)

    def _run(self, run_id: str) -> _Run:
        run = self._runs.get(run_id)
        if run is None:
            run = self._runs[run_id] = _Run()
        return run

    def feed(self, events: Sequence[dict[str, Any]]) -> list[Row]:
        """The rows ``events`` complete (a step's, and a restore's that falls due)."""
        if self._prime is not None:
            self._read_prime()
        self._engine.feed_events(events)  # the whole batch first: a restore's boundary too
        rows: list[Row] = []
        passed, counted, live = _PASSED, _COUNTED, self._live
        family = self._engine.state.family  # a forked child's run → its parent's (the pass's)
        for event in events:
            kind = event.get("event")
            if kind.__class__ is not str or kind in passed:  # a list is no kind (nor hashable)
                continue
            run_id = event.get("run_id")
            if run_id.__class__ is not str:
                continue
            run_id = family.get(run_id, run_id)
            run = self._run(run_id)
            try:
                name = counted.get(kind)
                if name is not None:
                    run.counts[name] += 1
                step = live.observe(event)
                if step is not None:
                    run.last_step = step.step
                    values = step_values(step, dict(run.counts))
                    if run.blind:  # seals it needs may have been dropped: no wrong value
                        self.withheld += 1
                        values = {k: v for k, v in values.items() if k not in _AGE_METRICS}
                    rows.append((run_id, step.step, values))
                    pending = run.restore
                    due = pending.due_step if pending is not None else None
                    if pending is not None and (due is None or step.step >= due):
                        rows += self._settle(run_id, step.step)
                elif kind == "weights.sync":
                    run.counts["rollout/refits"] += 1
                    run.counts["rollout/refit_paused_calls"] += len(event.get("cuts") or ())
                elif kind == "trace.dropped":
                    dropped = int(event.get("count", 0))
                    run.counts["rollout/trace_dropped"] += float(metric_value(dropped))
                elif kind == "checkpoint.restore":
                    self._restored(run_id, event.get("step"))
            except (LookupError, TypeError, ValueError):
                continue  # a field missing or mistyped: it changes no row (validate says why)
        return self._indexable(rows)

    def _indexable(self, rows: list[Row]) -> list[Row]:
        """``rows`` but those at a step no tracker can take (past int64), counted."""
        kept = [row for row in rows if indexable_step(row[1])]
        if len(kept) != len(rows):
            if not self.unindexable:
                _log.warning(
                    "otel-rollout: trackers: step %d is past what a tracker's step holds "
                    "(2**63 - 1): its row, and any such, is not logged",
                    next(row[1] for row in rows if not indexable_step(row[1])),
                )
            self.unindexable += len(rows) - len(kept)
        return kept

    def lost_events(self, run_ids: Iterable[Any]) -> None:
        """Events of ``run_ids`` were dropped: from now on their steps carry no batch age
        (nor token shares), and no restore row is logged for them (cost missed events)."""
        for run_id in run_ids:
            if isinstance(run_id, str):
                run = self._run(run_id)
                run.blind = True
                run.restore = run.logged = None

    def end_run(self, run_id: str) -> list[Row]:
        """A run is over: its restore row, if still owed, or changed since it was logged (the
        rollouts it dispatched again after catching up): then cost's final values."""
        run = self._runs.pop(run_id, None)
        if run is None or (run.restore is None and run.logged is None):
            return []
        restored = run.restore.restored_step if run.restore is not None else None
        step = run.last_step if run.last_step is not None else restored
        boundary = self._boundary(run_id)
        if boundary is None:
            return []
        values = restore_values(boundary)
        if values == run.logged:
            return []
        return self._indexable([(run_id, step if step is not None else 0, values)])

    def end_all(self) -> list[Row]:
        return [row for run_id in list(self._runs) for row in self.end_run(run_id)]

    # Restores.

    def _restored(self, run_id: str, step: Any) -> None:
        if self._runs[run_id].blind:
            self.withheld += 1
            return
        boundary = self._boundary(run_id)
        if boundary is None:
            return  # the file's first run: restored from elsewhere, no stop in this log
        self._runs[run_id].restore = _Pending(
            step if isinstance(step, int) else None, boundary.old_last_step
        )

    def _settle(self, run_id: str, step: int) -> list[Row]:
        run = self._runs[run_id]
        run.restore = None
        boundary = self._boundary(run_id)
        if boundary is None:
            return []
        run.logged = restore_values(boundary)
        return [(run_id, step, run.logged)]

    def _boundary(self, run_id: str) -> Any:
        """cost's boundary before ``run_id``, from the events so far (None if none)."""
        if len(self._engine.state.runs) < 2:
            return None  # no stop yet: the ledger's pass is not worth making
        report = self._cost.result()
        return next((b for b in report.boundaries if b.new_run == run_id), None)


def _quiet(where: Any, message: str) -> None:
    """The log's problems are validate's to report, not the trackers'."""


def runs_in(rows: Iterable[Row]) -> list[str]:
    return list(dict.fromkeys(run_id for run_id, _, _ in rows))
