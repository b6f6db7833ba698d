"""The HTML report: self-contained, every chart drawn, and rendered by a real Chromium."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from otel_rollout.render.html import CHROMIUM_FLAGS, chromium, render_html
from otel_rollout.report import collect
from otel_rollout.testing import TraceBuilder

INSTALL = "apt-get install -y --no-install-recommends chromium"
CHARTS = ("batch-age", "token-age", "age-heatmap", "length-bias", "timeline", "in-flight")


def two_run_trace() -> TraceBuilder:
    b = TraceBuilder(run_id="A")
    for n in range(3):
        gid = f"g{n}"
        b.event("group.reserve", group_id=gid, prompt_id=n, size=1, weight_version=n, epoch=0)
        b.event(
            "attempt.dispatch",
            attempt_id=f"a{n}",
            group_id=gid,
            prompt_id=n,
            generation_index=0,
            weight_version=n,
            epoch=0,
        )
        b.event(
            "attempt.seal",
            attempt_id=f"a{n}",
            group_id=gid,
            prompt_id=n,
            generation_index=0,
            tokens=10,
        )
        b.event(
            "group.seal",
            group_id=gid,
            prompt_id=n,
            tokens=10,
            tokens_by_version={str(n): 6, str(n - 1): 4} if n else {"0": 10},
        )
        b.step(n, n + 1, [gid])
    b.event("checkpoint.publish", step=2, weight_version=3)
    b.new_run("B", gap=2.0)
    b.event("checkpoint.restore", step=2, weight_version=3, from_run_id="A")
    b.sealed_group("h", {3: 10})
    b.step(3, 4, ["h"])
    return b


@pytest.fixture
def page(tmp_path):
    html = render_html(collect(two_run_trace().events, source="t.jsonl"))
    path = tmp_path / "report.html"
    path.write_text(html)
    return html, path


class TestPage:
    def test_fetches_nothing(self, page):
        """No src, href or url() that a browser would load: the file stands alone."""
        html, _ = page
        assert not re.search(r"\b(src|href)\s*=", html)
        assert "url(" not in html and "@import" not in html

    def test_every_chart_has_marks(self, page):
        """Six charts, each with drawn marks (series, bars, cells or spans) but the length
        bias of three rollouts, which says why it has none; and the tables."""
        html, _ = page
        for chart in CHARTS:
            svg = html.split(f'id="{chart}"', 1)[1].split("</svg>", 1)[0]
            if chart == "length-bias":
                assert "fewer than 10 finished rollouts" in svg and 'class="mark' not in svg
            else:
                assert 'class="mark' in svg, chart
        assert "What each stop cost" in html and '<th title="">downtime</th>' in html

    def test_stops_and_restores_are_marked(self, page):
        """The batch-age chart marks the stop and the restore, and says so in its legend."""
        html, _ = page
        svg = html.split('id="batch-age"', 1)[1].split("</svg>", 1)[0]
        assert "stop of run A" in svg and "restore: run B" in svg
        assert '<text class="legend" x="' in svg and ">stop</text>" in svg


def load_in_chromium(path: Path, tmp_path: Path) -> tuple[dict[str, str], list[str]]:
    """Open ``path`` in headless Chromium: the page's counts (``data-*`` of its body, set by
    its inline script) and the console lines Chromium logged."""
    browser = chromium()
    if browser is None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"Chromium is not installed ({INSTALL})")
        pytest.skip(f"Chromium is not installed ({INSTALL})")
    proc = subprocess.run(
        [
            browser,
            *CHROMIUM_FLAGS,
            f"--user-data-dir={tmp_path / 'profile'}",
            "--enable-logging=stderr",
            "--v=0",
            "--dump-dom",
            path.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    body = re.search(r"<body([^>]*)>", proc.stdout)
    assert body is not None, proc.stdout[:2000]
    attrs = dict(re.findall(r'data-(\w+)="(\d+)"', body.group(1)))
    return attrs, [line for line in proc.stderr.splitlines() if "CONSOLE" in line]


class TestInChromium:
    def test_renders_charts_without_errors(self, page, tmp_path):
        """Headless Chromium loads the file: the charts drawn (all but the length bias of
        three rollouts), no page or console errors."""
        _, path = page
        attrs, console = load_in_chromium(path, tmp_path)
        assert attrs["charts"] == str(len(CHARTS)) and attrs["drawn"] == str(len(CHARTS) - 1)
        assert int(attrs["marks"]) > 10 and attrs["errors"] == "0"
        assert console == []

    def test_png_export(self, tmp_path, cli):
        """--png writes each chart as a PNG image."""
        if chromium() is None:
            pytest.skip(f"Chromium is not installed ({INSTALL})")
        trace = two_run_trace().write(tmp_path / "t.jsonl")
        proc = cli(
            "report", str(trace), "-o", str(tmp_path / "r.html"), "--png", str(tmp_path / "png")
        )
        assert proc.returncode == 0, proc.stderr
        pngs = sorted((tmp_path / "png").glob("*.png"))
        assert [p.stem for p in pngs] == sorted(CHARTS)
        assert all(p.read_bytes().startswith(b"\x89PNG") for p in pngs)


class TestCommand:
    def test_report_command_writes_the_page(self, tmp_path, cli):
        """otel-rollout report FILE -o OUT writes the page; a missing file is exit 2."""
        trace = two_run_trace().write(tmp_path / "t.jsonl")
        out = tmp_path / "r.html"
        proc = cli("report", str(trace), "-o", str(out))
        assert proc.returncode == 0 and out.read_text().startswith("<!doctype html>")
        assert cli("report", str(tmp_path / "none")).returncode == 2

    def test_a_missing_directory_is_made_and_said(self, tmp_path, cli):
        """-o into a directory that does not exist makes it and says so on stderr."""
        trace = two_run_trace().write(tmp_path / "t.jsonl")
        out = tmp_path / "new" / "deeper" / "r.html"
        proc = cli("report", str(trace), "-o", str(out))
        assert proc.returncode == 0 and out.is_file()
        assert f"(made the directory {out.parent})" in proc.stderr
        again = cli("report", str(trace), "-o", str(out))
        assert "made the directory" not in again.stderr

    def test_timeline_makes_a_missing_directory_as_report_does(self, tmp_path, cli):
        """timeline -o into a directory that does not exist makes it and says so (it was an
        I/O error while report made the directory)."""
        trace = two_run_trace().write(tmp_path / "t.jsonl")
        out = tmp_path / "new" / "t.json.gz"
        proc = cli("timeline", str(trace), "-o", str(out))
        assert proc.returncode == 0 and out.is_file(), proc.stderr
        assert f"(made the directory {out.parent})" in proc.stderr
        blocked = tmp_path / "file"
        blocked.write_text("")
        proc = cli("timeline", str(trace), "-o", str(blocked / "sub" / "t.json"))
        assert proc.returncode == 2 and "cannot make the directory" in proc.stderr
        assert "Traceback" not in proc.stderr

    @pytest.mark.parametrize("command", ["report", "timeline"])
    @pytest.mark.parametrize("how", ["same-name", "a-link", "another-spelling"])
    def test_the_trace_being_read_is_never_written_over(self, tmp_path, cli, command, how):
        """-o naming the input trace (by its name, through a link, or spelled another way)
        is refused in one line, and the trace is left as it was."""
        trace = two_run_trace().write(tmp_path / "t.jsonl")
        before = trace.read_bytes()
        out = {
            "same-name": trace,
            "a-link": tmp_path / "link.json",
            "another-spelling": tmp_path / "sub" / ".." / "t.jsonl",
        }[how]
        if how == "a-link":
            out.symlink_to(trace)
        (tmp_path / "sub").mkdir()
        proc = cli(command, str(trace), "-o", str(out))
        assert proc.returncode == 2, proc.stderr
        assert "is the trace being read" in proc.stderr and "Traceback" not in proc.stderr
        assert trace.read_bytes() == before


def test_steps_and_versions_past_a_float_give_every_command_a_result(tmp_path, cli):
    """A step number and weight versions of 10**309 (valid: integers ≥ 0) give every read
    command a result, not a traceback; the report says where a chart cannot draw them."""
    import json

    from otel_rollout.testing import TraceBuilder

    big = 10**309
    b = TraceBuilder(run_id="A")
    b.sealed_group("g1", {big: 10})
    b.event("weights.sync", replaced_version=big, new_version=big + 1)
    b.step(big, big + 1, ["g1"])
    path = tmp_path / "t.jsonl"  # json, not orjson: it writes integers past 64 bits whole
    path.write_text("".join(json.dumps(e) + "\n" for e in b.events))
    page = tmp_path / "r.html"
    for args in (
        ("validate", str(path)),
        ("batch-age", str(path)),
        ("cost", str(path)),
        ("staleness", str(path)),
        ("timeline", str(path), "-o", str(tmp_path / "t.json")),
        ("report", str(path), "-o", str(page)),
        ("watch", "--once", str(path)),
    ):
        out = cli(*args)
        assert out.returncode == 0 and "Traceback" not in out.stderr, (args, out.stderr[-800:])
    assert "1.0000" in cli("batch-age", str(path)).stdout  # one update behind, exactly
    assert "past what a float holds" in page.read_text()
