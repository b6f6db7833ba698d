"""What the one pass keeps once for every analysis: runs, work in flight, seals, steps.

The records it keeps are in :mod:`.records`; finished work a resumed run carried into
groups of its own, in :mod:`.carry`.  The engine hands each event to the analyses
first and then to the state's own handlers,
so an analysis always sees the state as it was *before* the event it is
looking at (the attempt a seal ends is still in flight; the groups a step
trains are still in :attr:`State.groups`).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Container, Iterable
from typing import Any

from ..age import SealCounts, StepAge, seal_counts, step_age
from .carry import Carries
from .history import Histories
from .records import FLIGHT_COUNT, Attempt, Group, Key, Run, Step, Stop

__all__ = [
    "Attempt",
    "Group",
    "Key",
    "Run",
    "State",
    "Step",
    "Stop",
    "ended_run_writes",
    "never_sealed",
    "sealed_after_training",
    "step_again",
]


def never_sealed(step: int, group_ids: Iterable[str], sealed: Container[str]) -> str | None:
    """The warning for a ``train.step`` naming groups with no seal before it (``validate``
    and every analysis give the same one), or None."""
    never = [g for g in group_ids if g not in sealed]
    if not never:
        return None
    shown = ", ".join(never[:5]) + (f" and {len(never) - 5} more" if len(never) > 5 else "")
    return f"train.step {step} names groups that were never sealed: {shown}"


def sealed_after_training(group_id: str) -> str:
    """The warning for a ``group.seal`` of a group a ``train.step`` already trained
    (``validate`` and every analysis give the same one)."""
    return (
        f"group {group_id} is sealed after a train.step trained it: batch-age and "
        "staleness take this later seal's counts for that step, the report's chart and "
        "cost the counts as they were when it trained"
    )


def step_again(step: int) -> str:
    """The warning for a ``train.step`` whose number its own run logged before, with no
    ``checkpoint.restore`` between them (``validate`` and every analysis give the same
    one)."""
    return (
        f"train.step {step} again in the same run: the later one is step {step}, and the "
        "groups only the earlier one trained count as trained by a step its run logged again"
    )


def ended_run_writes(run_id: str, root: str) -> str:
    """The warning for a line of a run that ended, written after a later run began
    (``validate`` and every analysis give the same one)."""
    if run_id != root:
        return (f"run {run_id}, a forked child of run {root}, wrote after a later run began; "
                "its lines from here on are not read")  # fmt: skip
    return (
        f"run {run_id} writes again after a later run began (two processes writing one log, "
        "or a file with a copy of itself appended?); its lines from here on are not read"
    )


Warn = Callable[[Any, str], None]  # (the event, the problem)

#: Bytes of flight counts (64k changes) past which their analysis takes them.
FLIGHT_COUNTS_HELD = 1 << 20

#: The kinds that put attempts and groups in flight, or take them out.
_IN_FLIGHT = frozenset(
    {"attempt.dispatch", "attempt.resume", "attempt.seal", "attempt.refuse",
     "attempt.abandon", "group.reserve", "group.discard"}
)  # fmt: skip


class State:
    """Shared state of the pass (see the module docstring for when it changes)."""

    def __init__(self, warn: Warn) -> None:
        self.warn = warn
        self.runs: list[Run] = []
        self.run: Run | None = None
        self.attempts: dict[str, Attempt] = {}  # attempt_id → in flight
        self.groups: dict[str, Group] = {}  # group_id → in flight
        #: Every group's latest sealed counts (group_id → packed (version, tokens) pairs,
        #: see ``age.seal_items``); a seal without counts maps to an empty one.  Batch age
        #: resolves steps against these.
        self.seals: dict[str, SealCounts] = {}
        self.steps: dict[int, Step] = {}  # step number → its surviving train.step
        self.trained: set[str] = set()  # groups any train.step trained
        #: groups sealed (again) after a train.step trained them: a step's batch age made
        #: as the pass read it is its final one unless one of its groups is here
        self.sealed_late: set[str] = set()
        self.sealed_tokens = 0  # the tokens of every attempt.seal read
        #: groups of a train.step a later one of the same number and run replaced, with no
        #: checkpoint.restore between them (one between makes it a step a restore redid)
        self.logged_again: set[str] = set()
        self._restores = 0  # checkpoint.restore lines read
        self._step_restores: dict[int, int] = {}  # step number → restores read before it
        self._age_of: Any = None  # the train.step whose StepAge is in _age
        self._age: Any = None
        self.epochs: dict[str, int] = {}  # group_id → epoch, kept while attempts may name it
        self.family: dict[str, str] = {}  # a forked child's run_id → its first ancestor's
        self._orphans: set[str] = set()  # writers whose run ended, told of once
        self._run_ids: set[str] = set()  # every run begun
        #: Runs a later run's ``run.start`` ended (a run.start is read by every pass, so
        #: every reader ends the same runs, whatever kinds it reads).
        self._ended: set[str] = set()
        #: Finished work a resumed run carried into groups of its own (see carry.py).
        self.carries = Carries(self.groups)
        #: Every group's history to the end of the pass, when an analysis asks for it
        #: (:meth:`keep_histories`; see history.py).
        self.histories: Histories | None = None
        #: Every change of the count of attempts in flight since an analysis last took them
        #: (packed FLIGHT_COUNT points), when an analysis asks for them
        #: (:meth:`keep_flight_counts`): a dispatch or resume, the end of an attempt in
        #: flight, a stop that ended some.
        self.flight_counts: bytearray | None = None
        self._take_flight_counts: Callable[[bytearray], None] = lambda counts: None
        self._apply: dict[str, Callable[[Any], None]] = {
            "attempt.dispatch": self._hot_dispatch(),
            "attempt.resume": self._hot_dispatch(),
            "attempt.seal": self._hot_attempt_seal(),
            "attempt.refuse": self._attempt_end,
            "attempt.abandon": self._attempt_end,
            "group.reserve": self._group_reserve,
            "group.seal": self._group_seal,
            "group.discard": self._group_discard,
            "train.step": self._train_step,
            "checkpoint.publish": self._checkpoint_publish,
            "checkpoint.restore": self._restored,
            "run.start": self._run_start,
        }

    def keep_histories(self) -> None:
        """Keep every group's history (:attr:`histories`); called before the engine builds
        its table of handlers."""
        if self.histories is None:
            self.histories = Histories()
            self._apply["attempt.seal"] = self._hot_attempt_seal()

    def keep_flight_counts(self, take: Callable[[bytearray], None]) -> None:
        """Keep every change of the count of attempts in flight (:attr:`flight_counts`), for
        ``take`` (one analysis of the pass: it folds and clears them).  Called before the
        engine builds its table of handlers."""
        if self.flight_counts is not None:
            raise ValueError("one analysis of a pass may keep the flight counts")
        self.flight_counts = bytearray()
        self._take_flight_counts = take
        self._apply["attempt.dispatch"] = self._apply["attempt.resume"] = self._hot_dispatch()
        self._apply["attempt.seal"] = self._hot_attempt_seal()

    def bound_flight_counts(self) -> None:
        """Hand the flight counts to their analysis once they pass :data:`FLIGHT_COUNTS_HELD`
        bytes (the engine asks after each batch, the compiled path after each call): a file
        of attempts and no steps would otherwise hold 16 bytes a line."""
        counts = self.flight_counts
        if counts is not None and len(counts) >= FLIGHT_COUNTS_HELD:
            self._take_flight_counts(counts)

    def _counted(self, t: float) -> None:
        """A change of the count of attempts in flight at ``t``, if they are kept."""
        if self.flight_counts is not None:
            self.flight_counts += FLIGHT_COUNT.pack(t, len(self.attempts))

    def step_age(self, e: Any) -> StepAge:
        """The batch age of the ``train.step`` ``e`` by the seals read so far: made once per
        step, however many analyses of the pass ask for it (its final one unless a group of
        it is sealed later: :attr:`sealed_late`)."""
        if self._age_of is not e:
            self._age_of = e
            self._age = step_age(
                e.step,
                e.trained_version,
                e.group_ids,
                self.seals,
                run_id=self.run_id(e),
                t=e.t,
                logged_batch_age=e.batch_age,
            )
        return self._age

    def shown_age(self, e: Any) -> float | None:
        """The batch age a view of the ``train.step`` ``e`` shows as the pass reads it: its
        groups' counts read so far, or, where they carry none, the live value the step
        logged (None if neither)."""
        age = self.step_age(e).batch_age
        return e.batch_age if age is None else age

    def appliers(self, kinds: frozenset[str] | None = None) -> dict[str, Callable[[Any], None]]:
        """The state's own handler of each kind it follows: every kind, or those of
        ``kinds`` (the kinds the pass reads)."""
        if kinds is None:
            return dict(self._apply)
        apply = {kind: handler for kind, handler in self._apply.items() if kind in kinds}
        if not kinds & _IN_FLIGHT:
            # Seals and steps without the kinds that put work in flight (batch age's read):
            # no group to follow, only its counts and the steps (the Group made per seal
            # was ~15% of the pass).
            if "group.seal" in apply:
                apply["group.seal"] = self._seal_counts
            if "train.step" in apply:
                apply["train.step"] = self._step_only
        return apply

    def key(self, e: Any) -> Key:
        """The rollout an attempt event is about (its epoch from the group when omitted)."""
        epoch = getattr(e, "epoch", None)  # attempt.seal and its like carry no epoch
        if epoch is None:
            epoch = self.epochs.get(e.group_id, 0)
        return (epoch, e.prompt_id, e.generation_index)

    def root_of(self, e: Any) -> str:
        """The run ``e`` belongs to: its own, or for a forked child's line the first
        ancestor's.  A child writes the parent's log under a run_id of its own, and its
        ``run.start`` names its ``parent_run_id``; its lines, however they interleave with
        the parent's (or come first), are the parent's run, not a stop at every switch."""
        root = self.family.get(e.run_id)
        if root is not None:
            return root
        parent = getattr(e, "parent_run_id", None)  # only run.start carries one
        if parent is None:
            return e.run_id
        root = self.family[sys.intern(e.run_id)] = self.family.get(parent, parent)
        return root

    def orphaned(self, e: Any, root: str) -> bool:
        """Whether ``e`` belongs to a run that has ended (a later run's ``run.start`` was
        read since): a forked child's whose parent's run ended, or a run writing again
        (two processes writing one log, or a file with a copy of itself appended).  Said
        once for each such writer, and not read: it would stop the run in flight at every
        line, and make a new run of each switch."""
        if root not in self._ended:
            return False
        if e.run_id not in self._orphans:
            self._orphans.add(e.run_id)
            self.warn(e, ended_run_writes(e.run_id, root))
        return True

    def _restored(self, e: Any) -> None:
        self._restores += 1

    def _run_start(self, e: Any) -> None:
        """A run's ``run.start`` (its ``run_id`` already its root's): every other run ends."""
        ended = self._run_ids - {e.run_id}
        if len(ended) > len(self._ended):
            self._ended |= ended

    def begin(self, e: Any) -> Stop | None:
        """A new run's first event: start it, and return the stop of the run before."""
        old = self.run
        run = self.run = Run(e.run_id, e.t, e.t, len(self.runs))
        self.runs.append(run)
        self._run_ids.add(e.run_id)
        if old is None:
            return None
        attempts = self.attempts  # changed in place: the hot handlers hold it
        dead = [(i, a) for i, a in attempts.items() if a[0] == old.run_id]
        for attempt_id, _ in dead:
            del attempts[attempt_id]
        if dead:
            self._counted(run.first_t)
        groups = {g: group for g, group in self.groups.items() if group.run_id == old.run_id}
        self.carries.stop(groups)
        return Stop(old, run, [a for _, a in dead], groups)

    def run_id(self, e: Any) -> str:
        """The ID of the event's run (the one being handled), as one string for every
        record that keeps it: a decoded copy a record kept to the end of the pass cost
        81 bytes."""
        return self.run.run_id if self.run is not None else e.run_id

    # The state's handlers: called after every analysis has seen the event.

    # The two commonest kinds (most of a file) get closures over the state's dicts: a
    # method's attribute lookups made the pass ~15% slower on the bench trace.

    def _hot_dispatch(self) -> Callable[[Any], None]:
        attempts, epochs, counts = self.attempts, self.epochs, self.flight_counts
        point = FLIGHT_COUNT.pack

        def dispatch(e: Any) -> None:
            epoch = e.epoch
            if epoch is None:
                epoch = epochs.get(e.group_id, 0)
            attempts[e.attempt_id] = (e.run_id, (epoch, e.prompt_id, e.generation_index), e.t)
            if counts is not None:
                counts.extend(point(e.t, len(attempts)))

        return dispatch

    def _hot_attempt_seal(self) -> Callable[[Any], None]:
        attempts, groups, key_of, state = self.attempts, self.groups, self.key, self
        histories, counts, point = self.histories, self.flight_counts, FLIGHT_COUNT.pack

        def attempt_seal(e: Any) -> None:
            state.sealed_tokens += e.tokens
            attempt = attempts.pop(e.attempt_id, None)
            if histories is not None:
                histories.seal(e, e.run_id, attempt)
            if attempt is not None and counts is not None:
                counts.extend(point(e.t, len(attempts)))
            group = groups.get(e.group_id)
            if group is not None:
                key = attempt[1] if attempt is not None else key_of(e)
                held = group.attempts
                held[key] = held.get(key, 0) + e.tokens
                group.run_id = e.run_id

        return attempt_seal

    def _attempt_end(self, e: Any) -> None:
        if self.attempts.pop(e.attempt_id, None) is not None:
            self._counted(e.t)

    def _group_reserve(self, e: Any) -> None:
        epoch = e.epoch if e.epoch is not None else 0
        self.groups[e.group_id] = Group(e.run_id, epoch, e.t)
        if e.epoch is not None:
            self.epochs[e.group_id] = e.epoch
        if self.histories is not None:
            self.histories.reserve(e, e.run_id)

    def _group_seal(self, e: Any) -> None:
        group = self.groups.get(e.group_id)
        if group is None:
            group = self.groups[e.group_id] = Group(e.run_id, self.epochs.get(e.group_id, 0), e.t)
        group.sealed_tokens = e.tokens
        self.carries.seal(e, group)
        self._seal_counts(e)

    def _seal_counts(self, e: Any) -> None:
        group_id = e.group_id
        if group_id in self.trained:
            self.warn(e, sealed_after_training(group_id))
            self.sealed_late.add(group_id)
        elif group_id not in self.seals:  # one string a group for every record (see engine)
            group_id = sys.intern(group_id)
        self.seals[group_id] = seal_counts(e.tokens_by_version)

    def _group_discard(self, e: Any) -> None:
        group = self.groups.pop(e.group_id, None)
        if group is not None:
            self.carries.settled(e.group_id, group)
        self.epochs.pop(e.group_id, None)
        if self.histories is not None:
            self.histories.discard(e, e.run_id)

    def _train_step(self, e: Any) -> None:
        group_ids = self._step(e)
        self.trained.update(group_ids)
        groups, epochs, carries = self.groups, self.epochs, self.carries
        for group_id in group_ids:
            group = groups.pop(group_id, None)
            if group is not None:
                carries.settled(group_id, group)
            epochs.pop(group_id, None)

    def _step_only(self, e: Any) -> None:
        self.trained.update(self._step(e))

    def _step(self, e: Any) -> list[str]:
        """The step as the surviving one of its number (what batch age needs of it), and its
        group IDs; with nothing in flight followed, the whole of a ``train.step``."""
        problem = never_sealed(e.step, e.group_ids, self.seals)
        if problem is not None:
            self.warn(e, problem)
        # The step's group IDs as the seals' own strings, and the run's: a step's decoded
        # copies, kept to the end, were ~7 MB of the 1M-line bench trace's staleness peak.
        group_ids = [sys.intern(g) for g in e.group_ids]
        run_id = self.run_id(e)
        earlier = self.steps.get(e.step)
        restores = self._restores
        if (
            earlier is not None
            and earlier.run_id == run_id
            and self._step_restores.get(e.step) == restores
        ):
            self.warn(e, step_again(e.step))
            self.logged_again.update(earlier.group_ids)
        self._step_restores[e.step] = restores
        self.steps[e.step] = Step(e.step, e.trained_version, group_ids, run_id, e.t, e.batch_age)
        run = self.run
        if run is not None and (run.last_step is None or e.step > run.last_step):
            run.last_step = e.step
        return group_ids

    def _checkpoint_publish(self, e: Any) -> None:
        self.carries.published()
        if self.run is not None:
            self.run.last_checkpoint = {"step": e.step, "weight_version": e.weight_version}
