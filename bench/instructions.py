"""The read side in CPU instructions: each command's whole process under callgrind, beside
the yardstick's, at two trace sizes.

    python bench/instructions.py [--lines N] [--only NAME ...]

Seconds on a shared 2-core VM swing by 20-40% from one run to the next (bench/README.md);
instructions do not: callgrind counts every one the process executes, the same
count for the same code and input whatever else the machine is doing.  Each
command of ``bench/read_side.py`` (and its yardstick, a process that only
``orjson``-parses every line) runs on synthetic 3-run traces of ``N`` and ``2N``
lines, with ``PYTHONHASHSEED=0``.  Two figures per command:

* **whole process**, on the larger trace: start-up and imports included, as a user
  meets it; ``yardstick / command`` is the speed ratio ``bench/read_side.py``
  measures in seconds;
* **per line**: the instructions the second ``N`` lines added, divided by their
  count, so start-up drops out; ``yardstick / command`` here is the ratio a
  command tends to on a large file.

Instructions are not seconds (a cache miss costs more than an add), but for
these CPU-bound, in-cache passes they track each other closely, and a change
that saves instructions saves time.  Needs ``valgrind`` (Debian's package).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import read_side  # noqa: E402

from otel_rollout.testing import synthetic_trace  # noqa: E402

YARDSTICK = "yardstick: orjson every line"
_COLLECTED = re.compile(r"Collected : (\d+)")


def instructions(argv: list[str], tmp: Path) -> int:
    """Instructions the whole process ``python -c LAUNCH argv...`` executed."""
    out = tmp / "callgrind.out"
    proc = subprocess.run(
        [
            "valgrind",
            "--tool=callgrind",
            f"--callgrind-out-file={out}",
            sys.executable,
            "-c",
            read_side._LAUNCH,
            *argv,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        check=False,
        env={**os.environ, "PYTHONHASHSEED": "0"},
    )
    found = _COLLECTED.findall(proc.stderr)
    if proc.returncode not in (0, 1) or not found:  # validate exits 1 on a file with errors
        raise RuntimeError(f"{argv}: exit {proc.returncode}: {proc.stderr[-800:]}")
    out.unlink(missing_ok=True)
    return int(found[-1])


def lines_of(path: Path) -> int:
    with open(path, "rb") as f:
        return sum(1 for _ in f)


def figures(lines: int, only: list[str] | None = None) -> dict[str, Any]:
    """Instructions of each command on an ``lines``-line and a ``2 * lines``-line trace."""
    read_side.installed_bytecode()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        small = synthetic_trace(tmp / "small.jsonl", lines, runs=3)
        large = synthetic_trace(tmp / "large.jsonl", 2 * lines, runs=3)
        n_small, n_large = lines_of(small), lines_of(large)
        on_small = read_side.commands(small, tmp)
        on_large = read_side.commands(large, tmp)
        names = [n for n in on_small if n == YARDSTICK or not only or any(o in n for o in only)]
        rows: dict[str, dict[str, float]] = {}
        for name in names:
            a = instructions(on_small[name], tmp)
            b = instructions(on_large[name], tmp)
            rows[name] = {"whole": b, "per_line": (b - a) / (n_large - n_small)}
            print(f"  {name}: {b / 1e6:,.0f}M", file=sys.stderr, flush=True)
    return {"lines": n_large, "rows": rows}


def report(f: dict[str, Any]) -> str:
    rows = f["rows"]
    base = rows[YARDSTICK]
    out = [
        f"Instructions (callgrind), whole processes on a {f['lines']:,}-line 3-run trace:",
        "",
        "| process | whole process, M | vs. the yardstick | per line | vs. the yardstick |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, r in rows.items():
        out.append(
            f"| {name} | {r['whole'] / 1e6:,.0f} | {base['whole'] / r['whole']:.2f}× "
            f"| {r['per_line']:,.0f} | {base['per_line'] / r['per_line']:.2f}× |"
        )
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--lines", type=int, default=60_000, help="lines of the smaller trace (60,000)"
    )
    parser.add_argument(
        "--only",
        nargs="+",
        metavar="NAME",
        help="only the commands whose name contains NAME (cost, batch-age, ...), "
        "beside the yardstick",
    )
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        parser.error("needs valgrind (Debian: apt-get install valgrind)")
    print(report(figures(args.lines, args.only)))


if __name__ == "__main__":
    main()
