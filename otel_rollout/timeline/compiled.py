"""The timeline's side of the compiled path: what ``_hot_lanes.h`` reads of a drawn run and
hands back, as :class:`~otel_rollout.analysis.hot.DrawsLanes` asks.

The compiled path draws the commonest lines (dispatches, seals, reservations, group seals)
as :class:`~otel_rollout.timeline.analysis.Timeline`'s handlers do: it reads the run's
view once a call (:meth:`CompiledLanes.hot_sync`), keeps its numbers while it draws, and
hands them back (:meth:`CompiledLanes.hot_store`) before any of the Timeline's code runs
and at the end of the call.  A test draws random busy runs both ways and compares the bytes.
"""

from __future__ import annotations

from typing import Any

from ..analysis.state import Run
from .lanes import EngineLanes
from .runs import RunView
from .trace_events import TraceEventWriter

__all__ = ["CompiledLanes"]


class CompiledLanes:
    """Mixed into the Timeline: the methods the compiled path calls."""

    # The Timeline's, read and written here.
    w: TraceEventWriter
    lanes: EngineLanes
    _rv: RunView | None
    _run: Run | None
    _due: float
    _dirty: bool
    _changed_at: float
    resolution: float

    def _view(self) -> RunView | None:
        raise NotImplementedError

    def _tick(self, rv: RunView, t: float) -> None:
        raise NotImplementedError


    def hot_sync(self) -> tuple[Any, ...] | None:
        """The view of the state's run (switched to it if need be, as a handler would):
        ``(flight, free, groups, pid, whole, version known, refit_count, t0, due, dirty,
        changed_at, generating, sealed, writer's buffer, chunk, flush, its counters begun,
        its window's end, the counters' resolution)``, in the order of ``_hot_lanes.h``'s
        ``V_*`` names; None if the run is not drawn."""
        rv = self._view()
        if rv is None:
            return None
        w = self.w
        return (rv.flight, rv.free, rv.groups, rv.pid, rv.whole, rv.version is not None,
                rv.refit_count, self.lanes.t0, self._due, self._dirty, self._changed_at,
                rv.generating, rv.sealed, w.buffer, w.chunk, w.flush, rv.opened, rv.end,
                self.resolution)  # fmt: skip

    def hot_store(
        self,
        due: float,
        dirty: bool,
        changed_at: float,
        generating: int,
        sealed: int,
        fast: int,
    ) -> None:
        """The numbers the compiled path changed: the counters' clock and state, the groups
        in flight, and how many slices it drew."""
        rv = self._rv
        assert rv is not None, "hot_sync gave a view"
        self._due, self._dirty, self._changed_at = due, dirty, changed_at
        rv.generating, rv.sealed = generating, sealed
        self.lanes.fast += fast

    def hot_tick(self, t: float) -> tuple[float, bool, bool]:
        """The counters brought up to ``t`` (it reached the due time; the C side samples a
        run's counters once they have begun): the next due time, whether a change is
        still to be sampled, and whether the run's counters have begun."""
        rv = self._rv
        assert rv is not None, "hot_sync gave a view"
        self._tick(rv, t)
        return self._due, self._dirty, rv.opened

    def hot_lane(self) -> int:
        """A new lane of the run (no lane was free)."""
        rv = self._rv
        assert rv is not None, "hot_sync gave a view"
        return self.lanes.lane(rv)
