"""What the stop/restore report page shows, gathered in the one pass beside the cost
analysis: batch age per step as trained, token-age shares, attempts in flight, and
each run's span.  :mod:`otel_rollout.render.html` draws the page.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .age import AGE_BUCKETS, StepAge, step_age
from .analysis import Analysis, StepAges, Stop, run_events, run_file
from .cost import CostAnalysis, CostReport
from .reader import EventReader, Progress

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
    shares: dict[int, list[float]] = field(default_factory=dict)  # step → shares by age
    in_flight: list[tuple[float, int]] = field(default_factory=list)
    cost: CostReport | None = None
    step_ages: list[StepAge] = field(default_factory=list)  # the surviving steps, as batch-age


class ReportSeries(Analysis):
    """The page's time series: batch age per step as trained, token-age shares, attempts in
    flight, and each run's span (an analysis of the one pass, beside the cost analysis)."""

    kinds = frozenset({"attempt.dispatch", "attempt.resume", "train.step", "group.seal", *_ENDS})

    def __init__(self, data: ReportData) -> None:
        self.data = data
        self._every = 1  # keep every n-th point of attempts in flight
        self._seen = 0
        self._last: tuple[float, int] | None = None  # the newest point, if not kept

    def _point(self, t: float, n: int) -> None:
        """A point of the in-flight series, thinned as it comes: memory stays ~2 × the points
        drawn however long the file (a point per attempt start and end held the 600k-line
        bench trace's report at 120 MB peak)."""
        self._seen += 1
        if self._seen % self._every:
            self._last = (t, n)
            return
        self._last = None
        points = self.data.in_flight
        points.append((t, n))
        if len(points) >= 2 * _MAX_POINTS:
            del points[1::2]
            self._every *= 2

    def handlers(self) -> Mapping[str, Callable[[Any], None]]:
        ends = dict.fromkeys(_ENDS, self._end)
        return {"attempt.dispatch": self._start, "attempt.resume": self._start,
                "train.step": self._step, **ends}  # fmt: skip

    def stop(self, stop: Stop) -> None:
        if stop.attempts:  # the old run's attempts died with it
            self._point(stop.new.first_t, len(self.state.attempts))

    def _start(self, e: Any) -> None:
        running = self.state.attempts
        self._point(e.t, len(running) + (e.attempt_id not in running))

    def _end(self, e: Any) -> None:
        running = self.state.attempts
        if e.attempt_id in running:
            self._point(e.t, len(running) - 1)

    def _step(self, e: Any) -> None:
        row = step_age(e.step, e.trained_version, e.group_ids, self.state.seals)
        age = e.batch_age if e.batch_age is not None else row.batch_age
        if age is not None:
            self.data.steps.append((e.t, e.run_id, e.step, float(age)))
        if row.tokens:
            self.data.shares[e.step] = [row.share(a) for a in AGE_BUCKETS]

    def result(self) -> ReportData:
        data = self.data
        for run in self.state.runs:
            span = data.runs.setdefault(run.run_id, [run.first_t, run.last_t])
            span[1] = max(span[1], run.last_t)
        if self.state.runs:
            data.t0 = self.state.runs[0].first_t
        if self._last is not None:  # the series ends where the file does
            data.in_flight.append(self._last)
        return data


def collect(events: Iterable[Any], source: str = "") -> ReportData:
    """Read ``events`` once (dicts or typed events, file order) for the whole page."""
    data = ReportData(source)
    data.cost, _, data.step_ages = run_events(
        events, [CostAnalysis(), ReportSeries(data), StepAges()]
    )
    return data


def collect_file(
    path: str | os.PathLike[str] | EventReader, *, progress: Progress | None = None
) -> ReportData:
    """:func:`collect` over a trace file, read once in typed blocks."""
    source = path.path if isinstance(path, EventReader) else path
    data = ReportData(str(source))
    analyses = [CostAnalysis(), ReportSeries(data), StepAges()]
    data.cost, _, data.step_ages = run_file(path, analyses, progress=progress)
    return data
