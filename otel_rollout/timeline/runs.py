"""One drawn run of the timeline: its process, engine lanes, attempts in flight, and the
refits they span, from which an attempt's segments by weight version are cut."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from ..analysis.state import Run
from .cuts import Window

__all__ = ["Refit", "RunView"]

#: A refit: (t, new version, {call_id: tokens_so_far}, duration_s, replaced version).
Refit = tuple[float, int, dict[Any, int], float | None, int]


class RunView:
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
        self.refits: list[Refit] = []
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

    def spanned(self, seen: int) -> list[Refit]:
        """The refits of this run since the attempt began."""
        return self.refits[seen - self.refit_base :]

    def segments(
        self,
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
        refits = self.spanned(seen)
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

    def prune(self) -> None:
        """Forget the refits no attempt in flight began before."""
        oldest = min((r[3] for r in self.flight.values()), default=self.refit_count)
        drop = oldest - self.refit_base
        if drop > 0:
            del self.refits[:drop]
            self.refit_base = oldest
        self.prune_at = 2 * len(self.refits) + 64
