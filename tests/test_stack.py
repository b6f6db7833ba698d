"""The collector config and compose stack: correct by structure (no collector or Docker here).

Every pipeline names defined components, ports match what the package sends to and what
Prometheus scrapes, everything is bound to 127.0.0.1, images are pinned, mounts exist, and
Grafana's data sources are the ones the dashboard uses.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from conftest import start_simulation

ROOT = Path(__file__).resolve().parent.parent
COLLECTOR = ROOT / "collector"


def load(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


class TestCollectorConfig:
    def test_pipelines_use_only_defined_components(self):
        """Each pipeline's receivers, processors and exporters are defined in their sections."""
        config = load(COLLECTOR / "otelcol.yaml")
        service = config["service"]
        assert set(service["pipelines"]) == {"traces", "metrics"}
        for name, pipeline in service["pipelines"].items():
            for kind in ("receivers", "processors", "exporters"):
                for component in pipeline[kind]:
                    assert component in config[kind], f"{name}: {component} is not in {kind}"
        assert set(service["extensions"]) <= set(config["extensions"])

    def test_traces_go_to_jaeger_and_tempo_metrics_to_prometheus(self):
        """Spans reach both trace backends over OTLP; metrics are served for scraping."""
        pipelines = load(COLLECTOR / "otelcol.yaml")["service"]["pipelines"]
        assert {"otlp/jaeger", "otlp/tempo"} <= set(pipelines["traces"]["exporters"])
        assert "prometheus" in pipelines["metrics"]["exporters"]
        assert "batch" in pipelines["traces"]["processors"]

    def test_receiver_ports_are_the_packages_defaults(self):
        """OTLP gRPC on 4317 and HTTP on 4318, where the SDK's exporters send by default."""
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        protocols = load(COLLECTOR / "otelcol.yaml")["receivers"]["otlp"]["protocols"]
        assert protocols["grpc"]["endpoint"].endswith(":4317")
        assert protocols["http"]["endpoint"].endswith(":4318")
        assert OTLPSpanExporter()._endpoint.endswith("4317")

    def test_run_labels_match_the_dashboard(self):
        """The collector adds service_name/service_instance_id, which the dashboard filters on."""
        processor = load(COLLECTOR / "otelcol.yaml")["processors"]["resource/run_labels"]
        keys = {a["key"] for a in processor["attributes"]}
        board = (ROOT / "dashboards" / "rollout.json").read_text()
        assert keys == {"service_name", "service_instance_id"}
        assert all(key in board for key in keys)


class TestCompose:
    def test_every_port_is_bound_to_loopback(self):
        """No published port listens beyond 127.0.0.1."""
        for name, service in load(COLLECTOR / "compose.yaml")["services"].items():
            for port in service.get("ports", []):
                assert str(port).startswith("127.0.0.1:"), f"{name}: {port}"

    def test_images_are_pinned(self):
        """Every image has an explicit version tag."""
        for name, service in load(COLLECTOR / "compose.yaml")["services"].items():
            image = service["image"]
            tag = image.rsplit(":", 1)[1] if ":" in image else ""
            assert tag and tag != "latest", f"{name}: {image}"

    def test_mounted_files_exist(self):
        """Every file or directory the stack mounts is in the repository."""
        for name, service in load(COLLECTOR / "compose.yaml")["services"].items():
            for volume in service.get("volumes", []):
                source = volume.split(":", 1)[0]
                assert (COLLECTOR / source).resolve().exists(), f"{name}: {source}"

    def test_prometheus_scrapes_the_collectors_endpoint(self):
        """Prometheus's target is the port the collector's prometheus exporter serves."""
        exporter = load(COLLECTOR / "otelcol.yaml")["exporters"]["prometheus"]["endpoint"]
        scrape = load(COLLECTOR / "prometheus.yml")["scrape_configs"][0]
        (target,) = scrape["static_configs"][0]["targets"]
        assert target == "otel-collector:" + exporter.rsplit(":", 1)[1]
        assert scrape["honor_labels"] is True

    def test_grafana_provisions_the_dashboards_data_sources(self):
        """Data source uids in provisioning are the ones the dashboard's queries name."""
        sources = load(ROOT / "dashboards/provisioning/datasources/otel-rollout.yaml")
        uids = {s["uid"] for s in sources["datasources"]}
        board = json.loads((ROOT / "dashboards" / "rollout.json").read_text())
        used = {t["datasource"]["uid"] for p in board["panels"] for t in p["targets"]}
        assert used <= uids and {"jaeger", "tempo"} <= uids
        provider = load(ROOT / "dashboards/provisioning/dashboards/otel-rollout.yaml")
        path = provider["providers"][0]["options"]["path"]
        grafana = load(COLLECTOR / "compose.yaml")["services"]["grafana"]
        assert any(v.split(":")[1].startswith(path) for v in grafana["volumes"])


class TestStackCommand:
    def test_prints_the_commands_for_chosen_ports(self, cli):
        """The printed commands use the chosen OTLP and Grafana ports."""
        proc = cli("stack", "--otlp-grpc-port", "14317", "--grafana-port", "13000")
        assert proc.returncode == 0, proc.stderr
        assert "OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:14317" in proc.stdout
        assert "http://127.0.0.1:13000" in proc.stdout and "--write" in proc.stderr

    @pytest.mark.parametrize("port", ["99999", "0", "-1", "http"])
    def test_a_port_that_is_no_port_is_a_usage_error(self, cli, tmp_path, port):
        """A port outside 1-65535 is one line, exit 2, and writes nothing."""
        proc = cli("stack", "--write", str(tmp_path / "s"), "--grafana-port", port)
        assert proc.returncode == 2 and "must be a port number from 1 to 65535" in proc.stderr
        assert not (tmp_path / "s").exists()

    def test_write_maps_the_chosen_host_ports(self, cli, tmp_path):
        """--write DIR copies the stack with the host side of each port changed, on loopback."""
        proc = cli("stack", "--write", str(tmp_path), "--otlp-grpc-port", "14317")
        assert proc.returncode == 0, proc.stderr
        services = load(tmp_path / "collector" / "compose.yaml")["services"]
        assert "127.0.0.1:14317:4317" in services["otel-collector"]["ports"]
        assert (tmp_path / "dashboards" / "rollout.json").exists()
        header = (tmp_path / "collector" / "compose.yaml").read_text().split("services:")[0]
        assert "OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:14317 " in header
        assert "127.0.0.1:4317" not in header

    def test_check_passes_against_live_endpoints(self, cli, tmp_path):
        """--check: a real OTLP receiver (gRPC and HTTP) and a real metrics endpoint answer."""
        import socket
        import time
        import urllib.request

        from otel_rollout.testing import OtlpReceiver

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        run = start_simulation(tmp_path, port, "--steps", "2", "--speed", "10", "--hold", "30")
        url = f"http://127.0.0.1:{port}/metrics"
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    if b"rollout_step" in urllib.request.urlopen(url, timeout=1).read():
                        break
                except OSError:
                    pass
                assert time.monotonic() < deadline
                time.sleep(0.2)
            for protocol in ("grpc", "http/protobuf"):
                with OtlpReceiver(protocol) as rx:
                    proc = cli(
                        "stack",
                        "--check",
                        "--endpoint",
                        rx.endpoint,
                        "--protocol",
                        protocol,
                        "--metrics-url",
                        url,
                    )
                    assert proc.returncode == 0, proc.stdout + proc.stderr
                    assert proc.stdout.count("ok  ") == 2
        finally:
            run.kill()
            run.wait()

    def test_check_fails_clearly_when_nothing_answers(self, cli):
        """Closed ports: each check says FAIL with the reason; exit 1, no traceback."""
        proc = cli(
            "stack",
            "--check",
            "--endpoint",
            "http://127.0.0.1:1",
            "--metrics-url",
            "http://127.0.0.1:1/metrics",
        )
        assert proc.returncode == 1 and proc.stdout.count("FAIL") == 2
        assert "Traceback" not in proc.stderr
