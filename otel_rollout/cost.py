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

from collections import deque
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from .batch_age import LiveBatchAge

__all__ = ["COST_EVENTS", "Boundary", "CostReport", "analyze"]

Key = tuple[int, int, int]  # (epoch, prompt_id, generation_index)

#: Event kinds the analysis reads; others can be skipped unparsed.
COST_EVENTS = frozenset(
    {
        "run.start",
        "group.reserve",
        "group.seal",
        "group.discard",
        "attempt.dispatch",
        "attempt.resume",
        "attempt.seal",
        "attempt.refuse",
        "attempt.abandon",
        "train.step",
        "checkpoint.publish",
        "checkpoint.restore",
    }
)


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


def _key(event: dict[str, Any], epoch: int) -> Key:
    epoch = int(event.get("epoch", epoch))
    return (epoch, int(event["prompt_id"]), int(event["generation_index"]))


class _Analysis:
    def __init__(self, window: int) -> None:
        self.window = window
        self.result = CostReport()
        self.run: _Run | None = None
        self.open: dict[str, tuple[str, Key]] = {}  # attempt_id → (run, key)
        self.epochs: dict[str, int] = {}  # group_id → epoch, for attempts that omit it
        self.groups: dict[str, _Group] = {}
        self.live = LiveBatchAge(on_malformed=lambda e, why: None)
        self.watching: list[Boundary] = []  # boundaries whose new run is still running
        self._handlers = {
            "checkpoint.publish": self._checkpoint_publish,
            "checkpoint.restore": self._checkpoint_restore,
            "group.reserve": self._group_reserve,
            "group.seal": self._group_seal,
            "group.discard": self._group_discard,
            "attempt.dispatch": self._attempt_dispatch,
            "attempt.resume": self._attempt_resume,
            "attempt.seal": self._attempt_seal,
            "attempt.refuse": self._attempt_refuse,
            "attempt.abandon": self._attempt_abandon,
            "train.step": self._train_step,
        }

    def feed(self, event: dict[str, Any]) -> None:
        kind = event["event"]
        t = float(event["t"])
        run_id = event["run_id"]
        if kind == "run.start" or self.run is None or run_id != self.run.run_id:
            self._new_run(run_id, t)
        assert self.run is not None
        self.run.last_t = max(self.run.last_t, t)
        handler = self._handlers.get(kind)
        if handler is not None:
            handler(event, t)

    def _new_run(self, run_id: str, t: float) -> None:
        if self.run is not None and self.run.run_id == run_id:
            return
        old = self.run
        self.run = _Run(run_id, t, t, recent_ages=deque(maxlen=self.window))
        self.result.runs.append(run_id)
        if old is None:
            return
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
        for group in self.groups.values():
            if group.run_id != old.run_id:
                continue
            if group.sealed_tokens is None:
                boundary.groups_in_flight += 1
            else:
                boundary.sealed_groups_untrained += 1
            boundary._at_risk.update(group.attempts)
            boundary.tokens_at_risk += sum(group.attempts.values())
        boundary.rollouts_interrupted = len(boundary._interrupted)
        self.result.boundaries.append(boundary)
        self.watching = [boundary]  # only the run that directly follows is matched

    # Handlers (one per event kind the analysis uses).

    def _checkpoint_publish(self, e: dict[str, Any], t: float) -> None:
        assert self.run is not None
        self.run.last_checkpoint = {"step": e["step"], "weight_version": e["weight_version"]}

    def _checkpoint_restore(self, e: dict[str, Any], t: float) -> None:
        for b in self.watching:
            b.restored_checkpoint = {
                k: e.get(k) for k in ("step", "weight_version", "path", "from_run_id")
            }
            if b.old_last_step is not None and int(e["step"]) >= b.old_last_step:
                b.catch_up_s = t - b.resumed_at  # nothing to train again: back on restore

    def _group_reserve(self, e: dict[str, Any], t: float) -> None:
        assert self.run is not None
        self.groups[e["group_id"]] = _Group(self.run.run_id)
        if "epoch" in e:
            self.epochs[e["group_id"]] = int(e["epoch"])

    def _attempt_dispatch(self, e: dict[str, Any], t: float, resumed: bool = False) -> None:
        assert self.run is not None
        key = _key(e, self.epochs.get(e["group_id"], 0))
        self.open[e["attempt_id"]] = (self.run.run_id, key)
        for b in self.watching:
            if (key in b._interrupted or key in b._at_risk) and key not in b._fate:
                b._fate[key] = "resumed" if resumed else "redispatched"
                if resumed:
                    b.tokens_recovered += int(e.get("resumed_tokens", 0))

    def _attempt_resume(self, e: dict[str, Any], t: float) -> None:
        # The killed run never logged its partial tokens: the seal that follows counts them.
        self._attempt_dispatch(e, t, resumed=True)

    def _attempt_seal(self, e: dict[str, Any], t: float) -> None:
        tokens = int(e.get("tokens", 0))
        self.result.tokens_generated += tokens
        entry = self.open.pop(e["attempt_id"], None)
        key = entry[1] if entry else _key(e, self.epochs.get(e["group_id"], 0))
        group = self.groups.get(e["group_id"])
        if group is not None:
            group.attempts[key] = tokens
        for b in self.watching:
            if b._fate.get(key) == "redispatched":
                b.tokens_regenerated += tokens

    def _attempt_refuse(self, e: dict[str, Any], t: float) -> None:
        self.result.refused_attempts += 1
        self.open.pop(e["attempt_id"], None)

    def _attempt_abandon(self, e: dict[str, Any], t: float) -> None:
        tokens = int(e.get("tokens", 0))
        self.result.tokens_generated += tokens
        self._waste(f"abandoned: {e.get('reason', '')}", tokens)
        self.open.pop(e["attempt_id"], None)

    def _group_seal(self, e: dict[str, Any], t: float) -> None:
        self.live.observe(e)
        group = self.groups.setdefault(e["group_id"], _Group(e["run_id"]))
        group.sealed_tokens = int(e.get("tokens", 0))

    def _group_discard(self, e: dict[str, Any], t: float) -> None:
        self.live.observe(e)
        group = self.groups.pop(e["group_id"], None)
        self.epochs.pop(e["group_id"], None)
        if group is not None:
            self._waste(f"discarded: {e.get('reason', '')}", sum(group.attempts.values()))

    def _train_step(self, e: dict[str, Any], t: float) -> None:
        assert self.run is not None
        row = self.live.observe(e)
        age = e.get("batch_age") if isinstance(e.get("batch_age"), (int, float)) else None
        if age is None and row is not None:
            age = row.batch_age
        step = int(e["step"])
        for gid in e.get("group_ids") or ():
            group = self.groups.pop(gid, None)
            self.epochs.pop(gid, None)
            if group is not None and group.sealed_tokens is not None:
                self.result.tokens_trained += group.sealed_tokens
        for b in self.watching:
            if b.old_last_step is not None and step <= b.old_last_step:
                b.steps_retrained += 1
                if step == b.old_last_step and b.catch_up_s is None:
                    b.catch_up_s = t - b.resumed_at
            if age is not None and len(b._after) < self.window:
                b._after.append(age)
                b.batch_age_after = _mean(b._after)
        if age is not None:
            self.run.recent_ages.append(age)
        self.run.last_step = step if self.run.last_step is None else max(self.run.last_step, step)
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
            self._waste("lost at stops (generated again)", b.tokens_regenerated)
        for group in self.groups.values():  # sealed or in flight when the file ends
            self._waste("never trained", sum(group.attempts.values()))
        return self.result


def _mean(values: Iterable[float]) -> float | None:
    values = list(values)
    return sum(values) / len(values) if values else None


def analyze(events: Iterable[dict[str, Any]], *, window: int = 5) -> CostReport:
    """The cost of every stop and restore in ``events`` (file order), and a summary.

    ``window`` steps before and after each boundary give its batch age before/after.
    """
    analysis = _Analysis(window)
    for event in events:
        try:
            analysis.feed(event)
        except (KeyError, TypeError, ValueError):
            continue  # a malformed event; validate names it
    return analysis.finish()
