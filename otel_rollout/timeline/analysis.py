"""The timeline as one analysis of the pass: every event drawn as it is read (see the
package's docstring for what is drawn).

:class:`Timeline` chooses the runs drawn, keeps the counters' clock and draws the
trainer and the weights; the attempts are drawn on the engine lanes by
:mod:`.lanes`, a run's lanes, refits and segments are kept by :mod:`.runs`, the cuts
are :mod:`.cuts` and the output format :mod:`.trace_events`; :mod:`.compiled` lets the
compiled path draw the commonest lines as the handlers here do."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec

from ..analysis import Analysis
from ..analysis.state import Run
from ..render.words import counted
from .compiled import CompiledLanes
from .cuts import StepRange, Window, step_start
from .lanes import EngineLanes, micros
from .runs import RunView
from .trace_events import TRAINER_TID, WEIGHTS_TID, TraceEventWriter

__all__ = ["Timeline", "TimelineSummary"]

#: The handlers ``_hot_lanes.h`` mirrors, by kind.
_MIRRORED_KINDS = {
    "attempt.dispatch": "_dispatch",
    "attempt.seal": "_seal",
    "group.reserve": "_group_reserve",
    "group.seal": "_group_seal",
}

@dataclass
class TimelineSummary:
    """What the timeline holds."""

    runs: list[str] = field(default_factory=list)
    lanes: dict[str, int] = field(default_factory=dict)  # run_id → engine lanes used
    attempts: int = 0
    segments: int = 0
    refused: int = 0
    steps: int = 0
    refits: int = 0
    events: int = 0  # trace events written
    unmatched: int = 0  # ends of attempts with no dispatch or resume in their run

    def line(self) -> str:
        lanes = max(self.lanes.values(), default=0)
        return (
            f"{counted(len(self.runs), 'run')}, {counted(self.attempts, 'attempt')} "
            f"({counted(self.segments, 'slice')}, up to {counted(lanes, 'lane')}), "
            f"{counted(self.refused, 'refusal')}, {counted(self.steps, 'step')}, "
            f"{counted(self.refits, 'refit')}: {counted(self.events, 'trace event')}"
        )


class Timeline(CompiledLanes, Analysis):
    """Writes the trace-event timeline as the pass reads the file (an analysis of the pass).

    ``runs(index, run_id)`` picks the runs to draw (all by default); ``windows``
    (from :func:`step_windows`) limits each drawn run to a time window, and
    ``steps`` the step slices; ``counter_resolution`` is the shortest time in
    seconds between two samples of the in-flight counters (each sample is the
    value after the last change before it).
    """

    kinds = None  # every kind: a run begins at its first line, whatever its kind

    def __init__(
        self,
        writer: TraceEventWriter,
        *,
        runs: Callable[[int, str], bool] | None = None,
        windows: Mapping[str, Window] | None = None,
        steps: StepRange | None = None,
        counter_resolution: float = 0.01,
        source: str | None = None,
    ) -> None:
        self.w = writer
        self.runs = runs
        self.windows = windows
        self.steps = steps
        self.resolution = counter_resolution
        self.source = source
        self.summary = TimelineSummary()
        self.t0: float | None = None  # the file's first event: time zero
        self._t0 = 0.0
        self.lanes = EngineLanes(writer, self.summary)
        self._run: Run | None = None  # the state's run this view follows
        self._rv: RunView | None = None
        self._due = math.inf  # next time the counters may be sampled
        self._dirty = False
        self._changed_at = 0.0

    def handlers(self) -> Mapping[str, Callable[[Any], None]]:
        return {
            "attempt.dispatch": self._dispatch,
            "attempt.resume": self._dispatch,
            "attempt.seal": self._seal,
            "attempt.refuse": self._refuse,
            "attempt.abandon": self._abandon,
            "group.reserve": self._group_reserve,
            "group.seal": self._group_seal,
            "group.discard": self._group_discard,
            "train.step": self._train_step,
            "weights.sync": self._sync,
            "checkpoint.publish": self._checkpoint,
            "checkpoint.restore": self._checkpoint,
            "run.start": self._run_start,
        }

    def hot_lanes(self) -> CompiledLanes | None:
        """This timeline, for the compiled path to draw the commonest lines, if they would be
        drawn as ``_hot_lanes.h`` draws them: by these handlers and engine lanes, not a
        subclass's."""
        mirrored = ("_at", "_tick", "_dispatch", "_seal", "_group_reserve", "_group_seal")
        same = all(getattr(type(self), name) is getattr(Timeline, name) for name in mirrored)
        handlers = self.handlers()
        ours = all(getattr(handlers[k], "__func__", None) is getattr(Timeline, name)
                   for k, name in _MIRRORED_KINDS.items())  # fmt: skip
        return self if same and ours and type(self.lanes) is EngineLanes else None

    def _run_start(self, e: Any) -> None:
        """A run with nothing else drawn is still a run: its process."""
        self._at(e)

    # Runs: a handler that sees a new state.run closes the view of the old one first.

    def _at(self, e: Any) -> RunView | None:
        """The view of ``e``'s run (None if the cut leaves it out), its counters brought up
        to ``e``'s time: what every handler starts with."""
        rv = self._rv if self.state.run is self._run else self._view()
        if rv is not None and e.t >= self._due:
            self._tick(rv, e.t)
        return rv

    def _view(self) -> RunView | None:
        run = self.state.run
        if run is not self._run:
            self._switch(run)
        return self._rv

    def _switch(self, run: Run | None) -> None:
        if self._rv is not None:
            self._close(self._rv, "lost at stop")
        self._run = run
        self._rv = None
        if run is None:
            return
        if self.t0 is None:
            self.t0 = self._t0 = self.lanes.t0 = self.state.runs[0].first_t
        if self.runs is not None and not self.runs(run.index, run.run_id):
            return
        window = None
        if self.windows is not None:
            window = self.windows.get(run.run_id)
            if window is None:
                return
        rv = self._rv = RunView(run, run.index + 1, window)
        self.summary.runs.append(run.run_id)
        self._due = rv.start
        self._dirty = False
        meta = self.w.add_object
        pid = rv.pid
        name = f"run {run.index + 1}: {run.run_id}"
        meta({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "ts": 0,
              "args": {"name": name}})  # fmt: skip
        meta({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "ts": 0,
              "args": {"sort_index": run.index}})  # fmt: skip
        for tid, thread in ((TRAINER_TID, "trainer"), (WEIGHTS_TID, "weights")):
            meta({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "ts": 0,
                  "args": {"name": thread}})  # fmt: skip
            meta({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid, "ts": 0,
                  "args": {"sort_index": tid}})  # fmt: skip

    def _us(self, t: float) -> int:
        return micros(t - self._t0)

    def _in(self, rv: RunView, t: float) -> bool:
        return rv.start <= t <= rv.end

    # Counters: sampled at most once per resolution, each sample the value after the
    # last change before it (taken before the change that is due).

    def _tick(self, rv: RunView, t: float) -> None:
        """Called before a counter changes at ``t`` once ``t`` reaches ``self._due``."""
        if not rv.opened:
            if t < rv.start:
                self._due = rv.start
                return
            rv.opened = True
            start = max(rv.start, rv.run.first_t)
            self._counters(rv, start)
            if rv.version is not None:
                self._counter(rv, start, "weight version", "version", rv.version)
            self._dirty = False
        elif self._dirty and self._changed_at <= rv.end:
            self._counters(rv, self._changed_at)
            self._dirty = False
        self._due = t + self.resolution if t <= rv.end else math.inf

    def _counters(self, rv: RunView, t: float) -> None:
        ts, pid = self._us(t), rv.pid
        self.w.add(
            f'{{"ph":"C","name":"attempts in flight","ts":{ts},"pid":{pid},"tid":0,'
            f'"args":{{"attempts":{len(rv.flight)}}}}}'
        )
        self.w.add(
            f'{{"ph":"C","name":"groups in flight","ts":{ts},"pid":{pid},"tid":0,'
            f'"args":{{"generating":{rv.generating},"sealed":{rv.sealed}}}}}'
        )

    def _counter(self, rv: RunView, t: float, name: str, series: str, value: Any) -> None:
        self.w.add(
            f'{{"ph":"C","name":"{name}","ts":{self._us(t)},"pid":{rv.pid},"tid":0,'
            f'"args":{{"{series}":{msgspec.json.encode(value).decode()}}}}}'
        )

    def _changed(self, t: float) -> None:
        self._dirty = True
        self._changed_at = t

    def _set_version(self, rv: RunView, t: float, version: int) -> None:
        if version != rv.version:
            rv.version = version
            if rv.opened and self._in(rv, t):
                self._counter(rv, t, "weight version", "version", version)

    # Attempts: drawn on the run's engine lanes (lanes.py); the counters hear of each change.

    def _dispatch(self, e: Any) -> None:
        rv = self._at(e)
        if rv is None:
            return
        if rv.version is None:
            self._set_version(rv, e.t, e.weight_version)
        self.lanes.dispatch(rv, e)
        self._dirty = True
        self._changed_at = e.t

    def _seal(self, e: Any) -> None:
        rv = self._at(e)
        if rv is not None and self.lanes.seal(rv, e):
            self._dirty = True
            self._changed_at = e.t

    def _abandon(self, e: Any) -> None:
        rv = self._at(e)
        if rv is None:
            return
        outcome = f"abandoned: {e.reason}"
        if self.lanes.end(rv, e.attempt_id, e.t, e.group_id, outcome, e.tokens, None):
            self._changed(e.t)

    def _refuse(self, e: Any) -> None:
        rv = self._at(e)
        if rv is not None and self.lanes.refuse(rv, e):
            self._changed(e.t)

    # Groups.

    def _group_reserve(self, e: Any) -> None:
        rv = self._at(e)
        if rv is None:
            return
        t = e.t
        if rv.version is None:
            self._set_version(rv, t, e.weight_version)
        if e.group_id not in rv.groups:
            rv.groups[e.group_id] = False
            rv.generating += 1
            self._changed(t)

    def _group_seal(self, e: Any) -> None:
        rv = self._at(e)
        if rv is None:
            return
        t = e.t
        sealed = rv.groups.get(e.group_id)
        if sealed is not True:
            if sealed is False:
                rv.generating -= 1
            rv.sealed += 1
            rv.groups[e.group_id] = True
            self._changed(t)

    def _drop_group(self, rv: RunView, group_id: str) -> bool:
        sealed = rv.groups.pop(group_id, None)
        if sealed is None:
            return False
        if sealed:
            rv.sealed -= 1
        else:
            rv.generating -= 1
        return True

    def _group_discard(self, e: Any) -> None:
        rv = self._at(e)
        if rv is None:
            return
        t = e.t
        if self._drop_group(rv, e.group_id):
            self._changed(t)

    # The trainer and the weights.

    def _train_step(self, e: Any) -> None:
        rv = self._at(e)
        if rv is None:
            return
        t = e.t
        previous = rv.last_step_t
        rv.last_step_t = t
        changed = False
        for group_id in e.group_ids:
            changed |= self._drop_group(rv, group_id)
        if changed:
            self._changed(t)
        if (self.steps is not None and e.step not in self.steps) or not self._in(rv, t):
            return
        start = step_start(t, e.duration_s, previous)
        if start is None:
            start = rv.run.first_t
        age = self.state.step_age(e).batch_age
        args = {
            "step": e.step,
            "trained_version": e.trained_version,
            "batch_age": age if age is None or math.isfinite(age) else str(age),
            "groups": len(e.group_ids),
        }
        if e.batch_age is not None:
            args["logged_batch_age"] = e.batch_age
        ts = self._us(start)
        self.summary.steps += 1
        self.w.add_object({"ph": "X", "name": f"step {e.step}", "cat": "train", "ts": ts,
                           "dur": max(0, self._us(t) - ts), "pid": rv.pid, "tid": TRAINER_TID,
                           "args": args})  # fmt: skip
        if age is not None and math.isfinite(age):
            self._counter(rv, t, "batch age", "batch_age", age)

    def _sync(self, e: Any) -> None:
        rv = self._at(e)
        if rv is None:
            return
        t = e.t
        cuts = {c[0]: c[1] for c in e.cuts} if e.cuts else {}
        rv.refits.append((t, e.new_version, cuts, e.duration_s, e.replaced_version))
        rv.refit_count += 1
        if len(rv.refits) >= rv.prune_at:
            rv.prune()
        self._set_version(rv, t, e.new_version)
        if not self._in(rv, t):
            return
        self.summary.refits += 1
        name = f"refit v{e.replaced_version}\u2192v{e.new_version}"
        args = {
            "replaced_version": e.replaced_version,
            "new_version": e.new_version,
            "paused_calls": len(e.cuts or ()),
        }
        if e.duration_s is not None:
            args["duration_s"] = e.duration_s
            start = max(t - e.duration_s, rv.last_sync_end)
            ts = self._us(start)
            self.w.add_object({"ph": "X", "name": name, "cat": "weights", "ts": ts,
                               "dur": max(0, self._us(t) - ts), "pid": rv.pid,
                               "tid": WEIGHTS_TID, "args": args})  # fmt: skip
            rv.last_sync_end = t
        self.w.add_object({"ph": "i", "s": "p", "name": name, "cat": "weights",
                           "ts": self._us(t), "pid": rv.pid, "tid": WEIGHTS_TID,
                           "args": args})  # fmt: skip

    def _checkpoint(self, e: Any) -> None:
        rv = self._view()
        if rv is None:
            return
        restore = e.event == "checkpoint.restore"
        if restore and rv.version is None:
            self._set_version(rv, e.t, e.weight_version)
        if not self._in(rv, e.t):
            return
        args: dict[str, Any] = {"step": e.step, "weight_version": e.weight_version}
        if e.path is not None:
            args["path"] = e.path
        if restore and e.from_run_id is not None:
            args["from_run_id"] = e.from_run_id
        what = "restore" if restore else "publish"
        self.w.add_object({"ph": "i", "s": "t", "name": f"checkpoint {what} (step {e.step})",
                           "cat": "checkpoint", "ts": self._us(e.t), "pid": rv.pid,
                           "tid": TRAINER_TID, "args": args})  # fmt: skip

    # The end of a run, and of the file.

    def _close(self, rv: RunView, outcome: str) -> None:
        """End the run's view: attempts still in flight end at its last event."""
        last = rv.run.last_t
        if rv.opened and self._dirty and self._changed_at <= rv.end:
            self._counters(rv, self._changed_at)
        for attempt_id in list(rv.flight):
            self.lanes.end(rv, attempt_id, last, None, outcome, None, None)
        if rv.opened and last <= rv.end:
            rv.generating = rv.sealed = 0  # nothing of the run is in flight once it stops
            self._counters(rv, last)
        self._dirty = False
        self._due = math.inf

    def result(self) -> TimelineSummary:
        if self._rv is not None:
            self._close(self._rv, "running at end of file")
            self._rv = None
        other: dict[str, Any] = {
            "generator": "otel-rollout timeline",
            "time_zero_unix_s": self.t0,
            "runs": self.summary.runs,
        }
        if self.source is not None:
            other["source"] = self.source
        self.w.close(other)
        self.summary.events = self.w.events
        self.summary.attempts += self.lanes.fast
        self.summary.segments += self.lanes.fast
        self.lanes.fast = 0
        return self.summary
