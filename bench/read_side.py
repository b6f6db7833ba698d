"""The read side as a user meets it: whole commands in fresh processes, beside a process
that only ``orjson``-parses every line of the same file (the yardstick).

    python bench/read_side.py [--lines N] [--reps N]

Each command runs as ``python -m otel_rollout ...`` with its output thrown away;
the time is the whole process (start-up and imports included), the best of
``--reps`` runs interleaved with the yardstick's; peak memory is the process's
``VmHWM`` at exit.  In-process rows: the reference ``batch_age_by_step(read_events(path))``
beside the same function fed by a reader that ``orjson``-parses every line, and
the one pass running every analysis at once (cost, report series, batch age).
"""

from __future__ import annotations

import argparse
import compileall
import gc
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from yardstick import plain_read  # noqa: E402

import otel_rollout  # noqa: E402
from otel_rollout.analysis import StepAges, run_file  # noqa: E402
from otel_rollout.batch_age import batch_age_by_step  # noqa: E402
from otel_rollout.cost import CostAnalysis  # noqa: E402
from otel_rollout.reader import read_events  # noqa: E402
from otel_rollout.report import ReportData, ReportSeries  # noqa: E402
from otel_rollout.testing import synthetic_trace  # noqa: E402

# Runs a module or a script, then reports the process's peak resident memory on stderr.
_LAUNCH = """
import atexit, runpy, sys
def _peak():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM"):
            sys.stderr.write("\\nPEAK_KB %s\\n" % line.split()[1])
atexit.register(_peak)
what, sys.argv = sys.argv[1], sys.argv[1:]
if what == "yardstick":
    import orjson
    with open(sys.argv[1], "rb") as f:
        for line in f:
            orjson.loads(line)
else:
    runpy.run_module("otel_rollout", run_name="__main__")
"""


def installed_bytecode() -> None:
    """Bring the package's bytecode up to date, as ``pip install`` leaves it.

    A source checkout run with ``PYTHONDONTWRITEBYTECODE=1`` (set on this machine)
    recompiles every module changed since its ``.pyc`` was written, in every
    process: ~14M instructions (~4 ms here) a module, added to each command's
    start-up, a cost no installed package pays (four stale modules took
    ``batch-age`` on an empty file from 298M instructions to 354M).
    """
    compileall.compile_dir(Path(otel_rollout.__file__).parent, quiet=1)


def commands(path: Path, tmp: Path) -> dict[str, list[str]]:
    """The processes measured, by name."""
    p = str(path)
    return {
        "yardstick: orjson every line": ["yardstick", p],
        "otel-rollout cost --json": ["otel_rollout", "cost", "--json", p],
        "otel-rollout batch-age --json": ["otel_rollout", "batch-age", "--json", p],
        "otel-rollout staleness --json": ["otel_rollout", "staleness", "--json", p],
        "otel-rollout timeline": ["otel_rollout", "timeline", p, "-o", str(tmp / "t.json")],
        "otel-rollout report": ["otel_rollout", "report", p, "-o", str(tmp / "report.html")],
        "otel-rollout validate": ["otel_rollout", "validate", p],
    }


def run_once(argv: list[str]) -> tuple[float, float]:
    """Seconds and peak MB of one process."""
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-c", _LAUNCH, *argv],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        check=False,
    )
    seconds = time.perf_counter() - start
    if proc.returncode not in (0, 1):  # validate exits 1 on a file with errors
        raise RuntimeError(f"{argv}: exit {proc.returncode}: {proc.stderr[-500:]}")
    peak = [line for line in proc.stderr.splitlines() if line.startswith("PEAK_KB")]
    return seconds, int(peak[-1].split()[1]) / 1024


def processes(path: Path, tmp: Path, reps: int) -> dict[str, dict[str, float]]:
    """Best seconds and peak MB of each command, its runs interleaved with the others'."""
    todo = commands(path, tmp)
    best: dict[str, dict[str, float]] = {n: {"s": float("inf"), "mb": 0.0} for n in todo}
    for _ in range(reps):
        for name, argv in todo.items():
            seconds, mb = run_once(argv)
            best[name]["s"] = min(best[name]["s"], seconds)
            best[name]["mb"] = max(best[name]["mb"], mb)
    return best


def in_process(path: Path, lines: int, reps: int) -> dict[str, float]:
    """Lines per second of the reference function and of the one pass (best of ``reps``)."""

    def timed(fn: Callable[[], Any], *, no_gc: bool = False) -> float:
        best = float("inf")
        for _ in range(reps):
            if no_gc:
                gc.disable()
            start = time.perf_counter()
            fn()
            best = min(best, time.perf_counter() - start)
            gc.enable()
        return lines / best

    return {
        "batch_age_by_step(orjson every line)": timed(lambda: batch_age_by_step(plain_read(path))),
        "batch_age_by_step(read_events(path))": timed(lambda: batch_age_by_step(read_events(path))),
        "one pass, every analysis (GC on)": timed(
            lambda: run_file(path, [CostAnalysis(), ReportSeries(ReportData("")), StepAges()])
        ),
        "one pass, every analysis (GC off, as the commands run)": timed(
            lambda: run_file(path, [CostAnalysis(), ReportSeries(ReportData("")), StepAges()]),
            no_gc=True,
        ),
    }


def figures(path: Path, lines: int, reps: int) -> dict[str, Any]:
    installed_bytecode()
    with tempfile.TemporaryDirectory() as d:
        found: dict[str, Any] = {"processes": processes(path, Path(d), reps)}
        found["page_mb"] = (Path(d) / "report.html").stat().st_size / 1e6
        found["in_process"] = in_process(path, lines, reps)
        return found


def report(f: dict[str, Any], lines: int, size_mb: float) -> str:
    procs = f["processes"]
    base = procs["yardstick: orjson every line"]["s"]
    out = [
        f"Whole processes on a {lines:,}-line, 3-run trace ({size_mb:,.0f} MB), best of the runs:",
        "",
        "| process | seconds | speed vs. the yardstick | peak memory MB |",
        "|---|---:|---:|---:|",
    ]
    for name, r in procs.items():
        out.append(f"| {name} | {r['s']:.2f} | {base / r['s']:.2f}× | {r['mb']:.0f} |")
    out += ["", f"The page `report` writes: {f['page_mb']:.2f} MB."]
    inproc = f["in_process"]
    ref = inproc["batch_age_by_step(orjson every line)"]
    out += ["", "| in one process | lines/s | vs. orjson every line |", "|---|---:|---:|"]
    for name, rate in inproc.items():
        out.append(f"| {name} | {rate:,.0f} | {rate / ref:.2f}× |")
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=600_000, help="lines in the trace (600,000)")
    parser.add_argument("--reps", type=int, default=3, help="runs of each process (3)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as d:
        path = synthetic_trace(Path(d) / "trace.jsonl", args.lines, runs=3)
        with open(path, "rb") as f:
            lines = sum(1 for _ in f)
        print(report(figures(path, lines, args.reps), lines, path.stat().st_size / 1e6))


if __name__ == "__main__":
    main()
