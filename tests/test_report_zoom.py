"""The report's charts zoom to raw steps in headless Chromium: the script's tick, label and
bin rules agree with scale.py's, a real mouse drag, click or typed range redraws a chart
as svg.py draws the same steps, the dots are the file's batch age, and with scripts off
the static charts stay."""

from __future__ import annotations

import json
import math
import random
import re
from html import unescape
from pathlib import Path
from typing import Any

import pytest
from cdp import Page, browser

from otel_rollout.batch_age import batch_age_by_step
from otel_rollout.reader import read_events
from otel_rollout.render import frame, scale, svg, zoom
from otel_rollout.render.fields import AGE_LABELS, Style, iso_utc
from otel_rollout.render.html import write_html
from otel_rollout.report import collect_file
from otel_rollout.testing import TraceBuilder, synthetic_trace

W = frame.W


@pytest.fixture(scope="module")
def multi(tmp_path_factory):
    """A 50k-line trace of three runs (about 640 steps: every zoomable chart binned) and
    its page."""
    tmp = tmp_path_factory.mktemp("multi")
    trace = synthetic_trace(tmp / "multi.jsonl", 50_000, runs=3)
    return trace, page_of(trace, tmp / "report.html")


@pytest.fixture(scope="module")
def demo_page(demo_trace, tmp_path_factory):
    return demo_trace, page_of(demo_trace, tmp_path_factory.mktemp("zoom-demo") / "report.html")


def page_of(trace: Path, page: Path) -> Path:
    with open(page, "w") as out:
        write_html(collect_file(trace), out)
    return page


def columns(html: str, chart: str) -> dict[str, Any]:
    """The per-step columns the page embeds for ``chart``."""
    found = re.search(rf'class="zoom-data" data-for="{chart}">(.*?)</script>', html, re.S)
    assert found, chart
    return json.loads(found.group(1))


def sums(deltas: list[int]) -> list[int]:
    out, acc = [], 0
    for d in deltas:
        acc += d
        out.append(acc)
    return out


def features(drawing: str) -> dict[str, list[Any]]:
    """What a chart shows, from its SVG text as Python writes it or as the browser
    serialises it: tick labels, axis labels, legend labels, and each mark's kind, place
    and hover text."""
    drawing = drawing.replace("/>", ">")
    marks = []
    for kind, cls, attrs, title in re.findall(
        r'<(\w+) class="mark ([\w ]+)"([^>]*)>(?:<title>([^<]*)</title>)?', drawing
    ):
        place = dict(re.findall(r'\b(x|y|width|height|cx|cy|points|d|data-steps)="([^"]*)"', attrs))
        marks.append((kind, cls, place, unescape(title)))
    texts = lambda cls: [unescape(t) for t in re.findall(rf'class="{cls}"[^>]*>([^<]*)<', drawing)]  # noqa: E731
    return {"ticks": texts("tick"), "axes": texts("axis"), "legend": texts("legend"),
            "title": texts("title"), "marks": marks}  # fmt: skip


def zoomed(page: Page, chart: str) -> tuple[int, int]:
    a, b = page.eval(f"document.getElementById('{chart}').getAttribute('data-zoom')").split()
    return int(a), int(b)


def no_errors(page: Page) -> None:
    assert page.errors == [] and page.console == []
    assert page.eval("window.__errors") == []


def age_reference(d: dict[str, Any], a: int, b: int) -> str:
    """svg.band_chart over the embedded points of steps ``a`` … ``b``, as the page zooms."""
    ms, steps = sums(d["ms"]), sums(d["step"])
    series, at = [], 0
    for name, n in zip(d["runs"], d["n"], strict=True):
        pts = [(ms[i] / 1000, d["age"][i], steps[i]) for i in range(at, at + n)]
        series.append((name, [p for p in pts if a <= p[2] <= b]))
        at += n
    secs = [p[0] for _, pts in series for p in pts]
    lo, hi = min(secs), max(secs)
    unit, unit_name = scale.time_unit(hi - lo)

    def when(x: float) -> str:
        return iso_utc(d["t0"] + x * unit)

    markers = [(m[0] / unit, m[1], m[2]) for m in d["markers"] if lo <= m[0] <= hi]
    scaled = [(n, [(p[0] / unit, p[1], p[2]) for p in pts]) for n, pts in series]
    return svg.band_chart(
        "batch-age", d["title"], scaled,
        x_label=f"{unit_name} since {iso_utc(d['t0'])}", y_label=d["y"], x_text=when,
        point_text=zoom.age_point_text(when), bin_text=zoom.age_bin_text(when),
        markers=markers, marker_legend=zoom.MARKER_LEGEND if markers else [],
    )  # fmt: skip


def drag_batch_age(page: Page, html: str, left: float, right: float) -> tuple[int, int]:
    """Drag across the batch-age plot from ``left`` to ``right`` (shares of the plot's
    width); the steps of the points under the drag, by the static chart's axis."""
    r = page.box("batch-age")
    scale_px = r["w"] / W
    x0 = frame.PLOT_X0 + left * (frame.PLOT_X1 - frame.PLOT_X0)
    x1 = frame.PLOT_X0 + right * (frame.PLOT_X1 - frame.PLOT_X0)
    page.drag(r["x"] + x0 * scale_px, r["x"] + x1 * scale_px, r["y"] + 140 * scale_px)
    static = re.search(r'<svg class="chart" id="batch-age".*?</svg>', html, re.S).group(0)
    lo, hi = map(float, re.search(r'class="plot"[^>]*data-x="([^"]+)"', static).group(1).split())
    d = columns(html, "batch-age")

    def value(x: float) -> float:  # pixels back to seconds since the first event
        return (lo + (x - frame.PLOT_X0) * (hi - lo) / (frame.PLOT_X1 - frame.PLOT_X0)) * d["unit"]

    # the mouse lands on whole pixels: allow the steps a pixel either side could add
    slack = d["unit"] * (hi - lo) / (frame.PLOT_X1 - frame.PLOT_X0) / scale_px
    under = [k for t, k in zip(sums(d["ms"]), sums(d["step"]), strict=True)
             if value(x0) - slack <= t / 1000 <= value(x1) + slack]  # fmt: skip
    inner = [k for t, k in zip(sums(d["ms"]), sums(d["step"]), strict=True)
             if value(x0) + slack <= t / 1000 <= value(x1) - slack]  # fmt: skip
    a, b = zoomed(page, "batch-age")
    assert min(under) <= a <= min(inner) and max(inner) <= b <= max(under)
    return a, b


def check_dots(page: Page, trace: Path, a: int, b: int) -> None:
    """The zoomed batch-age chart draws a dot for every step ``a`` … ``b`` as trained, and
    the last run's dot of each step is the file's batch_age_by_step."""
    dots = re.findall(
        r"<title>run (\d+) \([^)]*\), step ([\d,]+) at [^:]+:\d\d:[\d.]+Z: batch age ([-\d.]+) "
        r"updates</title>",
        page.outer("batch-age"),
    )
    latest: dict[int, tuple[int, float]] = {}
    for run, step, age in dots:
        k = int(step.replace(",", ""))
        if k not in latest or int(run) >= latest[k][0]:
            latest[k] = (int(run), float(age))
    expected = {k: v for k, v in batch_age_by_step(read_events(trace)).items() if a <= k <= b}
    assert expected and set(latest) == set(expected)
    for k, age in expected.items():
        assert latest[k][1] == pytest.approx(age, abs=0.005 + 1e-9), k


class TestRules:
    def test_the_script_and_scale_py_agree_on_300_random_ranges(self, demo_page, tmp_path):
        """Ticks, tick labels, tight axes, bin edges, bar widths, time units, heat colours,
        number formatting and times, from the page's script and from scale.py, on 300
        random ranges of every scale (and the rounding ties of formatting)."""
        rng = random.Random(20261201)
        cases = []
        for _ in range(300):
            mag = 10 ** rng.uniform(-4, 9)
            lo = rng.choice([0.0, rng.uniform(-1, 1) * mag, rng.uniform(0, 1) * mag * 100])
            hi = lo + rng.choice([0.0, mag * rng.random(), mag, round(mag)])
            k0 = rng.randrange(0, 10 ** rng.randrange(1, 7))
            k1 = k0 + rng.randrange(0, 10 ** rng.randrange(1, 7))
            count = rng.randrange(1, k1 - k0 + 2)
            cases.append({"lo": lo, "hi": hi, "n": rng.randrange(3, 8), "min": rng.choice([0, 1]),
                          "k0": k0, "k1": k1, "count": count, "limit": rng.choice([100, 200]),
                          "share": rng.choice([rng.random(), 0.125, 0.5, 0.0, 1.0]),
                          "v": rng.choice([rng.uniform(-1e6, 1e6), 0.125, 2.5, 1.25, -0.0]),
                          "d": rng.randrange(0, 4), "t": 1.7e9 + rng.uniform(0, 1e6)})  # fmt: skip
        with browser(tmp_path) as page:
            page.open(demo_page[1].as_uri())
            got = page.eval(
                "(function (cases) { var R = window.otelRollout.rules;"
                " return cases.map(function (c) { var t = R.niceTicks(c.lo, c.hi, c.n, c.min);"
                " var ax = R.axisOf(c.lo, c.hi, 0, 1, c.n, true, 0);"
                " return {ticks: t.ticks, step: t.step, labels: t.ticks.map(function (v) {"
                " return R.tickLabel(v, t.step); }), tight: [ax.ticks, ax.lo, ax.hi],"
                " edges: c.hi > c.lo ? R.binEdges(c.lo, c.hi, 200) : [],"
                " width: R.keyWidth(c.k0, c.k1, c.count, c.limit), unit: R.timeUnit(c.hi - c.lo),"
                " heat: R.heatColor(c.share), fixed: R.fixed(c.v, c.d), iso: R.isoUtc(c.t)};"
                " }); })(" + json.dumps(cases) + ")"
            )
            no_errors(page)
        for c, js in zip(cases, got, strict=True):
            ticks, step = scale.nice_ticks(c["lo"], c["hi"], c["n"], c["min"])
            assert (js["ticks"], js["step"]) == (ticks, step), c
            assert js["labels"] == [scale.tick_label(v, step) for v in ticks], c
            ax = scale.Axis.of(c["lo"], c["hi"], 0, 1, c["n"], tight=True)
            assert js["tight"] == [ax.ticks, ax.lo, ax.hi], c
            if c["hi"] > c["lo"]:
                assert js["edges"] == scale.bin_edges(c["lo"], c["hi"], 200), c
            assert js["width"] == scale.key_width(c["k0"], c["k1"], c["count"], c["limit"]), c
            assert js["unit"] == list(scale.time_unit(c["hi"] - c["lo"])), c
            assert js["heat"] == scale.heat_color(c["share"]), c
            assert js["fixed"] == f"{c['v']:.{c['d']}f}", c
            assert js["iso"] == iso_utc(c["t"]), c


class TestZoom:
    def test_a_mouse_drag_zooms_batch_age_to_raw_steps(self, multi, tmp_path):
        """On three runs of about 640 steps (drawn as bins), a real mouse drag across a
        third of the plot zooms to the steps under it: one dot a step as trained, the file's
        batch_age_by_step, drawn as svg.py draws those points; no console errors."""
        trace, path = multi
        html = path.read_text()
        with browser(tmp_path) as page:
            page.open(path.as_uri())
            assert 'class="mark pt"' not in page.outer("batch-age")  # binned before
            a, b = drag_batch_age(page, html, 0.35, 0.6)
            assert 50 < b - a < svg.RAW_LIMIT
            shown = page.outer("batch-age")
            assert shown.count('class="mark pt"') > 50 and 'class="mark band"' not in shown
            check_dots(page, trace, a, b)
            assert features(shown) == features(age_reference(columns(html, "batch-age"), a, b))
            no_errors(page)

    def test_a_click_on_a_bin_zooms_to_its_steps_and_reset_restores(self, multi, tmp_path):
        """Clicking a bin of the binned batch-age chart zooms to the bin's steps; Reset
        brings back the static chart as written."""
        trace, path = multi
        with browser(tmp_path) as page:
            page.open(path.as_uri())
            static = page.outer("batch-age")
            r = page.box("batch-age")
            hover = page.eval(
                "(function () { var h = document.querySelectorAll('#batch-age .mark.hover')[40];"
                " var b = h.getBoundingClientRect(); return [b.left + b.width / 2, b.top + 20,"
                " h.getAttribute('data-steps')]; })()"
            )
            page.click(hover[0], hover[1])
            a, b = zoomed(page, "batch-age")
            assert [a, b] == [int(s) for s in hover[2].split()]
            check_dots(page, trace, a, b)
            reset = page.eval(
                "(function () { var b = document.querySelector('#batch-age + .zoom .zoom-reset')"
                ".getBoundingClientRect();"
                " return [b.left + b.width / 2, b.top + b.height / 2]; })()"
            )
            page.click(*reset)
            assert page.outer("batch-age") == static and r["w"] > 0
            no_errors(page)

    def test_a_typed_range_zooms_token_age_as_svg_py_draws_it(self, multi, tmp_path):
        """Typing a step range and pressing Zoom redraws the token-age bars one a step,
        equal to svg.stacked_bars of the file's steps in that range; Enter in a box zooms
        too."""
        trace, path = multi
        rows = [(r.step, [r.tokens_by_age.get(a, 0) for a in (0, 1, 2, 3)])
                for r in collect_file(trace).step_ages]  # fmt: skip
        with browser(tmp_path) as page:
            page.open(path.as_uri())
            page.box("token-age")
            for field, value in (("from", 200), ("to", 333)):
                page.eval(
                    f"(function (e) {{ e.focus(); e.select(); }})"
                    f"(document.querySelector('#token-age + .zoom .zoom-{field}'))"
                )
                page.call("Input.insertText", text=str(value))
            go = page.eval(
                "(function () { var b = document.querySelector('#token-age + .zoom .zoom-go')"
                ".getBoundingClientRect();"
                " return [b.left + b.width / 2, b.top + b.height / 2]; })()"
            )
            page.click(*go)
            assert zoomed(page, "token-age") == (200, 333)
            title, x_label, y_label = zoom.ZOOMABLE["token-age"]
            want = svg.stacked_bars("token-age", title, [r for r in rows if 200 <= r[0] <= 333],
                                    AGE_LABELS, x_label=x_label, y_label=y_label)  # fmt: skip
            got = features(page.outer("token-age"))
            assert got == features(want) and len({m[3] for m in got["marks"]}) == 134
            page.eval("(function (e) { e.focus(); e.select(); })"
                      "(document.querySelector('#token-age + .zoom .zoom-from'))")  # fmt: skip
            page.call("Input.insertText", text="250")
            page.enter()
            assert zoomed(page, "token-age") == (250, 333)
            no_errors(page)

    def test_a_drag_and_a_click_zoom_the_heat_map(self, multi, tmp_path):
        """A drag across the heat map zooms to the columns under it, then a click on a
        column to its steps: both equal to svg.heat_map of the file's histograms."""
        trace, path = multi
        html, ages = path.read_text(), collect_file(trace).age_tokens
        title, x_label, y_label = zoom.ZOOMABLE["age-heatmap"]

        def want(a: int, b: int) -> dict[str, list[Any]]:
            cols = [c for c in ages if a <= c[0] <= b]
            return features(
                svg.heat_map("age-heatmap", title, cols, x_label=x_label, y_label=y_label)
            )

        with browser(tmp_path) as page:
            page.open(path.as_uri())
            r = page.box("age-heatmap")
            s = r["w"] / W
            page.drag(r["x"] + 300 * s, r["x"] + 500 * s, r["y"] + 100 * s)
            a, b = zoomed(page, "age-heatmap")
            static = re.search(r'<svg class="chart" id="age-heatmap".*?</svg>', html, re.S)[0]
            lo, hi = map(float, re.search(r'class="plot"[^>]*data-x="([^"]+)"', static)[1].split())
            width = int(re.search(r"columns of ([\d,]+) steps", static)[1].replace(",", ""))
            per_px = (hi - lo) / (frame.PLOT_X1 - frame.PLOT_X0)

            def crossed(x0: float, x1: float) -> list[int]:  # columns under pixels x0 … x1
                v0, v1 = lo + (x0 - frame.PLOT_X0) * per_px, lo + (x1 - frame.PLOT_X0) * per_px
                return [k for k, _ in ages if k - k % width + width > v0 and k - k % width < v1]

            under, inner = crossed(300 - 1 / s, 500 + 1 / s), crossed(300 + 1 / s, 500 - 1 / s)
            assert min(under) <= a <= min(inner) and max(inner) <= b <= max(under)
            assert features(page.outer("age-heatmap")) == want(a, b)
            cell = page.eval(
                "(function () { var c = document.querySelectorAll('#age-heatmap .mark.cell')[10];"
                " var b = c.getBoundingClientRect(); return [b.left + b.width / 2,"
                " b.top + b.height / 2, c.getAttribute('data-steps')]; })()"
            )
            page.click(cell[0], cell[1])
            a, b = zoomed(page, "age-heatmap")
            assert [a, b] == [int(k) for k in cell[2].split()]
            assert features(page.outer("age-heatmap")) == want(a, b)
            no_errors(page)

    def test_the_demo_page_zooms(self, demo_page, tmp_path):
        """On the demo's page (24 steps, two kills and restores, retrained steps) a drag
        across the batch-age plot zooms to the dots of the file's batch age."""
        trace, path = demo_page
        html = path.read_text()
        with browser(tmp_path) as page:
            page.open(path.as_uri())
            a, b = drag_batch_age(page, html, 0.2, 0.7)
            check_dots(page, trace, a, b)
            assert features(page.outer("batch-age")) == features(
                age_reference(columns(html, "batch-age"), a, b)
            )
            no_errors(page)


class TestPage:
    def test_the_embedded_columns_are_the_files_steps(self, multi):
        """Each zoomable chart's columns hold every step of the file once: batch age and
        time of every step as trained, tokens by age of every surviving step."""
        trace, path = multi
        html, data = path.read_text(), collect_file(trace)
        d = columns(html, "batch-age")
        order = {r: n for n, r in enumerate(data.runs)}
        rows = sorted(data.steps, key=lambda s: order[s[1]])  # stable: file order in a run
        assert sums(d["step"]) == [s[2] for s in rows] and d["n"] == [
            sum(s[1] == r for s in rows) for r in data.runs
        ]
        assert all(math.isclose(a, s[3], abs_tol=1e-6) for a, s in zip(d["age"], rows, strict=True))
        assert all(abs(t / 1000 + d["t0"] - s[0]) <= 0.0005 + 1e-6
                   for t, s in zip(sums(d["ms"]), rows, strict=True))  # fmt: skip
        tok = columns(html, "token-age")
        assert sums(tok["step"]) == [r.step for r in data.step_ages]
        assert tok["tokens"] == [
            r.tokens_by_age.get(a, 0) for r in data.step_ages for a in range(4)
        ]
        heat = columns(html, "age-heatmap")
        assert sums(heat["step"]) == [k for k, _ in data.age_tokens]
        assert sum(heat["tokens"]) == sum(sum(c.values()) for _, c in data.age_tokens)

    def test_one_script_nothing_fetched_and_static_charts_without_scripts(self, multi, tmp_path):
        """The page has one script (plus inert JSON), loads nothing, and with scripts off
        shows every static chart and no zoom controls."""
        _, path = multi
        html = path.read_text()
        assert len(re.findall(r"<script>", html)) == 1
        assert len(re.findall(r"<script\b", html)) == 1 + 1 + len(zoom.ZOOMABLE)
        assert not re.search(r"\b(src|href)\s*=", html) and "url(" not in html
        with browser(tmp_path) as page:
            page.call("Emulation.setScriptExecutionDisabled", value=True)
            page.open(path.as_uri())
            page.call("Emulation.setScriptExecutionDisabled", value=False)  # to read the page
            drawn = page.eval(
                "Array.prototype.map.call(document.querySelectorAll('svg.chart'),"
                " function (s) { return s.querySelectorAll('.mark').length; })"
            )
            assert len(drawn) == 6 and all(drawn)
            assert page.eval("document.querySelectorAll('.zoom').length") == 0
            assert page.eval("typeof window.otelRollout") == "undefined"

    def test_a_run_id_that_closes_the_script_does_not_break_the_page(self, tmp_path):
        """Run IDs with ``</script>`` and ``<!--`` in them (shown whole: --full-ids) stay
        inside the embedded data: the page loads, every chart zooms, and the zoomed legend
        names the runs as written."""
        b = TraceBuilder(run_id="</script><!--a")
        for n in range(3):
            b.sealed_group(f"g{n}", {n: 10})
            b.step(n, n + 1, [f"g{n}"])
        b.new_run("</SCRIPT>b", gap=2.0)
        b.sealed_group("h", {3: 10})
        b.step(3, 4, ["h"])
        path = tmp_path / "report.html"
        with open(path, "w") as out:
            write_html(collect_file(b.write(tmp_path / "t.jsonl")), out, Style(full_ids=True))
        with browser(tmp_path) as page:
            page.open(path.as_uri())
            assert sorted(page.eval("Object.keys(window.otelRollout.zoom)")) == sorted(
                zoom.ZOOMABLE
            )
            page.eval("window.otelRollout.zoom['batch-age'].zoomTo(1, 3)")
            legend = [t for t in features(page.outer("batch-age"))["legend"] if t]
            assert legend[:2] == ["run 1 (</script><!--a)", "run 2 (</SCRIPT>b)"]
            no_errors(page)
