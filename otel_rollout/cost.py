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


#: The wasted buckets of the ledger that are not by reason (abandoned and discarded are).
LOST_AT_STOP = "lost at a stop"
ROLLED_BACK = "trained by a step a restore redid"


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

    def ledger_rows(self) -> list[tuple[str, int, str]]:
        """The ledger as (label, tokens, share of generated) rows, for the text and HTML
        reports alike; the share of a zero total is ``n/a``."""
        rows = [("trained", self.tokens_trained)]
        rows += [(f"wasted: {cause}", n) for cause, n in sorted(self.waste.items())]
        rows.append(("pending (sealed or running when the file ends)", self.tokens_pending))
        total = self.tokens_generated
        out = [("generated", total, "100.0%" if total else "n/a")]
        out += [(label, n, f"{n / total:.1%}" if total else "n/a") for label, n in rows]
        return out

    def balance(self) -> str:
        """The ledger's identity in numbers, and whether it holds."""
        wasted = sum(self.waste.values())
        holds = self.tokens_generated == self.tokens_trained + wasted + self.tokens_pending
        return (
            f"{self.tokens_generated:,} generated = {self.tokens_trained:,} trained + "
            f"{wasted:,} wasted + {self.tokens_pending:,} pending"
            + ("" if holds else "  (DOES NOT BALANCE: please report this)")
        )

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


class _Ledger:
    """Where every sealed attempt's tokens went, by its group's fate (resolved at the end,
    since a later run may train a group again, or redo the step that trained it).

    A group in flight collects its tokens in :class:`_Group` (by rollout key) and hands
    them over when it is trained, discarded, reserved again or left at the end.
    A group belongs to the last run that reserved it or sealed an attempt into it.  Its
    tokens are ``trained`` if the surviving ``train.step`` of some step number (the last
    one in the file) trained it; else wasted as ``ROLLED_BACK`` if an earlier step of that
    number did; else ``discarded: reason``; else ``pending`` if its run is the file's
    last, ``LOST_AT_STOP`` if not.  Memory: one small record per group and per step."""

    def __init__(self) -> None:
        self.groups: dict[str, list[Any]] = {}  # group_id → [tokens, run_id, discard reason]
        self.steps: dict[int, Any] = {}  # step number → group_ids of its latest train.step
        self.trained: set[str] = set()  # groups any train.step trained

    def touch(self, group_id: str, run_id: str, tokens: int = 0) -> None:
        record = self.groups.get(group_id)
        if record is None:
            self.groups[group_id] = [tokens, run_id, None]
        else:
            record[0] += tokens
            record[1] = run_id

    def settle(self, group_id: str, group: _Group) -> None:
        """Take over the tokens a group in flight collected (its attempts, by key)."""
        self.touch(group_id, group.run_id, sum(group.attempts.values()))

    def discard(self, group_id: str, run_id: str, reason: str) -> None:
        self.touch(group_id, run_id)
        self.groups[group_id][2] = reason

    def train(self, step: int, group_ids: Any) -> None:
        self.steps[step] = group_ids
        self.trained.update(group_ids)

    def resolve(self, result: CostReport, last_run: str | None) -> None:
        surviving: set[str] = set()
        for group_ids in self.steps.values():
            surviving.update(group_ids)
        for group_id, (tokens, run_id, reason) in self.groups.items():
            if not tokens:
                continue
            if group_id in surviving:
                result.tokens_trained += tokens
            elif group_id in self.trained:
                _add(result.waste, ROLLED_BACK, tokens)
            elif reason is not None:
                _add(result.waste, f"discarded: {reason}", tokens)
            elif run_id == last_run:
                result.tokens_pending += tokens
            else:
                _add(result.waste, LOST_AT_STOP, tokens)


def _add(counts: dict[str, int], cause: str, tokens: int) -> None:
    if tokens:
        counts[cause] = counts.get(cause, 0) + tokens


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
        self.ledger = _Ledger()
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
        old = self.groups.get(e.group_id)
        if old is not None:  # reserved again: what it held so far stays in the ledger
            self.ledger.settle(e.group_id, old)
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
        tokens = _tokens(e.tokens)
        self.result.tokens_generated += tokens
        _add(self.result.waste, f"abandoned: {e.reason or ''}", tokens)
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
            self.ledger.settle(e.group_id, group)
        self.ledger.discard(e.group_id, e.run_id, e.reason or "")

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
        group_ids = e.group_ids or ()
        self.ledger.train(step, group_ids)
        for gid in group_ids:
            group = self.groups.pop(gid, None)
            if group is not None:
                self.ledger.settle(gid, group)
            self.epochs.pop(gid, None)
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
        for group_id, group in self.groups.items():  # neither trained nor discarded yet
            self.ledger.settle(group_id, group)
        self.ledger.resolve(self.result, self.run.run_id if self.run is not None else None)
        return self.result


def _tokens(value: Any) -> int:
    """A token count as the ledger takes it: an int ≥ 0 (anything else is malformed)."""
    if value is None:
        return 0
    if value.__class__ is not int or value < 0:
        raise ValueError(f"tokens must be an integer ≥ 0, got {value!r}")
    return value  # type: ignore[no-any-return]


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
    ledger = analysis.ledger
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
                        tokens = e.tokens
                        if tokens.__class__ is not int or tokens < 0:
                            tokens = _tokens(tokens)  # None is 0; anything else is malformed
                        generated += tokens
                        entry = opened.pop(e.attempt_id, None)
                        key = entry[1] if entry else _key(e, epochs)
                        group = groups.get(e.group_id)
                        if group is not None:
                            # The group keeps its tokens until it is trained or discarded:
                            # a ledger record per seal cost cost 15-30% of its speed.
                            attempts = group.attempts
                            attempts[key] = attempts.get(key, 0) + tokens
                            group.run_id = run_id  # type: ignore[assignment]
                        else:  # no such group in flight (trained already, or never reserved)
                            ledger.touch(e.group_id, run_id, tokens)  # type: ignore[arg-type]
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
