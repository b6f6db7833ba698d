"""The commonest lines applied to the shared state in compiled code, where a pass allows.

Most of a trace is ``attempt.dispatch``, ``attempt.seal``, ``group.reserve``,
``group.admit`` and ``group.seal`` lines (97% of the bench trace), and most of those
change nothing but the shared state (:mod:`.state`): an attempt goes in flight, its
tokens go to its group, a group goes in flight or is sealed.  The Python path decodes
each into its struct and calls every handler of its kind: ~2.8 µs a line, most of a
``cost`` pass.  ``otel_rollout/_hot.c`` reads such lines straight from the file's
bytes, applies them to the state's dicts as the state's own handlers would, and hands
every other line back to the Python path, in file order (its header lists what it hands
back).  On the bench trace ``cost`` takes less than half the time it did.

A pass may use it only if the attempts are among the kinds it may take: for a kind an
analysis handles, only if that analysis says which of those events it must still see
(:meth:`~otel_rollout.analysis.Analysis.hot_keys`).  An analysis that says nothing sees
every event of the kinds it handles, in Python (every line, if it handles attempts).
What an analysis needs of those lines rather than the lines themselves, the state keeps
on both paths when asked (``keeps_histories``: every group's history, history.py;
``keeps_flight_counts``: every change of the attempts in flight), so ``staleness`` and
the report take this path too.  Only a reader of every kind takes it (one of a few kinds
finds its lines by name).  The C part is optional (a package built without a compiler
has none); results are the same either way, which a hypothesis test checks on hostile
files.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, Protocol

from .. import config
from ..reader import HotPath
from .history import History
from .records import FLIGHT_COUNT, Group, Key
from .state import FLIGHT_COUNTS_HELD, State

try:
    from .._hot import consume as _consume
except ImportError:  # built without a C compiler: every line takes the Python path
    _consume = None
try:
    from .._hot import fold_flight_counts as _fold
except ImportError:  # (an older build may lack it alone)
    _fold = None

__all__ = [
    "HOT_KINDS",
    "LANES_KINDS",
    "DrawsLanes",
    "consumer",
    "enabled",
    "fold_flight_counts",
]

#: The kinds the compiled path reads, with the flag ``_hot.consume`` knows each by.
HOT_KINDS = {
    "attempt.dispatch": 1,
    "attempt.seal": 2,
    "group.reserve": 4,
    "group.admit": 8,
    "group.seal": 16,
}


_ATTEMPTS = HOT_KINDS["attempt.dispatch"] | HOT_KINDS["attempt.seal"]

#: Off (``OTEL_ROLLOUT_COMPILED_PASS=false``, or built without a compiler): every line takes
#: the Python path (the tests compare the two).
enabled = _consume is not None and config.COMPILED_PASS.resolve()


class DrawsLanes(Protocol):
    """An analysis whose handlers of the hot kinds the compiled path mirrors in C: the
    timeline's engine lanes (``_hot_lanes.h`` says what it draws; the timeline's
    ``hot_*`` methods say what each call gives and takes)."""

    def hot_sync(self) -> tuple[Any, ...] | None: ...

    def hot_store(
        self,
        due: float,
        dirty: bool,
        changed_at: float,
        generating: int,
        sealed: int,
        fast: int,
    ) -> None: ...

    def hot_tick(self, t: float) -> tuple[float, bool, bool]: ...

    def hot_lane(self) -> int: ...


#: The kinds whose handlers a :class:`DrawsLanes` analysis has mirrored in C.
LANES_KINDS = frozenset({"attempt.dispatch", "attempt.seal", "group.reserve", "group.seal"})


class Handles(Protocol):
    """What the compiled path asks of an analysis (:class:`~.engine.Analysis` has all)."""

    def handlers(self) -> Mapping[str, Callable[[Any], None]]: ...

    def hot_keys(self) -> Mapping[str, Collection[Key]] | None: ...

    def hot_lanes(self) -> DrawsLanes | None: ...


def consumer(
    state: State,
    analyses: Sequence[Handles],
    kinds: Collection[str] | None,
    counted: Callable[[int], None],
) -> HotPath | None:
    """The compiled path for a pass over ``kinds`` (None: every kind) with ``analyses``,
    or None where it may not be used; ``counted(n)`` is told of each ``n`` lines it
    applies (they are events the reader did not decode)."""
    if not enabled or _consume is None:
        return None
    flags = 0
    watch: dict[str, list[Collection[Any]]] = {kind: [] for kind in HOT_KINDS}
    drawers = [(a, lanes) for a in analyses if (lanes := a.hot_lanes()) is not None]
    if len(drawers) > 1:
        return None  # the C side draws for one
    drawer, lanes = drawers[0] if drawers else (None, None)
    for kind, flag in HOT_KINDS.items():
        if kinds is not None and kind not in kinds:
            continue
        for analysis in analyses:
            if kind not in analysis.handlers() or (analysis is drawer and kind in LANES_KINDS):
                continue
            keys = (analysis.hot_keys() or {}).get(kind)
            if keys is None:  # this analysis must see every event of the kind
                break
            watch[kind].append(keys)
        else:
            flags |= flag
    if flags & _ATTEMPTS != _ATTEMPTS:
        # Without the attempts (most of a file), the few lines it could take would only break
        # the rest into many small batches: slower than none.
        return None
    consume = _consume
    attempts, groups, epochs = state.attempts, state.groups, state.epochs
    trained, seals, waiting = state.trained, state.seals, state.carries.waiting
    watch_dispatch, watch_seal = tuple(watch["attempt.dispatch"]), tuple(watch["attempt.seal"])
    histories = state.histories  # None, or every group's history (history.py), kept here too
    counts = state.flight_counts  # None, or the changes of the count in flight, kept here too

    def apply(chunk: bytes, pos: int, end: int) -> tuple[int, int, int]:
        run = state.run
        if run is None:  # the file's first line: the Python path begins the run
            return pos, 0, chunk.find(b"\n", pos, end) + 1 or end
        pos, lines, cold_end, last_t, tokens = consume(
            chunk, pos, end, run.run_id, attempts, groups, epochs, Group, flags,
            watch_dispatch, watch_seal, trained, seals, waiting, histories, History, counts,
            lanes,
        )  # fmt: skip
        if counts is not None and len(counts) >= FLIGHT_COUNTS_HELD:
            state.bound_flight_counts()
        if lines:
            counted(lines)
            state.sealed_tokens += tokens
            if last_t > run.last_t:
                run.last_t = last_t
        return pos, lines, cold_end

    return apply


def fold_flight_counts(
    counts: bytearray, buckets: list[list[Any]], geometry: list[float], points: int
) -> None:
    """Fold packed changes of attempts in flight (``records.FLIGHT_COUNT``) into time buckets
    ``[start, last t, least, most, sum, n]``, their ``geometry`` ``[width, origin]`` changed
    in place.  A change at a time before the last bucket's end (start + width) goes into
    it; any other begins a bucket (width 0: at its time; else at the start of the width's
    slot it falls in, counted from the origin, the first change's time).  Once there are
    ``2 * points`` buckets the width doubles (the first time: about 1/``points`` of the
    time so far) and the buckets sharing a slot merge: memory stays ~2 × the points drawn
    however long the file, and each bucket keeps its range's least and most, so a chart's
    band shows every peak.  In C where built (``_hot_fold.h``: in Python, the 1M-line
    bench trace's 820k changes, 19k buckets and 8 coarsenings were ~0.15 s, a seventh of
    the one pass); the report's series uses it."""
    if enabled and _fold is not None:
        _fold(counts, buckets, geometry, points)
        return
    width, origin = geometry
    last = buckets[-1] if buckets else None
    end = last[0] + width if last is not None else -math.inf
    for t, n in FLIGHT_COUNT.iter_unpack(counts):
        if last is not None and t < end:
            if t > last[1]:
                last[1] = t
            if n < last[2]:
                last[2] = n
            elif n > last[3]:
                last[3] = n
            last[4] += n
            last[5] += 1
            continue
        if not buckets:
            origin = t
        start = t if not width else t - (t - origin) % width
        buckets.append([start, t, n, n, n, 1])
        if len(buckets) >= 2 * points:
            width = _coarsen(buckets, width, origin, points)
        last = buckets[-1]
        end = last[0] + width
    geometry[:] = [width, origin]


def _coarsen(buckets: list[list[Any]], width: float, origin: float, points: int) -> float:
    """Double the buckets' width (the first time: the span so far over ``points``, at
    least a microsecond), merge those that now share a slot; the new width."""
    span = buckets[-1][1] - origin
    width = width * 2 if width else max(span / points, 1e-6)
    merged: list[list[Any]] = []
    for b in buckets:
        start = b[0] - (b[0] - origin) % width
        if merged and merged[-1][0] == start:
            m = merged[-1]
            m[1] = max(m[1], b[1])
            m[2], m[3] = min(m[2], b[2]), max(m[3], b[3])
            m[4] += b[4]
            m[5] += b[5]
        else:
            merged.append([start, *b[1:]])
    buckets[:] = merged
    return width
