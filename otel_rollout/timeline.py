"""The whole trace file on one time axis, as a Chrome Trace Event Format file.

One analysis of the pass (:class:`Timeline`) writes a JSON object with
``traceEvents`` that Perfetto UI, ``chrome://tracing`` and speedscope open:

* one process (``pid``) per run, named by a ``process_name`` metadata event
  holding the run's ID; a stop is the gap between two runs;
* a ``trainer`` thread: a slice per ``train.step`` (``args.step``,
  ``args.trained_version``, ``args.batch_age`` from the same arithmetic as
  ``batch-age``, with the seals read so far), and checkpoint publish/restore
  instants; a ``weights`` thread: each refit (``weights.sync``) as an instant
  with the calls it paused, and as a slice when it logs its ``duration_s``;
* engine lanes (threads ``engine lane N``): every attempt as slices from its
  dispatch or resume to its seal, refusal or abandonment, packed greedily
  onto the lowest free lane so that attempts on one lane never overlap.  An
  attempt is split at the refits that changed the weights under it, each
  segment named and coloured (``cname``) by the weight version that
  generated its tokens; a refit that paused one of its calls shows as a
  ``paused`` segment when the refit logged its duration;
* counters: the engine's weight version, attempts in flight, groups in
  flight (generating and sealed), batch age per step.

Time is microseconds from the file's first event, the same for a file cut
down with ``runs`` or ``steps``.  Events are written as they are made; memory
is the attempts in flight, the refits they span and the lanes, plus the
shared state of the pass.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, BinaryIO

import msgspec
import orjson

from .age import call_tokens_by_version
from .analysis import Analysis
from .analysis.state import Run
from .events import EVENT_TYPES
from .reader import EventReader

__all__ = [
    "PALETTE",
    "RunSelector",
    "StepRange",
    "Timeline",
    "TimelineSummary",
    "TraceEventWriter",
    "step_windows",
]

#: Reserved colour names of the trace viewer (``cname``); weight version v gets
#: ``PALETTE[v % len(PALETTE)]``, so neighbouring versions differ.
PALETTE = (
    "rail_response",
    "rail_load",
    "rail_idle",
    "rail_animation",
    "cq_build_passed",
    "heap_dump_child_node_arrow",
    "olive",
    "startup",
)
PAUSED_COLOUR = "grey"
_COLOURS = len(PALETTE)
_RESUME: Any = EVENT_TYPES["attempt.resume"]

TRAINER_TID = 1
WEIGHTS_TID = 2
_LANE_TID0 = 2  # engine lane n (from 1) is thread 2 + n

#: A refit: (t, new version, {call_id: tokens_so_far}, duration_s, replaced version).
_Refit = tuple[float, int, dict[Any, int], float | None, int]
#: A run's window in seconds: (start or None for the run's start, end).
Window = tuple[float | None, float]


def _js(text: str) -> str:
    """``text`` escaped for a JSON string's inside (IDs rarely need it)."""
    if text.isascii() and text.isprintable() and '"' not in text and "\\" not in text:
        return text
    return orjson.dumps(text).decode()[1:-1]


class TraceEventWriter:
    """Writes a trace-event JSON object to a binary file, event by event, in chunks.

    An event is a dict, a :class:`msgspec.Struct` or JSON text; each chunk is
    encoded by msgspec in one call (in C, escaping strings as JSON wants).
    """

    def __init__(self, out: BinaryIO, chunk: int = 4096) -> None:
        self.out = out
        self.events = 0
        self.buffer: list[Any] = []
        self.chunk = chunk
        self._first = True
        self._encode = msgspec.json.Encoder().encode
        out.write(b'{"traceEvents":[\n')

    def add(self, event: str) -> None:
        """One event, already JSON text."""
        self.add_object(msgspec.Raw(event))

    def add_object(self, event: Any) -> None:
        """One event as a dict or a struct."""
        buf = self.buffer
        buf.append(event)
        if len(buf) >= self.chunk:
            self.flush()

    def flush(self) -> None:
        buf = self.buffer
        if not buf:
            return
        data = memoryview(self._encode(buf))[1:-1]  # the list's items, without its brackets
        if not self._first:
            self.out.write(b",\n")
        self.out.write(data)
        self._first = False
        self.events += len(buf)
        buf.clear()

    def close(self, other: Mapping[str, Any]) -> None:
        """End the object with ``displayTimeUnit`` and ``otherData``."""
        self.flush()
        tail = {"displayTimeUnit": "ms", "otherData": dict(other)}
        self.out.write(b"\n]," + orjson.dumps(tail)[1:] + b"\n")


class _SliceArgs(msgspec.Struct, gc=False):
    attempt_id: str
    group_id: str
    outcome: str
    tokens: int
    version: int


class _Slice(msgspec.Struct, gc=False):
    """A sealed attempt no refit touched: one complete event (the commonest by far)."""

    ph: str
    name: str
    cat: str
    ts: int
    dur: int
    pid: int
    tid: int
    cname: str
    args: _SliceArgs


@dataclass
class StepRange:
    """Steps ``first`` ≤ step < ``stop`` (either end open when None)."""

    first: int | None = None
    stop: int | None = None

    @classmethod
    def parse(cls, text: str) -> StepRange:
        """``A:B``, ``A:`` or ``:B``; raises ``ValueError`` with a sentence."""
        if text.count(":") != 1:
            raise ValueError(f"--steps {text!r}: expected A:B (steps A to B-1), A: or :B")
        a, b = (part.strip() for part in text.split(":"))
        try:
            first = int(a) if a else None
            stop = int(b) if b else None
        except ValueError:
            raise ValueError(f"--steps {text!r}: A and B must be step numbers") from None
        if (first is not None and first < 0) or (stop is not None and stop < 0):
            raise ValueError(f"--steps {text!r}: step numbers are ≥ 0")
        if first is not None and stop is not None and stop <= first:
            raise ValueError(f"--steps {text!r}: B must be greater than A (B is excluded)")
        return cls(first, stop)

    def __contains__(self, step: int) -> bool:
        first, stop = self.first, self.stop
        return (first is None or step >= first) and (stop is None or step < stop)

    def text(self) -> str:
        """As given on the command line (``A:B``)."""
        first, stop = self.first, self.stop
        return f"{'' if first is None else first}:{'' if stop is None else stop}"


class RunSelector:
    """Which runs to draw: positions in the file (1 is its first run) or run ID prefixes.

    An item of up to three digits is a position; anything else is a prefix of
    a run ID (at least four characters, so a position is never read as one).
    """

    def __init__(self, items: Sequence[str]) -> None:
        self.positions: set[int] = set()
        self.prefixes: list[str] = []
        for item in items:
            item = item.strip()
            if item.isdigit() and len(item) <= 3:
                if int(item) < 1:
                    raise ValueError(f"--runs {item}: run positions start at 1")
                self.positions.add(int(item))
            elif len(item) >= 4:
                self.prefixes.append(item)
            else:
                raise ValueError(
                    f"--runs {item!r}: give a run's position (1, 2, …) or at least 4 "
                    "characters of its ID"
                )
        self.matched: set[str] = set()

    @classmethod
    def parse(cls, text: str) -> RunSelector:
        return cls([part for part in text.split(",") if part.strip()])

    def __call__(self, index: int, run_id: str) -> bool:
        hit = index + 1 in self.positions or any(run_id.startswith(p) for p in self.prefixes)
        if hit:
            self.matched.add(run_id)
        return hit


def step_windows(reader: EventReader, steps: StepRange) -> tuple[dict[str, Window], int]:
    """Each run's window of time for ``steps``: from the start of its first step in range
    (the previous step's end, or ``t - duration_s``, or the run's start) to the end of its
    last; and how many ``train.step`` lines the file has.  ``reader`` must be unstarted
    and typed (made with ``kinds={"train.step"}``, it skips every other line unparsed)."""
    windows: dict[str, list[float | None]] = {}
    previous: dict[str, float] = {}
    seen = 0
    for batch in reader.batches():
        for e in batch:
            if e.event != "train.step":
                continue
            seen += 1
            run_id = e.run_id
            prev = previous.get(run_id)
            previous[run_id] = e.t
            if e.step not in steps:
                continue
            start = _step_start(e.t, e.duration_s, prev)
            window = windows.get(run_id)
            if window is None:
                windows[run_id] = [start, e.t]
            else:
                if start is None or (window[0] is not None and start < window[0]):
                    window[0] = start
                if e.t > (window[1] or -math.inf):
                    window[1] = e.t
    return {r: (w[0], float(w[1] or 0.0)) for r, w in windows.items()}, seen


def _step_start(t: float, duration: float | None, previous: float | None) -> float | None:
    """Where a step's slice begins: ``t - duration_s`` (not before the previous step's
    end), else the previous step's end, else None (the run's start)."""
    if duration is not None:
        start = t - duration
        return start if previous is None or start >= previous else previous
    return previous


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
            f"{len(self.runs)} run{'s' * (len(self.runs) != 1)}, {self.attempts:,} attempts "
            f"({self.segments:,} slices, up to {lanes} lanes), {self.refused:,} refusals, "
            f"{self.steps:,} steps, {self.refits:,} refits: {self.events:,} trace events"
        )


class _RunView:
    """One drawn run: its process, lanes, attempts in flight and the refits they span."""

    def __init__(self, run: Run, pid: int, window: Window | None) -> None:
        self.run = run
        self.pid = pid
        self.start = -math.inf if window is None or window[0] is None else window[0]
        self.end = math.inf if window is None else window[1]
        self.whole = window is None  # no cut: every attempt is drawn
        self.free: list[int] = []  # lanes free, as a heap
        self.lanes = 0
        #: attempt_id → [start t, lane, version, refits seen at start, resumed tokens, group_id]
        self.flight: dict[str, tuple[Any, ...]] = {}
        #: refits of this run: (t, new version, {call_id: tokens_so_far}, duration_s, replaced)
        self.refits: list[_Refit] = []
        self.refit_base = 0  # refits dropped from the front (no attempt in flight needs them)
        self.refit_count = 0
        self.prune_at = 64
        self.version: int | None = None
        self.last_step_t: float | None = None
        self.last_sync_end = -math.inf
        self.groups: dict[str, bool] = {}  # group_id → sealed
        self.generating = 0
        self.sealed = 0
        self.opened = False


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
        self._rv: _RunView | None = None
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
        }

    # Runs: a handler that sees a new state.run closes the view of the old one first.

    def _at(self, e: Any) -> _RunView | None:
        """The view of ``e``'s run (None if the cut leaves it out), its counters brought up
        to ``e``'s time: what every handler starts with."""
        rv = self._rv if self.state.run is self._run else self._view()
        if rv is not None and e.t >= self._due:
            self._tick(rv, e.t)
        return rv

    def _view(self) -> _RunView | None:
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
        rv = self._rv = _RunView(run, run.index + 1, window)
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
        return int((t - self._t0) * 1e6)

    def _in(self, rv: _RunView, t: float) -> bool:
        return rv.start <= t <= rv.end

    # Counters: sampled at most once per resolution, each sample the value after the
    # last change before it (taken before the change that is due).

    def _tick(self, rv: _RunView, t: float) -> None:
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

    def _counters(self, rv: _RunView, t: float) -> None:
        ts, pid = self._us(t), rv.pid
        self.w.add(
            f'{{"ph":"C","name":"attempts in flight","ts":{ts},"pid":{pid},"tid":0,'
            f'"args":{{"attempts":{len(rv.flight)}}}}}'
        )
        self.w.add(
            f'{{"ph":"C","name":"groups in flight","ts":{ts},"pid":{pid},"tid":0,'
            f'"args":{{"generating":{rv.generating},"sealed":{rv.sealed}}}}}'
        )

    def _counter(self, rv: _RunView, t: float, name: str, series: str, value: Any) -> None:
        self.w.add(
            f'{{"ph":"C","name":"{name}","ts":{self._us(t)},"pid":{rv.pid},"tid":0,'
            f'"args":{{"{series}":{msgspec.json.encode(value).decode()}}}}}'
        )

    def _changed(self, t: float) -> None:
        self._dirty = True
        self._changed_at = t

    def _set_version(self, rv: _RunView, t: float, version: int) -> None:
        if version != rv.version:
            rv.version = version
            if rv.opened and self._in(rv, t):
                self._counter(rv, t, "weight version", "version", version)

    # Attempts.

    def _lane(self, rv: _RunView) -> int:
        if rv.free:
            return heapq.heappop(rv.free)
        rv.lanes += 1
        lane = rv.lanes
        self.summary.lanes[rv.run.run_id] = lane
        tid = _LANE_TID0 + lane
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
        ts = int((start - t0) * 1e6)
        end = int((t - t0) * 1e6)
        self._fast += 1
        name = self._names.get(version)
        if name is None:
            name = self._names[version] = f"v{version}"
        buf = self._buf
        buf.append(
            _Slice(
                "X",
                name,
                "attempt",
                ts,
                end - ts if end > ts else 0,
                rv.pid,
                _LANE_TID0 + lane,
                PALETTE[version % _COLOURS],
                _SliceArgs(attempt_id, e.group_id, "sealed", e.tokens, version),
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
            f'{{"ph":"i","s":"t","name":"{_js(outcome)}","cat":"attempt","ts":{self._us(t)},'
            f'"pid":{rv.pid},"tid":{_LANE_TID0 + lane},"args":{{"attempt_id":"{_js(e.attempt_id)}",'
            f'"group_id":"{_js(e.group_id)}","outcome":"{_js(outcome)}","tokens":0}}}}'
        )

    def _end(
        self,
        rv: _RunView,
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
        pid, tid = rv.pid, _LANE_TID0 + lane
        base = (
            f'"attempt_id":"{_js(attempt_id)}","group_id":"{_js(group_id or "")}",'
            f'"outcome":"{_js(outcome)}","tokens":{"null" if tokens is None else tokens}'
        )
        if resumed is not None:
            base += f',"resumed_tokens":{resumed}'

        def us(t: float) -> int:
            return int((t - t0) * 1e6)

        if seen == rv.refit_count:  # no refit while it ran: one slice
            name = f"v{version}" if outcome == "sealed" else f"v{version} ({_js(outcome)})"
            ts = us(start)
            self.summary.segments += 1
            self.w.add(
                f'{{"ph":"X","name":"{name}","cat":"attempt","ts":{ts},"dur":{us(t) - ts},'
                f'"pid":{pid},"tid":{tid},"cname":"{self._colour(version)}",'
                f'"args":{{{base},"version":{version}}}}}'
            )
            return
        segments = self._segments(rv, start, t, version, seen, calls)
        counts: dict[int, int] | None = None
        if calls:
            counts = {}
            for call_id, began, n in calls:
                cuts = [(r[2][call_id], r[1]) for r in self._spanned(rv, seen) if call_id in r[2]]
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
                name = f"v{v}" if outcome == "sealed" or i < last else f"v{v} ({_js(outcome)})"
                colour = self._colour(v)
                extra = f'"version":{v}'
                if counts is not None:
                    extra += f',"segment_tokens":{counts.get(v, 0)}'
            self.w.add(
                f'{{"ph":"X","name":"{name}","cat":"attempt","ts":{ts},"dur":{us(b) - ts},'
                f'"pid":{pid},"tid":{tid},"cname":"{colour}","args":{{{base},{extra},'
                f'"segment":"{i + 1}/{last + 1}"}}}}'
            )

    def _spanned(self, rv: _RunView, seen: int) -> list[_Refit]:
        """The refits of this run since the attempt began."""
        return rv.refits[seen - rv.refit_base :]

    def _segments(
        self,
        rv: _RunView,
        start: float,
        end: float,
        version: int,
        seen: int,
        calls: Sequence[Any] | None,
    ) -> list[tuple[float, float, int, int | None]]:
        """``(from, to, version, None)`` pieces of an attempt, and ``(from, to, new version,
        replaced version)`` for a pause; split at each refit that changed its weights: with
        its calls known, a refit that cut one of them or installed a version one began on;
        without, every refit while it ran."""
        refits = self._spanned(rv, seen)
        if calls:
            ids = {c[0] for c in calls}
            began = {c[1] for c in calls}
            splits = [r for r in refits if r[1] in began or not ids.isdisjoint(r[2])]
        else:
            ids = set()
            splits = refits
        pieces: list[tuple[float, float, int, int | None]] = []
        at, v = start, version
        for t, new, cuts, duration, replaced in splits:
            t = min(max(t, at), end)
            if duration and cuts and not ids.isdisjoint(cuts):
                pause = max(at, t - duration)
                if pause > at:
                    pieces.append((at, pause, v, None))
                if t > pause:
                    pieces.append((pause, t, new, replaced))
            elif t > at:
                pieces.append((at, t, v, None))
            at, v = t, new
        if end > at or not pieces:
            pieces.append((at, end, v, None))
        return pieces

    def _colour(self, version: int) -> str:
        colour = self._versions.get(version)
        if colour is None:
            colour = self._versions[version] = PALETTE[version % len(PALETTE)]
        return colour

    def _prune(self, rv: _RunView) -> None:
        """Forget the refits no attempt in flight began before."""
        oldest = min((r[3] for r in rv.flight.values()), default=rv.refit_count)
        drop = oldest - rv.refit_base
        if drop > 0:
            del rv.refits[:drop]
            rv.refit_base = oldest
        rv.prune_at = 2 * len(rv.refits) + 64

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

    def _drop_group(self, rv: _RunView, group_id: str) -> bool:
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
        start = _step_start(t, e.duration_s, previous)
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
            self._prune(rv)
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

    def _close(self, rv: _RunView, outcome: str) -> None:
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
