"""Build dashboards/rollout.json, the Grafana dashboard, from the panel list below.

    python dashboards/build.py        # rewrite rollout.json
    python dashboards/build.py --check   # exit 1 if rollout.json is not what this builds

Every query filters by run through the OpenTelemetry ``target_info`` series
(``service_name``, ``service_instance_id``), joined on ``job`` and
``instance``; the tests run each query against a real Prometheus.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE / "rollout.json"
PROM = {"type": "prometheus", "uid": "prometheus"}
RUN = 'target_info{service_name=~"$service_name", service_instance_id=~"$service_instance_id"}'
JAEGER = "http://127.0.0.1:16686"
RESTORES = 'rollout_checkpoints_total{kind="restore"}'


def by_run(expr: str, keep: str = "service_instance_id") -> str:
    """``expr`` limited to the chosen runs (and labelled with the run)."""
    return f"({expr}) * on(job, instance) group_left({keep}) {RUN}"


def summed(by: str, counter: str) -> str:
    """A counter's increase per interval, summed by ``by``, over the chosen runs."""
    return f"sum by ({by}) ({by_run(f'increase({counter}[$__rate_interval])', '')})"


def target(expr: str, legend: str, ref: str = "A") -> dict:
    return {"refId": ref, "datasource": PROM, "expr": expr, "legendFormat": legend}


def panel(
    kind: str,
    title: str,
    targets: list[dict],
    x: int,
    y: int,
    w: int = 12,
    h: int = 8,
    unit: str = "none",
    links: list[dict] | None = None,
    stack: str | None = None,
    description: str = "",
) -> dict:
    custom = {"stacking": {"mode": stack, "group": "A"}} if stack else {}
    return {
        "type": kind,
        "title": title,
        "description": description,
        "datasource": PROM,
        "gridPos": {"h": h, "w": w, "x": x, "y": y},
        "targets": targets,
        "fieldConfig": {
            "defaults": {"unit": unit, "links": links or [], "custom": custom},
            "overrides": [],
        },
        "options": {"legend": {"displayMode": "list", "placement": "bottom"}},
    }


STEP_LINKS = [
    {
        "title": "Traces of this step in Jaeger",
        "url": JAEGER + "/search?service=${service_name}"
        "&tags=%7B%22rollout.step%22%3A%22${__value.raw}%22%7D",
        "targetBlank": True,
    },
    {
        "title": "Traces of this step in Tempo",
        "url": "/explore?left="
        + json.dumps(
            {
                "datasource": "tempo",
                "queries": [
                    {
                        "refId": "A",
                        "queryType": "traceql",
                        "query": "{ span.rollout.step = ${__value.raw} }",
                    }
                ],
            },
            separators=(",", ":"),
        ),
        "targetBlank": True,
    },
]

PANELS = [
    panel(
        "stat",
        "Batch age (last step)",
        [target(by_run("rollout_batch_age"), "{{service_instance_id}}")],
        0,
        0,
        w=6,
        unit="none",
        description="Token-weighted policy updates between generating a token "
        "and training on it, for the last step trained.",
    ),
    panel(
        "stat",
        "Trained step",
        [target(by_run("rollout_step"), "{{service_instance_id}}")],
        6,
        0,
        w=6,
        links=STEP_LINKS,
        description="Click through to the step's traces.",
    ),
    panel(
        "timeseries",
        "Batch age per step",
        [target(by_run("rollout_batch_age"), "{{service_instance_id}}")],
        12,
        0,
        description="The gauge is set once per step; step is not a label.",
    ),
    panel(
        "timeseries",
        "Token age: share of trained tokens",
        [target(summed("age", "rollout_tokens_trained_total"), "age {{age}}")],
        0,
        8,
        stack="percent",
        unit="percentunit",
    ),
    panel(
        "timeseries",
        "Attempts by outcome and reason",
        [target(summed("outcome, reason", "rollout_attempts_total"), "{{outcome}} {{reason}}")],
        12,
        8,
    ),
    panel(
        "timeseries",
        "Groups sealed vs discarded",
        [target(summed("outcome, reason", "rollout_groups_total"), "{{outcome}} {{reason}}")],
        0,
        16,
    ),
    panel(
        "timeseries",
        "Refits and paused calls",
        [
            target(by_run("increase(rollout_refits_total[$__rate_interval])"), "refits", "A"),
            target(
                by_run("increase(rollout_refit_paused_calls_total[$__rate_interval])"),
                "paused calls",
                "B",
            ),
        ],
        12,
        16,
    ),
    panel(
        "timeseries",
        "Weight version vs trained step",
        [
            target(by_run("rollout_weight_version"), "weight version {{service_instance_id}}", "A"),
            target(by_run("rollout_step"), "trained step {{service_instance_id}}", "B"),
        ],
        0,
        24,
    ),
    panel(
        "timeseries",
        "Trace events written and dropped",
        [
            target(by_run("rate(rollout_trace_events_total[$__rate_interval])"), "events/s", "A"),
            target(
                by_run("increase(rollout_trace_dropped_total[$__rate_interval])"), "dropped", "B"
            ),
        ],
        12,
        24,
    ),
]

ANNOTATIONS = [
    {
        "builtIn": 1,
        "datasource": {"type": "grafana", "uid": "-- Grafana --"},
        "enable": True,
        "hide": True,
        "iconColor": "rgba(0, 211, 255, 1)",
        "name": "Annotations & Alerts",
        "type": "dashboard",
    },
    {
        "name": "checkpoint published",
        "datasource": PROM,
        "enable": True,
        "iconColor": "green",
        "expr": by_run('increase(rollout_checkpoints_total{kind="publish"}[1m]) > 0'),
        "step": "15s",
        "titleFormat": "checkpoint published",
        "textFormat": "{{service_instance_id}}",
    },
    {
        "name": "checkpoint restored",
        "datasource": PROM,
        "enable": True,
        "iconColor": "red",
        # A restore happens before the new process is first scraped, so its series may appear
        # already at 1; "new within the last minute" catches that case.
        "expr": by_run(
            f"(increase({RESTORES}[1m]) > 0) or ({RESTORES} unless {RESTORES} offset 1m)"
        ),
        "step": "15s",
        "titleFormat": "checkpoint restored",
        "textFormat": "{{service_instance_id}}",
    },
]


def variable(name: str, query: str, label: str) -> dict:
    return {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": PROM,
        "query": {"query": query, "refId": "PrometheusVariableQueryEditor-VariableQuery"},
        "definition": query,
        "refresh": 2,
        "includeAll": True,
        "multi": True,
        "allValue": ".*",
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
        "sort": 1,
    }


def dashboard() -> dict:
    panels = [dict(p, id=n + 1) for n, p in enumerate(PANELS)]
    return {
        "uid": "otel-rollout",
        "title": "otel-rollout: batch age and rollouts",
        "tags": ["otel-rollout", "rl"],
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "refresh": "10s",
        "time": {"from": "now-30m", "to": "now"},
        "annotations": {"list": ANNOTATIONS},
        "templating": {
            "list": [
                variable("service_name", "label_values(target_info, service_name)", "service"),
                variable(
                    "service_instance_id",
                    'label_values(target_info{service_name=~"$service_name"}, service_instance_id)',
                    "run",
                ),
            ]
        },
        "links": [{"title": "Jaeger", "url": JAEGER, "type": "link", "targetBlank": True}],
        "panels": panels,
    }


def text() -> str:
    return json.dumps(dashboard(), indent=2) + "\n"


if __name__ == "__main__":
    if "--check" in sys.argv:
        sys.exit(0 if OUT.read_text() == text() else 1)
    OUT.write_text(text())
    print(f"wrote {OUT}")
