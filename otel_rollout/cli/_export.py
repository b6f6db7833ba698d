"""``otel-rollout export FILE``: replay a trace file into OTLP as the spans a live run makes."""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from .._blocks import is_gzipped
from ..exporters import log_path
from ..otel import OtelSettings, settings
from ..reader import unreadable
from ..render.words import counted
from ._common import CliError, checked_batches, endpoint_url, seconds, trace_argument, trace_reader

if TYPE_CHECKING:
    from ..sidecar._telemetry import Telemetry


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "export",
        help="replay a trace file into OTLP spans (for Jaeger, Tempo, a collector), or follow "
        "a growing one and export its spans and metrics as they come (--follow)",
        description=(
            "Turn a trace file written anywhere (a cluster with no collector, say) into the "
            "spans a live run would have sent, with their historical timestamps, through the "
            "same span builder, and send them over OTLP. Each run in the file becomes its own "
            "resource (service.instance.id = run_id). Spans still open when a run stopped are "
            "ended at that run's last event with rollout.ended_by=run.stopped."
        ),
    )
    parser.add_argument(
        "file", type=trace_argument, help="a rollout_trace.jsonl (or .jsonl.gz), or its directory"
    )
    parser.add_argument(
        "--endpoint",
        type=endpoint_url,
        help="OTLP endpoint, e.g. http://127.0.0.1:4317 (grpc) or http://127.0.0.1:4318 "
        "(http/protobuf); default: OTEL_EXPORTER_OTLP_ENDPOINT, else the SDK's localhost default",
    )
    parser.add_argument(
        "--protocol",
        choices=["grpc", "http/protobuf"],
        help="OTLP protocol (default: OTEL_EXPORTER_OTLP_PROTOCOL, else grpc)",
    )
    parser.add_argument(
        "--service-name", help="service.name (default: OTEL_SERVICE_NAME or otel-rollout)"
    )
    parser.add_argument(
        "--follow",
        action="store_true",
        help="keep following the file as it grows, like tail -F (a file not there yet, a "
        "partial last line, a file replaced), and export spans and metrics as the standard "
        "OTEL_* settings say, serving the Prometheus endpoint if asked: the sidecar a trace "
        "starts by itself when export is on",
    )
    parser.add_argument(
        "--linger",
        type=seconds,
        metavar="SECONDS",
        help="with --follow: exit this long after every run in the file has stopped "
        "(default: follow until Ctrl-C or SIGTERM)",
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    if args.linger is not None and not args.follow:
        raise CliError("--linger goes with --follow (a replay ends at the end of the file)")
    chosen = settings(
        traces=None if args.follow else _replay_exporter(args.endpoint),
        endpoint=args.endpoint,
        protocol=args.protocol,
        service_name=args.service_name,
    )
    if not chosen.enabled:
        raise CliError("OTEL_SDK_DISABLED=true turns spans and metrics off: nothing to export "
                       "(unset it to export)")  # fmt: skip
    if not args.follow and chosen.traces == "none":
        raise CliError("OTEL_TRACES_EXPORTER=none turns spans off: nothing to replay (unset "
                       "it, or give --endpoint)")  # fmt: skip
    telemetry = _follow(args, chosen) if args.follow else _replay(args, chosen)
    if chosen.traces == "console":
        where = "standard output (OTEL_TRACES_EXPORTER=console)"
    else:
        where = _where(args.endpoint, chosen.protocol)
    read = f"{counted(telemetry.events, 'event')} from {counted(len(telemetry.runs), 'run')}"
    if chosen.traces == "none":
        asked = os.environ.get("OTEL_TRACES_EXPORTER", "").strip()
        why = (f"OTEL_TRACES_EXPORTER={asked}" if asked
               else "neither OTEL_TRACES_EXPORTER nor --endpoint asks for them")  # fmt: skip
        sent = f"no spans ({why})"
    else:
        sent = (
            f"{counted(telemetry.spans_made, 'span')}; {telemetry.spans_sent:,} sent to "
            f"{where}, {telemetry.spans_failed:,} not sent"
        )
    print(f"{args.file}: {read} → {sent}", file=sys.stderr)
    if telemetry.spans_failed:
        raise CliError(f"{telemetry.spans_failed} spans could not be sent to {where}", exit_code=1)
    return 0


def _replay_exporter(endpoint: str | None) -> str:
    """Where a replay sends spans: over OTLP, unless OTEL_TRACES_EXPORTER names only the
    console, or none, and no --endpoint outranks it (a name this version does not know is
    warned of and passed over, as everywhere)."""
    named = {n.strip().lower() for n in os.environ.get("OTEL_TRACES_EXPORTER", "").split(",")}
    known = named & {"otlp", "console", "none"}
    if endpoint or not known or "otlp" in known:
        return "otlp"
    return "console" if "console" in known else "none"


def _where(endpoint: str | None, protocol: str) -> str:
    """The endpoint spans went to, in words."""
    if endpoint:
        return endpoint
    for name in ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"):
        if os.environ.get(name):
            return f"{os.environ[name]} ({name})"
    port = 4318 if protocol == "http/protobuf" else 4317
    return f"the SDK's default endpoint, localhost:{port} (no --endpoint, no {name})"


def _replay(args: argparse.Namespace, chosen: OtelSettings) -> Telemetry:
    """The whole file, once: what a run left open ends when the next run starts, or at the end."""
    from ..sidecar._telemetry import Telemetry

    # Spans only: metrics pushed now would carry today's time, not the file's.
    telemetry = Telemetry(replace(chosen, metrics=frozenset()), end_other_runs=True)
    for batch in checked_batches(trace_reader(args.file, validate=True)):
        telemetry.export(batch)
    telemetry.finish("run.stopped")
    return telemetry


def _follow(args: argparse.Namespace, chosen: OtelSettings) -> Telemetry:
    from ..sidecar import Sidecar, handle_signals

    if not chosen.active and not chosen.trackers:
        raise CliError(
            "nothing to export: set --endpoint, OTEL_EXPORTER_OTLP_ENDPOINT, "
            "OTEL_TRACES_EXPORTER, OTEL_METRICS_EXPORTER or OTEL_ROLLOUT_TRACKERS"
        )
    path = log_path(args.file)  # the log a writer given this path writes; it may not exist yet
    problem = unreadable(path) if path.exists() else None
    if problem is not None:
        raise CliError(problem)
    if is_gzipped(path):
        raise CliError(f"{path}: gzipped; --follow follows a plain log as it grows "
                       "(replay a finished .gz with export FILE, no --follow)")  # fmt: skip
    try:
        sidecar = Sidecar(path, chosen, linger=args.linger)
    except OSError as exc:
        raise CliError(f"another sidecar already follows {path} ({exc})") from exc
    handle_signals(sidecar)
    print(f"following {path}; Ctrl-C to stop", file=sys.stderr)
    sidecar.run()
    return sidecar.telemetry
