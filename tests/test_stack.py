"""The collector config and compose stack: correct by structure (no collector or Docker here).

Every pipeline names defined components, ports match what the package sends to and what
Prometheus scrapes, everything is bound to 127.0.0.1, images are pinned, mounts exist, and
Grafana's data sources are the ones the dashboard uses.
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

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
