"""What each stop and restore cost, read from a trace file in one streaming pass.

A *boundary* is where one run stopped and the run that resumed into the same
file began.  For each boundary the analysis reports the downtime, the old
run's last step and checkpoint, the work in flight at the stop, what the new
run did with the interrupted rollouts (matched by ``epoch``, ``prompt_id``,
``generation_index``: resumed from a snapshot, re-dispatched from scratch, or
never run again), the steps trained again and how long the new run took to
get back, and batch age before and after.  A whole-file summary adds where
generated tokens went.  Memory is bounded by the work in flight and the steps
kept for the before/after windows, not by the size of the file.
"""

from __future__ import annotations

import gc
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import msgspec

from .batch_age import LiveBatchAge
from .schema import struct_type

__all__ = ["Boundary", "CostEvent", "CostReport", "analyze", "analyze_batches"]

Key = tuple[int, int, int]  # (epoch, prompt_id, generation_index)


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
    """Every boundary and a whole-file summary of where generated tokens went."""

    runs: list[str] = field(default_factory=list)
    boundaries: list[Boundary] = field(default_factory=list)
    tokens_generated: int = 0
    tokens_trained: int = 0
    steps: int = 0
    waste: dict[str, int] = field(default_factory=dict)
    refused_attempts: int = 0

    def report(self) -> dict[str, Any]:
        return {
            "runs": self.runs,
            "boundaries": [b.report() for b in self.boundaries],
            "summary": {
                "steps": self.steps,
                "tokens_generated": self.tokens_generated,
                "tokens_trained": self.tokens_trained,
                "tokens_wasted_by_cause": dict(sorted(self.waste.items())),
                "refused_attempts": self.refused_attempts,
            },
        }


@dataclass
class _Run:
    run_id: str
    first_t: float
    last_t: float
    last_step: int | None = None
    last_checkpoint: dict[str, Any] | None = None
    recent_ages: deque[float] = field(default_factory=lambda: deque(maxlen=5))


@dataclass
class _Group:
    run_id: str
    attempts: dict[Key, int] = field(default_factory=dict)  # sealed attempts' tokens
    sealed_tokens: int | None = None


#: The fields the analysis reads; the reader skips the rest of each line unbuilt.
CostEvent = struct_type(
    "CostEvent",
    [
        "attempt_id", "group_id", "epoch", "prompt_id", "generation_index", "tokens",
        "resumed_tokens", "reason", "step", "weight_version", "path", "from_run_id",
        "group_ids", "trained_version", "batch_age", "tokens_by_version",
    ],
)  # fmt: skip
Event = Any  # a CostEvent (typed loosely: malformed fields fail inside the handlers)


def _key(e: Event, epochs: dict[str, int]) -> Key:
    epoch = e.epoch
    if epoch is None:
        epoch = epochs.get(e.group_id, 0)
    return (epoch, e.prompt_id, e.generation_index)


class _Analysis:
    def __init__(self, window: int) -> None:
        self.window = window
        self.result = CostReport()
        self.run: _Run | None = None
        self.open: dict[str, tuple[str, Key]] = {}  # attempt_id → (run, key)
        self.epochs: dict[str, int] = {}  # group_id → epoch, for attempts that omit it
        self.groups: dict[str, _Group] = {}
        self.live = LiveBatchAge(on_malformed=lambda e, why: None)
        # The boundary whose new run is running: only the run that directly follows is matched.
        self.watching: Boundary | None = None
        self.unmatched: set[Key] = set()  # its rollouts that have not run again yet
        self.regenerating: set[Key] = set()  # its rollouts re-dispatched from scratch
        self.handlers: dict[str, Callable[[Event], None]] = {
            "checkpoint.publish": self._checkpoint_publish,
            "checkpoint.restore": self._checkpoint_restore,
            "group.reserve": self._group_reserve,
            "group.seal": self._group_seal,
            "group.discard": self._group_discard,
            "attempt.resume": self._attempt_resume,
            "attempt.refuse": self._attempt_refuse,
            "attempt.abandon": self._attempt_abandon,
            "train.step": self._train_step,
        }

    def new_run(self, run_id: str, t: float) -> _Run:
        """Start ``run_id`` at ``t``; if another run was going, that is a boundary."""
        old = self.run
        if old is not None and old.run_id == run_id:
            return old
        run = self.run = _Run(run_id, t, t, recent_ages=deque(maxlen=self.window))
        self.result.runs.append(run_id)
        if old is None:
            return run
        boundary = Boundary(
            old_run=old.run_id,
            new_run=run_id,
            stopped_at=old.last_t,
            resumed_at=t,
            downtime_s=t - old.last_t,
            old_last_step=old.last_step,
            old_last_checkpoint=old.last_checkpoint,
            batch_age_before=_mean(old.recent_ages),
        )
        for attempt_id, (owner, key) in list(self.open.items()):
            if owner == old.run_id:
                boundary._interrupted.add(key)
                del self.open[attempt_id]
        boundary.attempts_in_flight = len(boundary._interrupted)
        for group_id, group in self.groups.items():
            if group.run_id != old.run_id:
                continue
            if group.sealed_tokens is None:
                boundary.groups_in_flight += 1
            else:
                boundary.sealed_groups_untrained += 1
            boundary._at_risk.update(group.attempts)
            boundary._at_risk_groups[group_id] = list(group.attempts)
            boundary.tokens_at_risk += sum(group.attempts.values())
        boundary.rollouts_interrupted = len(boundary._interrupted)
        self.result.boundaries.append(boundary)
        self.watching = boundary
        self.unmatched.clear()
        self.unmatched.update(boundary._interrupted, boundary._at_risk)
        self.regenerating.clear()
        return run

    # Handlers (one per event kind the analysis uses).

    def _checkpoint_publish(self, e: Event) -> None:
        assert self.run is not None
        self.run.last_checkpoint = {"step": e.step, "weight_version": e.weight_version}

    def _checkpoint_restore(self, e: Event) -> None:
        b = self.watching
        if b is None:
            return
        b.restored_checkpoint = {
            k: getattr(e, k) for k in ("step", "weight_version", "path", "from_run_id")
        }
        if b.old_last_step is not None and e.step is not None and e.step >= b.old_last_step:
            b.catch_up_s = e.t - b.resumed_at  # nothing to train again: back on restore

    def _group_reserve(self, e: Event) -> None:
        assert self.run is not None
        self.groups[e.group_id] = _Group(self.run.run_id)
        if e.epoch is not None:
            self.epochs[e.group_id] = e.epoch

    def _ran_again(self, key: Key, e: Event, resumed: bool) -> None:
        """An interrupted rollout of the watched boundary is dispatched or resumed again."""
        b = self.watching
        assert b is not None
        self.unmatched.discard(key)
        b._fate[key] = "resumed" if resumed else "redispatched"
        if resumed:
            b.tokens_recovered += e.resumed_tokens or 0
        else:
            self.regenerating.add(key)

    def _attempt_resume(self, e: Event) -> None:
        # The killed run never logged its partial tokens: the seal that follows counts them.
        key = _key(e, self.epochs)
        self.open[e.attempt_id] = (e.run_id, key)
        if key in self.unmatched:
            self._ran_again(key, e, resumed=True)

    def _attempt_refuse(self, e: Event) -> None:
        self.result.refused_attempts += 1
        self.open.pop(e.attempt_id, None)

    def _attempt_abandon(self, e: Event) -> None:
        tokens = e.tokens or 0
        self.result.tokens_generated += tokens
        self._waste(f"abandoned: {e.reason or ''}", tokens)
        self.open.pop(e.attempt_id, None)

    def _group_seal(self, e: Event) -> None:
        self.live.observe(
            {"event": e.event, "group_id": e.group_id, "tokens_by_version": e.tokens_by_version}
        )
        group = self.groups.setdefault(e.group_id, _Group(e.run_id))
        group.sealed_tokens = e.tokens or 0

    def _group_discard(self, e: Event) -> None:
        self.live.observe({"event": e.event, "group_id": e.group_id})
        group = self.groups.pop(e.group_id, None)
        self.epochs.pop(e.group_id, None)
        if group is not None:
            self._waste(f"discarded: {e.reason or ''}", sum(group.attempts.values()))

    def _train_step(self, e: Event) -> None:
        run = self.run
        assert run is not None
        row = self.live.observe(
            {
                "event": e.event,
                "step": e.step,
                "trained_version": e.trained_version,
                "group_ids": e.group_ids,
                "run_id": e.run_id,
                "t": e.t,
                "batch_age": e.batch_age,
            }
        )
        age = e.batch_age if isinstance(e.batch_age, (int, float)) else None
        if age is None and row is not None:
            age = row.batch_age
        step = e.step
        if step is None:
            raise ValueError("a train.step without its step")
        b = self.watching
        for gid in e.group_ids or ():
            group = self.groups.pop(gid, None)
            self.epochs.pop(gid, None)
            if group is not None and group.sealed_tokens is not None:
                self.result.tokens_trained += group.sealed_tokens
            if b is not None:  # a sealed group the snapshot kept, trained as it was
                for key in b._at_risk_groups.pop(gid, ()):
                    if key in self.unmatched:
                        self.unmatched.discard(key)
                        b._fate[key] = "kept"
        if b is not None:
            if b.old_last_step is not None and step <= b.old_last_step:
                b.steps_retrained += 1
                if step == b.old_last_step and b.catch_up_s is None:
                    b.catch_up_s = e.t - b.resumed_at
            if age is not None and len(b._after) < self.window:
                b._after.append(age)
                b.batch_age_after = _mean(b._after)
        if age is not None:
            run.recent_ages.append(age)
        run.last_step = step if run.last_step is None else max(run.last_step, step)
        self.result.steps += 1

    def _waste(self, cause: str, tokens: int) -> None:
        if tokens:
            self.result.waste[cause] = self.result.waste.get(cause, 0) + tokens

    def finish(self) -> CostReport:
        for b in self.result.boundaries:
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
            self._waste("lost at stops (generated again)", b.tokens_regenerated)
        for group in self.groups.values():  # sealed or in flight when the file ends
            self._waste("never trained", sum(group.attempts.values()))
        return self.result


def _mean(values: Iterable[float]) -> float | None:
    values = list(values)
    return sum(values) / len(values) if values else None


def analyze(events: Iterable[Any], *, window: int = 5) -> CostReport:
    """The cost of every stop and restore in ``events`` (file order), and a summary.

    Events are :data:`CostEvent` structs or dicts.  ``window`` steps before and
    after each boundary give its batch age before/after.
    """
    return analyze_batches([_structs(events)], window=window)


def _structs(events: Iterable[Any]) -> Iterator[Any]:
    """Events as :data:`CostEvent`; dicts that do not fit it are skipped (malformed)."""
    for e in events:
        if e.__class__ is dict:
            try:
                e = msgspec.convert(e, CostEvent)
            except msgspec.ValidationError:
                continue
        yield e


def analyze_batches(batches: Iterable[Iterable[Any]], *, window: int = 5) -> CostReport:
    """:func:`analyze` over blocks of :data:`CostEvent`, the fast path:
    ``EventReader(path, as_type=CostEvent).batches()`` reads a file with the
    least work per line."""
    analysis = _Analysis(window)
    handlers = analysis.handlers
    opened, epochs, groups = analysis.open, analysis.epochs, analysis.groups
    unmatched, regenerating = analysis.unmatched, analysis.regenerating
    run: _Run | None = None
    run_id, last_t, generated = None, 0.0, 0
    collecting = gc.isenabled()
    gc.disable()  # the state holds no cycles; collections would only cost time (~10%)
    try:
        for batch in batches:
            for e in batch:
                try:
                    if e.run_id != run_id:  # a run.start of the same run starts nothing
                        if run is not None:
                            run.last_t = last_t
                        run = analysis.new_run(e.run_id, e.t)
                        run_id, last_t = e.run_id, e.t
                    elif e.t > last_t:
                        last_t = e.t
                    kind = e.event
                    # The two kinds that are most of a trace are handled here, without a call.
                    if kind == "attempt.dispatch":
                        key = _key(e, epochs)
                        opened[e.attempt_id] = (run_id, key)
                        if unmatched and key in unmatched:
                            analysis._ran_again(key, e, resumed=False)
                    elif kind == "attempt.seal":
                        tokens = e.tokens or 0
                        generated += tokens
                        entry = opened.pop(e.attempt_id, None)
                        key = entry[1] if entry else _key(e, epochs)
                        group = groups.get(e.group_id)
                        if group is not None:
                            group.attempts[key] = tokens
                        if regenerating and key in regenerating:
                            analysis.watching.tokens_regenerated += tokens  # type: ignore[union-attr]
                    else:
                        handler = handlers.get(kind)
                        if handler is not None:
                            handler(e)
                except (KeyError, TypeError, ValueError):
                    continue  # a malformed event
    finally:
        if collecting:
            gc.enable()
    if run is not None:
        run.last_t = last_t
    analysis.result.tokens_generated += generated
    return analysis.finish()
