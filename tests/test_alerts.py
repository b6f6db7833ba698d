"""The alert rules in dashboards/alerts.yml: promtool checks and unit-tests them, the compose
stack's Prometheus loads them, and a real Prometheus evaluates them against simulated runs.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml
from conftest import get, installed, running_prometheus, start_simulation

from otel_rollout.reader import read_events

ROOT = Path(__file__).resolve().parent.parent
DASHBOARDS = ROOT / "dashboards"
RULES = DASHBOARDS / "alerts.yml"
RULE_TESTS = DASHBOARDS / "alerts_test.yml"
COLLECTOR = ROOT / "collector"
ALERTS = {
    "RolloutBatchAgeHigh",
    "RolloutTraceDropping",
    "RolloutSpansDropping",
    "RolloutTrainerStalled",
    "RolloutRunRestarted",
}


def rules(path: Path = RULES) -> list[dict]:
    return [rule for group in yaml.safe_load(path.read_text())["groups"] for rule in group["rules"]]


class TestRuleFile:
    def test_promtool_checks_the_rules(self):
        """`promtool check rules` accepts the file: every expression parses."""
        proc = subprocess.run(
            [installed("promtool"), "check", "rules", str(RULES)], capture_output=True, text=True
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert f"SUCCESS: {len(rules())} rules found" in proc.stdout

    def test_promtool_unit_tests_pass(self):
        """`promtool test rules` passes: each rule fires when it should and only then."""
        proc = subprocess.run(
            [installed("promtool"), "test", "rules", RULE_TESTS.name],
            cwd=DASHBOARDS,
            capture_output=True,
            text=True,
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "SUCCESS" in proc.stdout

    def test_every_alert_says_what_to_look_at_and_how_bad(self):
        """The five alerts exist, each with a summary, a description and a severity."""
        alerts = {r["alert"]: r for r in rules() if "alert" in r}
        assert set(alerts) == ALERTS
        for name, rule in alerts.items():
            assert rule["labels"]["severity"] in {"info", "warning", "critical"}, name
            assert rule["annotations"]["summary"].strip(), name
            assert "Look first" in rule["annotations"]["description"], name

    def test_every_alert_is_tested_firing_and_quiet(self):
        """The unit tests expect each alert firing at some time and absent at another."""
        cases = [
            case
            for test in yaml.safe_load(RULE_TESTS.read_text())["tests"]
            for case in test.get("alert_rule_test", [])
        ]
        for name in ALERTS:
            mine = [c for c in cases if c["alertname"] == name]
            assert any(c["exp_alerts"] for c in mine), f"{name}: never expected to fire"
            assert any(not c["exp_alerts"] for c in mine), f"{name}: never expected quiet"

    def test_the_batch_age_threshold_is_one_recorded_number(self):
        """The threshold is the recording rule rollout:batch_age_threshold, which the alert
        compares with."""
        by_name = {r.get("record") or r["alert"]: r for r in rules()}
        assert by_name["rollout:batch_age_threshold"]["expr"].strip() == "vector(2)"
        assert "rollout:batch_age_threshold" in by_name["RolloutBatchAgeHigh"]["expr"]


class TestStackLoadsTheRules:
    def test_prometheus_config_names_the_mounted_rules(self, tmp_path):
        """The compose Prometheus mounts dashboards/alerts.yml where its config's rule_files
        points, and promtool accepts that config with the rules beside it."""
        config = yaml.safe_load((COLLECTOR / "prometheus.yml").read_text())
        (rule_file,) = config["rule_files"]
        service = yaml.safe_load((COLLECTOR / "compose.yaml").read_text())["services"]
        mounts = dict(v.split(":")[:2] for v in service["prometheus"]["volumes"])
        container_config = mounts["./prometheus.yml"]
        inside = str(Path(container_config).parent / rule_file)
        assert mounts["../dashboards/alerts.yml"] == inside
        shutil.copy(COLLECTOR / "prometheus.yml", tmp_path / "prometheus.yml")
        shutil.copy(RULES, tmp_path / rule_file)
        proc = subprocess.run(
            [installed("promtool"), "check", "config", str(tmp_path / "prometheus.yml")],
            capture_output=True,
            text=True,
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert f"SUCCESS: {len(rules())} rules found" in proc.stdout

    def test_prometheus_scrapes_the_collectors_own_metrics(self):
        """RolloutSpansDropping needs the collector's own metrics: the collector serves them and
        Prometheus scrapes them."""
        otelcol = yaml.safe_load((COLLECTOR / "otelcol.yaml").read_text())
        (reader,) = otelcol["service"]["telemetry"]["metrics"]["readers"]
        exporter = reader["pull"]["exporter"]["prometheus"]
        jobs = yaml.safe_load((COLLECTOR / "prometheus.yml").read_text())["scrape_configs"]
        targets = [t for job in jobs for c in job["static_configs"] for t in c["targets"]]
        assert f"otel-collector:{exporter['port']}" in targets
        assert exporter["host"] == "0.0.0.0"  # inside the container; compose publishes no port


def readme_yaml() -> list[str]:
    """The YAML blocks of the README's Alerts section, in order."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("\n## Alerts\n") : text.index("\n## Commands\n")]
    return re.findall(r"```yaml\n(.*?)```", section, re.S)


class TestReadmeRouting:
    def test_the_alerting_snippet_is_a_valid_prometheus_config(self, tmp_path):
        """The README's `alerting:` block, with the rules, passes `promtool check config`."""
        _, alerting, _ = readme_yaml()
        config = tmp_path / "prometheus.yml"
        config.write_text(alerting + "rule_files: [alerts.yml]\nscrape_configs: []\n")
        shutil.copy(RULES, tmp_path / "alerts.yml")
        proc = subprocess.run(
            [installed("promtool"), "check", "config", str(config)], capture_output=True, text=True
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr

    def test_the_alertmanager_routes_match_the_rules_severities(self, tmp_path):
        """Every severity the README's Alertmanager routes match is one the rules set, every
        receiver routed to is defined, and amtool accepts the file where it is installed."""
        *_, routing = readme_yaml()
        config = yaml.safe_load(routing)
        severities = {r["labels"]["severity"] for r in rules() if "alert" in r}
        matched = {
            m.split("=")[1].strip('"')
            for route in config["route"]["routes"]
            for m in route["matchers"]
        }
        assert matched <= severities and "critical" in matched
        names = {r["name"] for r in config["receivers"]}
        assert {config["route"]["receiver"]} | {
            r["receiver"] for r in config["route"]["routes"]
        } <= names
        amtool = shutil.which("amtool")
        if amtool is not None:
            url = tmp_path / "url"
            url.write_text("https://hooks.slack.com/services/T/B/X\n")
            path = tmp_path / "alertmanager.yml"
            path.write_text(routing.replace("/etc/alertmanager/slack_webhook_url", str(url)))
            proc = subprocess.run(
                [amtool, "check-config", str(path)], capture_output=True, text=True
            )
            assert proc.returncode == 0, proc.stdout + proc.stderr


# The shipped rules, with the windows a simulated run cannot wait out made short, and the
# batch-age threshold lowered the way the README says to change it.
_FAST = {
    "rollout:batch_age_threshold": {"expr": "vector(0.5)"},
    "RolloutBatchAgeHigh": {"for": "2s"},
}


def fast_rules(target: Path) -> None:
    document = yaml.safe_load(RULES.read_text())
    for group in document["groups"]:
        for rule in group["rules"]:
            rule.update(_FAST.get(rule.get("record") or rule.get("alert"), {}))
            if rule.get("alert") == "RolloutTrainerStalled":
                rule["expr"] = rule["expr"].replace("20m", "6s")
    target.write_text(yaml.safe_dump(document, sort_keys=False))


@pytest.fixture
def alerting_prometheus(tmp_path) -> Iterator[tuple[Callable[[], dict[str, dict]], int]]:
    """A Prometheus server scraping 127.0.0.1:<target> every second and evaluating the rules
    every second; yields (rule states by name, target port)."""
    fast_rules(tmp_path / "alerts.yml")
    with running_prometheus(tmp_path, "rule_files: [alerts.yml]\n") as (base, target):

        def states() -> dict[str, dict]:
            groups = get(f"{base}/api/v1/rules")["data"]["groups"]
            return {r["name"]: r for g in groups for r in g["rules"]}

        yield states, target


def wait_for(
    states: Callable[[], dict[str, dict]], what: str, ok: Callable[[dict[str, dict]], bool]
) -> dict[str, dict]:
    """Poll the rule states until ``ok`` holds (30 s at most); returns them."""
    deadline = time.monotonic() + 30
    while not ok(now := states()):
        assert time.monotonic() < deadline, f"{what}: {now}"
        time.sleep(0.3)
    return now


def state(rules: dict[str, dict], name: str) -> str:
    return rules[name].get("state", "")


class TestRulesInPrometheus:
    def test_rules_fire_on_a_simulated_run_and_its_resume(self, alerting_prometheus, tmp_path):
        """Scraping a simulated run, the rules load healthy, batch age above a lowered threshold
        and a trainer held after its last step fire while nothing drops; when the run stops and
        is resumed, RolloutRunRestarted fires for the new run."""
        states, port = alerting_prometheus
        log_dir = tmp_path / "run"
        common = ("--speed", "8", "--checkpoint-every", "2")
        first = start_simulation(log_dir, port, "--steps", "4", *common, "--hold", "15")
        second = None
        try:
            loaded = wait_for(
                states,
                "the trainer held after its last step never stalled",
                lambda r: state(r, "RolloutTrainerStalled") == "firing",
            )
            assert set(loaded) >= ALERTS | {"rollout:batch_age_threshold", "rollout:run_info"}
            assert {r["health"] for r in loaded.values()} == {"ok"}, loaded
            assert state(loaded, "RolloutBatchAgeHigh") == "firing"
            for quiet in ("RolloutTraceDropping", "RolloutSpansDropping", "RolloutRunRestarted"):
                assert state(loaded, quiet) == "inactive", loaded[quiet]
            (stalled,) = loaded["RolloutTrainerStalled"]["alerts"]
            assert stalled["labels"]["severity"] == "critical"
            assert "the last step trained is 3" in stalled["annotations"]["description"]

            assert first.wait(60) == 0
            second = start_simulation(
                log_dir, port, "--resume", "--steps", "8", *common, "--hold", "20"
            )
            restarted = wait_for(
                states,
                "the resumed run was never reported",
                lambda r: state(r, "RolloutRunRestarted") == "firing",
            )
            runs = [
                e["run_id"]
                for e in read_events(log_dir / "rollout_trace.jsonl")
                if e["event"] == "run.start"
            ]
            assert len(runs) == 2
            (alert,) = restarted["RolloutRunRestarted"]["alerts"]
            assert alert["labels"]["service_instance_id"] == runs[1]
            assert alert["labels"]["service_name"] == "otel-rollout"
            assert alert["labels"]["severity"] == "info"
        finally:
            for proc in (first, second):
                if proc is not None:
                    proc.kill()
                    proc.wait()
