"""Batch age, the reference API (SPEC §4): the arithmetic and its file functions.

The arithmetic lives in :mod:`otel_rollout.age`; the functions over a file's
events run the one analysis pass (:mod:`otel_rollout.analysis`), so they
read, check and count exactly as ``otel-rollout batch-age`` does.  They take
the dicts :func:`~otel_rollout.reader.read_events` yields (an unstarted
``read_events(path)`` is read as its file, with the least work), or the
schema's typed events.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

from .age import (
    AGE_BUCKETS,
    BATCH_AGE_TOKENS_METRIC,
    BATCH_AGE_VERSION_SUM_METRIC,
    RefitCuts,
    StepAge,
    batch_age,
    batch_age_group_metrics,
    call_tokens_by_version,
    pop_batch_age,
    step_age,
)
from .analysis import BATCH_AGE_EVENTS, SealedCounts, StepAges, run_events
from .live_age import LiveBatchAge, OnMalformed

__all__ = [
    "AGE_BUCKETS",
    "BATCH_AGE_EVENTS",
    "BATCH_AGE_TOKENS_METRIC",
    "BATCH_AGE_VERSION_SUM_METRIC",
    "LiveBatchAge",
    "RefitCuts",
    "StepAge",
    "batch_age",
    "batch_age_by_step",
    "batch_age_group_metrics",
    "call_tokens_by_version",
    "pop_batch_age",
    "step_age",
    "step_ages",
    "tokens_by_version",
]


def _warner(on_malformed: OnMalformed | None) -> Any:
    """The engine's warning callback for the reference functions' ``on_malformed``."""
    if on_malformed is None:
        return None
    return lambda where, message: on_malformed({"where": where}, message)


def tokens_by_version(
    events: Iterable[Any] | str | os.PathLike[str], *, on_malformed: OnMalformed | None = None
) -> dict[str, dict[int, int]]:
    """Each published group's trained tokens, by the weight version that made them.

    Groups are resolved across the whole file; when a group was sealed more
    than once, the latest seal wins.
    """
    [counts] = run_events(events, [SealedCounts()], on_warning=_warner(on_malformed))
    return counts


def step_ages(
    events: Iterable[Any] | str | os.PathLike[str], *, on_malformed: OnMalformed | None = None
) -> list[StepAge]:
    """Every step's :class:`StepAge`, in step order; a step trained again keeps the later one.

    Seals are resolved across the whole input (the latest seal of a group
    wins), so steps are evaluated once every event has been read.  Memory is
    bounded by the groups and steps, not by the number of lines.  Events the
    schema's rules reject, and steps naming groups never sealed, go to
    ``on_malformed({"where": line or "event N"}, reason)`` (default: a warning).
    """
    [rows] = run_events(events, [StepAges()], on_warning=_warner(on_malformed))
    return rows


def batch_age_by_step(
    events: Iterable[Any] | str | os.PathLike[str], *, on_malformed: OnMalformed | None = None
) -> dict[int, float]:
    """Each step's token-weighted age: policy updates from generating to training.

    A step a resumed run trained again keeps the later run's value; steps
    whose groups carry no counts are absent, not 0.  ``events`` are events (dicts
    or the schema's structs), ``read_events(path)``, or a path itself.
    """
    rows = step_ages(events, on_malformed=on_malformed)
    return {r.step: r.batch_age for r in rows if r.batch_age is not None}
