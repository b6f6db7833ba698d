"""Integers of any size (valid in the file) reach metrics and trackers without a traceback:
as floats past 64 bits, and a step past int64 (which no tracker's step holds) left out."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from _tracker_readers import tensorboard_runs
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from otel_rollout.batch_age import batch_age_by_step
from otel_rollout.metric_values import metric_value
from otel_rollout.metrics import MetricsExporter
from otel_rollout.reader import read_events
from otel_rollout.testing import TraceBuilder

HUGE_VERSION = 10**400  # past what a float holds
HUGE_STEP = 10**30  # past int64, within a float


def huge_trace(path: Path) -> Path:
    """Six steps; step 2 trains version 10**400, and step 4 is numbered 10**30."""
    b = TraceBuilder(run_id="r2r2r2r2")
    for s in range(6):
        b.event("group.seal", group_id=f"g{s}", prompt_id=s, tokens=10,
                tokens_by_version={str(s): 10})  # fmt: skip
        b.event("train.step", step=HUGE_STEP if s == 4 else s,
                trained_version=HUGE_VERSION if s == 2 else s + 1, group_ids=[f"g{s}"])  # fmt: skip
    path.write_text("".join(json.dumps(e) + "\n" for e in b.events))  # orjson stops at 64 bits
    return path


@pytest.mark.parametrize(
    ("n", "expected"),
    [
        (5, 5),
        (2**63 - 1, 2**63 - 1),
        (2**63, 2.0**63),
        (-(2**63) - 1, -(2.0**63)),
        (10**400, math.inf),
        (-(10**400), -math.inf),
        (1.5, 1.5),
    ],
)
def test_metric_value_keeps_64_bits_and_turns_wider_into_floats(n, expected):
    """Within int64 an integer is kept as it is; past it, a float (±inf past a float)."""
    got = metric_value(n)
    assert got == expected and type(got) is type(expected)


def test_metrics_take_huge_steps_and_versions(tmp_path):
    """The metrics exporter (the sidecar's and export's) updates its gauges from such a file,
    through the real SDK, with no error; the step gauge ends at the last step."""
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    exporter = MetricsExporter(provider.get_meter("test"))
    events = list(read_events(huge_trace(tmp_path / "t.jsonl")))
    assert exporter.export(events) == 0 and exporter.malformed == 0
    points = {
        m.name: [p.value for p in m.data.data_points]
        for rm in reader.get_metrics_data().resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
    }
    assert points["rollout.step"] == [5]
    assert points["rollout.trained_version"] == [6]
    provider.shutdown()


def test_log_to_logs_every_step_a_tracker_can_take(tmp_path, cli):
    """log-to writes every step but the one past int64, read back with TensorBoard's own
    reader, each at the file's batch age (inf at 10**400); the one left out is named."""
    trace = huge_trace(tmp_path / "t.jsonl")
    proc = cli("log-to", f"tensorboard:{tmp_path / 'tb'}", str(trace))
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    assert f"otel-rollout: WARNING: trackers: step {HUGE_STEP} is past" in proc.stderr
    [series] = tensorboard_runs(tmp_path / "tb").values()
    expected = {s: a for s, a in batch_age_by_step(read_events(trace)).items() if s < 2**63}
    logged = series["rollout/batch_age"]
    assert sorted(logged) == sorted(expected) == [0, 1, 2, 3, 5]
    for step, age in expected.items():
        assert logged[step] == pytest.approx(age, rel=1e-6) or logged[step] == age == math.inf
    assert series["rollout/trained_version"][2] == math.inf


def test_metrics_leave_out_values_past_a_float_without_a_warning_each(caplog):
    """A refit to version 10**400, a drop count and a seal of 10**400 tokens update what
    they can; the SDK is handed no value past a float (it warns at each one)."""
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    exporter = MetricsExporter(provider.get_meter("test"))
    huge = 10**400
    events = [
        {"t": 1.0, "run_id": "r", "event": "weights.sync", "replaced_version": 0,
         "new_version": huge},
        {"t": 2.0, "run_id": "r", "event": "trace.dropped", "count": huge},
        {"t": 3.0, "run_id": "r", "event": "group.seal", "group_id": "g", "prompt_id": 0,
         "tokens": huge, "tokens_by_version": {"0": huge}},
        {"t": 4.0, "run_id": "r", "event": "train.step", "step": 0, "trained_version": 1,
         "group_ids": ["g"]},
    ]  # fmt: skip
    with caplog.at_level("WARNING"):
        assert exporter.export(events) == 0
        reader.get_metrics_data()
    assert not [r for r in caplog.records if "not finite" in r.getMessage()]
    points = {
        m.name: [p.value for p in m.data.data_points]
        for rm in reader.get_metrics_data().resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
    }
    assert points["rollout.step"] == [0] and points["rollout.refits"] == [1]
    provider.shutdown()


def test_tokens_past_a_float_are_read_by_every_text_and_json_view(tmp_path, cli):
    """A group of 10**400 tokens (valid) gives batch age, staleness and cost, text and JSON,
    with the exact token count and no traceback."""
    huge = 10**400
    b = TraceBuilder(run_id="r1")
    ids = {"attempt_id": "a1", "group_id": "g1", "prompt_id": 1, "generation_index": 0}
    b.event("attempt.dispatch", weight_version=0, **ids)
    b.event("attempt.seal", tokens=huge, **ids)
    b.event("group.seal", group_id="g1", prompt_id=1, tokens=huge, tokens_by_version={"0": huge})
    b.event("train.step", step=1, trained_version=2, group_ids=["g1"])
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in b.events))
    for command in ("batch-age", "staleness", "cost"):
        for form in ((), ("--json",)):
            proc = cli(command, *form, str(path))
            assert proc.returncode == 0 and "Traceback" not in proc.stderr, (command, proc.stderr)
            assert f"{huge:,}" in proc.stdout or str(huge) in proc.stdout, command
    assert "mean batch age 2.0000" in cli("batch-age", str(path)).stdout
    staleness = json.loads(cli("staleness", "--json", str(path)).stdout)
    assert staleness["file"]["p50"] == 2 and staleness["file"]["tokens"] == huge


def test_times_past_a_float_in_microseconds_are_drawn_at_a_bound(tmp_path, cli):
    """A ``t`` of 1e200 or a ``duration_s`` of 1e303 (valid) puts the timeline's slices at a
    bound instead of raising or writing a 200-digit duration; the file is still a
    trace-event document."""
    b = TraceBuilder(run_id="r1")
    b.event("weights.sync", replaced_version=0, new_version=1, duration_s=1e303)
    ids = {"attempt_id": "a1", "group_id": "g1", "prompt_id": 1, "generation_index": 0}
    b.event("attempt.dispatch", weight_version=0, **ids)
    b.events.append({**b.events[-1], "t": 1e200, "event": "attempt.seal", "tokens": 3})
    del b.events[-1]["weight_version"]
    b.event("train.step", step=1, trained_version=2, group_ids=[], t=1e303)
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in b.events))
    proc = cli("timeline", str(path), "-o", str(tmp_path / "t.json"))
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    doc = json.loads((tmp_path / "t.json").read_text())
    times = [e["ts"] for e in doc["traceEvents"] if e["ph"] != "M"]
    assert times and all(abs(ts) <= 10**18 for ts in times)
    assert all(e.get("dur", 0) <= 2 * 10**18 for e in doc["traceEvents"])  # finite t too
    assert any(e["ph"] == "X" and e["cat"] == "attempt" for e in doc["traceEvents"])


def test_an_age_past_a_float_is_inf_in_text_and_json(tmp_path, cli):
    """A step trained at version 10**400 on tokens of version 0 is one age past any float:
    the table prints ``inf`` and the JSON the string ``"inf"``, not ``null`` (which is a
    step without tokens)."""
    b = TraceBuilder(run_id="A")
    b.sealed_group("g1", {0: 10})
    b.step(0, 10**400, ["g1"])
    b.step(1, 1, [])
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in b.events))
    rows = [json.loads(line) for line in cli("batch-age", "--json", str(path)).stdout.splitlines()]
    assert [r["batch_age"] for r in rows] == ["inf", None]
    assert " inf " in cli("batch-age", str(path)).stdout
    report = cli("report", str(path), "-o", str(tmp_path / "r.html"))
    assert report.returncode == 0, report.stderr
    page = (tmp_path / "r.html").read_text()
    assert '<td class="n">inf</td>' in page and "1 of them past what a float holds" in page
    drawn = "".join(re.findall(r"<svg[ >].*?</svg>", page.split("<body>")[1], flags=re.S))
    assert drawn and "inf" not in drawn  # no point of a chart at infinity


def test_ages_past_a_float_both_ways_have_no_mean(tmp_path, cli):
    """Steps aged +inf and -inf give the table's summary a mean of ``n/a`` (not ``nan``)
    and a max of ``inf``."""
    b = TraceBuilder(run_id="A")
    b.sealed_group("g1", {0: 10})
    b.step(0, 10**400, ["g1"])
    b.sealed_group("g2", {10**400: 10})
    b.step(1, 1, ["g2"])
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in b.events))
    summary = cli("batch-age", str(path)).stdout.splitlines()[-1]
    assert "mean batch age n/a, max inf" in summary and "nan" not in summary


def test_a_report_with_an_infinite_age_draws_its_finite_steps_and_zooms(tmp_path, cli):
    """A page whose steps include an age of inf: no chart draws a point at infinity, and
    every zoom data block is strict JSON (``Infinity`` made the page's ``JSON.parse`` throw,
    leaving every chart without its zoom)."""
    b = TraceBuilder(run_id="A")
    b.sealed_group("g1", {0: 10})
    b.step(0, 10**400, ["g1"])
    b.sealed_group("g2", {0: 10})
    b.step(1, 1, ["g2"])
    b.sealed_group("g3", {5: 10})
    b.step(2, 7, ["g3"])
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in b.events))
    assert cli("report", str(path), "-o", str(tmp_path / "r.html")).returncode == 0
    page = (tmp_path / "r.html").read_text()
    zoom_data = r'<script type="application/json" class="zoom-data"[^>]*>(.*?)</script>'
    blocks = re.findall(zoom_data, page)
    assert blocks and all(json.loads(b, parse_constant=_refuse) for b in blocks)
    drawn = "".join(re.findall(r"<svg[ >].*?</svg>", page.split("<body>")[1], flags=re.S))
    assert "inf" not in drawn and "nan" not in drawn.lower()


def _refuse(name: str) -> None:
    raise ValueError(f"{name} is not JSON a browser parses")


@pytest.mark.parametrize(
    "first, last",
    [(1.7e9, 1.7e18), (-1.7e308, 1.7e308), (1e300, 1.7e308)],
    ids=["seconds-then-nanoseconds", "infinite-span", "far-times"],
)
def test_spans_past_64_bits_of_milliseconds_are_held_at_the_bound(tmp_path, cli, first, last):
    """Valid times whose spans overflow 64-bit milliseconds (or a float: ``-1.7e308`` to
    ``1.7e308``) are held at the bound by every view: an attempt sealed, one abandoned,
    one running at a stop, steps; no traceback, and staleness's longest flight is the
    bound (1e12 s)."""
    b = TraceBuilder(run_id="A")
    ids = {"group_id": "g", "prompt_id": 0}
    b.event("group.reserve", size=3, weight_version=0, t=first, **ids)
    for n, attempt in enumerate(("a", "b", "c")):
        b.event("attempt.dispatch", attempt_id=attempt, generation_index=n, weight_version=0,
                t=first, **ids)  # fmt: skip
    b.event("attempt.seal", attempt_id="a", generation_index=0, tokens=5, t=last, **ids)
    b.event("attempt.abandon", attempt_id="b", generation_index=1, reason="stale", tokens=3,
            t=last, **ids)  # fmt: skip
    b.event("group.seal", tokens=5, tokens_by_version={"0": 5}, t=last, **ids)
    b.event("train.step", step=0, trained_version=1, group_ids=["g"], t=last)
    b.events.append({"t": last, "run_id": "B", "event": "run.start", "schema": 1, "pid": 2})
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in b.events))
    for args in (["staleness"], ["cost"], ["batch-age"], ["watch", "--once"],
                 ["report", "-o", str(tmp_path / "r.html")],
                 ["timeline", "-o", str(tmp_path / "t.json")]):  # fmt: skip
        proc = cli(*args, str(path))
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, (args, proc.stderr)
    report = json.loads(cli("staleness", "--json", str(path)).stdout)
    flights = [o["seconds_in_flight"]["max"] for o in report["length_bias"]["outcomes"].values()]
    assert max(flights) == 1e12


def test_a_sparkline_draws_infinite_ages_at_its_ends():
    """``±inf`` batch ages take the highest and lowest bars; the finite ones keep their
    scale, and a step without an age is a gap."""
    from otel_rollout.render.live import sparkline

    assert sparkline([1.0, math.inf, None, 3.0, -math.inf]) == "▁█ █▁"
    assert sparkline([math.inf]) == "█"


def test_the_writer_writes_no_integer_a_reader_cannot_read(tmp_path):
    """With Python's digit limit lifted (PYTHONINTMAXSTRDIGITS=0) the writer could print a
    5,000-digit step that no reader reads (msgspec stops at 4,300 digits): it writes the
    text "an integer of N bits" instead, and validate names the field."""
    script = (
        "from otel_rollout.trace import RolloutTrace\n"
        f"t = RolloutTrace({str(tmp_path)!r})\n"
        "t.emit('train.step', step=10**5000, trained_version=1, group_ids=[])\n"
        "t.emit('train.step', step=10**4000, trained_version=1, group_ids=[])\n"
        "t.close()\n"
    )
    env = {**os.environ, "PYTHONINTMAXSTRDIGITS": "0"}
    subprocess.run([sys.executable, "-c", script], env=env, check=True, timeout=60)
    steps = [e["step"] for e in read_events(tmp_path) if e["event"] == "train.step"]
    assert steps == ["an integer of 16,610 bits", 10**4000]
