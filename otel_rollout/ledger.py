"""The token ledger: where every logged token went, by its group's fate.

Every token a sealed or abandoned attempt logged lands in exactly one bucket,
once: ``trained``, a wasted cause, or ``pending``.  :class:`GroupFates` is the
one rule for a group's fate; the cost analysis and the staleness diagnostics
both use it, so their numbers add up to each other.
"""

from __future__ import annotations

import sys
from collections.abc import Container, Iterable, Mapping
from typing import Any

from .analysis.state import Group, State

__all__ = [
    "LOGGED_AGAIN",
    "LOST_AT_STOP",
    "PENDING",
    "ROLLED_BACK",
    "TRAINED",
    "GroupFates",
    "Ledger",
    "add",
]

#: The wasted buckets that are not by reason (abandoned and discarded are).
LOST_AT_STOP = "lost at a stop"
ROLLED_BACK = "trained by a step a restore redid"
LOGGED_AGAIN = "trained by a step its run logged again"


class Ledger:
    """Where every sealed attempt's tokens went, by its group's fate (resolved at the end,
    since a later run may train a group again, or redo the step that trained it).

    A group in flight collects its tokens in the shared state (by rollout key) and hands
    them over when it is trained, discarded, reserved again or left at the end.
    A group belongs to the last run that reserved it or sealed an attempt into it.  Its
    tokens are wasted or trained by :class:`GroupFates`.  Memory: one small record per
    group and per step."""

    def __init__(self) -> None:
        self.groups: dict[str, list[Any]] = {}  # group_id → [tokens, run_id, discard reason]

    def touch(self, group_id: str, run_id: str, tokens: int = 0) -> None:
        record = self.groups.get(group_id)
        if record is None:  # one string a group for every record: interned
            self.groups[sys.intern(group_id)] = [tokens, run_id, None]
        else:
            record[0] += tokens
            record[1] = run_id

    def settle(self, group_id: str, group: Group) -> None:
        """Take over the tokens a group in flight collected (its attempts, by key)."""
        self.touch(group_id, group.run_id, sum(group.attempts.values()))

    def carry_out(self, group_id: str, tokens: int) -> None:
        """A resumed run carried ``tokens`` of a settled group's work into a group of its own
        (:class:`~otel_rollout.analysis.carry.Carried`): they follow that group now."""
        self.groups[group_id][0] -= tokens

    def discard(self, group_id: str, run_id: str, reason: str) -> None:
        self.touch(group_id, run_id)
        self.groups[group_id][2] = reason

    def resolve(
        self, fate: GroupFates, in_flight: Mapping[str, Group] | None = None
    ) -> dict[str, int]:
        """Tokens by fate: ``trained``, ``pending`` and each wasted cause (the file is read),
        counting ``in_flight`` groups as if settled, without changing the ledger."""
        buckets: dict[str, int] = {}
        in_flight = in_flight or {}
        for group_id, (tokens, run_id, reason) in self.groups.items():
            group = in_flight.get(group_id)
            if group is not None:
                tokens, run_id = tokens + sum(group.attempts.values()), group.run_id
            add(buckets, fate(group_id, run_id, reason), tokens)
        for group_id, group in in_flight.items():
            if group_id not in self.groups:
                add(buckets, fate(group_id, group.run_id, None), sum(group.attempts.values()))
        return buckets


#: A group's fate, besides the wasted causes: trained by a surviving step, or pending.
TRAINED = "trained"
PENDING = "pending"


class GroupFates:
    """The one rule for where a group's work went, once the whole file is read: ``trained``
    if the surviving ``train.step`` of some step number (the last one in the file)
    trained it; else :data:`LOGGED_AGAIN` if a step its own run logged again under the
    same number did; else :data:`ROLLED_BACK` if an earlier step of that number did
    (a later run's replaced it); else ``discarded: REASON``; else ``pending`` if its run
    is the file's last; else :data:`LOST_AT_STOP`.  The ledger and the staleness
    analysis both use it."""

    def __init__(
        self,
        surviving: Iterable[Iterable[str]],
        trained: Container[str],
        last_run: str | None,
        logged_again: Container[str] = (),
    ) -> None:
        self.surviving: set[str] = set()
        for group_ids in surviving:  # the group_ids of each step number's last train.step
            self.surviving.update(group_ids)
        self.trained = trained  # groups any train.step trained
        self.logged_again = logged_again  # groups of a step its run logged again
        self.last_run = last_run

    @classmethod
    def of(cls, state: State) -> GroupFates:
        """The fates by the shared state of a pass that has read the whole file."""
        last = state.run.run_id if state.run is not None else None
        surviving = (s.group_ids for s in state.steps.values())
        return cls(surviving, state.trained, last, state.logged_again)

    def __call__(self, group_id: str, run_id: str, reason: str | None) -> str:
        if group_id in self.surviving:
            return TRAINED
        if group_id in self.logged_again:
            return LOGGED_AGAIN
        if group_id in self.trained:
            return ROLLED_BACK
        if reason is not None:
            return f"discarded: {reason}"
        return PENDING if run_id == self.last_run else LOST_AT_STOP


def add(counts: dict[str, int], cause: str, tokens: int) -> None:
    """Count ``tokens`` under ``cause`` (nothing for none)."""
    if tokens:
        counts[cause] = counts.get(cause, 0) + tokens
