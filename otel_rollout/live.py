"""The one pass, fed as a file grows: each look reads only the lines appended since the last.

:class:`LiveTrace` follows a trace with the export sidecar's
:class:`~otel_rollout.follow.FileFollower` (a partial last line is held until its
newline arrives, a truncated or replaced file is read again from its start),
decodes the new lines with the reader's own block step
(:meth:`~otel_rollout.reader.EventReader.numbered_block`) and feeds them to one
:class:`~otel_rollout.analysis.Engine` that lives across looks, so the shared
state and every analysis carry over.  After any number of looks the results are
those of one fresh pass over the complete lines read so far (a property test
cuts files at random byte offsets to check it).
"""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .age import StepAge, step_age
from .analysis import Analysis, Engine, OnWarning, StepAges, Stop
from .cost import CostAnalysis, CostReport
from .follow import FileFollower
from .reader import EventReader, Progress

__all__ = ["Frame", "LiveFigures", "LiveTrace"]

#: Steps the sparkline of batch age covers.
RECENT_STEPS = 40
#: Seconds of reading the events-per-second figure averages over.
_RATE_WINDOW = 5.0


class LiveFigures(Analysis):
    """What a live view shows that the shared state does not keep: the last step, the
    versions, refits and the calls they paused, restores, and trace events dropped."""

    kinds = frozenset({"train.step", "weights.sync", "checkpoint.restore", "trace.dropped"})

    def __init__(self) -> None:
        self.last_step: Any = None  # the latest train.step read
        self.top_step: int | None = None  # the highest step number read
        self.trainer_version: int | None = None  # the current run's weights: step or restore
        self.engine_version: int | None = None  # the current run's latest refit
        self.refits = 0
        self.paused_calls = 0
        self.last_paused = 0  # calls the latest refit paused
        self.restores = 0
        self.dropped = 0

    def handlers(self) -> Mapping[str, Callable[[Any], None]]:
        return {
            "train.step": self._step,
            "weights.sync": self._sync,
            "checkpoint.restore": self._restore,
            "trace.dropped": self._dropped,
        }

    def stop(self, stop: Stop) -> None:
        self.trainer_version = self.engine_version = None  # the new run says its own

    def _step(self, e: Any) -> None:
        self.last_step = e
        self.trainer_version = e.trained_version + 1  # a step updates its trained_version
        if self.top_step is None or e.step > self.top_step:
            self.top_step = e.step

    def _sync(self, e: Any) -> None:
        self.refits += 1
        self.last_paused = len(e.cuts) if e.cuts else 0
        self.paused_calls += self.last_paused
        self.engine_version = e.new_version

    def _restore(self, e: Any) -> None:
        self.restores += 1
        self.trainer_version = e.weight_version

    def _dropped(self, e: Any) -> None:
        self.dropped += e.count

    def result(self) -> dict[str, Any]:
        last = self.last_step
        return {
            "step": last.step if last is not None else None,
            "top_step": self.top_step,
            "trainer_version": self.trainer_version,
            "engine_version": self.engine_version,
            "refits": self.refits,
            "paused_calls": self.paused_calls,
            "last_paused": self.last_paused,
            "restores": self.restores,
            "trace_events_dropped": self.dropped,
        }


@dataclass
class Frame:
    """Everything one screen of ``otel-rollout watch`` shows, as of one look."""

    path: str
    exists: bool
    size: int  # the file's size now
    complete_to: int  # offset past the last complete line read (FileFollower.offset)
    partial: int  # bytes of an unfinished last line, held back
    lines: int
    events: int
    events_per_s: float | None  # over the last few seconds of following
    runs: int
    run_id: str | None
    run_first_t: float | None
    last_t: float | None  # the newest event's time
    step: int | None  # the latest train.step's number
    age: StepAge | None  # its batch age, by the file's seals so far
    recent: list[tuple[int, float | None]]  # (step, batch age) of the highest step numbers
    figures: dict[str, Any]
    attempts_in_flight: int
    groups_in_flight: int
    groups_sealed: int  # of those, sealed and not yet trained
    skipped: int
    last_skip: str | None
    step_warnings: int
    last_step_warning: str | None
    cost: CostReport | None  # when the file holds a stop
    notes: list[str] = field(default_factory=list)


class LiveTrace:
    """One growing trace file, read incrementally into one analysis pass.

    ``on_warning(line, message)`` hears every skipped line and every problem the pass
    finds (a step naming groups never sealed), as :func:`run_file` reports them.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        window: int = 5,
        on_warning: OnWarning | None = None,
    ) -> None:
        self.path = Path(path)
        self.window = window
        self._on_warning = on_warning
        self.follower = FileFollower(self.path)
        self.notes: list[str] = []
        self._rate: deque[tuple[float, int]] = deque()
        self._whole: int | None = None  # read_whole read the file, of this size
        self._begin()

    def _begin(self) -> None:
        """A fresh pass (at the start, and when the file is replaced or truncated)."""
        self.reader = EventReader(self.path, typed=True, on_skip=self._skip)
        self.figures = LiveFigures()
        # no handlers: nothing kept per step, the rows made when results() asks for them
        self.ages = StepAges(rows_as_read=False)
        self.costs = CostAnalysis(self.window)
        self.engine = Engine([self.figures, self.ages, self.costs], self._step_warning)
        self.skipped = self.step_warnings = 0
        self.last_skip: str | None = None
        self.last_step_warning: str | None = None
        self._long = self.follower.long_lines
        self._cost: CostReport | None = None
        self._cost_at = self._cost_took = 0.0
        self._cost_events = -1
        self._rate.clear()

    def _skip(self, line: int, why: str) -> None:
        self.skipped += 1
        self.last_skip = f"line {line}: {why}"
        if self._on_warning is not None:
            self._on_warning(line, f"{why}; skipped")

    def _step_warning(self, where: int | str, message: str) -> None:
        self.step_warnings += 1
        self.last_step_warning = f"line {where}: {message}"
        if self._on_warning is not None:
            self._on_warning(where, message)

    @property
    def lines(self) -> int:
        return self.reader.lines

    def read(self, budget: float = 0.5) -> int:
        """Read what was appended since the last call (for at most about ``budget``
        seconds, so a view of a large file shows its progress); the events read."""
        reader, before = self.reader, self.reader.events
        deadline = time.monotonic() + budget
        while True:
            batch = self.follower.read()
            if batch.reopened:
                self.notes.append(
                    f"{time.strftime('%H:%M:%S')}: the file was truncated or replaced; "
                    "read again from its start"
                )
                self._begin()
                reader, before = self.reader, 0
            if self.follower.long_lines > self._long:  # the batch's first line, now blank
                reader.skip_long_line(reader.lines + 1, self.follower.long_line_bytes)
                self._long = self.follower.long_lines
            if not batch.data:
                break
            self.engine.feed([reader.numbered_block(batch.data, reader.lines)])
            if time.monotonic() >= deadline:
                break
        now = time.monotonic()
        rate = self._rate
        if not self.caught_up:  # reading a backlog is no rate of the run's: start once level
            rate.clear()
        rate.append((now, reader.events))
        while len(rate) > 2 and rate[1][0] <= now - _RATE_WINDOW:
            rate.popleft()
        return reader.events - before

    def read_whole(self, progress: Progress | None = None) -> int:
        """Read the file start to end as the other read commands do, plain or gzipped (one
        frame of a finished run, ``watch --once``); the events read."""
        self.reader = EventReader(self.path, typed=True, on_skip=self._skip, progress=progress)
        self.engine.feed(self.reader.numbered_batches())
        self._whole = self.follower.size()
        return self.reader.events

    @property
    def caught_up(self) -> bool:
        """Whether every complete line of the file has been read."""
        return self.follower.size() - self.follower.read_to <= 0

    def events_per_s(self) -> float | None:
        """Events read per second over the last few seconds (None before two looks)."""
        if len(self._rate) < 2:
            return None
        (t0, n0), (t1, n1) = self._rate[0], self._rate[-1]
        return (n1 - n0) / (t1 - t0) if t1 > t0 else None

    def results(self) -> list[Any]:
        """The analyses' results as of now: live figures, batch age per step, the cost."""
        return self.engine.results()

    def cost(self) -> CostReport | None:
        """The cost analysis's report when the file holds a stop, else None.  Made again
        at once after a new stop, otherwise only when new events came and at most a tenth
        of the time: its ledger is one record per group of the file."""
        state = self.engine.state
        if len(state.runs) < 2:
            return None
        now = time.monotonic()
        fresh = self.reader.events != self._cost_events
        stopped = self._cost is None or len(self._cost.runs) != len(state.runs)  # a new stop
        if fresh and (stopped or now - self._cost_at >= 10 * self._cost_took):
            self._cost = self.costs.result()
            self._cost_took = time.monotonic() - now
            self._cost_at, self._cost_events = now, self.reader.events
        return self._cost

    def frame(self) -> Frame:
        """The view as of the last :meth:`read`."""
        state = self.engine.state
        figures = self.figures.result()
        run = state.run
        last = self.figures.last_step
        age = None
        if last is not None:
            survivor = state.steps.get(last.step)
            if survivor is not None:
                age = step_age(survivor.step, survivor.trained_version, survivor.group_ids,
                               state.seals, run_id=survivor.run_id, t=survivor.t)  # fmt: skip
        recent: list[tuple[int, float | None]] = []
        top = self.figures.top_step
        if top is not None:
            for n in range(top - RECENT_STEPS + 1, top + 1):
                s = state.steps.get(n)
                if s is not None:
                    recent.append(
                        (n, step_age(n, s.trained_version, s.group_ids, state.seals).batch_age)
                    )
        # The current run's groups: a stopped run's groups that no step trained are lost at
        # its stop (cost's ledger), not in flight, though the state keeps them in case.
        current = run.run_id if run is not None else None
        groups = [g for g in state.groups.values() if g.run_id == current]
        sealed = sum(1 for g in groups if g.sealed_tokens is not None)
        follower = self.follower
        return Frame(
            path=str(self.path),
            exists=self.path.exists(),
            size=follower.size(),
            complete_to=follower.offset if self._whole is None else self._whole,
            partial=follower.read_to - follower.offset if self._whole is None else 0,
            lines=self.reader.lines,
            events=self.reader.events,
            events_per_s=self.events_per_s(),
            runs=len(state.runs),
            run_id=run.run_id if run is not None else None,
            run_first_t=run.first_t if run is not None else None,
            last_t=run.last_t if run is not None else None,
            step=last.step if last is not None else None,
            age=age,
            recent=recent,
            figures=figures,
            attempts_in_flight=len(state.attempts),
            groups_in_flight=len(groups),
            groups_sealed=sealed,
            skipped=self.skipped,
            last_skip=self.last_skip,
            step_warnings=self.step_warnings,
            last_step_warning=self.last_step_warning,
            cost=self.cost(),
            notes=list(self.notes),
        )

    def close(self) -> None:
        self.follower.close()
