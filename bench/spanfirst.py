"""What span-first costs, beside ``emit`` (and the yardstick) in the same run.

Span-first: the training stack makes the rollout spans itself, on its own
``TracerProvider`` with the SDK's ``BatchSpanProcessor`` holding a
``JsonlSpanExporter``.  :class:`SpanFirst` stands for such a controller: each
event is the SDK call the span conventions ask for (a span started at a
reserve or dispatch, an ``admit`` span event, a span ended at a seal; a step,
a sync, a checkpoint started and ended), made on the caller's thread by the
package's own span builder.

* caller's cost per event: ns per event of the realistic mix, median of
  rounds of 1,000 (``measure.emit_cost``, the same loop as every emit row),
  and the SDK's floor (a bare span started and ended);
* the exporter thread's cost per span: ``export`` of the mix's spans in
  batches of 512, timed on this thread (under span-first it runs on the
  batch processor's thread, beside the caller's, under one GIL);
* ``kill -9``: a child runs the mix at 5,000 events/s and is killed; kill
  time minus the newest ``t`` in the file, and the share of the events it
  emitted (its own count, in a shared page) that the file lacks.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import measure
import with_otel
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from yardstick import PlainWriter

from otel_rollout.reader import EventReader
from otel_rollout.span_exporter import JsonlSpanExporter
from otel_rollout.spans import SpanBuilder
from otel_rollout.trace import RolloutTrace, new_run_id

HERE = Path(__file__).resolve().parent


class SpanFirst:
    """A controller that makes rollout spans with the SDK; the file is what the exporter writes."""

    def __init__(self, path: Path) -> None:
        self.run_id = new_run_id()
        resource = Resource.create({"service.instance.id": self.run_id})
        self.provider = TracerProvider(resource=resource)
        self.exporter = JsonlSpanExporter(path)
        self.provider.add_span_processor(BatchSpanProcessor(self.exporter))  # the SDK's defaults
        tracer = self.provider.get_tracer("controller")
        self.builder = SpanBuilder(lambda run: tracer)
        self.export = self.builder.export

    def emit(self, kind: str, /, **fields: Any) -> None:
        self.export(({"t": time.time(), "run_id": self.run_id, "event": kind, **fields},))

    def flush(self, *, durable: bool = False) -> None:
        """As ``RolloutTrace.flush``: written; with ``durable``, on disk too (the SDK's
        ``force_flush`` never calls the exporter's, which is what syncs)."""
        self.provider.force_flush()
        if durable:
            self.exporter.force_flush()

    def close(self) -> None:
        self.builder.shutdown()
        self.provider.shutdown()


DESIGNS: dict[str, measure.Writer] = {
    "yardstick": PlainWriter,
    "emit": RolloutTrace,
    "span-first": SpanFirst,
}

_EMITTER = """
import mmap, struct, sys, time
sys.path.insert(0, {here!r})
import with_otel
from spanfirst import DESIGNS
events = with_otel.mixed_events(int(float(sys.argv[2]) * 30))
trace = DESIGNS[sys.argv[3]](sys.argv[1])
with open(sys.argv[4], "r+b") as f:  # the count of events emitted, shared: no syscall
    emitted = mmap.mmap(f.fileno(), 8)
interval = 1.0 / float(sys.argv[2])
start = time.perf_counter()
print("ready", time.time(), flush=True)
for i, (kind, fields) in enumerate(events):
    delay = start + i * interval - time.perf_counter()
    if delay > 0:
        time.sleep(delay)  # a controller waits on I/O, releasing the GIL; it does not spin
    trace.emit(kind, **fields)
    struct.pack_into("q", emitted, 0, i + 1)
"""


def kill_once(path: Path, design: str, rate: float, run_for: float) -> tuple[float, float]:
    """Seconds from the newest event in the file to the SIGKILL, and the share of the events
    the child says it emitted (its count, in a shared page the kill leaves) the file lacks."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    count = path.with_suffix(".count")
    count.write_bytes(bytes(8))
    args = [str(path), str(rate), design, str(count)]
    child = subprocess.Popen(
        [sys.executable, "-c", _EMITTER.format(here=str(HERE)), *args],
        stdout=subprocess.PIPE,
        env=env,
        text=True,
    )
    try:
        assert child.stdout is not None
        ready, began = child.stdout.readline().split()
        assert ready == "ready"
        time.sleep(run_for)
        killed_at = time.time()
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.wait(30)
    times = [
        e["t"]
        for e in EventReader(path, on_skip=lambda *a: None)
        if e.get("event") not in ("run.start", "trace.dropped")
    ]
    (emitted,) = struct.unpack("q", count.read_bytes())
    newest = max(times, default=float(began))
    return killed_at - newest, max(0.0, 1 - len(times) / max(emitted, 1))


def sdk_floor_ns(tmp: Path, rounds: int) -> float:
    """The SDK's floor: ns to start and end one span with no attributes, on a provider whose
    batch processor holds the exporter (which ignores it); median of rounds of 1,000."""
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(JsonlSpanExporter(tmp / "floor.jsonl")))
    tracer = provider.get_tracer("floor")
    clock, samples = time.perf_counter_ns, []
    for _ in range(rounds):
        start = clock()
        for _ in range(1000):
            tracer.start_span("floor").end()
        samples.append((clock() - start) / 1000)
        time.sleep(0.0002)
    provider.shutdown()
    return statistics.median(samples)


def exporter_ns_per_span(tmp: Path, rounds: int) -> float:
    """The exporter thread's cost: ns per span of ``JsonlSpanExporter.export`` (lines made,
    checked and written) on the spans the builder makes for the mix, in batches of 512 as the
    batch processor hands them over; median of rounds."""
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.instance.id": new_run_id()}))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("mix")
    builder, run_id = SpanBuilder(lambda run: tracer), new_run_id()
    for kind, fields in with_otel.mixed_events(10_000):
        builder.export(({"t": time.time(), "run_id": run_id, "event": kind, **fields},))
    builder.shutdown()
    spans = memory.get_finished_spans()
    samples = []
    for i in range(rounds):
        exporter = JsonlSpanExporter(tmp / f"exporter-sf-{i}.jsonl")
        start = time.perf_counter_ns()
        for at in range(0, len(spans), 512):
            exporter.export(spans[at : at + 512])
        samples.append((time.perf_counter_ns() - start) / len(spans))
        exporter.shutdown()
    provider.shutdown()
    return statistics.median(samples)


def figures_of(tmp: Path, rounds: int, kills: int) -> dict[str, Any]:
    """Emit cost per design on the mix, the SDK's floor; the kill -9 figures of emit and
    span-first."""
    mix = with_otel.mixed_events(max(rounds * 1000 // 5, 20_000))
    out: dict[str, Any] = {"emit_ns": measure.emit_cost(tmp, DESIGNS, mix, rounds, tag="-sf")}
    out["sdk_bare_span_ns"] = sdk_floor_ns(tmp, max(rounds // 4, 5))
    out["exporter_ns_per_span"] = exporter_ns_per_span(tmp, max(rounds // 40, 3))
    for design in ("emit", "span-first"):
        windows, lost = [], []
        for i in range(kills):
            window, share = kill_once(tmp / f"kill-sf-{design}-{i}.jsonl", design, 5000.0, 1.0)
            windows.append(window * 1000)
            lost.append(share * 100)
        out[f"kill_{design}"] = {
            "newest_age_ms_median": statistics.median(windows),
            "newest_age_ms_max": max(windows),
            "lost_pct_median": statistics.median(lost),
        }
    return out


def report(f: dict[str, Any]) -> str:
    ns = f["emit_ns"]
    ratio = ns["span-first"] / ns["emit"]
    rows = [
        "| measure | yardstick | emit | span-first |",
        "|---|---:|---:|---:|",
        f"| caller ns/event, realistic mix (median) | {ns['yardstick']:,.0f} | "
        f"{ns['emit']:,.0f} | {ns['span-first']:,.0f} ({ratio:.0f}× emit) |",
    ]
    rows.append(
        f"| the SDK's floor: one span started and ended, no attributes, ns (median) | | | "
        f"{f['sdk_bare_span_ns']:,.0f} |"
    )
    rows.append(
        f"| the exporter's thread: ns per span of the mix, batches of 512 (median) | | | "
        f"{f['exporter_ns_per_span']:,.0f} |"
    )
    e, s = f["kill_emit"], f["kill_span-first"]
    rows.append(
        f"| kill -9 at 5,000 events/s: newest event's age at the kill, ms (median; max) | | "
        f"{e['newest_age_ms_median']:,.2f}; {e['newest_age_ms_max']:,.2f} | "
        f"{s['newest_age_ms_median']:,.0f}; {s['newest_age_ms_max']:,.0f} |"
    )
    rows.append(
        f"| kill -9: share of the events emitted that the file lacks (median) | | "
        f"{e['lost_pct_median']:.2f}% | {s['lost_pct_median']:.1f}% |"
    )
    return "\n".join(rows)


def run(rounds: int, kills: int, json_path: Path | None) -> None:
    """``bench/run.py --only spanfirst``: measure, print the table, keep the figures."""
    with tempfile.TemporaryDirectory() as d:
        print(
            "span-first: emit cost, the SDK's floor, the exporter, then kill -9 ...",
            file=sys.stderr,
        )
        figures = {"spanfirst": figures_of(Path(d), rounds, kills)}
    print(report(figures["spanfirst"]))
    if json_path is not None:
        json_path.write_text(json.dumps(figures, indent=2))
