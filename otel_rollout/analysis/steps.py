"""Batch age per step, from the shared state: the steps that survive and their groups' seals.

A step a resumed run trained again keeps the later run's ``train.step``; seals
are resolved across the whole file (a group sealed again keeps its latest
counts).  Each step's row is made as the pass reads it, the one the pass's other
views show, and made again at the end only if a group of it was sealed after it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ..age import BATCH_AGE_EVENTS, StepAge, seal_items, step_age
from .engine import Analysis

__all__ = ["BATCH_AGE_EVENTS", "SealedCounts", "StepAges"]


class StepAges(Analysis):
    """Every surviving step's :class:`~otel_rollout.age.StepAge`, in step order."""

    kinds = BATCH_AGE_EVENTS

    def __init__(self, *, rows_as_read: bool = True) -> None:
        """``rows_as_read``: keep each step's row as the pass reads it, for the result (made
        again at the end, every row cost ~0.1 s of the 1M-line pass); False keeps nothing
        per step and makes every row when :meth:`result` is asked for (a live view, which
        may follow a run for days, keeps its memory to the work in flight)."""
        # step number → the row of its latest train.step as read (the state's steps keep
        # the same one)
        self._read: dict[int, StepAge] = {}
        self._rows_as_read = rows_as_read

    def handlers(self) -> Mapping[str, Callable[[Any], None]]:
        return {"train.step": self._step} if self._rows_as_read else {}

    def _step(self, e: Any) -> None:
        self._read[e.step] = self.state.step_age(e)

    def result(self) -> list[StepAge]:
        seals, steps, late, read = (
            self.state.seals,
            self.state.steps,
            self.state.sealed_late,
            self._read,
        )
        rows = []
        for n in sorted(steps):
            s = steps[n]
            row = read.get(n)
            if row is None or (late and not late.isdisjoint(s.group_ids)):
                row = step_age(
                    s.step,
                    s.trained_version,
                    s.group_ids,
                    seals,
                    run_id=s.run_id,
                    t=s.t,
                    logged_batch_age=s.logged_batch_age,
                )
            rows.append(row)
        return rows


class SealedCounts(Analysis):
    """Each sealed group's latest tokens by version (groups sealed without counts left out)."""

    kinds = frozenset({"group.seal"})

    def result(self) -> dict[str, dict[int, int]]:
        return {g: dict(seal_items(c)) for g, c in self.state.seals.items() if c}
