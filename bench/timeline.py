"""``timeline`` on the bench trace: lines/s and peak memory, each in a fresh process.

    python bench/timeline.py                 # 1M-line, 3-run synthetic trace, best of 3
    python bench/timeline.py --lines 20000 --repeat 1    # a smoke run
    python bench/timeline.py --trace FILE    # any trace

Each run is a fresh interpreter that writes the timeline of the trace to a
file (as ``otel-rollout timeline`` does: the cyclic GC off) and reports its
wall time and ``VmHWM`` (its resident high-water mark: the whole process,
interpreter included, and the figure the target is about), so runs do not
share caches or a heap.  Targets: at least 0.5M lines/s, under 200 MB.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from otel_rollout.testing import synthetic_trace

_CHILD = """
import gc, json, sys, time
from otel_rollout.cli._timeline import write_timeline

def high_water_mb():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM"):
            return int(line.split()[1]) / 1024

gc.disable()
base = high_water_mb()
start = time.perf_counter()
with open(sys.argv[2], "wb") as out:
    summary = write_timeline(sys.argv[1], out, progress=False)
elapsed = time.perf_counter() - start
print(json.dumps({"seconds": elapsed, "peak_mb": high_water_mb(), "base_mb": base,
                  "events": summary.events, "attempts": summary.attempts}))
"""


def measure(trace: Path, repeat: int = 3) -> dict[str, float]:
    """Best time and highest peak over ``repeat`` fresh processes, with the line count."""
    with open(trace, "rb") as f:
        lines = sum(1 for _ in f)
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "timeline.json"
        for _ in range(repeat):
            proc = subprocess.run(
                [sys.executable, "-c", _CHILD, str(trace), str(out)],
                capture_output=True,
                text=True,
                check=True,
            )
            runs.append(json.loads(proc.stdout))
        size = out.stat().st_size
    best = min(r["seconds"] for r in runs)
    return {
        "lines": lines,
        "seconds": best,
        "lines_per_s": lines / best,
        "peak_mb": max(r["peak_mb"] for r in runs),
        "base_mb": runs[0]["base_mb"],
        "events": runs[0]["events"],
        "output_mb": size / 1e6,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=1_000_000, help="synthetic trace lines")
    parser.add_argument("--runs", type=int, default=3, help="runs in the synthetic trace")
    parser.add_argument("--trace", type=Path, help="measure this trace instead")
    parser.add_argument("--repeat", type=int, default=3, help="fresh processes (best time)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        trace = args.trace or synthetic_trace(Path(tmp) / "big.jsonl", args.lines, runs=args.runs)
        figures = measure(trace, args.repeat)
    print(
        f"timeline: {figures['lines']:,} lines in {figures['seconds']:.2f} s = "
        f"{figures['lines_per_s']:,.0f} lines/s (target ≥ 500,000); peak {figures['peak_mb']:.1f} "
        f"MB VmHWM (interpreter alone {figures['base_mb']:.1f} MB; target < 200 MB); "
        f"{figures['events']:,} trace events, {figures['output_mb']:.0f} MB written"
    )
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1) + "\n")


if __name__ == "__main__":
    main()
