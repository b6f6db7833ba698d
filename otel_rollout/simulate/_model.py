"""The simulated run's data: its configuration, its groups, and what the display shows."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ._snapshot import Calls


@dataclass(frozen=True)
class SimConfig:
    """The simulated run's shape; durations are divided by ``speed``."""

    steps: int = 24
    groups_per_step: int = 4
    group_size: int = 4
    max_lag: int = 2
    max_groups_in_flight: int = 10
    engine_slots: int = 36
    prompts: int = 64
    turns: tuple[int, int] = (1, 3)
    tokens_per_call: tuple[int, int] = (60, 360)
    token_rate: float = 900.0
    train_seconds: float = 0.3
    refit_seconds: float = 0.04
    checkpoint_every: int = 5
    error_rate: float = 0.03
    seed: int = 0
    speed: float = 1.0


@dataclass(eq=False)
class _Group:
    group_id: str
    prompt_id: int
    epoch: int
    weight_version: int
    calls: list[tuple[str, int, int]] = field(default_factory=list)
    tokens: int = 0
    discarded: bool = False
    metrics: dict[str, int] = field(default_factory=dict)
    #: generation → calls of its sealed attempt (carried over by a resume, too)
    done: dict[int, Calls] = field(default_factory=dict)
    #: generation → (calls finished so far, the call running now) of attempts in progress
    running: dict[int, tuple[Calls, Any]] = field(default_factory=dict)
    #: generation → calls of a partial attempt restored from a snapshot, to resume
    resume_from: dict[int, Calls] = field(default_factory=dict)

    def state(self) -> dict[str, Any]:
        """What a snapshot keeps of this group."""
        partial = {}
        for index, (calls, current) in self.running.items():
            now = [(current.call_id, current.began_version, current.tokens)] if current else []
            kept = [c for c in calls + now if c[2] > 0]  # a call that made no token is no work
            if kept:
                partial[str(index)] = kept
        partial.update({str(i): c for i, c in self.resume_from.items()})
        return {
            "group_id": self.group_id,
            "prompt_id": self.prompt_id,
            "epoch": self.epoch,
            "weight_version": self.weight_version,
            "calls": self.calls,
            "tokens": self.tokens,
            "metrics": self.metrics,
            "done": {str(i): c for i, c in self.done.items()},
            "partial": partial,
        }


@dataclass
class SimStatus:
    """What the progress display shows, updated as the run goes."""

    step: int = 0
    version: int = 0
    groups_in_flight: int = 0
    attempts_running: int = 0
    tokens: int = 0
    last_batch_age: float | None = None
    live_batch_age: dict[int, float] = field(default_factory=dict)
