"""Staleness diagnostics: how old each step's tokens are, whether long rollouts are starved,
which prompts are wasted again and again, and how long groups wait to be trained.

One analysis of the one pass.  Every attempt's fate follows its group's, by the
same rule as the token ledger (:class:`otel_rollout.cost.GroupFates`), so the
outcomes here add up to the ledger's buckets.  Memory: one small record per
attempt and per group (their lengths and times, for exact quantiles).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .analysis import Analysis, OnWarning, Stop, run_events, run_file
from .cost import LOST_AT_STOP, PENDING, GroupFates
from .reader import EventReader, Progress

__all__ = [
    "STALE",
    "StalenessAnalysis",
    "StalenessReport",
    "StepStaleness",
    "quantile",
    "staleness",
    "staleness_file",
]

#: The discard (or abandon) reason that means "too old to train".
STALE = "stale"
REFUSED = "refused"


def quantile(values: Sequence[float], q: float) -> float | None:
    """The ``q`` quantile of sorted ``values`` (nearest rank: the smallest value with at
    least a share ``q`` of the values at or below it), or None for none."""
    if not values:
        return None
    return values[max(0, math.ceil(q * len(values)) - 1)]


def weighted_quantile(histogram: Mapping[int, int], q: float) -> int | None:
    """The same for a histogram ``{value: count}`` (token ages weighted by tokens)."""
    total = sum(histogram.values())
    if not total:
        return None
    need, seen = q * total, 0
    for value in sorted(histogram):
        seen += histogram[value]
        if seen >= need:
            return value
    return max(histogram)  # pragma: no cover - seen reaches total


def _summary(values: list[float]) -> dict[str, float | None]:
    values.sort()
    return {"p50": quantile(values, 0.5), "p90": quantile(values, 0.9), "max": quantile(values, 1)}


@dataclass
class StepStaleness:
    """One surviving step: its tokens by age, and how long its groups waited."""

    step: int
    trained_version: int
    run_id: str
    age_tokens: dict[int, int]
    wait_s: list[float]

    def record(self) -> dict[str, Any]:
        ages = self.age_tokens
        waits = sorted(self.wait_s)
        return {
            "step": self.step,
            "trained_version": self.trained_version,
            "run_id": self.run_id,
            "tokens": sum(ages.values()),
            "age_tokens": {str(a): n for a, n in sorted(ages.items())},
            "age": {
                "p50": weighted_quantile(ages, 0.5),
                "p90": weighted_quantile(ages, 0.9),
                "max": max(ages) if ages else None,
            },
            "wait_s": _summary(waits),
        }


@dataclass
class StalenessReport:
    """What :class:`StalenessAnalysis` found; :meth:`record` is ``staleness --json``."""

    steps: list[StepStaleness] = field(default_factory=list)
    runs: dict[str, dict[int, int]] = field(default_factory=dict)  # run → tokens by age
    outcomes: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    deciles: list[dict[str, Any]] = field(default_factory=list)
    starvation: float | None = None
    prompts: dict[str, Any] = field(default_factory=dict)

    def record(self) -> dict[str, Any]:
        every: dict[int, int] = {}
        for ages in self.runs.values():
            for age, n in ages.items():
                every[age] = every.get(age, 0) + n
        return {
            "steps": [s.record() for s in self.steps],
            "runs": {run: _age_distribution(ages) for run, ages in self.runs.items()},
            "file": _age_distribution(every),
            "length_bias": {
                "outcomes": {
                    outcome: {
                        "attempts": len(lists["tokens"]),
                        "tokens": int(sum(lists["tokens"])),
                        "length_tokens": _summary(lists["tokens"]),
                        "seconds_in_flight": _summary(lists["seconds"]),
                    }
                    for outcome, lists in sorted(self.outcomes.items())
                },
                "deciles": self.deciles,
                "long_rollout_starvation": self.starvation,
            },
            "prompts": self.prompts,
        }


def _age_distribution(ages: Mapping[int, int]) -> dict[str, Any]:
    return {
        "tokens": sum(ages.values()),
        "age_tokens": {str(a): n for a, n in sorted(ages.items())},
        "p50": weighted_quantile(ages, 0.5),
        "p90": weighted_quantile(ages, 0.9),
        "max": max(ages) if ages else None,
    }


class StalenessAnalysis(Analysis):
    """Token age per step and per run, length bias by outcome, repeat waste, group waits."""

    kinds = None  # attempts, groups and steps: nearly every kind

    def __init__(self) -> None:
        self.started: dict[str, tuple[float, str]] = {}  # attempt_id → (t, run) in flight
        self.sealed: dict[str, list[tuple[int, float]]] = {}  # group → [(tokens, seconds)]
        self.groups: dict[str, list[Any]] = {}  # group → [prompt, reserved t, run, reason]
        self.ended: list[tuple[str, int, float]] = []  # (outcome, tokens, seconds) known now
        self.steps: dict[int, list[str]] = {}  # step number → its latest train.step's groups
        self.trained: set[str] = set()
        self.waits: dict[int, list[float]] = {}  # step number → its groups' waits, latest

    def handlers(self) -> Mapping[str, Callable[[Any], None]]:
        return {
            "attempt.dispatch": self._start,
            "attempt.resume": self._start,
            "attempt.seal": self._seal,
            "attempt.abandon": self._abandon,
            "attempt.refuse": self._refuse,
            "group.reserve": self._reserve,
            "group.discard": self._discard,
            "train.step": self._step,
        }

    def _start(self, e: Any) -> None:
        self.started[e.attempt_id] = (e.t, e.run_id)

    def _flight(self, e: Any) -> float:
        start = self.started.pop(e.attempt_id, None)
        return max(e.t - start[0], 0.0) if start is not None else 0.0

    def _seal(self, e: Any) -> None:
        self.sealed.setdefault(e.group_id, []).append((e.tokens, self._flight(e)))
        info = self.groups.get(e.group_id)
        if info is None:
            self.groups[e.group_id] = [None, None, e.run_id, None]
        else:
            info[2] = e.run_id  # the group belongs to the last run that sealed into it

    def _abandon(self, e: Any) -> None:
        self.ended.append((f"abandoned: {e.reason}", e.tokens or 0, self._flight(e)))

    def _refuse(self, e: Any) -> None:
        self.ended.append((REFUSED, 0, self._flight(e)))

    def _reserve(self, e: Any) -> None:
        info = self.groups.get(e.group_id)
        prompt = (e.epoch or 0, e.prompt_id)
        if info is None:
            self.groups[e.group_id] = [prompt, e.t, e.run_id, None]
        else:  # reserved again: the latest reservation starts the wait
            info[0], info[1], info[2] = prompt, e.t, e.run_id

    def _discard(self, e: Any) -> None:
        info = self.groups.setdefault(e.group_id, [None, None, e.run_id, None])
        info[2], info[3] = e.run_id, e.reason

    def _step(self, e: Any) -> None:
        self.steps[e.step] = e.group_ids
        self.trained.update(e.group_ids)
        waits = []
        for group_id in e.group_ids:
            info = self.groups.get(group_id)
            if info is not None and info[1] is not None:
                waits.append(max(e.t - info[1], 0.0))
        self.waits[e.step] = waits

    def stop(self, stop: Stop) -> None:
        old = stop.old
        for attempt_id, (t, run) in list(self.started.items()):
            if run == old.run_id:  # running when its run stopped: it died with it
                self.ended.append((LOST_AT_STOP, 0, max(old.last_t - t, 0.0)))
                del self.started[attempt_id]

    def result(self) -> StalenessReport:
        state = self.state
        report = StalenessReport()
        for number in sorted(state.steps):
            s = state.steps[number]
            ages: dict[int, int] = {}
            for group_id in s.group_ids:
                for version, n in state.seals.get(group_id, {}).items():
                    age = max(s.trained_version - version, 0)
                    ages[age] = ages.get(age, 0) + n
            report.steps.append(
                StepStaleness(number, s.trained_version, s.run_id, ages, self.waits.get(number, []))
            )
            run = report.runs.setdefault(s.run_id, {})
            for age, n in ages.items():
                run[age] = run.get(age, 0) + n
        last = state.run.run_id if state.run is not None else None
        fate = GroupFates(self.steps, self.trained, last)
        attempts = list(self.ended)
        wasted_by_prompt: dict[Any, list[int]] = {}  # prompt → tokens of each wasted group
        for group_id, sealed in self.sealed.items():
            prompt, _, run, reason = self.groups.get(group_id, [None, None, "", None])
            outcome = fate(group_id, run, reason)
            attempts.extend((outcome, tokens, seconds) for tokens, seconds in sealed)
            if prompt is not None and outcome.startswith(("discarded", LOST_AT_STOP)):
                wasted_by_prompt.setdefault(prompt, []).append(sum(t for t, _ in sealed))
        for group_id, (prompt, _, run, reason) in self.groups.items():
            if group_id not in self.sealed and prompt is not None:
                outcome = fate(group_id, run, reason)
                if outcome.startswith(("discarded", LOST_AT_STOP)):  # wasted before a seal
                    wasted_by_prompt.setdefault(prompt, []).append(0)
        for outcome, tokens, seconds in attempts:
            lists = report.outcomes.setdefault(outcome, {"tokens": [], "seconds": []})
            lists["tokens"].append(tokens)
            lists["seconds"].append(seconds)
        report.deciles, report.starvation = _deciles(attempts)
        report.prompts = _repeats(wasted_by_prompt)
        return report


def _is_stale(outcome: str) -> bool:
    return outcome in (f"discarded: {STALE}", f"abandoned: {STALE}")


def _deciles(
    attempts: Iterable[tuple[str, int, float]],
) -> tuple[list[dict[str, Any]], float | None]:
    """Discard rates by generation-length decile, and the starvation ratio: the stale rate
    of the longest tenth of rollouts over that of the shortest tenth."""
    ranked = sorted(
        (tokens, outcome)
        for outcome, tokens, _ in attempts
        if outcome not in (REFUSED, PENDING) and not (outcome == LOST_AT_STOP and tokens == 0)
    )
    if len(ranked) < 10:
        return [], None
    rows = []
    for d in range(10):
        part = ranked[d * len(ranked) // 10 : (d + 1) * len(ranked) // 10]
        discarded = sum(1 for _, o in part if o.startswith(("discarded", "abandoned")))
        stale = sum(1 for _, o in part if _is_stale(o))
        rows.append(
            {
                "decile": d + 1,
                "min_tokens": part[0][0],
                "max_tokens": part[-1][0],
                "attempts": len(part),
                "discard_rate": discarded / len(part),
                "stale_rate": stale / len(part),
            }
        )
    low, high = rows[0]["stale_rate"], rows[-1]["stale_rate"]
    if low:
        return rows, high / low
    return rows, (math.inf if high else None)


def _repeats(wasted: Mapping[Any, list[int]]) -> dict[str, Any]:
    """Prompts whose groups were discarded or lost more than once."""
    times: dict[int, int] = {}
    for groups in wasted.values():
        times[len(groups)] = times.get(len(groups), 0) + 1
    total = sum(sum(g) for g in wasted.values())
    again = [g for g in wasted.values() if len(g) > 1]
    return {
        "prompts_wasted": len(wasted),
        "by_times_wasted": {str(n): p for n, p in sorted(times.items())},
        "prompts_wasted_more_than_once": len(again),
        "most_times_wasted": max((len(g) for g in wasted.values()), default=0),
        "share_of_wasted_tokens_more_than_once": (
            sum(sum(g) for g in again) / total if total else None
        ),
    }


def staleness(events: Iterable[Any], *, on_warning: OnWarning | None = None) -> StalenessReport:
    """The diagnostics of ``events`` (dicts or typed events, in file order)."""
    [report] = run_events(events, [StalenessAnalysis()], on_warning=on_warning)
    return report


def staleness_file(
    path: str | os.PathLike[str] | EventReader,
    *,
    on_warning: OnWarning | None = None,
    progress: Progress | None = None,
) -> StalenessReport:
    """:func:`staleness` over a trace file, read once."""
    [report] = run_file(path, [StalenessAnalysis()], on_warning=on_warning, progress=progress)
    return report
