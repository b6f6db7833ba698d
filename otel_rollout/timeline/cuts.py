"""Cutting a huge trace down to what the timeline draws: runs by position or ID prefix, and
steps ``A:B`` with the window of time they cover in each run."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from ..reader import EventReader

__all__ = ["RunSelector", "StepRange", "Window", "step_start", "step_windows"]

#: A run's window in seconds: (start or None for the run's start, end).
Window = tuple[float | None, float]


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
    a run ID (at least four characters, so a position is never read as one; letters
    in either case).  :meth:`ambiguous` names the prefixes that matched several runs.
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
                self.prefixes.append(item.lower())
            else:
                raise ValueError(
                    f"--runs {item!r}: give a run's position (1, 2, …) or at least 4 "
                    "characters of its ID"
                )
        self.matched: set[str] = set()
        self._by_prefix: dict[str, list[str]] = {}

    @classmethod
    def parse(cls, text: str) -> RunSelector:
        return cls([part for part in text.split(",") if part.strip()])

    def __call__(self, index: int, run_id: str) -> bool:
        lowered = run_id.lower()
        prefixes = [p for p in self.prefixes if lowered.startswith(p)]
        for p in prefixes:
            self._by_prefix.setdefault(p, []).append(run_id)
        hit = index + 1 in self.positions or bool(prefixes)
        if hit:
            self.matched.add(run_id)
        return hit

    def ambiguous(self) -> dict[str, list[str]]:
        """Each prefix that matched more than one run, with the runs (all were drawn)."""
        return {p: runs for p, runs in self._by_prefix.items() if len(runs) > 1}


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
            start = step_start(e.t, e.duration_s, prev)
            window = windows.get(run_id)
            if window is None:
                windows[run_id] = [start, e.t]
            else:
                if start is None or (window[0] is not None and start < window[0]):
                    window[0] = start
                if e.t > (window[1] or -math.inf):
                    window[1] = e.t
    return {r: (w[0], float(w[1] or 0.0)) for r, w in windows.items()}, seen


def step_start(t: float, duration: float | None, previous: float | None) -> float | None:
    """Where a step's slice begins: ``t - duration_s`` (not before the previous step's
    end), else the previous step's end, else None (the run's start)."""
    if duration is not None:
        start = t - duration
        return start if previous is None or start >= previous else previous
    return previous
