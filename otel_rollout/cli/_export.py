"""``otel-rollout export FILE``: replay a trace file into OTLP as the spans a live run makes."""

from __future__ import annotations

import argparse
import sys
from itertools import islice
from typing import Any

from ..otel import settings
from ._common import CliError, checked_events, trace_reader

_BATCH = 2048  # events per slice: fewer spans than the SDK's 2048-span queue holds


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "export",
        help="replay a trace file into OTLP spans (for Jaeger, Tempo, a collector)",
        description=(
            "Turn a trace file written anywhere (a cluster with no collector, say) into the "
            "spans a live run would have sent, with their historical timestamps, through the "
            "same span builder, and send them over OTLP. Each run in the file becomes its own "
            "resource (service.instance.id = run_id). Spans still open when a run stopped are "
            "ended at that run's last event with rollout.ended_by=run.stopped."
        ),
    )
    parser.add_argument("file", help="a rollout_trace.jsonl (or .jsonl.gz)")
    parser.add_argument(
        "--endpoint",
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
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from .. import _providers

    chosen = settings(
        traces="otlp",
        endpoint=args.endpoint,
        protocol=args.protocol,
        service_name=args.service_name,
    )
    replay = _providers.Replay(chosen)
    events = checked_events(trace_reader(args.file))
    seen = 0
    while batch := list(islice(events, _BATCH)):
        seen += len(batch)
        replay.builder.export(batch)
        replay.flush()
    exported, failed = replay.finish()
    where = args.endpoint or "the endpoint from OTEL_EXPORTER_OTLP_ENDPOINT"
    print(
        f"{args.file}: {seen} events from {len(replay.runs)} runs → {replay.builder.spans_started} "
        f"spans; {exported} sent to {where}, {failed} not sent",
        file=sys.stderr,
    )
    if failed:
        raise CliError(f"{failed} spans could not be sent to {where}", exit_code=1)
    return 0
