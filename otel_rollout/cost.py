"""What each stop and restore cost, read from a trace file in one streaming pass.

A *boundary* is where one run stopped and the run that resumed into the same
file began.  For each boundary the analysis reports the downtime, the old
run's last step and checkpoint, the work in flight at the stop, what the new
run did with the interrupted rollouts (matched by ``epoch``, ``prompt_id``,
``generation_index``: resumed from a snapshot, re-dispatched from scratch, or
never run again), the steps trained again and how long the new run took to
get back, and batch age before and after.  A whole-file summary adds where
generated tokens went: a ledger that puts every logged token in exactly one
bucket.  Memory is the work in flight, the steps kept for the before/after
windows and one small record per group and per step, not the file.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from .analysis import Analysis, OnWarning, Stop, run_events, run_file
from .analysis.state import Key
from .ledger import LOST_AT_STOP, PENDING, ROLLED_BACK, TRAINED, GroupFates, Ledger, add
from .reader import EventReader, Progress

__all__ = ["LOST_AT_STOP", "PENDING", "ROLLED_BACK", "TRAINED", "Boundary", "CostAnalysis",
           "CostReport", "GroupFates", "analyze", "analyze_file"]  # fmt: skip


@dataclass
class Boundary:
    """One stop (the end of ``old_run``) and the restore that followed (``new_run``)."""

    old_run: str
    new_run: str
    stopped_at: float
    resumed_at: float
    downtime_s: float
    old_last_step: int | None
    old_last_checkpoint: dict[str, Any] | None
    restored_checkpoint: dict[str, Any] | None = None
    attempts_in_flight: int = 0
    groups_in_flight: int = 0
    sealed_groups_untrained: int = 0
    tokens_at_risk: int = 0
    rollouts_interrupted: int = 0
    resumed: int = 0
    redispatched: int = 0
    never_ran_again: int = 0
    rollouts_at_risk: int = 0
    at_risk_kept: int = 0
    at_risk_resumed: int = 0
    at_risk_redispatched: int = 0
    at_risk_never_ran_again: int = 0
    tokens_recovered: int = 0
    tokens_regenerated: int = 0
    steps_retrained: int = 0
    catch_up_s: float | None = None
    batch_age_before: float | None = None
    batch_age_after: float | None = None
    # working state, not reported
    _interrupted: set[Key] = field(default_factory=set, repr=False)  # running at the stop
    _at_risk: set[Key] = field(default_factory=set, repr=False)  # sealed, group not trained
    _fate: dict[Key, str] = field(default_factory=dict, repr=False)
    _at_risk_groups: dict[str, list[Key]] = field(default_factory=dict, repr=False)
    _after: list[float] = field(default_factory=list, repr=False)

    def report(self) -> dict[str, Any]:
        """The boundary as plain data (``--json``)."""
        return {k: v for k, v in asdict(self).items() if not k.startswith("_")}


@dataclass
class CostReport:
    """Every boundary and a whole-file ledger of where generated tokens went.

    The ledger puts every logged token (of a sealed or abandoned attempt) in
    exactly one bucket, so ``tokens_generated == tokens_trained +
    sum(waste.values()) + tokens_pending`` always.
    """

    runs: list[str] = field(default_factory=list)
    boundaries: list[Boundary] = field(default_factory=list)
    tokens_generated: int = 0
    tokens_trained: int = 0
    tokens_pending: int = 0
    steps: int = 0
    waste: dict[str, int] = field(default_factory=dict)
    refused_attempts: int = 0

    @property
    def ledger(self) -> dict[str, Any]:
        """``{"generated", "trained", "wasted": {cause: n}, "pending"}``: they balance."""
        return {
            "generated": self.tokens_generated,
            "trained": self.tokens_trained,
            "wasted": dict(sorted(self.waste.items())),
            "pending": self.tokens_pending,
        }

    def report(self) -> dict[str, Any]:
        return {
            "runs": self.runs,
            "boundaries": [b.report() for b in self.boundaries],
            "ledger": self.ledger,
            "summary": {
                "steps": self.steps,
                "tokens_generated": self.tokens_generated,
                "tokens_trained": self.tokens_trained,
                "tokens_pending": self.tokens_pending,
                "tokens_wasted_by_cause": dict(sorted(self.waste.items())),
                "refused_attempts": self.refused_attempts,
            },
        }


class CostAnalysis(Analysis):
    """Every stop and restore, and the token ledger (an analysis of the one pass)."""

    kinds = None  # nearly every kind

    def __init__(self, window: int = 5) -> None:
        self.window = window
        self.report = CostReport()
        self.ledger = Ledger()
        self.generated = 0  # abandoned attempts' tokens (the state counts the sealed ones)
        self.abandoned: dict[str, int] = {}  # wasted tokens by "abandoned: reason"
        self.recent: deque[float] = deque(maxlen=window)  # the current run's last ages
        # The boundary whose new run is running: only the run that directly follows is matched.
        self.watching: Boundary | None = None
        self.unmatched: set[Key] = set()  # its rollouts that have not run again yet
        self.regenerating: set[Key] = set()  # its rollouts re-dispatched from scratch
        self._carried = 0  # the shared state's carried lots taken into the ledger so far

    def hot_keys(self) -> Mapping[str, Collection[Key]]:
        # A dispatch matters only as an interrupted rollout running again; a seal in flight,
        # only as one regenerating (the state counts its tokens); a reservation, only of a
        # group in flight (the compiled path leaves those to the handlers).
        return {"attempt.dispatch": self.unmatched, "attempt.seal": self.regenerating,
                "group.reserve": ()}  # fmt: skip

    def handlers(self) -> Mapping[str, Callable[[Any], None]]:
        return {
            "attempt.dispatch": self._dispatch,
            "attempt.resume": self._resume,
            "attempt.seal": self._attempt_seal,
            "attempt.refuse": self._refuse,
            "attempt.abandon": self._abandon,
            "group.reserve": self._group_reserve,
            "group.discard": self._group_discard,
            "train.step": self._train_step,
            "checkpoint.restore": self._checkpoint_restore,
        }

    def stop(self, stop: Stop) -> None:
        old = stop.old
        b = Boundary(
            old_run=old.run_id,
            new_run=stop.new.run_id,
            stopped_at=old.last_t,
            resumed_at=stop.new.first_t,
            downtime_s=stop.new.first_t - old.last_t,
            old_last_step=old.last_step,
            old_last_checkpoint=old.last_checkpoint,
            batch_age_before=_mean(self.recent),
        )
        self.recent = deque(maxlen=self.window)
        b._interrupted.update(attempt[1] for attempt in stop.attempts)
        b.attempts_in_flight = len(b._interrupted)
        for group_id, group in stop.groups.items():
            if group.sealed_tokens is None:
                b.groups_in_flight += 1
            else:
                b.sealed_groups_untrained += 1
            b._at_risk.update(group.attempts)
            b._at_risk_groups[group_id] = list(group.attempts)
            b.tokens_at_risk += sum(group.attempts.values())
        b.rollouts_interrupted = len(b._interrupted)
        self.report.boundaries.append(b)
        self.watching = b
        # Changed in place, not replaced: the pass's compiled path holds them (hot_keys).
        self.unmatched.clear()
        self.unmatched.update(b._interrupted, b._at_risk)
        self.regenerating.clear()

    # Handlers: the shared state is as it was before the event.

    def _ran_again(self, e: Any, resumed: bool) -> None:
        """An attempt is dispatched or resumed: is it an interrupted rollout running again?"""
        key = self.state.key(e)
        if key not in self.unmatched:
            return
        b = self.watching
        assert b is not None
        self.unmatched.discard(key)
        b._fate[key] = "resumed" if resumed else "redispatched"
        if resumed:
            b.tokens_recovered += e.resumed_tokens
        else:
            self.regenerating.add(key)

    def _dispatch(self, e: Any) -> None:
        if self.unmatched:
            self._ran_again(e, resumed=False)

    def _resume(self, e: Any) -> None:
        # The killed run never logged its partial tokens: the seal that follows counts them.
        if self.unmatched:
            self._ran_again(e, resumed=True)

    def _attempt_seal(self, e: Any) -> None:
        tokens = e.tokens
        if e.group_id not in self.state.groups:  # trained already, or never reserved
            self.ledger.touch(e.group_id, e.run_id, tokens)
        if self.regenerating:
            attempt = self.state.attempts.get(e.attempt_id)
            key = attempt[1] if attempt is not None else self.state.key(e)
            if key in self.regenerating:
                self.watching.tokens_regenerated += tokens  # type: ignore[union-attr]  # regenerating keys exist only while watching

    def _refuse(self, e: Any) -> None:
        self.report.refused_attempts += 1

    def _abandon(self, e: Any) -> None:
        tokens = e.tokens or 0
        self.generated += tokens
        add(self.abandoned, f"abandoned: {e.reason}", tokens)

    def _group_reserve(self, e: Any) -> None:
        old = self.state.groups.get(e.group_id)
        if old is not None:  # reserved again: what it held so far stays in the ledger
            self.ledger.settle(e.group_id, old)

    def _group_discard(self, e: Any) -> None:
        group = self.state.groups.get(e.group_id)
        if group is not None:
            self.ledger.settle(e.group_id, group)
        self.ledger.discard(e.group_id, e.run_id, e.reason)

    def _checkpoint_restore(self, e: Any) -> None:
        b = self.watching
        if b is None:
            return
        b.restored_checkpoint = {
            k: getattr(e, k) for k in ("step", "weight_version", "path", "from_run_id")
        }
        if b.old_last_step is not None and e.step >= b.old_last_step:
            b.catch_up_s = e.t - b.resumed_at  # nothing to train again: back on restore

    def _train_step(self, e: Any) -> None:
        state = self.state
        age = state.shown_age(e)
        b = self.watching
        for gid in e.group_ids:
            group = state.groups.get(gid)
            if group is not None:
                self.ledger.settle(gid, group)
            if b is not None:  # a sealed group the snapshot kept, trained as it was
                for key in b._at_risk_groups.pop(gid, ()):
                    if key in self.unmatched:
                        self.unmatched.discard(key)
                        b._fate[key] = "kept"
        if b is not None:
            if b.old_last_step is not None and e.step <= b.old_last_step:
                b.steps_retrained += 1
                if e.step == b.old_last_step and b.catch_up_s is None:
                    b.catch_up_s = e.t - b.resumed_at
            if age is not None and len(b._after) < self.window:
                b._after.append(age)
                b.batch_age_after = _mean(b._after)
        if age is not None:
            self.recent.append(age)
        self.report.steps += 1

    def result(self) -> CostReport:
        report = self.report
        report.runs = [r.run_id for r in self.state.runs]
        report.tokens_generated = self.generated + self.state.sealed_tokens
        for b in report.boundaries:
            fates = [b._fate.get(k) for k in b._interrupted]
            b.resumed = fates.count("resumed")
            b.redispatched = fates.count("redispatched")
            b.never_ran_again = fates.count(None)
            fates = [b._fate.get(k) for k in b._at_risk]
            b.rollouts_at_risk = len(fates)
            b.at_risk_kept = fates.count("kept")
            b.at_risk_resumed = fates.count("resumed")
            b.at_risk_redispatched = fates.count("redispatched")
            b.at_risk_never_ran_again = fates.count(None)
        # Work a resumed run carried out of a group already trained or discarded (by a step
        # or discard its restore undid) leaves that group's tokens in the ledger; from a
        # group in flight it left the shared state's record before the ledger took it.
        moved = self.state.carries.moved
        for move in moved[self._carried :]:
            if move.settled:
                self.ledger.carry_out(move.donor, move.tokens)
        self._carried = len(moved)
        # Groups neither trained nor discarded yet count as they stand, the ledger untouched:
        # a live view asks for the result again as the file grows.
        buckets = self.ledger.resolve(GroupFates.of(self.state), self.state.groups)
        report.tokens_trained = buckets.pop(TRAINED, 0)
        report.tokens_pending = buckets.pop(PENDING, 0)
        report.waste = dict(self.abandoned)
        for cause, tokens in buckets.items():
            add(report.waste, cause, tokens)
        return report


def _mean(values: Iterable[float]) -> float | None:
    values = list(values)
    return sum(values) / len(values) if values else None


def analyze(
    events: Iterable[Any], *, window: int = 5, on_warning: OnWarning | None = None
) -> CostReport:
    """The cost of every stop and restore in ``events`` (file order), and the ledger.

    Events are dicts (as ``read_events`` yields them) or the schema's typed
    events; an unstarted ``read_events(path)`` is read as its file.  ``window``
    steps before and after each boundary give its batch age before/after.
    """
    [report] = run_events(events, [CostAnalysis(window)], on_warning=on_warning)
    return report


def analyze_file(
    path: str | os.PathLike[str] | EventReader,
    *,
    window: int = 5,
    on_warning: OnWarning | None = None,
    progress: Progress | None = None,
) -> CostReport:
    """:func:`analyze` over a trace file, read once in typed blocks."""
    [report] = run_file(path, [CostAnalysis(window)], on_warning=on_warning, progress=progress)
    return report
