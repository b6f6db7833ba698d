"""Batch age as events arrive: :class:`LiveBatchAge`, the incremental counterpart of the
offline pass, behind the Prometheus gauge and the trackers' rows.

It keeps the groups in flight and resolves each ``train.step`` with
:func:`~otel_rollout.age.step_age`, the one implementation of the arithmetic the
offline analyses use too.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from .age import SealCounts, StepAge, seal_counts, step_age
from .events import from_object

_log = logging.getLogger("otel_rollout")

__all__ = ["LiveBatchAge", "OnMalformed"]

OnMalformed = Callable[[dict[str, Any], str], None]


def _log_malformed(event: dict[str, Any], reason: str) -> None:
    _log.warning("skipping a malformed %s event: %s", event.get("event"), reason)


class LiveBatchAge:
    """Batch age as events arrive, with the same code as the offline analyses.

    The live counterpart for a running process: feed it every event (a dict);
    a ``train.step`` returns that step's :class:`StepAge`.  Seals and steps
    are checked by the schema's rules (:func:`otel_rollout.events.from_object`)
    and malformed ones go to ``on_malformed(event, reason)``.

    A step's groups are resolved against each group's latest seal so far, as
    ``batch_age_by_step`` resolves them against the latest in the file, so the
    two agree for every step except where the live value cannot see the future:

    * a group sealed again after a step that trained it (the file counts the later
      seal for that step too);
    * a step number trained again (the file keeps the later ``train.step``; here
      each gets its own value);
    * a group named again after more than :data:`_KEPT` other groups left flight
      since it did, unless a checkpoint published while it was sealed and not
      trained is among the :data:`_KEPT` newest such groups.

    Memory: the groups in flight, plus two bounded sets.  A group that leaves
    flight (trained or discarded) is kept among the :data:`_KEPT` newest such, for a
    step naming it again (the file counts it again).  At each ``checkpoint.publish``
    the groups sealed and not yet trained are kept too, apart, among the
    :data:`_KEPT` newest: only those can come back from a rollout snapshot, however
    many groups the stopped run trained after the checkpoint.
    """

    def __init__(self, on_malformed: OnMalformed | None = None) -> None:
        self._groups: dict[str, SealCounts] = {}  # sealed and in flight
        #: Groups that left flight (trained or discarded), oldest first.
        self._left: OrderedDict[str, SealCounts] = OrderedDict()
        #: Groups sealed and untrained at a checkpoint, oldest checkpoint first.
        self._snapped: OrderedDict[str, SealCounts] = OrderedDict()
        self._report = on_malformed or _log_malformed

    def observe(self, event: dict[str, Any]) -> StepAge | None:
        kind = event.get("event")
        if kind.__class__ is str and kind not in _LIVE_KINDS:
            return None  # (an event that is no string is reported below)
        typed, problem = from_object(event)
        if typed is None:
            if problem is not None:
                self._report(event, problem)
            return None
        if kind == "group.seal":
            counts = seal_counts(typed.tokens_by_version)
            group_id = typed.group_id
            self._groups[group_id] = counts
            self._left.pop(group_id, None)
            if group_id in self._snapped:  # the latest seal counts wherever the group is named
                self._snapped[group_id] = counts
        elif kind == "group.discard":
            counts = self._groups.pop(typed.group_id, None)
            if counts is not None:
                self._leave(typed.group_id, counts)
        elif kind == "checkpoint.publish":
            snapped = self._snapped
            for group_id, counts in self._groups.items():
                snapped[group_id] = counts
                snapped.move_to_end(group_id)
            _trim(snapped)
        else:
            return self._step(typed)
        return None

    def _leave(self, group_id: str, counts: SealCounts) -> None:
        left = self._left
        left[group_id] = counts
        left.move_to_end(group_id)
        _trim(left)

    def _step(self, typed: Any) -> StepAge:
        groups, left, snapped = self._groups, self._left, self._snapped
        seals: dict[str, SealCounts] = {}
        for group_id in typed.group_ids:
            counts = groups.get(group_id)
            if counts is None:
                counts = left.get(group_id)
                if counts is None:
                    counts = snapped.get(group_id)
            if counts is not None:
                seals[group_id] = counts
        row = step_age(
            typed.step,
            typed.trained_version,
            typed.group_ids,
            seals,
            run_id=typed.run_id,
            t=typed.t,
            logged_batch_age=typed.batch_age,
        )
        for group_id, counts in seals.items():
            groups.pop(group_id, None)
            self._leave(group_id, counts)
        return row


def _trim(kept: OrderedDict[str, SealCounts]) -> None:
    # popitem, not ``del d[next(iter(d))]``: a plain dict scans the slots its deletions
    # left, 12-41 µs a group once full, against ~1.3 µs here (measured).
    while len(kept) > _KEPT:
        kept.popitem(last=False)


_LIVE_KINDS = frozenset({"group.seal", "group.discard", "train.step", "checkpoint.publish"})
#: Groups kept after they left flight, and apart, groups kept from checkpoints: 64k groups
#: each (~250 bytes a group, ~16 MB each, measured with tracemalloc) is hundreds of steps
#: of a large run.
_KEPT = 65_536
