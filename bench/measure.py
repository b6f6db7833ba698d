"""The timed loops every benchmark row uses: designs interleaved, same events for each."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

Writer = Callable[[Path], Any]
Event = tuple[str, dict[str, Any]]


def emit_cost(
    tmp: Path, makers: dict[str, Writer], events: Sequence[Event], rounds: int, tag: str = ""
) -> dict[str, float]:
    """Median caller ns/event over rounds of 1,000 emits while each writer drains."""
    samples: dict[str, list[float]] = {name: [] for name in makers}
    per_rep = rounds // 5
    for rep in range(5):
        for name, make in makers.items():
            writer = make(tmp / f"cost{tag}-{name}-{rep}.jsonl")
            emit = writer.emit
            clock = time.perf_counter_ns
            for r in range(per_rep):
                offset = (r * 1000) % len(events)
                chunk = events[offset : offset + 1000]
                start = clock()
                for kind, fields in chunk:
                    emit(kind, **fields)
                samples[name].append((clock() - start) / len(chunk))
                time.sleep(0.0002)  # let the writer drain between rounds
            writer.close()
    return {name: statistics.median(s) for name, s in samples.items()}


def throughput(
    tmp: Path, makers: dict[str, Writer], events: Sequence[Event], reps: int, tag: str = ""
) -> dict[str, float]:
    """Events per second from the first emit until flush returns (median of interleaved runs)."""
    rates: dict[str, list[float]] = {name: [] for name in makers}
    for rep in range(reps):
        for name, make in makers.items():
            writer = make(tmp / f"drain{tag}-{name}-{rep}.jsonl")
            start = time.perf_counter()
            for kind, fields in events:
                writer.emit(kind, **fields)
            writer.flush()
            rates[name].append(len(events) / (time.perf_counter() - start))
            writer.close()
    return {name: statistics.median(r) for name, r in rates.items()}
