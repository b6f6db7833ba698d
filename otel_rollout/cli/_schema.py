"""``otel-rollout schema``: print the JSON Schema of one trace line."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ..schema import json_schema_text


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "schema",
        help="print the JSON Schema of a trace line",
        description="Print the JSON Schema (draft 2020-12) that every trace line follows.",
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    sys.stdout.buffer.write(json_schema_text())
    return 0
