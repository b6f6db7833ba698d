"""The one pass: events in one typed shape → shared state → every analysis at once.

An analysis is one class (:class:`Analysis`): the event kinds it reads, a
handler per kind, an optional hook for each stop between runs, and its
result.  :func:`run_file` reads a trace file once for any number of them;
:func:`run_events` does the same for events already in memory (dicts or the
schema's structs).  Every event is checked by the schema's rules on the way
in (:mod:`otel_rollout.events`): what ``validate`` calls an error is skipped
with a warning naming its line, so every analysis reads the same events.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from typing import Any

from .. import events
from .._warnings import CappedWarnings
from ..reader import MOST_KINDS_SEARCHED, EventReader, EventStream, Progress
from . import hot
from .records import Key
from .state import State, Stop

__all__ = ["Analysis", "Engine", "OnWarning", "run_events", "run_file"]

#: ``(where, message)``: ``where`` is a line number, or ``"event N"`` for events in memory.
OnWarning = Callable[[int | str, str], None]


class Analysis:
    """One view of a trace, fed by the engine's single pass (subclass it).

    * ``kinds``: the event kinds it reads (``None``: every kind).  The engine
      reads only the union of its analyses' kinds, and the shared state follows
      only those; a few kinds let the reader skip other lines unparsed.
    * :meth:`handlers`: ``{kind: handler(event)}``.  A handler sees the event as
      the schema's struct (``e.event``, ``e.t``, ``e.run_id`` and the kind's
      fields, valid by the schema's rules) while :attr:`state` is as it was
      before the event.
    * :meth:`stop`: a run ended and the next run in the file began.
    * :meth:`result`: what the analysis found, once the last event is read.
    * :meth:`hot_keys` (optional, for speed): which attempts and groups it must see, so
      that the pass may apply the others to the state in compiled code.
    * ``keeps_histories``: the shared state keeps every group's history to the end of
      the pass (:attr:`State.histories <otel_rollout.analysis.state.State.histories>`:
      its sealed attempts' lengths and times in flight, its latest reservation), on
      the compiled path too, so the analysis need not handle the commonest kinds itself.
    * ``keeps_flight_counts``: the shared state keeps every change of the count of
      attempts in flight (:attr:`State.flight_counts
      <otel_rollout.analysis.state.State.flight_counts>`), on the compiled path too,
      and hands them to its :meth:`take_flight_counts` once they pass a megabyte; the
      analysis calls that itself with ``self.state.flight_counts`` for the rest (at a
      step, at the end).  One analysis of a pass may keep them.

    :attr:`state` (:class:`~otel_rollout.analysis.state.State`) is shared by
    every analysis of the pass and set before the first event.
    """

    kinds: frozenset[str] | None = None
    keeps_histories = False
    keeps_flight_counts = False
    state: State

    def handlers(self) -> Mapping[str, Callable[[Any], None]]:
        return {}

    def hot_keys(self) -> Mapping[str, Collection[Key]] | None:
        """Lets the pass apply the commonest events to the shared state in compiled code
        without calling this analysis's handlers (:mod:`.hot`).  For each kind of
        ``attempt.dispatch``, ``attempt.seal``, ``group.reserve``, ``group.admit`` and
        ``group.seal`` it handles: the rollout keys whose attempts it must still see, as
        a set it changes in place (for the group kinds, any collection; it is not
        read).  The
        events it must be fine to miss: a dispatch of the run being read; a seal of an
        attempt and a group both in flight (the state counts their tokens:
        :attr:`State.sealed_tokens`); a reservation of a group not in flight; an
        admission; a group seal of a group in flight that no step trained.  None (the
        default): it sees every event of the kinds it handles, and the pass reads every
        line in Python."""
        return None

    def take_flight_counts(self, counts: bytearray) -> None:
        """Fold the packed changes of attempts in flight (``records.FLIGHT_COUNT``) and clear
        ``counts`` (only for an analysis with ``keeps_flight_counts``)."""
        raise NotImplementedError

    def hot_lanes(self) -> hot.DrawsLanes | None:
        """An object whose ``hot_*`` methods let the compiled path draw this analysis's
        handlers of ``attempt.dispatch``, ``attempt.seal``, ``group.reserve`` and
        ``group.seal`` in C (:class:`~otel_rollout.analysis.hot.DrawsLanes`): only the
        timeline's engine lanes, which ``_hot_lanes.h`` mirrors.  None (the default)."""
        return None

    def stop(self, stop: Stop) -> None:
        """A run stopped and another began (the new run's first event is next)."""

    def result(self) -> Any:
        raise NotImplementedError


class Engine:
    """Runs analyses over batches of typed events in one pass."""

    def __init__(
        self, analyses: Sequence[Analysis], on_warning: OnWarning, *, in_memory: bool = False
    ) -> None:
        self.analyses = list(analyses)
        #: Where the pass's problems go (run_file points it at its reader's warnings).
        self.on_warning = on_warning
        self._in_memory = in_memory  # events are named "event N", not by a line number
        self._batch: tuple[Sequence[Any], int | Sequence[int]] = ((), 0)
        self.state = State(self._warn)
        kinds: set[str] | None = set()
        for analysis in self.analyses:
            analysis.state = self.state
            if analysis.keeps_histories:
                self.state.keep_histories()
            if analysis.keeps_flight_counts:
                self.state.keep_flight_counts(analysis.take_flight_counts)
            if analysis.kinds is None or kinds is None:
                kinds = None
            else:
                kinds |= analysis.kinds
        self._stops = [a.stop for a in self.analyses if type(a).stop is not Analysis.stop]
        if kinds is not None:  # a forked child's run.start ties its lines to its parent's run
            kinds.add("run.start")  # (State.root_of); a few lines in any file
        self.kinds = frozenset(kinds) if kinds is not None else None
        table: dict[str, list[Callable[[Any], None]]] = {}
        for analysis in self.analyses:
            for kind, handler in analysis.handlers().items():
                table.setdefault(kind, []).append(handler)
        for kind, handler in self.state.appliers(self.kinds).items():
            table.setdefault(kind, []).append(handler)  # after the analyses: see State
        # Keyed by the event's struct class (cheaper to reach than its kind's name); a kind
        # with one handler maps to it, one with several to their tuple.
        self._table: dict[type, Any] = {
            events.EVENT_TYPES[kind]: handlers[0] if len(handlers) == 1 else tuple(handlers)
            for kind, handlers in table.items()
            if kind in events.EVENT_TYPES
        }

    def _warn(self, event: Any, message: str) -> None:
        """A problem the pass found with ``event``, reported with its line."""
        batch, lines = self._batch
        i = next((n for n, e in enumerate(batch) if e is event), 0)  # rare: search, not track
        where = lines + i if isinstance(lines, int) else lines[i]
        self.on_warning(f"event {where}" if self._in_memory else where, message)

    def feed(self, batches: Iterable[tuple[Sequence[Any], int | Sequence[int]]]) -> None:
        """Every event of ``batches``: ``(events, where)`` with ``where`` the first event's
        line (consecutive lines) or one line per event."""
        state, table, stops = self.state, self._table, self._stops
        run = state.run
        run_id, last_t = (run.run_id, run.last_t) if run is not None else (None, 0.0)
        for item in batches:
            self._batch = item
            if run is not None:  # the compiled path may have read later lines of it since
                last_t = run.last_t
            for e in item[0]:
                # A forked child's lines are its parent's run (State.root_of).
                if e.run_id != run_id and (root := state.root_of(e)) != run_id:
                    if state.orphaned(e, root):
                        continue  # a run that ended writes again (State.orphaned)
                    if run is not None:
                        run.last_t = last_t
                    e.run_id = root
                    stop = state.begin(e)
                    run, run_id, last_t = state.run, root, e.t
                    if stop is not None:
                        for hook in stops:
                            hook(stop)
                else:
                    # One string object per run for every record an analysis keeps (a
                    # group's run, say): the decoder makes one per line, and on the 1M-line
                    # bench trace the copies held by the report's pass were ~10 MB.
                    e.run_id = run_id
                    if e.t > last_t:
                        last_t = e.t
                handlers = table.get(e.__class__)
                if handlers is not None:
                    if handlers.__class__ is tuple:
                        for handler in handlers:
                            handler(e)
                    else:
                        handlers(e)
            if run is not None:  # the state is whole between batches
                run.last_t = last_t
            state.bound_flight_counts()

    def feed_events(self, stream: Iterable[Any]) -> None:
        """As :meth:`feed`, for events in memory (dicts or the schema's structs), checked
        as :func:`run_events` checks them; the engine lives on for the next ones."""
        self.feed(_checked(stream, self.kinds, self.on_warning))

    def results(self) -> list[Any]:
        return [a.result() for a in self.analyses]


def _file_warner(path: str | os.PathLike[str]) -> tuple[OnWarning, Callable[[], None]]:
    """The default warning: the first few logged with the file and line, then a count."""
    warnings = CappedWarnings(path)
    return warnings.warn, warnings.done


def run_file(
    path: str | os.PathLike[str] | EventReader,
    analyses: Sequence[Analysis],
    *,
    on_warning: OnWarning | None = None,
    progress: Progress | None = None,
) -> list[Any]:
    """Read a trace file once for every analysis; their results, in order.

    Lines that are not valid events (by the schema's rules) are skipped with a
    warning naming the line; so are the problems the pass itself finds (a
    step naming groups that never sealed).  ``path`` may be an unstarted
    :class:`~otel_rollout.reader.EventReader` made with ``typed=True``.
    """
    told = on_warning
    engine = Engine(analyses, told or _told_later)
    if isinstance(path, EventReader):
        reader = path
    else:
        few = engine.kinds is not None and len(engine.kinds) <= MOST_KINDS_SEARCHED
        reader = EventReader(
            path,
            typed=True,
            kinds=engine.kinds if few else None,
            on_skip=(lambda line, why: told(line, f"{why}; skipped")) if told else None,
            progress=progress,
        )
    if reader.typed and reader.kinds is None and reader.hot is None:
        # Only for a reader of every kind (a reader of a few finds its lines by name, fast
        # already); of those, the kinds the pass follows: the state applies only those.
        reader.hot = hot.consumer(engine.state, engine.analyses, engine.kinds, reader.counted)
    if told is None:
        # The reader's own warnings, for its skipped lines and the pass's problems alike:
        # one count, and none of them for a file that proves no trace at all.
        engine.on_warning = reader.warn
    engine.feed(reader.numbered_batches())
    return engine.results()


def _told_later(where: int | str, message: str) -> None:
    """A placeholder, until :func:`run_file` has the reader whose warnings it uses."""
    raise AssertionError("run_file sets the engine's on_warning before the pass")


def run_events(
    stream: Iterable[Any] | str | os.PathLike[str],
    analyses: Sequence[Analysis],
    *,
    on_warning: OnWarning | None = None,
) -> list[Any]:
    """As :func:`run_file`, for events in memory: dicts (as :func:`read_events` yields
    them) or the schema's structs, in file order.  An unstarted ``read_events(path)``
    is read as its file, with the least work; so is a path (a trace, or the directory
    a run logged into), where a string would otherwise be read as its characters."""
    if isinstance(stream, (str, os.PathLike)):
        return run_file(stream, analyses, on_warning=on_warning)
    if isinstance(stream, EventStream) and not stream.started and stream.reader.kinds is None:
        return run_file(stream.reader.path, analyses, on_warning=on_warning)
    if on_warning is None:
        on_warning, done = _file_warner("events in memory")
    else:
        done = lambda: None  # noqa: E731
    engine = Engine(analyses, on_warning, in_memory=True)
    engine.feed_events(stream)
    done()
    return engine.results()


def _checked(
    stream: Iterable[Any], kinds: frozenset[str] | None, on_warning: OnWarning
) -> Iterator[tuple[list[Any], list[int]]]:
    """Events in memory as typed events, checked as a file's lines are, in batches with
    each event's number; dicts of kinds no analysis reads are passed over unchecked, as
    a file's lines are."""
    batch: list[Any] = []
    numbers: list[int] = []
    n = 0
    types = tuple(events.EVENT_TYPES.values())
    for value in stream:
        n += 1
        if value.__class__ is not dict and isinstance(value, types):
            event: Any = value
        else:
            if kinds is not None and value.__class__ is dict:
                kind = value.get("event")
                if kind.__class__ is str and kind not in kinds:
                    continue  # not a kind read (one that is no string is reported)
            event, why = events.from_object(value)
            if event is None:
                if why is not None:
                    on_warning(f"event {n}", f"{why}; skipped")
                continue
        batch.append(event)
        numbers.append(n)
        if len(batch) >= 1024:
            yield batch, numbers
            batch, numbers = [], []
    if batch:
        yield batch, numbers
