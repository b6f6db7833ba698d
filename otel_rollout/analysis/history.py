"""Every group's history, kept to the end of the pass for an analysis that asks for it.

The shared state forgets a group once it is trained or discarded; the staleness
diagnostics need, at the end of the file, every group's sealed attempts (each one's
length and time in flight, to sort them by the group's fate), its latest
reservation (its prompt, and when its wait for a step began) and the run that last
touched it.  The state keeps these here when an analysis of the pass sets
:attr:`~otel_rollout.analysis.Analysis.keeps_histories`, by the same rules on both
paths a line may take: the state's Python handlers call :class:`Histories`, and the
compiled path (``_hot.c``) writes the same records for the lines it applies (a
hypothesis test compares the two).  Memory: one record a group, 16 bytes a sealed
attempt.
"""

from __future__ import annotations

import struct
import sys
from array import array
from collections.abc import Iterable
from typing import Any

from .._spans_of_time import FAR_S, whole_ms
from .records import Attempt

__all__ = ["PAIR", "Histories", "History", "flat_pairs"]

#: A sealed attempt as its history holds it: (tokens, milliseconds in flight), two native
#: 64-bit integers, as the compiled path packs them.
PAIR = struct.Struct("=qq")


class History:
    """One group's history (slots: a record per group of the file)."""

    __slots__ = ("epoch", "prompt_id", "reason", "reserved", "run", "sealed")

    def __init__(self, run: str) -> None:
        self.run = run  # the last run that reserved, sealed into or discarded it
        self.reason: str | None = None  # its discard's reason
        self.epoch: int | None = None  # of its latest reservation
        self.prompt_id: Any = None
        self.reserved: float | None = None  # the latest reservation's time
        #: its sealed attempts as PAIR-packed bytes, or as a flat list of ints once a count
        #: does not fit in 64 bits
        self.sealed: bytearray | list[int] | None = None


def flat_pairs(held: Iterable[bytearray | list[int]]) -> array[int] | list[int]:
    """The sealed attempts of some histories as one flat ``tokens, ms, tokens, ms, …``
    sequence (an array of 64-bit integers, or a list where one held a bigger count)."""
    held = list(held)
    packed = [sealed for sealed in held if isinstance(sealed, bytearray)]
    if len(packed) == len(held):
        values = array("q")
        values.frombytes(b"".join(packed))
        return values
    flat: list[int] = []
    for sealed in held:
        flat.extend(array("q", sealed) if isinstance(sealed, bytearray) else sealed)
    return flat


class Histories(dict[str, History]):
    """``group_id → History``: the rules by which each event changes a group's history."""

    def of(self, group_id: str, run: str) -> History:
        """The group's record, made on first sight (its ID interned: one string for all)."""
        record = self.get(group_id)
        if record is None:
            record = self[sys.intern(group_id)] = History(run)
        return record

    def reserve(self, e: Any, run: str) -> None:
        """A reservation (again: the latest one starts the wait)."""
        record = self.of(e.group_id, run)
        record.run, record.epoch = run, e.epoch or 0
        record.prompt_id, record.reserved = e.prompt_id, e.t

    def seal(self, e: Any, run: str, attempt: Attempt | None) -> None:
        """An attempt sealed into the group: its tokens and its time in flight (from its
        dispatch or resume; 0 if it was not in flight)."""
        record = self.of(e.group_id, run)
        record.run = run  # the group belongs to the last run that sealed into it
        ms = 0
        if attempt is not None:
            flight = e.t - attempt[2]
            if flight > 0.0:
                ms = round(flight * 1000) if flight < FAR_S else whole_ms(flight)
        sealed = record.sealed
        if sealed is None:
            sealed = record.sealed = bytearray()
        if isinstance(sealed, bytearray):
            try:
                sealed += PAIR.pack(e.tokens, ms)
                return
            except struct.error:  # a count past 64 bits: this group's lengths in a list
                sealed = record.sealed = list(memoryview(sealed).cast("q"))
        sealed += (e.tokens, ms)

    def discard(self, e: Any, run: str) -> None:
        record = self.of(e.group_id, run)
        record.run, record.reason = run, e.reason
