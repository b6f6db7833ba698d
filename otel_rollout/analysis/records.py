"""The records the one pass keeps (:mod:`.state`): runs, attempts and groups in flight,
the surviving step of each number, and what a stop left in flight."""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any

__all__ = ["FLIGHT_COUNT", "Attempt", "Group", "Key", "Run", "Step", "Stop"]

#: A rollout's identity across runs: ``(epoch, prompt_id, generation_index)``.
Key = tuple[int, int, int]


@dataclass(slots=True)
class Run:
    """One process's run in the file, from its first event to its last."""

    run_id: str
    first_t: float
    last_t: float
    index: int  # 0 for the file's first run
    last_step: int | None = None
    last_checkpoint: dict[str, Any] | None = None


#: An attempt dispatched or resumed and not yet sealed, refused or abandoned:
#: ``(run_id, key, t)``, ``t`` the dispatch's or resume's time.  A plain tuple: one is
#: made per dispatch, the commonest event, and a tuple costs a tenth of a dataclass
#: instance (0.05 against 0.5 µs here).
Attempt = tuple[str, Key, float]


#: A change of the count of attempts in flight, as :attr:`State.flight_counts
#: <otel_rollout.analysis.state.State.flight_counts>` packs it: ``(t, attempts in flight
#: after it)``, a native double and 64-bit integer (the compiled path packs them too).
FLIGHT_COUNT = struct.Struct("=dq")


@dataclass(slots=True)
class Group:
    """A group reserved (or sealed) and not yet trained or discarded."""

    run_id: str
    epoch: int
    t: float
    attempts: dict[Key, int] = field(default_factory=dict)  # sealed attempts' tokens
    sealed_tokens: int | None = None  # set by its seal


@dataclass(slots=True)
class Step:
    """The ``train.step`` of one step number that survives so far (a later one replaces it)."""

    step: int
    trained_version: int
    group_ids: list[str]
    run_id: str
    t: float
    logged_batch_age: float | None


@dataclass(slots=True)
class Stop:
    """A run ended and the next run in the file began: what was in flight at the stop."""

    old: Run
    new: Run
    attempts: list[Attempt]  # running when the old run stopped (they died with it)
    groups: dict[str, Group]  # the old run's groups in flight (they may be trained later)
