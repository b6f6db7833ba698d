"""Every query of the Grafana dashboard returns data from a real Prometheus scraping a run.

Renaming a metric in the code breaks this test; so does a query that no longer parses.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

from conftest import start_simulation
from test_prometheus import simulate

ROOT = Path(__file__).resolve().parent.parent
DASHBOARD = ROOT / "dashboards" / "rollout.json"


def concrete(expr: str) -> str:
    """A panel query as Grafana sends it: variables replaced by 'all' and a rate interval."""
    return (
        expr.replace("$service_name", ".*")
        .replace("$service_instance_id", ".*")
        .replace("$__rate_interval", "30s")
    )


def queries() -> list[tuple[str, str, str]]:
    board = json.loads(DASHBOARD.read_text())
    found = [
        (p["title"], t["expr"], t["legendFormat"]) for p in board["panels"] for t in p["targets"]
    ]
    found += [
        (a["name"], a["expr"], a.get("textFormat", ""))
        for a in board["annotations"]["list"]
        if "expr" in a
    ]
    return found


class TestDashboardFile:
    def test_committed_json_is_what_build_makes(self):
        """dashboards/rollout.json is the output of dashboards/build.py."""
        proc = subprocess.run([sys.executable, str(ROOT / "dashboards" / "build.py"), "--check"])
        assert proc.returncode == 0, "run: python dashboards/build.py"

    def test_panels_the_issue_asks_for(self):
        """Batch age (stat and series), token age, attempts, groups, refits, versions,
        trace events, checkpoint annotations, run variables, and links to traces."""
        board = json.loads(DASHBOARD.read_text())
        titles = " | ".join(p["title"] for p in board["panels"])
        for words in (
            "Batch age (last step)",
            "Batch age per step",
            "Token age",
            "Attempts",
            "Groups",
            "Refits",
            "Weight version",
            "Trace events",
        ):
            assert words in titles
        assert {v["name"] for v in board["templating"]["list"]} == {
            "service_name",
            "service_instance_id",
        }
        links = [
            link["url"] for p in board["panels"] for link in p["fieldConfig"]["defaults"]["links"]
        ]
        assert any("16686" in u for u in links) and any("tempo" in u for u in links)


class TestEveryQueryHasData:
    def test_all_panel_and_annotation_queries(self, prometheus, tmp_path):
        """Against a resumed simulated run scraped every second, every query of the board
        returns series, with the labels its legend uses."""
        query, port = prometheus
        log_dir = tmp_path / "run"
        first = simulate(log_dir, 1, "--steps", "4", "--speed", "8", "--checkpoint-every", "2")
        assert first.returncode == 0, first.stderr  # port 1 is refused: metrics off, trace kept
        child = start_simulation(
            log_dir,
            port,
            "--resume",
            "--steps",
            "12",
            "--speed",
            "2",  # slow enough that publishes come after the export sidecar's first scrape
            "--checkpoint-every",
            "2",
            "--hold",
            "20",
        )
        try:
            deadline = time.monotonic() + 90
            while not query("rollout_step >= 11"):
                assert time.monotonic() < deadline, "the resumed run never reached step 11"
                time.sleep(0.5)
            time.sleep(3)  # a few more scrapes so every increase() has two samples
            for title, expr, legend in queries():
                result = query(concrete(expr))
                assert result, f"{title}: no data for {expr}"
                for label in re.findall(r"\{\{(\w+)\}\}", legend):  # reason: not on sealed
                    assert any(label in r["metric"] for r in result), f"{title}: no {label}"
            values = query('count by (service_instance_id) (target_info{service_name=~".*"})')
            assert values, "the run variable has no values"
        finally:
            child.kill()
            child.wait()
