"""What the stop/restore report page shows, gathered in the one pass beside the cost
analysis: batch age per step as trained, attempts in flight, each run's span, and the
staleness views (token age per step, discard and stale rates by generation-length
decile).  :mod:`otel_rollout.render.html` draws the page.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .age import StepAge
from .analysis import Analysis, StepAges, hot, run_events, run_file
from .cost import CostAnalysis, CostReport
from .reader import EventReader, Progress
from .staleness import StalenessAnalysis, StalenessReport

__all__ = ["ReportData", "ReportSeries", "collect", "collect_file"]

_MAX_POINTS = 2000
_ENDS = ("attempt.seal", "attempt.refuse", "attempt.abandon")


@dataclass
class ReportData:
    """Everything the page shows, gathered in one pass."""

    source: str
    t0: float | None = None
    runs: dict[str, list[float]] = field(default_factory=dict)  # run → [first t, last t]
    steps: list[tuple[float, str, int, float]] = field(default_factory=list)  # t, run, step, age
    #: Steps whose batch age is past what a float holds (±inf): in the table, not the chart.
    steps_off_chart: int = 0
    #: Attempts in flight as time buckets ``[start, end, least, most, sum, count]`` in file
    #: order: every change, one a bucket, or (past 4,000 changes) the least, most and mean
    #: of each bucket of a width doubled as the file goes on.
    in_flight: list[list[float]] = field(default_factory=list)
    cost: CostReport | None = None
    step_ages: list[StepAge] = field(default_factory=list)  # the surviving steps, as batch-age
    #: Each surviving step's tokens by age (every age, not bucketed), in step order.
    age_tokens: list[tuple[int, dict[int, int]]] = field(default_factory=list)
    #: ``staleness --json``'s ``length_bias.deciles`` and ``long_rollout_starvation``.
    deciles: list[dict[str, Any]] = field(default_factory=list)
    starvation: float | None = None


class ReportSeries(Analysis):
    """The page's time series: batch age per step as trained, attempts in flight, and each
    run's span (an analysis of the one pass, beside the cost analysis)."""

    kinds = frozenset({"attempt.dispatch", "attempt.resume", "train.step", "group.seal", *_ENDS})
    #: The attempts in flight: every change the shared state counted (on the compiled
    #: path too), taken at each step, at the end, and whenever they pass a megabyte.  (The
    #: attempt kinds stay in ``kinds`` above so that the state follows them.)
    keeps_flight_counts = True

    def __init__(self, data: ReportData) -> None:
        self.data = data
        #: The in-flight buckets' [width in seconds (0: one a change), origin].
        self._geometry = [0.0, 0.0]

    def handlers(self) -> Mapping[str, Callable[[Any], None]]:
        return {"train.step": self._step}

    def _counts(self) -> bytearray:
        counts = self.state.flight_counts
        assert counts is not None, "the engine keeps them: keeps_flight_counts"
        return counts

    def take_flight_counts(self, counts: bytearray) -> None:
        """Fold the changes of attempts in flight the state counted since the last call
        into the time buckets (:func:`~otel_rollout.analysis.hot.fold_flight_counts`: at
        most ~2 × the points drawn however long the file, each with its range's least and
        most, so a chart's band shows every peak; a point per attempt start and end held
        the 600k-line bench trace's report at 120 MB peak), and clear them."""
        if counts:
            hot.fold_flight_counts(counts, self.data.in_flight, self._geometry, _MAX_POINTS)
            counts.clear()

    def _step(self, e: Any) -> None:
        self.take_flight_counts(self._counts())  # (at most a megabyte of them)
        age = self.state.shown_age(e)
        if age is not None:
            if math.isfinite(age):
                self.data.steps.append((e.t, e.run_id, e.step, float(age)))
            else:  # no point of a chart or its zoom data's JSON can hold it
                self.data.steps_off_chart += 1

    def result(self) -> ReportData:
        self.take_flight_counts(self._counts())
        data = self.data
        for run in self.state.runs:
            span = data.runs.setdefault(run.run_id, [run.first_t, run.last_t])
            span[1] = max(span[1], run.last_t)
        if self.state.runs:
            data.t0 = self.state.runs[0].first_t
        return data


def _staleness(data: ReportData, found: StalenessReport) -> None:
    """The page's staleness views from the staleness analysis of the same pass."""
    data.age_tokens = [(row.step, row.age_tokens) for row in found.steps]
    data.deciles, data.starvation = found.deciles, found.starvation


def collect(events: Iterable[Any], source: str = "") -> ReportData:
    """Read ``events`` once (dicts or typed events, file order) for the whole page."""
    data = ReportData(source)
    analyses = [CostAnalysis(), ReportSeries(data), StepAges(), StalenessAnalysis()]
    data.cost, _, data.step_ages, found = run_events(events, analyses)
    _staleness(data, found)
    return data


def collect_file(
    path: str | os.PathLike[str] | EventReader, *, progress: Progress | None = None
) -> ReportData:
    """:func:`collect` over a trace file, read once in typed blocks."""
    source = path.path if isinstance(path, EventReader) else path
    data = ReportData(str(source))
    analyses = [CostAnalysis(), ReportSeries(data), StepAges(), StalenessAnalysis()]
    data.cost, _, data.step_ages, found = run_file(path, analyses, progress=progress)
    _staleness(data, found)
    return data
