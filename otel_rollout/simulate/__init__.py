"""A simulated asynchronous GRPO run that drives the real otel-rollout API.

It is the demo, a source of realistic trace files for tests and benchmarks,
and a worked example of what a real controller must emit and when.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..constants import ROLLOUT_TRACE_FILENAME
from ..trace import RolloutTrace
from ._controller import Controller
from ._model import SimConfig, SimStatus
from ._snapshot import CHECKPOINTS
from ._snapshot import latest as latest_checkpoint

__all__ = ["CHECKPOINTS", "SimConfig", "SimResult", "SimStatus", "latest_checkpoint", "simulate"]


@dataclass
class SimResult:
    """Where the run wrote its trace and the batch age it logged live, per step."""

    trace_path: Path
    run_id: str
    live_batch_age: dict[int, float]
    status: SimStatus


def simulate(
    log_dir: Path,
    config: SimConfig | None = None,
    *,
    on_progress: Callable[[SimStatus], None] | None = None,
    hold: float = 0.0,
    resume: bool = False,
    **otel_options: Any,
) -> SimResult:
    """Run one simulated training run, appending to ``log_dir/rollout_trace.jsonl``.

    ``hold`` keeps the trace (and a metrics endpoint) open that many seconds
    after the last step, so a scraper collects the final values.
    ``otel_options`` go to :class:`RolloutTrace` (spans and metrics).
    With ``resume``, the run continues from the latest checkpoint and rollout
    snapshot in ``log_dir`` (or from scratch if there is none), appending.
    """
    config = config or SimConfig()
    log_dir.mkdir(parents=True, exist_ok=True)
    trace = RolloutTrace(
        log_dir / ROLLOUT_TRACE_FILENAME,
        config_fields={"simulated": True, "steps": config.steps, "seed": config.seed},
        **otel_options,
    )
    try:
        controller = Controller(trace, config, log_dir, on_progress, resume=resume)
        status = asyncio.run(controller.run())
        if hold > 0:
            trace.flush()
            time.sleep(hold)
    finally:
        trace.close()
    assert trace.path is not None and trace.run_id is not None
    return SimResult(trace.path, trace.run_id, dict(status.live_batch_age), status)
