"""The ``otel-rollout`` command: one subcommand per module in this package.

Exit codes: 0 ok, 1 the input has problems, 2 usage or I/O error.  Errors
are one line on stderr, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from .. import __version__
from .._reference import drop_stdout, print_batch_ages, setup_logging
from ._common import CliError

__all__ = ["main", "run", "run_reference_main"]

#: Each command and the module that defines it, in the order --help lists them.  Only
#: the module of the command being run is imported: the others (asyncio for simulate,
#: urllib for stack, OpenTelemetry for export) would add ~0.1 s to every read command.
_COMMANDS = {
    "batch-age": "_batch_age",
    "cost": "_cost",
    "report": "_report",
    "staleness": "_staleness",
    "timeline": "_timeline",
    "validate": "_validate",
    "watch": "_watch",
    "simulate": "_simulate",
    "demo": "_simulate",
    "export": "_export",
    "log-to": "_log_to",
    "stack": "_stack",
    "schema": "_schema",
}


def _parser(argv: Sequence[str] = ()) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="otel-rollout",
        description=(
            "Instrumentation for asynchronous RL rollouts: read a rollout_trace.jsonl, "
            "report batch age per step, validate the log, or run a simulated training run."
        ),
        epilog="Run 'otel-rollout COMMAND --help' for a command's options.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    chosen = next((arg for arg in argv if not arg.startswith("-")), None)
    names = [_COMMANDS[chosen]] if chosen in _COMMANDS else list(dict.fromkeys(_COMMANDS.values()))
    for name in names:
        importlib.import_module(f"{__name__}.{name}").add_parser(commands)
    return parser


def run(argv: Sequence[str] | None = None) -> int:
    """Run one command and return its exit code."""
    if argv is None:
        argv = sys.argv[1:]
    args = _parser(argv).parse_args(argv)
    setup_logging()
    try:
        code = int(args.handler(args) or 0)
        sys.stdout.flush()  # a full disk under stdout is met here, not at exit
        return code
    except CliError as exc:
        print(f"otel-rollout: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("otel-rollout: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        sys.stderr.close()  # the reader went away (| head); nothing left to say
        return 0
    except OSError as exc:  # standard output could not be written (a full disk, say)
        drop_stdout()
        where = f"{exc.filename}: " if exc.filename else "cannot write the output: "
        print(f"otel-rollout: error: {where}{exc.strerror or exc}", file=sys.stderr)
        return 2


def main(argv: Sequence[str] | None = None) -> None:
    raise SystemExit(run(argv))


def run_reference_main(argv: Sequence[str] | None = None) -> int:
    """``python -m otel_rollout.trace FILE``: one line per step, step then batch age."""
    return print_batch_ages(argv)
