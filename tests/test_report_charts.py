"""The report's charts: round ticks, legends beside the plot, long runs binned, the staleness
views equal to ``staleness --json``, and the page in headless Chromium on the demo's trace
and on a 1M-line three-run trace (under 5 MB, every chart drawn, no errors)."""

from __future__ import annotations

import math
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_ledger import traces
from test_report import CHARTS, load_in_chromium

from otel_rollout.render import svg
from otel_rollout.render.fields import iso_utc
from otel_rollout.report import collect, collect_file
from otel_rollout.staleness import deciles, staleness, staleness_file
from otel_rollout.testing import TraceBuilder, synthetic_trace

MB = 1024 * 1024


def report(trace: Path, page: Path) -> tuple[float, int | None]:
    """Run ``otel-rollout report`` as its own process: seconds taken, and its peak RSS in KB
    when ``/usr/bin/time`` is there to measure it."""
    command = [sys.executable, "-m", "otel_rollout", "report", str(trace), "-o", str(page)]
    timer = shutil.which("time") or ("/usr/bin/time" if Path("/usr/bin/time").exists() else None)
    if timer:
        command = [timer, "-f", "peak %M", *command]
    start = time.monotonic()
    proc = subprocess.run(command, capture_output=True, text=True, timeout=600)
    seconds = time.monotonic() - start
    assert proc.returncode == 0, proc.stderr[-2000:]
    peak = re.search(r"^peak (\d+)$", proc.stderr, re.M)
    return seconds, int(peak.group(1)) if peak else None


@pytest.fixture(scope="session")
def demo(demo_trace, tmp_path_factory):
    """The demo's trace (24 steps, two kills and restores) and its page."""
    page = tmp_path_factory.mktemp("demo-page") / "report.html"
    report(demo_trace, page)
    return demo_trace, page


@pytest.fixture(scope="session")
def big(tmp_path_factory):
    """A 1M-line trace of three runs (made once a session), its page, and the report's time
    and peak memory."""
    tmp = tmp_path_factory.mktemp("big")
    trace = synthetic_trace(tmp / "big.jsonl", 1_000_000, runs=3)
    page = tmp / "report.html"
    seconds, peak_kb = report(trace, page)
    return trace, page, seconds, peak_kb


def charts_of(html: str) -> dict[str, str]:
    """Each chart's SVG in the page, by id."""
    found = re.findall(r'<svg class="chart" id="([\w-]+)".*?</svg>', html, re.S)
    return {name: re.search(rf'<svg class="chart" id="{name}".*?</svg>', html, re.S).group(0)
            for name in found}  # fmt: skip


class TestTicks:
    @pytest.mark.parametrize(
        ("lo", "hi"),
        [(0, 12_819), (0, 1), (0, 2.2), (0, 0.003), (3, 3), (0, 1_281_000), (-7, 45),
         (1_700_000_000, 1_700_000_100), (0, 22_000_000), (0.5, 0.55), (0, 533.2)],
    )  # fmt: skip
    def test_tick_labels_are_round_numbers_without_exponents(self, lo, hi):
        """Every tick is a whole multiple of a 1, 2, 2.5 or 5 × 10^k step, covers the range in
        3 to 12 ticks, and is written in plain digits (thousands separated, no 'e')."""
        ticks, step = svg.nice_ticks(lo, hi)
        mantissa = step / 10 ** math.floor(math.log10(step))
        assert any(math.isclose(mantissa, m) for m in (1, 2, 2.5, 5))
        assert ticks[0] <= lo and ticks[-1] >= hi and 3 <= len(ticks) <= 12
        for value in ticks:
            text = svg.tick_label(value, step)
            assert re.fullmatch(r"-?\d{1,3}(,\d{3})*(\.\d+)?", text), text
            assert math.isclose(float(text.replace(",", "")), value, abs_tol=step * 1e-6)
            assert math.isclose(value / step, round(value / step), abs_tol=1e-6)

    def test_no_tick_of_the_big_page_has_an_exponent(self, big):
        """No tick label of the 1M-line page is in exponent notation (one read 1.281e+)."""
        html = big[1].read_text()
        ticks = re.findall(r'class="tick">([^<]*)<', html)
        assert ticks and not [t for t in ticks if re.search(r"\de[+-]?\d|e\+", t)]

    def test_time_axes_are_in_words(self, big):
        """Time axes say their unit since the first event in ISO-8601 UTC; hovers give times."""
        trace, page, _, _ = big
        t0 = collect_file(trace).t0
        drawn = charts_of(page.read_text())
        assert f"minutes since {iso_utc(t0)}" in drawn["batch-age"]
        assert f"minutes since {iso_utc(t0)}" in drawn["timeline"]
        assert re.search(
            r"<title>[^<]* from 2023-11-14T\d\d:\d\d:\d\d\.\d{3}Z to ", drawn["batch-age"]
        )


class TestLongRuns:
    def test_a_12k_step_series_is_binned_to_a_few_hundred_marks(self):
        """12,000 steps of batch age become at most 200 bins: a few hundred marks, each bin's
        hover naming its step range and its mean and p10-p90."""
        points = [(k * 0.04, (k * 7919 % 13) / 6, k) for k in range(12_000)]
        drawn = svg.band_chart(
            "c", "t", [("run", points)], x_label="x", y_label="y", x_text=str,
            point_text=lambda _, p: f"step {p[2]}",
            bin_text=lambda _, b: f"steps {b.k_first}–{b.k_last}: mean {b.mean:.2f}, "
            f"p10 {b.low:.2f}, p90 {b.high:.2f}",
        )  # fmt: skip
        assert drawn.count('class="mark') <= 300
        hovers = re.findall(r'class="mark hover"[^>]*><title>steps (\d+)–(\d+)', drawn)
        assert 50 <= len(hovers) <= svg.MAX_BINS
        assert hovers[0][0] == "0" and hovers[-1][1] == "11999"

    def test_12k_steps_of_token_age_are_binned_by_step_range(self):
        """12,000 steps of token-age shares become at most 200 bars of a round step range."""
        rows = [(k, [k % 5, 3, 2, 1]) for k in range(12_000)]
        drawn = svg.stacked_bars("c", "t", rows, ["a", "b", "c", "d"], x_label="x", y_label="y")
        bars = re.findall(r"<title>steps ([\d,]+)–([\d,]+): ", drawn)
        assert 0 < len(set(bars)) <= svg.MAX_BINS and "(bars of 100 steps)" in drawn

    def test_attempts_in_flight_keep_every_peak(self):
        """12,000 attempts run one at a time with one burst of five: the in-flight series is
        bounded (4,000 buckets), counts every change, and its band still reaches five."""
        b = TraceBuilder(run_id="A", dt=0.001)
        ids = {"group_id": "g", "prompt_id": 0, "weight_version": 0, "epoch": 0}
        b.event("group.reserve", group_id="g", prompt_id=0, size=1, weight_version=0, epoch=0)
        for n in range(12_000):
            burst = range(5) if n == 7_777 else range(1)
            for k in burst:
                b.event("attempt.dispatch", attempt_id=f"a{n}.{k}", generation_index=k, **ids)
            for k in burst:
                b.event("attempt.abandon", attempt_id=f"a{n}.{k}", group_id="g", prompt_id=0,
                        generation_index=k, reason="error", tokens=1)  # fmt: skip
        buckets = collect(b.events).in_flight
        assert len(buckets) < 4_000 and sum(x[5] for x in buckets) == 2 * 12_000 + 8
        assert max(x[3] for x in buckets) == 5 and min(x[2] for x in buckets) == 0

    def test_every_chart_of_the_big_page_stays_small(self, big):
        """On 12,800 steps no chart of the 1M-line page has more than 600 marks."""
        drawn = charts_of(big[1].read_text())
        assert set(drawn) == set(CHARTS)
        for name, chart in drawn.items():
            assert 0 < chart.count('class="mark') <= 600, name

    def test_the_raw_steps_stay_reachable(self, big, demo):
        """The demo draws a dot per step with its values; the big page keeps every step in
        the table at its end."""
        trace, page, _, _ = big
        steps = len(collect_file(trace).step_ages)
        html = page.read_text()
        table = html.split("<details>", 1)[1]
        assert table.count("<tr>") == steps + 1 and steps > 12_000
        dots = re.findall(r'class="mark pt"[^>]*><title>[^<]*step (\d+) at ', demo[1].read_text())
        assert len(dots) >= 24


class TestLegends:
    def test_legends_sit_outside_the_plot_area(self, demo, big):
        """Every legend swatch and label lies right of the plot's frame, on both pages."""
        for page in (demo[1], big[1]):
            for name, chart in charts_of(page.read_text()).items():
                plot = re.search(
                    r'<rect class="plot" x="([\d.]+)" y="[\d.]+" width="([\d.]+)"', chart
                )
                right = float(plot.group(1)) + float(plot.group(2))
                legend = chart.split('<g class="legend">', 1)[1].split("</g>", 1)[0]
                xs = [float(x) for x in re.findall(r'\bx1?="([\d.]+)"', legend)]
                assert xs and min(xs) > right, name
                assert re.search(r'class="swatch"', legend), name

    def test_many_runs_keep_the_legend_in_its_column(self):
        """Sixteen binned runs and their stop markers: the legend is cut to the rows its
        column holds (the rest counted), each row inside the picture."""
        series = [(f"run {r + 1} ({r:08x})", [(r * 1000 + k, k % 7, k) for k in range(900)])
                  for r in range(16)]  # fmt: skip
        markers = [(r * 1000.0, f"stop {r}", "#d62728") for r in range(1, 16)]
        drawn = svg.band_chart(
            "c", "t", series, x_label="x", y_label="y", x_text=str, markers=markers,
            point_text=lambda *_: "", bin_text=lambda *_: "",
            marker_legend=[svg.LegendItem("stop", "#d62728", "dash")],
        )  # fmt: skip
        legend = drawn.split('<g class="legend">', 1)[1].split("</g>", 1)[0]
        ys = [
            float(y)
            for y in re.findall(r'<text class="legend[^"]*" x="[\d.]+" y="([\d.]+)"', legend)
        ]
        assert len(ys) == svg.LEGEND_ROWS and max(ys) < svg.H
        assert re.search(r">… and \d+ more<", legend)


class TestStalenessViews:
    def test_equal_to_staleness_on_the_demo(self, demo):
        """The page's length-bias deciles, starvation ratio and per-step age histograms are
        those of otel-rollout staleness, on the demo (kills, stale discards, retrained steps)."""
        trace, _ = demo
        data = collect_file(trace)
        record = staleness_file(trace).record()
        assert data.deciles == record["length_bias"]["deciles"] and len(data.deciles) == 10
        assert data.starvation == record["length_bias"]["long_rollout_starvation"]
        assert any(d["stale_rate"] for d in data.deciles)
        ages = [{str(a): n for a, n in sorted(h.items())} for _, h in data.age_tokens]
        assert ages == [s["age_tokens"] for s in record["steps"]]

    @settings(max_examples=150, deadline=None)
    @given(traces())
    def test_equal_to_staleness_on_any_trace(self, events):
        """On generated traces (stops, discards, refusals, retrained steps) the page's deciles
        and starvation ratio equal those of the staleness analysis."""
        data = collect(events)
        bias = staleness(events).record()["length_bias"]
        assert data.deciles == bias["deciles"]
        assert data.starvation == bias["long_rollout_starvation"]

    @settings(max_examples=200, deadline=None)
    @given(
        st.lists(
            st.tuples(
                st.integers(0, 40),
                st.sampled_from(["trained", "discarded: stale", "discarded: filter",
                                 "abandoned: stale", "abandoned: error", "lost at a stop"]),
            ),
            max_size=80,
        )
    )  # fmt: skip
    def test_deciles_from_a_histogram_equal_the_ranked_list(self, attempts):
        """Cutting the (tokens, outcome) histogram into tenths gives the rows and ratio of
        ranking every attempt and slicing the list (a naive model)."""
        counts: dict[tuple[int, str], int] = {}
        for key in attempts:
            counts[key] = counts.get(key, 0) + 1
        ranked, rows = sorted(attempts), []
        for d in range(10 if len(ranked) >= 10 else 0):
            part = ranked[d * len(ranked) // 10 : (d + 1) * len(ranked) // 10]
            bad = [o for _, o in part if o.startswith(("discarded", "abandoned"))]
            stale = sum(o.endswith(": stale") for o in bad)
            rows.append({"decile": d + 1, "min_tokens": part[0][0], "max_tokens": part[-1][0],
                         "attempts": len(part), "discard_rate": len(bad) / len(part),
                         "stale_rate": stale / len(part)})  # fmt: skip
        got, ratio = deciles(counts)
        assert got == rows
        if rows and rows[0]["stale_rate"]:
            assert ratio == rows[-1]["stale_rate"] / rows[0]["stale_rate"]
        elif rows and rows[-1]["stale_rate"]:
            assert ratio == math.inf
        else:
            assert ratio is None

    def test_the_starvation_ratio_is_in_the_title(self, demo):
        """The length-bias chart's title and caption give the long-rollout starvation ratio."""
        trace, page = demo
        ratio = collect_file(trace).starvation
        html = page.read_text()
        assert ratio is not None
        assert f"long-rollout starvation ratio {ratio:.2f}×" in charts_of(html)["length-bias"]
        assert f"(1 means no length bias): {ratio:.2f}." in html


class TestInChromium:
    def test_the_demo_page(self, demo, tmp_path):
        """The demo's page loads in headless Chromium: every chart drawn, no page or console
        errors."""
        attrs, console = load_in_chromium(demo[1], tmp_path)
        assert attrs["charts"] == attrs["drawn"] == str(len(CHARTS))
        assert attrs["errors"] == "0" and console == []

    def test_the_1m_line_page(self, big, tmp_path):
        """The 1M-line three-run page is under 5 MB and loads in headless Chromium: every
        chart drawn, no page or console errors."""
        _, page, _, _ = big
        assert page.stat().st_size < 5 * MB
        attrs, console = load_in_chromium(page, tmp_path)
        assert attrs["charts"] == attrs["drawn"] == str(len(CHARTS))
        assert attrs["errors"] == "0" and console == []

    def test_the_report_stays_under_100_mb(self, big):
        """otel-rollout report on 1M lines peaks under 100 MB (the page is written part by
        part)."""
        _, _, _, peak_kb = big
        if peak_kb is None:
            pytest.skip("/usr/bin/time is not installed (Debian: apt-get install time)")
        assert peak_kb < 100 * 1024, f"{peak_kb / 1024:.0f} MB"
