"""Batch age arithmetic: token-weighted policy updates between generating a token and
training on it.

This module is the one implementation of the arithmetic (SPEC §5).  The live
path (a controller calls :func:`batch_age_group_metrics` per published group
and :func:`pop_batch_age` per step; the Prometheus gauge and the trackers feed
:class:`~otel_rollout.live_age.LiveBatchAge`) and the offline path (the
analysis engine over a trace file) share :func:`step_age` and
:func:`batch_age`, so both give the same float for every step.
"""

from __future__ import annotations

import itertools
import math
import struct
from array import array
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

# The step's sums in C (_age.c) wherever built: the live gauge's and the trackers' too, not
# only the read pass's (``OTEL_ROLLOUT_COMPILED_PASS`` is the pass's switch); a hypothesis
# test holds them to the Python loop, row for row.
try:
    from ._age import step_sums as _step_sums
except ImportError:
    _step_sums = None

__all__ = [
    "AGE_BUCKETS",
    "BATCH_AGE_EVENTS",
    "BATCH_AGE_TOKENS_METRIC",
    "BATCH_AGE_VERSION_SUM_METRIC",
    "RefitCuts",
    "StepAge",
    "batch_age",
    "batch_age_group_metrics",
    "call_tokens_by_version",
    "pop_batch_age",
    "seal_counts",
    "seal_items",
    "step_age",
]

BATCH_AGE_TOKENS_METRIC = "batch_age/trained_tokens"
BATCH_AGE_VERSION_SUM_METRIC = "batch_age/token_version_sum"

#: The only event kinds batch age needs; readers may skip every other line unparsed.  A
#: ``run.start`` says which run a line is (a forked child's lines are its parent's run).
#: (a ``checkpoint.restore`` tells a step a run trains again after it from one it logged
#: again: both are read so that every reader warns of the same steps.)
BATCH_AGE_EVENTS = frozenset({"group.seal", "train.step", "run.start", "checkpoint.restore"})

#: Token ages reported separately; the last bucket holds this age and older.
AGE_BUCKETS = (0, 1, 2, 3)


def call_tokens_by_version(
    began_version: int, tokens: int, cuts: Sequence[tuple[int, int]] = ()
) -> dict[int, int]:
    """Split one call's tokens by the version that generated them.

    ``cuts`` are ``(tokens_so_far, new_version)`` in refit order.  Cut counts
    are clamped into ``[previous cut, tokens]``; zero-token pieces are left out.
    """
    counts: dict[int, int] = {}
    version, start = began_version, 0
    for at, new_version in cuts:
        at = min(max(at, start), tokens)
        if at > start:
            counts[version] = counts.get(version, 0) + at - start
        version, start = new_version, at
    if tokens > start:
        counts[version] = counts.get(version, 0) + tokens - start
    return counts


class RefitCuts:
    """Where each running captured call switched weights, until its group publishes.

    vLLM keeps running calls across a refit, so a call's tokens after the
    refit come from the new weights.  Record every refit's paused calls, then
    ask for a published group's counts with :meth:`tokens_by_version`.
    """

    def __init__(self) -> None:
        self._cuts: dict[Any, list[tuple[int, int]]] = {}
        self._first_replaced: dict[Any, int] = {}

    def __len__(self) -> int:
        """How many calls have recorded cuts (what the controller is holding on to)."""
        return len(self._cuts)

    def record(
        self, replaced_version: int, new_version: int, calls: Iterable[Sequence[Any]]
    ) -> None:
        """Record how many tokens each call had when the refit ``replaced_version → new_version``
        paused it; ``calls`` holds ``(call_id, tokens_so_far)`` pairs."""
        for call in calls:
            call_id, tokens_so_far = call[0], call[1]
            cuts = self._cuts.get(call_id)
            if cuts is None:
                self._cuts[call_id] = [(int(tokens_so_far), new_version)]
                self._first_replaced[call_id] = replaced_version
            else:
                cuts.append((int(tokens_so_far), new_version))

    def forget_before(self, oldest_trainable_version: int) -> None:
        """Drop calls whose group cannot be trained any more.

        A call began on or before the version its first refit replaced, and
        its group no later than the call, so the group is too old to train
        when that version is.
        """
        stale = [c for c, r in self._first_replaced.items() if r < oldest_trainable_version]
        for call_id in stale:
            del self._cuts[call_id]
            del self._first_replaced[call_id]

    def snapshot(self) -> dict[str, Any]:
        """The recorded cuts as JSON-ready data, for a rollout snapshot."""
        return {
            "cuts": {str(c): [list(cut) for cut in cuts] for c, cuts in self._cuts.items()},
            "first_replaced": {str(c): r for c, r in self._first_replaced.items()},
        }

    @classmethod
    def restore(cls, state: dict[str, Any]) -> RefitCuts:
        """Cuts as :meth:`snapshot` saved them (call IDs come back as strings)."""
        cuts = cls()
        cuts._cuts = {c: [(int(a), int(v)) for a, v in cs] for c, cs in state["cuts"].items()}
        cuts._first_replaced = {c: int(r) for c, r in state["first_replaced"].items()}
        return cuts

    def tokens_by_version(self, call_versions: Iterable[tuple[Any, int, int]]) -> dict[int, int]:
        """A published group's trained tokens by the weight version that made them.

        ``call_versions`` holds each trained call's ID, the version it began
        on and the tokens it generated.  A call's tokens count under the
        version it began on until a refit paused it, and under the version
        that refit installed from there on.  The calls are forgotten.
        """
        counts: dict[int, int] = {}
        for call_id, began_version, tokens in call_versions:
            cuts = self._cuts.pop(call_id, ())
            self._first_replaced.pop(call_id, None)
            for version, n in call_tokens_by_version(began_version, tokens, cuts).items():
                counts[version] = counts.get(version, 0) + n
        return counts


def batch_age_group_metrics(counts: dict[int, int]) -> dict[str, int]:
    """A published group's share of its step's batch age, as two sums."""
    return {
        BATCH_AGE_TOKENS_METRIC: sum(counts.values()),
        BATCH_AGE_VERSION_SUM_METRIC: sum(int(v) * n for v, n in counts.items()),
    }


#: Below this every integer is a float exactly (2**53).
_FLOAT_EXACT = 1 << 53


def batch_age(trained_version: int, tokens: int, version_sum: int) -> float | None:
    """``trained_version − version_sum / tokens``, or None when there are no tokens."""
    if tokens <= 0:
        return None
    if trained_version < _FLOAT_EXACT and version_sum < _FLOAT_EXACT:
        return trained_version - version_sum / tokens  # the reference's arithmetic, to the bit
    # Past 2**53 a float no longer holds every integer, and the reference's arithmetic
    # loses the age (2**53 + 1 trained as 2**53 + 2 gave 2.0; 2**64 gave 0.0): one division
    # of exact integers gives it correctly rounded, and never overflows below 2**1024.
    try:
        return (trained_version * tokens - version_sum) / tokens
    except OverflowError:  # the age itself is past the float range
        return math.inf if trained_version * tokens > version_sum else -math.inf


def pop_batch_age(per_group_metrics: dict[str, list[Any]], trained_version: int) -> float | None:
    """Remove the step's batch-age sums and return its batch age, if it has tokens.

    ``per_group_metrics`` holds the step's rollout metrics, one value per
    group; ``trained_version`` is the policy version the step updates.
    """
    return batch_age(
        trained_version,
        _total(per_group_metrics.pop(BATCH_AGE_TOKENS_METRIC, None)),
        _total(per_group_metrics.pop(BATCH_AGE_VERSION_SUM_METRIC, None)),
    )


def _total(values: Any) -> Any:
    """The sum of one metric's per-group values: a list, or a numpy array or tensor a
    trainer gathered them into (whose truth value is no answer), as a Python number."""
    if values is None:
        return 0
    total = sum(values)
    return total.item() if hasattr(total, "item") else total


@dataclass
class StepAge:
    """One training step's batch age and the token-age distribution behind it."""

    step: int
    trained_version: int
    groups: int
    tokens: int
    batch_age: float | None
    tokens_by_age: dict[int, int] = field(default_factory=dict)
    run_id: str | None = None
    t: float | None = None
    logged_batch_age: float | None = None

    def share(self, age: int) -> float:
        """Share of this step's tokens at ``age`` (the last bucket: that age or older)."""
        return self.tokens_by_age.get(age, 0) / self.tokens if self.tokens else 0.0


#: A seal's counts as every analysis keeps them: the bytes of ``array('q', [v1, n1, v2,
#: n2, ...])`` (16 bytes a version; a dict and its int objects took ~400 bytes a seal, 20 MB
#: of the 1M-line bench trace's 51k groups, and the array object itself 80 more than
#: bytes: 4 MB), or a dict when a number is past 64 bits.
SealCounts = Any
Seals = Mapping[str, SealCounts]  # group_id → its sealed tokens by version


def seal_counts(tokens_by_version: Mapping[Any, int] | None) -> SealCounts:
    """A seal's ``tokens_by_version`` (int keys from a typed event, decimal strings from a
    dict) packed as :data:`SealCounts`."""
    if not tokens_by_version:
        return _EMPTY
    pairs: Any = tokens_by_version.items()
    # A seal of one or two versions (nearly every seal of the bench trace has two: a refit
    # paused its calls) packs in one call: ~0.3 us against ~0.8 for the array below.
    try:
        if len(tokens_by_version) == 2:
            (v1, n1), (v2, n2) = pairs
            return _TWO.pack(v1, n1, v2, n2)
        if len(tokens_by_version) == 1:
            ((v1, n1),) = pairs
            return _PAIRS.pack(v1, n1)
    except struct.error:  # a decimal-string key, or past 64 bits: as below
        pass
    try:
        try:  # in C, for a typed event's int keys
            return array("q", _flat(pairs)).tobytes()
        except TypeError:  # a dict's decimal-string keys
            pairs = [(int(v), n) for v, n in pairs]
            return array("q", _flat(pairs)).tobytes()
    except OverflowError:  # integers past 64 bits are kept exact, in a dict
        return {int(v): n for v, n in pairs}


def seal_items(counts: SealCounts) -> Iterable[tuple[int, int]]:
    """``(version, tokens)`` of packed seal counts (unpacked in C: a memoryview's two
    slices and a zip took 4.7× as long, a fifth of batch-age's own time)."""
    if counts.__class__ is dict:
        return counts.items()  # the past-64-bits form
    return _PAIRS.iter_unpack(counts)


_PAIRS = struct.Struct("qq")
_TWO = struct.Struct("qqqq")
_flat = itertools.chain.from_iterable


_EMPTY = b""


def step_age(
    step: int,
    trained_version: int,
    group_ids: Sequence[str],
    seals: Seals,
    *,
    run_id: str | None = None,
    t: float | None = None,
    logged_batch_age: float | None = None,
) -> StepAge:
    """A step's :class:`StepAge` from its groups' sealed counts: the one computation the
    live gauge, the trackers and every offline analysis use."""
    top = AGE_BUCKETS[-1]
    sums = _step_sums(group_ids, seals, trained_version, top) if _step_sums else None
    if sums is not None:
        tokens, version_sum, by_age = sums
    else:  # the same loop in Python: without the C part, or past 64 bits
        tokens = version_sum = 0
        by_age = {}
        unpack = _PAIRS.iter_unpack
        for group_id in group_ids:
            counts = seals.get(group_id)
            if counts:
                # seal_items, inline (a call a group was a fifth of the step's time)
                pairs = counts.items() if counts.__class__ is dict else unpack(counts)
                for version, n in pairs:
                    tokens += n
                    version_sum += version * n
                    age = trained_version - version
                    age = top if age > top else 0 if age < 0 else age
                    by_age[age] = by_age.get(age, 0) + n
    mean = batch_age(trained_version, tokens, version_sum)
    return StepAge(
        step, trained_version, len(group_ids), tokens, mean, by_age, run_id, t, logged_batch_age
    )
