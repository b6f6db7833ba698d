"""Staleness diagnostics: how old each step's tokens are, whether long rollouts are starved,
which prompts are wasted again and again, and how long groups wait to be trained.

One analysis of the one pass.  Every attempt's fate follows its group's, by the
same rule as the token ledger (:class:`otel_rollout.ledger.GroupFates`), so the
outcomes here add up to the ledger's buckets.  Memory: 16 bytes per sealed attempt
(its length and its time in flight, to the millisecond) until the file ends, one
small record per group, and a histogram per outcome; quantiles are exact (the
statistics are in :mod:`otel_rollout.distributions`).
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from itertools import chain
from typing import Any

from ._spans_of_time import whole_ms
from .age import seal_items
from .analysis import Analysis, OnWarning, Stop, run_events, run_file
from .analysis.carry import Carried
from .analysis.history import Histories, History, flat_pairs
from .distributions import (
    STALE,
    deciles,
    hist_summary,
    quantile,
    summary,
    weighted_quantile,
)
from .ledger import LOST_AT_STOP, PENDING, GroupFates
from .reader import EventReader, Progress

__all__ = [
    "STALE",
    "StalenessAnalysis",
    "StalenessReport",
    "StepStaleness",
    "deciles",
    "quantile",
    "staleness",
    "staleness_file",
    "weighted_quantile",
]

REFUSED = "refused"
#: Groups whose sealed attempts are flattened and counted at once (see result).
_GROUPS_COUNTED = 4096


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
            "wait_s": summary(waits),
        }


@dataclass
class StalenessReport:
    """What :class:`StalenessAnalysis` found; :meth:`record` is ``staleness --json``."""

    steps: list[StepStaleness] = field(default_factory=list)
    runs: dict[str, dict[int, int]] = field(default_factory=dict)  # run → tokens by age
    #: outcome → {"tokens": {length: attempts}, "ms": {milliseconds in flight: attempts}}
    outcomes: dict[str, dict[str, dict[int, int]]] = field(default_factory=dict)
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
                        "attempts": sum(hists["tokens"].values()),
                        "tokens": sum(t * n for t, n in hists["tokens"].items()),
                        "length_tokens": hist_summary(hists["tokens"]),
                        "seconds_in_flight": hist_summary(hists["ms"], 1000),
                    }
                    for outcome, hists in sorted(self.outcomes.items())
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

    keeps_histories = True  # every group's sealed attempts and reservation (history.py)

    def __init__(self) -> None:
        self.outcomes: dict[str, dict[str, dict[int, int]]] = {}  # known at the time: histograms
        self.waits: dict[int, list[float]] = {}  # step number → its groups' waits, latest

    def _count(self, outcome: str, tokens: int, ms: int) -> None:
        hists = self.outcomes.get(outcome)
        if hists is None:
            hists = self.outcomes[outcome] = {"tokens": {}, "ms": {}}
        lengths, times = hists["tokens"], hists["ms"]
        lengths[tokens] = lengths.get(tokens, 0) + 1
        times[ms] = times.get(ms, 0) + 1

    def handlers(self) -> Mapping[str, Callable[[Any], None]]:
        # Seals, reservations and discards go to every group's history, kept by the shared
        # state (on the compiled path too: the commonest lines are none of these).
        return {
            "attempt.abandon": self._abandon,
            "attempt.refuse": self._refuse,
            "train.step": self._step,
        }

    def _flight(self, e: Any) -> int:
        """Milliseconds from the attempt's dispatch or resume to ``e`` (0 if not in flight)."""
        attempt = self.state.attempts.get(e.attempt_id)
        return whole_ms(e.t - attempt[2]) if attempt is not None else 0

    def _abandon(self, e: Any) -> None:
        self._count(f"abandoned: {e.reason}", e.tokens or 0, self._flight(e))

    def _refuse(self, e: Any) -> None:
        self._count(REFUSED, 0, self._flight(e))

    def _step(self, e: Any) -> None:
        waits = []
        histories = self._histories()
        for group_id in e.group_ids:
            record = histories.get(group_id)
            if record is not None and record.reserved is not None:
                waits.append(max(e.t - record.reserved, 0.0))
        self.waits[e.step] = waits

    def stop(self, stop: Stop) -> None:
        last_t = stop.old.last_t
        for _, _, t in stop.attempts:  # running when its run stopped: it died with it
            self._count(LOST_AT_STOP, 0, whole_ms(last_t - t))

    def result(self) -> StalenessReport:
        state = self.state
        report = StalenessReport()
        for number in sorted(state.steps):
            s = state.steps[number]
            ages: dict[int, int] = {}
            for group_id in s.group_ids:
                for version, n in seal_items(state.seals.get(group_id, b"")):
                    age = max(s.trained_version - version, 0)
                    ages[age] = ages.get(age, 0) + n
            report.steps.append(
                StepStaleness(number, s.trained_version, s.run_id, ages, self.waits.get(number, []))
            )
            run = report.runs.setdefault(s.run_id, {})
            for age, n in ages.items():
                run[age] = run.get(age, 0) + n
        histories = self._histories()
        moved, received = _carried(histories, state.carries.moved)
        fate = GroupFates.of(state)
        # Each sealed attempt counts under its group's fate: the groups' packed attempts are
        # gathered by outcome and counted at once in C (Counter over one array), not group
        # by group: on the 1M-line bench trace a Counter.update a group was 0.3 s.
        sealed_by_outcome: dict[str, list[Any]] = {}
        wasted_by_prompt: dict[Any, list[int]] = {}  # prompt → tokens of each wasted group
        for group_id, g in chain(histories.items(), received.items()):
            outcome = fate(group_id, g.run, g.reason)
            sealed = moved.get(group_id, g.sealed)
            if sealed:
                held = sealed_by_outcome.get(outcome)
                if held is None:
                    held = sealed_by_outcome[outcome] = []
                held.append(sealed)
            if g.prompt_id is not None and outcome.startswith(("discarded", LOST_AT_STOP)):
                # a wasted group reserved in the file
                tokens = sum(flat_pairs([sealed])[::2]) if sealed else 0
                wasted_by_prompt.setdefault((g.epoch, g.prompt_id), []).append(tokens)
        # A copy: the pass's own histograms stay as read, so a later result() is the same.
        outcomes = {o: {k: dict(h) for k, h in hists.items()} for o, hists in self.outcomes.items()}
        for outcome, held in sealed_by_outcome.items():
            hists = outcomes.setdefault(outcome, {"tokens": {}, "ms": {}})
            # A few thousand groups at a time: the trained attempts of the 1M-line bench
            # trace flattened at once were ~20 MB for a moment, the report's peak.
            for i in range(0, len(held), _GROUPS_COUNTED):
                values = flat_pairs(held[i : i + _GROUPS_COUNTED])
                for name, counted in (
                    ("tokens", Counter(values[::2])),
                    ("ms", Counter(values[1::2])),
                ):
                    counts = hists[name]
                    for value, n in counted.items():
                        counts[value] = counts.get(value, 0) + n
        report.outcomes = outcomes
        ranked = {
            (tokens, outcome): n
            for outcome, hists in outcomes.items()
            if outcome not in (REFUSED, PENDING)
            for tokens, n in hists["tokens"].items()
            if tokens or outcome != LOST_AT_STOP  # a rollout lost before a token: not ranked
        }
        report.deciles, report.starvation = deciles(ranked)
        report.prompts = _repeats(wasted_by_prompt)
        return report

    def _histories(self) -> Histories:
        histories = self.state.histories
        assert histories is not None, "the engine keeps them: keeps_histories"
        return histories


def _carried(
    histories: Mapping[str, History], moved: Iterable[Carried]
) -> tuple[dict[str, list[int]], dict[str, History]]:
    """Sealed attempts a resumed run carried into another group (the shared state found
    them: :class:`~otel_rollout.analysis.carry.Carries`) follow that group's fate, as in
    the ledger: each moved rollout takes from the group it left the attempt of its
    tokens, or the first attempts in file order that add up to them (a rollout sealed
    more than once); none if nothing does.  The flat sealed attempts of every group a
    move touched, after the moves, and a history for each group that had none (the
    histories themselves stay as read, so a later result is the same)."""
    touched: dict[str, list[list[int]]] = {}
    received: dict[str, History] = {}

    def held(group_id: str) -> list[list[int]]:
        if group_id not in touched:
            history = histories.get(group_id)
            flat = flat_pairs([history.sealed]) if history is not None and history.sealed else []
            touched[group_id] = [list(flat[i : i + 2]) for i in range(0, len(flat), 2)]
        return touched[group_id]

    for move in moved:
        donor = histories.get(move.donor)
        if move.donor not in touched and (donor is None or donor.sealed is None):
            continue  # (a donor an earlier move gave work to holds it, whatever it sealed)
        if move.group not in histories:
            received.setdefault(move.group, History(move.run))
        left, taken = held(move.donor), held(move.group)
        for _, tokens in move.keys:
            for i in sorted(_lots_of(left, tokens), reverse=True):
                taken.append(left.pop(i))
    return {g: [v for pair in held for v in pair] for g, held in touched.items()}, received


def _lots_of(pairs: list[Any], tokens: int) -> list[int]:
    """The positions of the attempt of ``tokens``, or of the first attempts that add up to
    it; none if nothing does."""
    for i, pair in enumerate(pairs):
        if pair[0] == tokens:
            return [i]
    chosen, total = [], 0
    for i, pair in enumerate(pairs):
        if total + pair[0] <= tokens:
            chosen.append(i)
            total += pair[0]
            if total == tokens:
                return chosen
    return []


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
