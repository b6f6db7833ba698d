"""``otel-rollout report FILE -o report.html``: the stop/restore report as one HTML page."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path
from typing import Any

from ..render.fields import Style
from ..render.html import write_html, write_pngs
from ..report import collect_file
from ._common import (
    CliError,
    add_full_ids,
    check_is_trace,
    prepare_output,
    trace_argument,
    trace_reader,
    without_cyclic_gc,
)


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "report",
        help="one self-contained HTML page: batch age, token age, runs, in-flight work, cost",
        description=(
            "Write one self-contained HTML file (no network fetches when opened): batch age "
            "per step with the stops and restores marked, the token-age distribution per "
            "step, a timeline of the runs (active, down, catching up), attempts in flight "
            "over time, and the cost tables of 'otel-rollout cost'. In a browser the batch-age, "
            "token-age and heat-map charts zoom to raw steps: drag across a plot, click a bin, "
            "or type a step range under the chart (scripts off: the static charts)."
        ),
    )
    parser.add_argument(
        "file", type=trace_argument, help="a rollout_trace.jsonl (or .jsonl.gz), or its directory"
    )
    parser.add_argument(
        "-o", "--output", type=Path, default=Path("report.html"), help="where (report.html)"
    )
    parser.add_argument(
        "--png", type=Path, metavar="DIR", help="also write each chart as a PNG (needs Chromium)"
    )
    add_full_ids(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    without_cyclic_gc()
    reader = trace_reader(args.file, typed=True)
    where = prepare_output(args.output, Path(args.file))
    if args.png is not None and args.png.exists() and not args.png.is_dir():
        raise CliError(f"--png {args.png}: is a file; name a directory for the charts' PNGs")
    data = collect_file(reader)
    check_is_trace(reader, reader.events)
    try:
        with open(args.output, "w", encoding="utf-8") as out:
            write_html(data, out, Style(args.full_ids))
    except OSError as exc:
        raise CliError(f"cannot write {args.output}: {exc.strerror or exc}") from exc
    print(f"wrote {args.output}{where}", file=sys.stderr)
    if args.png is not None:
        try:
            for path in write_pngs(data, args.png):
                print(f"wrote {path}", file=sys.stderr)
        except FileNotFoundError as exc:
            raise CliError(str(exc)) from exc
        except OSError as exc:
            raise CliError(f"--png {args.png}: cannot write ({exc.strerror or exc})") from None
        except subprocess.SubprocessError as exc:
            raise CliError(f"Chromium could not render the charts: {exc}") from exc
    return 0
