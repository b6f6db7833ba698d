"""The engine lanes of the timeline: every attempt drawn as slices from its dispatch (or
resume) to its end, on the lowest free lane of its run, split by weight version at the
refits that changed the weights under it (see the package's docstring).

:class:`EngineLanes` draws; :class:`~otel_rollout.timeline.analysis.Timeline` decides
which run is drawn and keeps the counters, and tells it each attempt event with the
run's :class:`~otel_rollout.timeline.runs.RunView`.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from typing import Any

from .._spans_of_time import FAR_S, bounded
from ..age import call_tokens_by_version
from ..events import EVENT_TYPES
from .runs import RunView
from .trace_events import (
    LANE_TID0,
    PALETTE,
    PAUSED_COLOUR,
    Slice,
    SliceArgs,
    TraceEventWriter,
    colour_of,
    js,
)

__all__ = ["EngineLanes", "micros"]

_RESUME: Any = EVENT_TYPES["attempt.resume"]
_COLOURS = len(PALETTE)


def micros(seconds: float) -> int:
    """``seconds`` from the file's start as the trace's whole microseconds (bounded)."""
    return int(bounded(seconds) * 1e6)


class EngineLanes:
    """Draws the attempts of the drawn runs onto their lanes (``t0``: the file's time zero,
    set by the timeline once the first run is read).  Each method that ends or starts an
    attempt returns whether the run's work in flight changed (for the counters)."""

    def __init__(self, writer: TraceEventWriter, summary: Any) -> None:
        self.w = writer
        self.summary = summary
        self.t0 = 0.0
        self.fast = 0  # attempts drawn by the fast path (added to the summary at the end)
        self._buf = writer.buffer
        self._chunk = writer.chunk
        self._names: dict[int, str] = {}  # version → its slices' name
        self._colours: dict[int, str] = {}  # version → its cname (a cache)

    def lane(self, rv: RunView) -> int:
        """The lowest free lane of the run; a new one (named in the trace) if none is free."""
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

    def dispatch(self, rv: RunView, e: Any) -> None:
        """An attempt dispatched or resumed: in flight on a lane from ``e.t``."""
        t = e.t
        flight = rv.flight
        attempt_id = e.attempt_id
        if attempt_id in flight:  # dispatched again before it ended
            self.end(rv, attempt_id, t, e.group_id, "dispatched again", None, None)
        free = rv.free
        lane = heapq.heappop(free) if free else self.lane(rv)
        resumed = e.resumed_tokens if e.__class__ is _RESUME else None
        flight[attempt_id] = (t, lane, e.weight_version, rv.refit_count, resumed, e.group_id)

    def seal(self, rv: RunView, e: Any) -> bool:
        """An attempt sealed: its slices, at once when no refit touched it."""
        t = e.t
        attempt_id = e.attempt_id
        record = rv.flight.pop(attempt_id, None)
        if record is None or record[3] != rv.refit_count or not rv.whole or record[4] is not None:
            return self.end(rv, attempt_id, t, e.group_id, "sealed", e.tokens, e.calls, record)
        start, lane, version = record[0], record[1], record[2]
        heapq.heappush(rv.free, lane)
        t0 = self.t0
        if -FAR_S <= start - t0 <= FAR_S and -FAR_S <= t - t0 <= FAR_S:
            ts = int((start - t0) * 1e6)
            end = int((t - t0) * 1e6)
        else:  # an absurd time (1e200 s): drawn at the bound, as every other event is
            ts, end = micros(start - t0), micros(t - t0)
        self.fast += 1
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
        return True

    def refuse(self, rv: RunView, e: Any) -> bool:
        """An attempt refused: its end if it ran, else an instant on a lane."""
        t = e.t
        outcome = f"refused: {e.reason}"
        if e.attempt_id in rv.flight:
            return self.end(rv, e.attempt_id, t, e.group_id, outcome, 0, None)
        if not rv.start <= t <= rv.end:
            return False
        # Refused before it ran: an instant on the lowest free lane, or on lane 1 when every
        # lane is busy (it takes no time, so it adds no lane: lanes stay the peak in flight).
        if rv.free:
            lane = rv.free[0]
        elif rv.lanes:
            lane = 1
        else:
            lane = self.lane(rv)
            heapq.heappush(rv.free, lane)
        self.summary.refused += 1
        self.w.add(
            f'{{"ph":"i","s":"t","name":"{js(outcome)}","cat":"attempt",'
            f'"ts":{micros(t - self.t0)},"pid":{rv.pid},"tid":{LANE_TID0 + lane},'
            f'"args":{{"attempt_id":"{js(e.attempt_id)}","group_id":"{js(e.group_id)}",'
            f'"outcome":"{js(outcome)}","tokens":0}}}}'
        )
        return False

    def end(
        self,
        rv: RunView,
        attempt_id: str,
        t: float,
        group_id: str | None,
        outcome: str,
        tokens: int | None,
        calls: Sequence[Any] | None,
        record: tuple[Any, ...] | None = None,
    ) -> bool:
        """Draw an attempt that ended at ``t`` (``record``: its flight record, if already
        taken out); False if it was not in flight (counted as unmatched)."""
        if record is None:
            record = rv.flight.pop(attempt_id, None)
        if record is None:
            self.summary.unmatched += 1
            return False
        t0 = self.t0
        start, lane, version, seen, resumed, dispatched_group = record
        if group_id is None:
            group_id = dispatched_group
        heapq.heappush(rv.free, lane)
        if start > rv.end or t < rv.start:
            return True
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
                f'"pid":{pid},"tid":{tid},"cname":"{self.colour(version)}",'
                f'"args":{{{base},"version":{version}}}}}'
            )
            return True
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
                colour = self.colour(v)
                extra = f'"version":{v}'
                if counts is not None:
                    extra += f',"segment_tokens":{counts.get(v, 0)}'
            self.w.add(
                f'{{"ph":"X","name":"{name}","cat":"attempt","ts":{ts},"dur":{us(b) - ts},'
                f'"pid":{pid},"tid":{tid},"cname":"{colour}","args":{{{base},{extra},'
                f'"segment":"{i + 1}/{last + 1}"}}}}'
            )
        return True

    def colour(self, version: int) -> str:
        colour = self._colours.get(version)
        if colour is None:
            colour = self._colours[version] = colour_of(version)
        return colour
