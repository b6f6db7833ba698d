"""Finished work a resumed run carried into a group of its own.

A resumed run re-reserves the groups its snapshot held in flight under new IDs
and carries their finished generations over; those log no attempt events in
the new run, so the new group's ``group.seal`` names more tokens than its own
attempts sealed.  :class:`Carries` finds where that work came from, for the
shared state (:mod:`otel_rollout.analysis.state`): the attempts of the same
prompt and epoch that earlier runs' groups hold (groups a stop left in flight,
or that the run before trained or discarded after its last
``checkpoint.publish``, which the restore undid), of generations the new group
did not run itself.  They move to the new group when their tokens make up the
difference exactly; otherwise nothing moves (the difference is unexplained).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .records import Group, Key

__all__ = ["SETTLED_KEPT", "Carried", "Carries"]

#: Most groups trained or discarded since a run's last checkpoint that are kept as
#: possible donors: a run that never publishes a checkpoint would otherwise keep every
#: group it trained (~110 bytes an attempt).  A restore undoes at most a checkpoint
#: interval, far fewer groups than this in any run seen here.
SETTLED_KEPT = 4096


@dataclass(slots=True)
class Carried:
    """Sealed attempts a resumed run carried from group ``donor`` into its group ``group``."""

    donor: str
    group: str
    run: str  # the run the group sealed in
    keys: list[tuple[Key, int]]  # each rollout moved, with its sealed tokens
    settled: bool  # the donor was trained or discarded already (its tokens in the ledger)

    @property
    def tokens(self) -> int:
        return sum(tokens for _, tokens in self.keys)


class Carries:
    """The donors a group seal may have taken work from, and the moves found (:attr:`moved`,
    in file order; analyses read the ones past those they have seen)."""

    def __init__(self, groups: Mapping[str, Group]) -> None:
        self._groups = groups  # the shared state's groups in flight
        self._settled: OrderedDict[str, Group] = OrderedDict()  # this run's, since a publish
        self._donors: dict[str, Group] = {}  # the run before's
        #: (epoch, prompt_id) → groups that may hold its finished work (an ordered set).
        self._orphans: dict[tuple[int, int], dict[str, None]] = {}
        self.moved: list[Carried] = []

    @property
    def waiting(self) -> dict[tuple[int, int], dict[str, None]]:
        """The groups that may hold finished work a later group takes, by (epoch, prompt_id)
        (empty: a seal has nothing to look for); the one dict, changed in place."""
        return self._orphans

    def settled(self, group_id: str, group: Group) -> None:
        """A group with sealed attempts was trained or discarded."""
        if not group.attempts:
            return
        settled = self._settled
        if group_id in settled:  # settled again: the newest now (a new key goes last anyway)
            settled.move_to_end(group_id)
        settled[group_id] = group
        if len(settled) > SETTLED_KEPT:
            settled.popitem(last=False)

    def published(self) -> None:
        """A checkpoint: what was trained or discarded before it no resume from it redoes."""
        self._settled.clear()

    def stop(self, in_flight: Mapping[str, Group]) -> None:
        """A run stopped with ``in_flight`` (its groups still in flight): they, and what it
        trained or discarded since its last checkpoint, may give work to the next run."""
        self._donors, self._settled = dict(self._settled), OrderedDict()
        live = {**self._groups, **self._donors}
        for prompt, donors in list(self._orphans.items()):  # drop groups gone for good
            kept = {d: None for d in donors if d in live}
            if kept:
                self._orphans[prompt] = kept
            else:
                del self._orphans[prompt]
        for group_id, group in (*in_flight.items(), *self._donors.items()):
            for prompt in {key[:2] for key in group.attempts}:
                self._orphans.setdefault(prompt, {})[group_id] = None

    def seal(self, e: Any, group: Group) -> None:
        """``e`` seals ``group``: take the work it names beyond its own attempts' tokens from
        the donors, if they hold exactly that much."""
        if not self._orphans:
            return
        shortfall = e.tokens - sum(group.attempts.values())
        if shortfall <= 0:
            return
        found: list[tuple[str, Group, Key, int]] = []
        for donor_id in self._orphans.get((group.epoch, e.prompt_id), ()):
            donor = self._groups.get(donor_id) or self._donors.get(donor_id)
            if donor is None or donor is group or donor.run_id == e.run_id:
                continue  # settled before its run's last checkpoint, or taken over since
            for key, tokens in donor.attempts.items():
                if key[1] == e.prompt_id and key[0] == group.epoch and key not in group.attempts:
                    found.append((donor_id, donor, key, tokens))
        if not found or sum(tokens for *_, tokens in found) != shortfall:
            return
        moved: dict[str, Carried] = {}
        held = group.attempts
        for donor_id, donor, key, tokens in found:
            del donor.attempts[key]
            held[key] = held.get(key, 0) + tokens  # two donors may hold one rollout
            move = moved.get(donor_id)
            if move is None:
                settled = donor_id not in self._groups
                move = moved[donor_id] = Carried(donor_id, e.group_id, e.run_id, [], settled)
            move.keys.append((key, tokens))
        self.moved += moved.values()
