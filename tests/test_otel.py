"""OpenTelemetry settings: the standard variables, configure(), and keyword arguments."""

from __future__ import annotations

import pytest

import otel_rollout
import otel_rollout.otel
from otel_rollout.otel import settings


@pytest.fixture(autouse=True)
def forget_configure():
    yield
    otel_rollout.otel.reset()


class TestFromEnvironment:
    def test_nothing_set_means_nothing_exported(self):
        """The embedded default is the JSONL file alone."""
        s = settings({})
        assert not s.active and s.traces == "none" and s.metrics == frozenset()

    def test_endpoint_alone_turns_otlp_on(self):
        """OTEL_EXPORTER_OTLP_ENDPOINT alone exports spans and metrics over OTLP (grpc)."""
        s = settings({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317"})
        assert (s.traces, s.metrics, s.protocol) == ("otlp", frozenset({"otlp"}), "grpc")

    def test_exporter_choices(self):
        """OTEL_TRACES_EXPORTER / OTEL_METRICS_EXPORTER pick exporters; none turns one off."""
        s = settings(
            {
                "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318",
                "OTEL_TRACES_EXPORTER": "none",
                "OTEL_METRICS_EXPORTER": "prometheus,otlp",
                "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
            }
        )
        assert s.traces == "none" and s.metrics == {"prometheus", "otlp"}
        assert s.protocol == "http/protobuf"

    def test_sdk_disabled_wins(self):
        """OTEL_SDK_DISABLED=true turns everything off."""
        s = settings({"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c"})
        assert not s.active

    def test_prometheus_address(self):
        """The scrape endpoint is 127.0.0.1:9464 unless the variables say otherwise."""
        assert (settings({}).prometheus_host, settings({}).prometheus_port) == ("127.0.0.1", 9464)
        s = settings(
            {"OTEL_EXPORTER_PROMETHEUS_HOST": "0.0.0.0", "OTEL_EXPORTER_PROMETHEUS_PORT": "9999"}
        )
        assert (s.prometheus_host, s.prometheus_port) == ("0.0.0.0", 9999)

    def test_bad_values_warn_and_fall_back(self, caplog):
        """A malformed port or unknown exporter is logged; defaults are used."""
        s = settings({"OTEL_EXPORTER_PROMETHEUS_PORT": "lots", "OTEL_METRICS_EXPORTER": "zipkin"})
        assert s.prometheus_port == 9464 and s.metrics == frozenset()
        assert "OTEL_EXPORTER_PROMETHEUS_PORT" in caplog.text and "zipkin" in caplog.text


class TestInCode:
    def test_configure_then_keywords_win(self):
        """configure() sets defaults; keyword arguments override them."""
        otel_rollout.configure(metrics={"prometheus"}, prometheus_port=1234)
        assert settings({}).metrics == {"prometheus"}
        assert settings({}, prometheus_port=99).prometheus_port == 99

    @pytest.mark.parametrize(
        "options, words",
        [({"metrics": {"prom"}}, "metrics: each of"), ({"traces": "zipkin"}, "traces: one of"),
         ({"prometheus_port": "abc"}, "prometheus_port: a port number"),
         ({"prometheus_port": 70000}, "prometheus_port: a port number")],
    )  # fmt: skip
    def test_a_value_given_in_code_that_cannot_work_raises(self, options, words):
        """configure() and a trace's keywords refuse an exporter name or a port that cannot
        work at once (the same typo in an OTEL_* variable is warned of and passed over), and
        keep the settings they had."""
        with pytest.raises(ValueError, match=words):
            otel_rollout.configure(**options)
        with pytest.raises(ValueError, match=words):
            settings({}, **options)
        assert settings({}).traces == "none" and settings({}).metrics == frozenset()

    def test_endpoint_in_code_turns_otlp_on(self):
        """An endpoint given in code turns OTLP export on, like the variable."""
        s = settings({}, endpoint="http://127.0.0.1:4317")
        assert s.traces == "otlp" and s.metrics == {"otlp"}

    def test_unknown_options_are_a_clear_error(self):
        """A misspelt option names the known ones instead of being ignored."""
        with pytest.raises(TypeError, match="endpointt"):
            otel_rollout.configure(endpointt="x")
        with pytest.raises(TypeError, match="known:"):
            settings({}, prometheus="yes")

    def test_none_leaves_a_setting_unchanged(self):
        """An option passed as None keeps what an earlier configure() set."""
        otel_rollout.configure(metrics={"prometheus"}, prometheus_port=1234, service_name="a")
        otel_rollout.configure(metrics=None, prometheus_port=None, service_name="b")
        s = settings({})
        assert (s.metrics, s.prometheus_port, s.service_name) == ({"prometheus"}, 1234, "b")

    def test_configure_without_arguments_changes_nothing(self):
        """configure() with no arguments is not a reset."""
        otel_rollout.configure(metrics={"prometheus"})
        otel_rollout.configure()
        assert settings({}).metrics == {"prometheus"}

    def test_reset_restores_the_defaults(self):
        """reset() forgets every configure() call; the environment applies again."""
        otel_rollout.configure(metrics={"prometheus"}, service_name="a", export_mode="inprocess")
        otel_rollout.otel.reset()
        assert settings({}) == settings({}, service_name=None)
        assert not settings({}).active and settings({}).service_name is None
        env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317"}
        assert settings(env).traces == "otlp"

    def test_configure_reset_true_restores_then_sets(self):
        """configure(reset=True, ...) starts from the defaults, then applies its options."""
        otel_rollout.configure(metrics={"prometheus"}, prometheus_port=1234)
        otel_rollout.configure(reset=True, service_name="b")
        s = settings({})
        assert (s.metrics, s.prometheus_port, s.service_name) == (frozenset(), 9464, "b")

    def test_endpoint_none_never_turns_export_on(self, tmp_path):
        """configure(endpoint=None), or the keyword, exports nothing: only a value does."""
        otel_rollout.configure(endpoint=None)
        assert not settings({}).active
        assert not settings({}, endpoint=None).active
        otel_rollout.configure(service_name="x", protocol="http/protobuf", export_mode="sidecar")
        assert not settings({}).active
        from otel_rollout.trace import RolloutTrace

        with RolloutTrace(tmp_path, endpoint=None) as tr:
            assert not tr.otel.active
        assert tr.sidecar_counts == {}  # no export sidecar was asked for

    def test_only_endpoint_exporter_name_or_variable_turn_export_on(self):
        """Each of the three ways turns export on; the rest of the settings do not."""
        assert settings({}, endpoint="http://c:4317").traces == "otlp"
        assert settings({}, traces="console").active
        assert settings({}, metrics="otlp").active
        assert settings({"OTEL_METRICS_EXPORTER": "prometheus"}).active


class TestResource:
    def test_resource_from_variables_and_run(self, monkeypatch):
        """service.name and OTEL_RESOURCE_ATTRIBUTES come from the environment;
        service.instance.id is always the trace's run_id."""
        from otel_rollout._providers import resource

        monkeypatch.setenv("OTEL_SERVICE_NAME", "grpo-7b")
        monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "cluster=a,service.instance.id=ignored")
        attrs = resource("run-42", settings()).attributes
        assert attrs["service.name"] == "grpo-7b" and attrs["cluster"] == "a"
        assert attrs["service.instance.id"] == "run-42"

    def test_default_service_name(self, monkeypatch):
        """Without OTEL_SERVICE_NAME the service is otel-rollout, not unknown_service."""
        from otel_rollout._providers import resource

        monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
        monkeypatch.delenv("OTEL_RESOURCE_ATTRIBUTES", raising=False)
        assert resource("r", settings({})).attributes["service.name"] == "otel-rollout"


class TestTraceOptions:
    def test_misspelt_option_fails_before_anything_is_written(self, tmp_path):
        """RolloutTrace(path, endpont=...) raises TypeError and creates nothing."""
        from otel_rollout.trace import RolloutTrace

        with pytest.raises(TypeError, match="endpont"):
            RolloutTrace(tmp_path / "logs" / "t.jsonl", endpont="http://c:4317")
        assert not (tmp_path / "logs").exists()
