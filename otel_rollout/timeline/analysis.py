"""The timeline as one analysis of the pass: every event drawn as it is read (see the
package's docstring for what is drawn).

Longer than this project's modules usually are (~600 lines) because it is one
:class:`Timeline` whose handlers share the drawn run, the writer and the
counters' clock; what stands on its own (a run's lanes, refits and segments;
the cuts; the output format) lives in the package's other modules."""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from .._spans_of_time import FAR_S, bounded
from ..age import call_tokens_by_version
from ..analysis import Analysis
from ..analysis.state import Run
from ..events import EVENT_TYPES
from ..render.words import counted
from .cuts import StepRange, Window, step_start
from .runs import RunView
from .trace_events import (
    LANE_TID0,
    PALETTE,
    PAUSED_COLOUR,
    TRAINER_TID,
    WEIGHTS_TID,
    Slice,
    SliceArgs,
    TraceEventWriter,
    colour_of,
    js,
)

__all__ = ["Timeline", "TimelineSummary"]

_RESUME: Any = EVENT_TYPES["attempt.resume"]
_FAR = FAR_S


def micros(seconds: float) -> int:
    """``seconds`` from the file's start as the trace's whole microseconds (bounded)."""
    return int(bounded(seconds) * 1e6)


_COLOURS = len(PALETTE)


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


class Timeline(Analysis):
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
        self._buf = writer.buffer
        self._chunk = writer.chunk
        self._fast = 0  # attempts drawn by the fast path
        self._names: dict[int, str] = {}  # version → its slices' name
        self._run: Run | None = None  # the state's run this view follows
        self._rv: RunView | None = None
        self._due = math.inf  # next time the counters may be sampled
        self._dirty = False
        self._changed_at = 0.0
        self._versions: dict[int, str] = {}  # version → its cname (a cache)

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
            self.t0 = self._t0 = self.state.runs[0].first_t
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

    # Attempts.

    def _lane(self, rv: RunView) -> int:
        if rv.free:
            return heapq.heappop(rv.free)
        rv.lanes += 1
        lane = rv.lanes
        self.summary.lanes[rv.run.run_id] = lane
        tid = LANE_TID0 + lane
        meta = self.w.add_object
        meta({"ph": "M", "name": "thread_name", "pid": rv.pid, "tid": tid, "ts": 0,
              "args": {"name": f"engine lane {lane}"}})  # fmt: skip
        meta({"ph": "M", "name": "thread_sort_index", "pid": rv.pid, "tid": tid, "ts": 0,
              "args": {"sort_index": tid}})  # fmt: skip
        return lane

    # The two commonest kinds get a fast path: a sealed attempt no refit touched is one
    # slice, formatted from a template (a dict and orjson per attempt cost twice as much).

    def _dispatch(self, e: Any) -> None:
        rv = self._at(e)
        if rv is None:
            return
        t = e.t
        flight = rv.flight
        attempt_id = e.attempt_id
        if attempt_id in flight:  # dispatched again before it ended
            self._end(rv, attempt_id, t, e.group_id, "dispatched again", None, None)
        if rv.version is None:
            self._set_version(rv, t, e.weight_version)
        free = rv.free
        lane = heapq.heappop(free) if free else self._lane(rv)
        resumed = e.resumed_tokens if e.__class__ is _RESUME else None
        flight[attempt_id] = (t, lane, e.weight_version, rv.refit_count, resumed, e.group_id)
        self._dirty = True
        self._changed_at = t

    def _seal(self, e: Any) -> None:
        rv = self._at(e)
        if rv is None:
            return
        t = e.t
        attempt_id = e.attempt_id
        record = rv.flight.pop(attempt_id, None)
        if record is None or record[3] != rv.refit_count or not rv.whole or record[4] is not None:
            self._end(rv, attempt_id, t, e.group_id, "sealed", e.tokens, e.calls, record)
            return
        self._dirty = True
        self._changed_at = t
        start, lane, version = record[0], record[1], record[2]
        heapq.heappush(rv.free, lane)
        t0 = self._t0
        if -_FAR <= start - t0 <= _FAR and -_FAR <= t - t0 <= _FAR:
            ts = int((start - t0) * 1e6)
            end = int((t - t0) * 1e6)
        else:  # an absurd time (1e200 s): drawn at the bound, as every other event is
            ts, end = micros(start - t0), micros(t - t0)
        self._fast += 1
        name = self._names.get(version)
        if name is None:
            name = self._names[version] = f"v{version}"
        buf = self._buf
        buf.append(
            Slice(
                "X",
                name,
                "attempt",
                ts,
                end - ts if end > ts else 0,
                rv.pid,
                LANE_TID0 + lane,
                PALETTE[version % _COLOURS],  # inline: the fast path runs once per attempt
                SliceArgs(attempt_id, e.group_id, "sealed", e.tokens, version),
            )
        )
        if len(buf) >= self._chunk:
            self.w.flush()

    def _abandon(self, e: Any) -> None:
        rv = self._at(e)
        if rv is None:
            return
        t = e.t
        self._end(rv, e.attempt_id, t, e.group_id, f"abandoned: {e.reason}", e.tokens, None)

    def _refuse(self, e: Any) -> None:
        rv = self._at(e)
        if rv is None:
            return
        t = e.t
        outcome = f"refused: {e.reason}"
        if e.attempt_id in rv.flight:
            self._end(rv, e.attempt_id, t, e.group_id, outcome, 0, None)
            return
        if not self._in(rv, t):
            return
        # Refused before it ran: an instant on the lowest free lane, or on lane 1 when every
        # lane is busy (it takes no time, so it adds no lane: lanes stay the peak in flight).
        if rv.free:
            lane = rv.free[0]
        elif rv.lanes:
            lane = 1
        else:
            lane = self._lane(rv)
            heapq.heappush(rv.free, lane)
        self.summary.refused += 1
        self.w.add(
            f'{{"ph":"i","s":"t","name":"{js(outcome)}","cat":"attempt","ts":{self._us(t)},'
            f'"pid":{rv.pid},"tid":{LANE_TID0 + lane},"args":{{"attempt_id":"{js(e.attempt_id)}",'
            f'"group_id":"{js(e.group_id)}","outcome":"{js(outcome)}","tokens":0}}}}'
        )

    def _end(
        self,
        rv: RunView,
        attempt_id: str,
        t: float,
        group_id: str | None,
        outcome: str,
        tokens: int | None,
        calls: Sequence[Any] | None,
        record: tuple[Any, ...] | None = None,
    ) -> None:
        """Draw an attempt that ended at ``t`` (``record``: its flight record, if already
        taken out)."""
        if record is None:
            record = rv.flight.pop(attempt_id, None)
        if record is None:
            self.summary.unmatched += 1
            return
        t0 = self._t0
        self._dirty = True
        self._changed_at = t
        start, lane, version, seen, resumed, dispatched_group = record
        if group_id is None:
            group_id = dispatched_group
        heapq.heappush(rv.free, lane)
        if start > rv.end or t < rv.start:
            return
        if t < start:
            t = start
        self.summary.attempts += 1
        pid, tid = rv.pid, LANE_TID0 + lane
        base = (
            f'"attempt_id":"{js(attempt_id)}","group_id":"{js(group_id or "")}",'
            f'"outcome":"{js(outcome)}","tokens":{"null" if tokens is None else tokens}'
        )
        if resumed is not None:
            base += f',"resumed_tokens":{resumed}'

        def us(t: float) -> int:
            return micros(t - t0)

        if seen == rv.refit_count:  # no refit while it ran: one slice
            name = f"v{version}" if outcome == "sealed" else f"v{version} ({js(outcome)})"
            ts = us(start)
            self.summary.segments += 1
            self.w.add(
                f'{{"ph":"X","name":"{name}","cat":"attempt","ts":{ts},"dur":{us(t) - ts},'
                f'"pid":{pid},"tid":{tid},"cname":"{self._colour(version)}",'
                f'"args":{{{base},"version":{version}}}}}'
            )
            return
        segments = rv.segments(start, t, version, seen, calls)
        counts: dict[int, int] | None = None
        if calls:
            counts = {}
            for call_id, began, n in calls:
                cuts = [(r[2][call_id], r[1]) for r in rv.spanned(seen) if call_id in r[2]]
                for v, k in call_tokens_by_version(began, n, cuts).items():
                    counts[v] = counts.get(v, 0) + k
        last = len(segments) - 1
        for i, (a, b, v, paused) in enumerate(segments):
            ts = us(a)
            self.summary.segments += 1
            if paused is not None:
                name = f"paused: refit v{paused}\u2192v{v}"
                colour = PAUSED_COLOUR
                extra = f'"paused_by_refit":{v}'
            else:
                name = f"v{v}" if outcome == "sealed" or i < last else f"v{v} ({js(outcome)})"
                colour = self._colour(v)
                extra = f'"version":{v}'
                if counts is not None:
                    extra += f',"segment_tokens":{counts.get(v, 0)}'
            self.w.add(
                f'{{"ph":"X","name":"{name}","cat":"attempt","ts":{ts},"dur":{us(b) - ts},'
                f'"pid":{pid},"tid":{tid},"cname":"{colour}","args":{{{base},{extra},'
                f'"segment":"{i + 1}/{last + 1}"}}}}'
            )

    def _colour(self, version: int) -> str:
        colour = self._versions.get(version)
        if colour is None:
            colour = self._versions[version] = colour_of(version)
        return colour

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
            self._end(rv, attempt_id, last, None, outcome, None, None)
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
        self.summary.attempts += self._fast
        self.summary.segments += self._fast
        self._fast = 0
        return self.summary
