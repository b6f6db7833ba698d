"""Helpers for testing code that uses otel-rollout (and for testing otel-rollout itself).

* :class:`InMemoryExporter` collects every event the pipeline exports.
* :class:`TraceBuilder` writes small, exact trace files for analyses to read.
* :func:`synthetic_trace` writes a large, realistic one quickly (benchmarks).
* :class:`OtlpReceiver` is a real OTLP endpoint (gRPC or HTTP) on 127.0.0.1
  that keeps the spans and metrics sent to it (or answers slowly, or refuses).
* :class:`BlackHole` is an endpoint that accepts connections and never answers.
* :func:`kill_loss_window` kills a steadily emitting process with ``SIGKILL``
  and measures how much of its recent history the file lost.
"""

from __future__ import annotations

import itertools
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from .schema import SCHEMA_VERSION

if TYPE_CHECKING:
    from ._receiver import OtlpReceiver

__all__ = [
    "BlackHole",
    "InMemoryExporter",
    "KillResult",
    "OtlpReceiver",
    "TraceBuilder",
    "kill_loss_window",
    "synthetic_trace",
]


def __getattr__(name: str) -> Any:
    if name == "OtlpReceiver":  # imports grpc, so only when asked for
        from ._receiver import OtlpReceiver

        return OtlpReceiver
    raise AttributeError(f"module 'otel_rollout.testing' has no attribute {name!r}")


class BlackHole:
    """A TCP endpoint on 127.0.0.1 that accepts connections, reads, and never answers:
    the collector that hangs, for testing that nothing waits on it for long."""

    def __init__(self) -> None:
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port = self._server.getsockname()[1]
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.connections = 0
        self._held: list[socket.socket] = []
        self._closed = False
        threading.Thread(target=self._accept, name="black-hole", daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            self.connections += 1
            self._held.append(conn)
            threading.Thread(target=self._swallow, args=(conn,), daemon=True).start()

    @staticmethod
    def _swallow(conn: socket.socket) -> None:
        try:
            while conn.recv(1 << 16):
                pass
        except OSError:
            pass

    def close(self) -> None:
        self._closed = True
        self._server.close()
        for conn in self._held:
            conn.close()

    def __enter__(self) -> BlackHole:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class InMemoryExporter:
    """An exporter that keeps every event it is given, for assertions."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.batches = 0
        self.shut_down = False
        self._lock = threading.Lock()

    def export(self, events: Sequence[dict[str, Any]]) -> int:
        with self._lock:
            self.events.extend(dict(e) for e in events)
            self.batches += 1
        return 0

    def shutdown(self) -> None:
        self.shut_down = True

    def kinds(self) -> list[str]:
        """The event names, in order."""
        with self._lock:
            return [e["event"] for e in self.events]


class TraceBuilder:
    """Builds trace events by hand, with increasing timestamps, then writes them as JSONL.

    >>> b = TraceBuilder()
    >>> b.sealed_group("g1", {3: 100, 4: 200})
    >>> b.step(0, trained_version=5, group_ids=["g1"])
    >>> b.write(tmp_path / "rollout_trace.jsonl")  # doctest: +SKIP
    """

    def __init__(self, run_id: str = "run-1", t0: float = 1_700_000_000.0, dt: float = 0.01):
        self.events: list[dict[str, Any]] = []
        self.run_id = run_id
        self.t = t0
        self.dt = dt
        self._prompts = itertools.count()
        self.event("run.start", schema=SCHEMA_VERSION, pid=1, host="test")

    def new_run(self, run_id: str, gap: float = 1.0) -> TraceBuilder:
        """Continue as a new process (a resumed run) after ``gap`` seconds of downtime."""
        self.run_id = run_id
        self.t += gap
        self.event("run.start", schema=SCHEMA_VERSION, pid=2, host="test")
        return self

    def event(self, kind: str, **fields: Any) -> dict[str, Any]:
        """Append one event of any kind and return it."""
        self.t += self.dt
        event = {"t": round(self.t, 6), "run_id": self.run_id, "event": kind, **fields}
        self.events.append(event)
        return event

    def sealed_group(
        self,
        group_id: str,
        counts: dict[int, int] | None,
        *,
        prompt_id: int | None = None,
        weight_version: int | None = None,
    ) -> None:
        """Reserve, admit and seal a group whose tokens split by version as ``counts``."""
        prompt = next(self._prompts) if prompt_id is None else prompt_id
        version = min(counts) if counts else (weight_version or 0)
        ids = {"group_id": group_id, "prompt_id": prompt}
        self.event("group.reserve", **ids, size=1, weight_version=weight_version or version)
        self.event("group.admit", **ids)
        seal: dict[str, Any] = {**ids, "tokens": sum(counts.values()) if counts else 0}
        if counts is not None:
            seal["tokens_by_version"] = {str(v): n for v, n in counts.items()}
        self.event("group.seal", **seal)

    def step(self, step: int, trained_version: int, group_ids: list[str], **fields: Any) -> None:
        """A train.step over ``group_ids``."""
        self.event(
            "train.step", step=step, trained_version=trained_version, group_ids=group_ids, **fields
        )

    def lines(self) -> bytes:
        """The events as the bytes of a trace file."""
        return b"".join(orjson.dumps(e, option=orjson.OPT_APPEND_NEWLINE) for e in self.events)

    def write(self, path: Path) -> Path:
        """Write the events to ``path`` (replacing it) and return the path."""
        path.write_bytes(self.lines())
        return path


def synthetic_trace(
    path: Path,
    lines: int,
    *,
    group_size: int = 8,
    groups_per_step: int = 4,
    runs: int = 1,
    seed: int = 0,
) -> Path:
    """Write a realistic trace of about ``lines`` lines: groups of attempts with multi-turn
    calls, refits that cut running calls, steps and checkpoints; ``runs`` processes in turn."""
    rng = random.Random(seed)
    out = bytearray()
    dumps = orjson.dumps
    option = orjson.OPT_APPEND_NEWLINE
    t = 1_700_000_000.0
    written = 0
    lines_per_run = lines // runs
    step = 0

    def emit(run_id: str, kind: str, **fields: Any) -> None:
        nonlocal t, written
        t += 0.0005
        out.extend(dumps({"t": t, "run_id": run_id, "event": kind, **fields}, option=option))
        written += 1

    with open(path, "wb") as f:
        for run in range(runs):
            run_id = f"{run:08x}" + "0" * 24
            version = step
            if run:
                step = max(0, step - 3)  # resumed runs retrain a few steps
                version = step
            run_end = written + lines_per_run

            emit(run_id, "run.start", schema=SCHEMA_VERSION, pid=1000 + run, host="bench")
            g = 0
            while written < run_end:
                group_ids = []
                for _ in range(groups_per_step):
                    gid = f"{run_id[:8]}-g{g}"
                    g += 1
                    group_ids.append(gid)
                    prompt = rng.randrange(100_000)
                    ids = {"group_id": gid, "prompt_id": prompt}
                    emit(
                        run_id,
                        "group.reserve",
                        **ids,
                        size=group_size,
                        weight_version=version,
                        epoch=0,
                    )
                    emit(run_id, "group.admit", **ids)
                    counts: dict[int, int] = {}
                    total = 0
                    for i in range(group_size):
                        aid = f"{gid}-a{i}"
                        a_ids = {**ids, "attempt_id": aid, "generation_index": i}
                        emit(run_id, "attempt.dispatch", **a_ids, weight_version=version, epoch=0)
                        n = rng.randrange(50, 800)
                        calls = [[f"{aid}-c0", version, n]]
                        emit(run_id, "attempt.seal", **a_ids, tokens=n, calls=calls)
                        lag = rng.choice((0, 0, 1, 1, 2))
                        counts[version - min(lag, version)] = (
                            counts.get(version - min(lag, version), 0) + n
                        )
                        total += n
                    tbv = {str(v): c for v, c in sorted(counts.items())}
                    emit(run_id, "group.seal", **ids, tokens=total, tokens_by_version=tbv)
                emit(run_id, "train.step", step=step, trained_version=version, group_ids=group_ids)
                cuts = [[f"c{rng.randrange(10**6)}", rng.randrange(500)] for _ in range(4)]
                emit(
                    run_id,
                    "weights.sync",
                    replaced_version=version,
                    new_version=version + 1,
                    cuts=cuts,
                )
                version += 1
                step += 1
                if step % 50 == 0:
                    emit(run_id, "checkpoint.publish", step=step - 1, weight_version=version)
                if len(out) > 1 << 22:
                    f.write(out)
                    out.clear()
        f.write(out)
    return path


_OUR_WRITER = "from otel_rollout.trace import RolloutTrace\ntrace = RolloutTrace(sys.argv[1])"
_EMITTER = """
import sys, time
{writer}
interval = 1.0 / float(sys.argv[2])
start = time.perf_counter()
print("ready", flush=True)
for i in range(10**9):
    delay = start + i * interval - time.perf_counter()
    if delay > 0:
        time.sleep(delay)  # a controller waits on I/O, releasing the GIL; it does not spin
    trace.emit("tick", seq=i)
"""


@dataclass
class KillResult:
    """One kill: how far the file's newest event trailed the kill, and what the file holds."""

    window: float  # seconds between the newest event in the file and the kill
    events: int
    skipped_lines: int


def kill_loss_window(
    path: os.PathLike[str] | str,
    *,
    rate: float = 5000.0,
    run_for: float = 0.5,
    env: Mapping[str, str] | None = None,
    writer: str = _OUR_WRITER,
) -> KillResult:
    """Start a process emitting ``rate`` events/s into ``path``, ``SIGKILL`` it after
    ``run_for`` seconds, and measure the kill time minus the newest ``t`` in the file.

    ``writer`` is the Python code that binds ``trace`` (an object with ``emit``)
    writing to ``sys.argv[1]``; by default a :class:`RolloutTrace`.
    """
    from .reader import EventReader

    child_env = dict(os.environ if env is None else env)
    child = subprocess.Popen(
        [sys.executable, "-c", _EMITTER.format(writer=writer), str(path), str(rate)],
        stdout=subprocess.PIPE,
        env=child_env,
        text=True,
    )
    try:
        assert child.stdout is not None
        if child.stdout.readline().strip() != "ready":
            raise RuntimeError("the emitting process did not start")
        time.sleep(run_for)
        killed_at = time.time()
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.wait(30)
    reader = EventReader(path, kinds={"tick"}, on_skip=lambda *a: None)
    times = [e["t"] for e in reader]
    return KillResult(killed_at - max(times, default=float("nan")), len(times), reader.skipped)
