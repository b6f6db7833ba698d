"""The timed loops every benchmark row uses: designs interleaved, same events for each."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
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

#: The fields of the latency rows' tick events (a dispatch's worth).
FIELDS = {
    "attempt_id": "0f3a9c1e-a17",
    "group_id": "0f3a9c1e-g4",
    "prompt_id": 81234,
    "generation_index": 3,
    "weight_version": 118,
    "epoch": 1,
}

HERE = Path(__file__).resolve().parent


def latency(
    tmp: Path,
    rate: int,
    seconds: float,
    makers: dict[str, Writer],
    events: list[tuple[str, dict[str, Any]]] | None = None,
    busy: bool = False,
) -> dict[str, tuple[float, float]]:
    """p50/p99 ms from emit to the line being readable, tailed by another process.

    The emitter waits for each millisecond's events with ``sleep`` (a controller waiting
    on I/O), or with ``busy`` in pure-Python work that never gives the GIL up."""
    per_ms = max(1, rate // 1000)
    ticks = int(seconds * 1000)
    events = events or [("bench.tick", FIELDS)] * (ticks * per_ms)
    result = {}
    for name, make in makers.items():
        path = tmp / f"latency-{name}-{rate}-{len(events)}-{time.monotonic_ns()}.jsonl"
        tail = subprocess.Popen(
            [sys.executable, str(HERE / "_tail.py"), str(path)], stdout=subprocess.PIPE
        )
        try:
            writer = make(path)
            try:
                time.sleep(0.3)  # the tail process is up and polling
                start = time.perf_counter()
                for tick in range(ticks):
                    target = start + tick / 1000
                    while (now := time.perf_counter()) < target:
                        if busy:
                            sum(i * i for i in range(50))  # ~5 us of Python, GIL held
                        else:
                            time.sleep(min(target - now, 0.0005))
                    for kind, fields in events[tick * per_ms : (tick + 1) * per_ms]:
                        writer.emit(kind, **fields)
                writer.emit("bench.end")
            finally:
                writer.close()
            out, _ = tail.communicate(timeout=60)
        finally:
            if tail.poll() is None:
                tail.kill()
                tail.wait()
        ms = sorted(x * 1000 for x in json.loads(out))
        result[name] = (ms[len(ms) // 2], ms[int(len(ms) * 0.99)])
    return result
