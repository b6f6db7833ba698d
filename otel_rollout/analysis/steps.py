"""Batch age per step, from the shared state: the steps that survive and their groups' seals.

A step a resumed run trained again keeps the later run's ``train.step``; seals
are resolved across the whole file (a group sealed again keeps its latest
counts), so rows are made once the last event is read.
"""

from __future__ import annotations

from ..age import BATCH_AGE_EVENTS, StepAge, seal_items, step_age
from .engine import Analysis

__all__ = ["BATCH_AGE_EVENTS", "SealedCounts", "StepAges"]


class StepAges(Analysis):
    """Every surviving step's :class:`~otel_rollout.age.StepAge`, in step order."""

    kinds = BATCH_AGE_EVENTS

    def result(self) -> list[StepAge]:
        seals = self.state.seals
        steps = self.state.steps
        return [
            step_age(
                s.step,
                s.trained_version,
                s.group_ids,
                seals,
                run_id=s.run_id,
                t=s.t,
                logged_batch_age=s.logged_batch_age,
            )
            for s in (steps[n] for n in sorted(steps))
        ]


class SealedCounts(Analysis):
    """Each sealed group's latest tokens by version (groups sealed without counts left out)."""

    kinds = frozenset({"group.seal"})

    def result(self) -> dict[str, dict[int, int]]:
        return {g: dict(seal_items(c)) for g, c in self.state.seals.items() if c}
