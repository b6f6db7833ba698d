"""Benchmark rows with OpenTelemetry on: spans and metrics exported over OTLP (gRPC).

The receiver runs in a separate process (decoding protobuf in this one would
compete with the writer for the GIL).  The events are a realistic mix, so
spans open and end as in a run: per group a reserve, an admit, eight attempt
dispatches and seals with their calls, a group seal, and per four groups a
train step and a weight sync.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from yardstick import PlainWriter

from otel_rollout.trace import RolloutTrace

Event = tuple[str, dict[str, Any]]

_RECEIVER = """
import sys, time
from otel_rollout.testing import OtlpReceiver
receiver = OtlpReceiver("grpc", keep=False)
print(receiver.endpoint, flush=True)
sys.stdin.read()  # until the benchmark closes our stdin
print(receiver.span_count, flush=True)
receiver.close()  # stop the server before exit, not in the middle of interpreter shutdown
"""


#: Prompt groups in one cycle of the mix, which then ends with a train.step and a weights.sync.
GROUPS_PER_CYCLE = 4


def _cycle(first_group: int) -> list[Event]:
    """One cycle of the mix: :data:`GROUPS_PER_CYCLE` groups numbered from ``first_group``
    (a reserve, an admit, eight attempts dispatched and sealed, a seal), then the step that
    trains them and a weight sync."""
    events: list[Event] = []
    gids = []
    for group in range(first_group, first_group + GROUPS_PER_CYCLE):
        gid = f"g{group}"
        gids.append(gid)
        ids = {"group_id": gid, "prompt_id": group + 1}
        events.append(("group.reserve", {**ids, "size": 8, "weight_version": 7, "epoch": 0}))
        events.append(("group.admit", ids))
        for i in range(8):
            a = {**ids, "attempt_id": f"{gid}-a{i}", "generation_index": i}
            events.append(("attempt.dispatch", {**a, "weight_version": 7, "epoch": 0}))
            events.append(("attempt.seal", {**a, "tokens": 300, "calls": [[f"{gid}-{i}", 7, 300]]}))
        events.append(("group.seal", {**ids, "tokens": 2400, "tokens_by_version": {"7": 2400}}))
    step = {
        "step": first_group + GROUPS_PER_CYCLE,
        "trained_version": 8,
        "group_ids": gids,
        "batch_age": 1.0,
        "duration_s": 0.001,
    }
    events.append(("train.step", step))
    sync = {"replaced_version": 8, "new_version": 9, "cuts": [["c", 10]], "duration_s": 0.001}
    events.append(("weights.sync", sync))
    return events


#: Events in one cycle of the mix.
CYCLE = len(_cycle(0))


def mixed_events(n: int, first_group: int = 0) -> list[Event]:
    """``n`` events of a realistic run, with unique IDs (groups numbered from
    ``first_group``, so that calls with starts far enough apart make no ID twice)."""
    events: list[Event] = []
    group = first_group
    while len(events) < n:
        events += _cycle(group)
        group += GROUPS_PER_CYCLE
    return events[:n]


def stream(position: int, n: int) -> list[Event]:
    """The ``n`` events from ``position`` on of one endless run of the mix, made anew (as a
    controller makes its fields just before it emits them): ``mixed_events(position +
    n)[position:]``, without making the events before ``position``."""
    cycle, offset = divmod(position, CYCLE)
    return mixed_events(offset + n, first_group=GROUPS_PER_CYCLE * cycle)[offset:]


class Receiver:
    """An OTLP receiver in its own process; ``close`` returns the spans it counted."""

    def __init__(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-c", _RECEIVER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.process.stdout is not None
        self.endpoint = self.process.stdout.readline().strip()

    def close(self) -> int:
        out, _ = self.process.communicate("", timeout=60)
        return int(out.strip() or 0)


def designs(endpoint: str) -> dict[str, Callable[[Path], Any]]:
    # In-process: these rows measure the trainer's own pipeline making spans and metrics.
    # With the sidecar (the default) the trainer's pipeline is the log alone, measured above;
    # bench/controller.py compares the two modes as a controller feels them.
    return {
        "yardstick": PlainWriter,
        "otel-rollout + spans + metrics": lambda p: RolloutTrace(
            p, endpoint=endpoint, metrics={"otlp"}, export_mode="inprocess"
        ),
    }
