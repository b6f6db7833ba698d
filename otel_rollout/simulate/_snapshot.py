"""Rollout checkpointing for the simulator: what is saved beside each trainer checkpoint.

A snapshot is taken at the same moment as the trainer checkpoint, so the two
are consistent: the policy version, the dataloader cursor, the refit cuts,
every sealed group not yet trained, and every group in flight with its
finished generations and its partial attempts (the calls so far, with the
versions they began on).  Both files are written atomically (temp + rename).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

CHECKPOINTS = "checkpoints"
ROLLOUTS = "rollouts"

Calls = list[tuple[str, int, int]]


def write_atomically(path: Path, data: dict[str, Any]) -> None:
    """Write JSON so that a kill leaves either the old file or the new one, never half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(orjson.dumps(data))
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(path)


def paths(log_dir: Path, step: int) -> tuple[Path, Path]:
    """The trainer checkpoint and the rollout snapshot of ``step``."""
    name = f"step_{step:06d}.json"
    return log_dir / CHECKPOINTS / name, log_dir / ROLLOUTS / name


@dataclass
class Restored:
    """The latest consistent checkpoint and rollout snapshot in a log directory."""

    checkpoint_path: Path
    snapshot_path: Path
    step: int
    weight_version: int
    state: dict[str, Any]


def latest(log_dir: Path) -> Restored | None:
    """The newest step with both a checkpoint and a snapshot, or None for a fresh start."""
    directory = log_dir / CHECKPOINTS
    if not directory.is_dir():
        return None
    for checkpoint in sorted(directory.glob("step_*.json"), reverse=True):
        step = int(checkpoint.stem.split("_")[1])
        checkpoint_path, snapshot_path = paths(log_dir, step)
        if not snapshot_path.exists():
            continue
        trainer = orjson.loads(checkpoint_path.read_bytes())
        state = orjson.loads(snapshot_path.read_bytes())
        return Restored(checkpoint_path, snapshot_path, step, trainer["weight_version"], state)
    return None


def calls_of(raw: list[list[Any]]) -> Calls:
    return [(str(c), int(b), int(n)) for c, b, n in raw]
