"""``otel-rollout stack``: commands (or files) for the live stack, and a check it answers."""

from __future__ import annotations

import argparse
import shutil
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from ._common import CliError, endpoint_url, port_number

ROOT = Path(__file__).resolve().parents[2]
_FILES = ("collector", "dashboards")
_PORTS = {  # option → (container port, what listens there)
    "otlp_grpc_port": (4317, "OTLP gRPC (collector)"),
    "otlp_http_port": (4318, "OTLP HTTP (collector)"),
    "grafana_port": (3000, "Grafana"),
    "jaeger_port": (16686, "Jaeger UI"),
    "prometheus_port": (9090, "Prometheus"),
}


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "stack",
        help="commands for the collector/Jaeger/Tempo/Prometheus/Grafana stack; --check it",
        description=(
            "Print the commands that start the live stack (collector, Jaeger, Tempo, "
            "Prometheus, Grafana) on the chosen host ports and point a run at it; --write DIR "
            "writes the stack's files with those ports; --check sends an empty OTLP export "
            "to the endpoint and scrapes the metrics target, and says whether each answers."
        ),
    )
    for option, (port, what) in _PORTS.items():
        parser.add_argument(
            "--" + option.replace("_", "-"), type=port_number, default=port, help=f"{what} ({port})"
        )
    parser.add_argument("--write", type=Path, metavar="DIR", help="write the stack files here")
    parser.add_argument(
        "--check", action="store_true", help="check that the endpoints below answer"
    )
    parser.add_argument(
        "--endpoint",
        type=endpoint_url,
        help="OTLP endpoint to check (default http://127.0.0.1:<otlp-grpc-port>)",
    )
    parser.add_argument(
        "--protocol", choices=["grpc", "http/protobuf"], default="grpc", help="its protocol"
    )
    parser.add_argument(
        "--metrics-url",
        default="http://127.0.0.1:9464/metrics",
        help="scrape target to check (a trainer's endpoint; default http://127.0.0.1:9464/metrics)",
    )
    parser.set_defaults(handler=run)


def _compose_text(args: argparse.Namespace, text: str) -> str:
    for option, (port, _) in _PORTS.items():
        text = text.replace(
            f'"127.0.0.1:{port}:{port}"', f'"127.0.0.1:{getattr(args, option)}:{port}"'
        )
        # The header's how-to names host ports too: http://127.0.0.1:4317 and the like.
        mine = f"http://127.0.0.1:{getattr(args, option)}"
        for end in (" ", "\n"):
            text = text.replace(f"http://127.0.0.1:{port}{end}", mine + end)
    return text


def write_stack(args: argparse.Namespace, target: Path) -> Path:
    """A copy of collector/ and dashboards/ with the chosen host ports; returns compose.yaml."""
    missing = [d for d in _FILES if not (ROOT / d).is_dir()]
    if missing:
        raise CliError(
            "the stack files live in a checkout of otel-rollout (collector/, dashboards/)"
        )
    for name in _FILES:
        shutil.copytree(ROOT / name, target / name, dirs_exist_ok=True)
    compose = target / "collector" / "compose.yaml"
    compose.write_text(_compose_text(args, compose.read_text()))
    return compose


def _check_otlp(endpoint: str, protocol: str) -> str | None:
    """None if the endpoint takes an (empty) OTLP export, else why not."""
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

    request = trace_service_pb2.ExportTraceServiceRequest()
    if protocol == "grpc":
        import grpc
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc

        target = endpoint.split("://", 1)[-1]
        with grpc.insecure_channel(target) as channel:
            try:
                trace_service_pb2_grpc.TraceServiceStub(channel).Export(request, timeout=3)
            except grpc.RpcError as exc:
                return f"{exc.code().name}: {exc.details()}"
        return None
    http = urllib.request.Request(
        endpoint.rstrip("/") + "/v1/traces",
        data=request.SerializeToString(),
        headers={"Content-Type": "application/x-protobuf"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(http, timeout=3) as response:
            return None if response.status == 200 else f"HTTP {response.status}"
    except (urllib.error.URLError, OSError) as exc:
        return str(getattr(exc, "reason", exc))


def _check_metrics(url: str) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=3) as response:
            body = response.read().decode("utf-8", "replace")
    except (urllib.error.URLError, OSError) as exc:
        return str(getattr(exc, "reason", exc))
    return None if "rollout_" in body else "answers, but serves no rollout_ metrics"


def run(args: argparse.Namespace) -> int:
    if args.check:
        endpoint = args.endpoint or f"http://127.0.0.1:{args.otlp_grpc_port}"
        failures = 0
        for label, problem in (
            (f"OTLP {args.protocol} {endpoint}", _check_otlp(endpoint, args.protocol)),
            (f"metrics {args.metrics_url}", _check_metrics(args.metrics_url)),
        ):
            failures += problem is not None
            print(
                f"{'ok  ' if problem is None else 'FAIL'} {label}"
                + (f": {problem}" if problem else "")
            )
        return 1 if failures else 0
    compose = ROOT / "collector" / "compose.yaml"
    changed = [o for o, (port, _) in _PORTS.items() if getattr(args, o) != port]
    if changed and args.write is None:
        print(
            "note: collector/compose.yaml has the default ports; add --write DIR to get a "
            "copy with yours",
            file=sys.stderr,
        )
    if args.write is not None:
        compose = write_stack(args, args.write)
        print(f"wrote {args.write / 'collector'} and {args.write / 'dashboards'}", file=sys.stderr)
    print(f"docker compose -f {compose} up -d")
    print(f"export OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:{args.otlp_grpc_port}")
    print("otel-rollout demo")
    print(f"# Grafana    http://127.0.0.1:{args.grafana_port}")
    print(f"# Jaeger     http://127.0.0.1:{args.jaeger_port}")
    print(f"# Prometheus http://127.0.0.1:{args.prometheus_port}")
    print(
        f"otel-rollout stack --check --endpoint http://127.0.0.1:{args.otlp_grpc_port} "
        f"--metrics-url http://127.0.0.1:8889/metrics"
    )
    return 0
