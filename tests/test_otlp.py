"""Spans and metrics over real OTLP (gRPC and HTTP/protobuf) to a receiver speaking the wire
protocol; the structure that arrives is checked against the trace file."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from test_spans import ns

from otel_rollout.reader import read_events
from otel_rollout.testing import OtlpReceiver

PROTOCOLS = ["grpc", "http/protobuf"]


def run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    return subprocess.run(
        [sys.executable, "-m", "otel_rollout", *args],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def check_structure(spans, events) -> None:
    """What arrived mirrors the file: one resource per run, parents, links, refits, times."""
    run_ids = {e["run_id"] for e in events}
    assert {attrs["service.instance.id"] for attrs, _ in spans} == run_ids
    assert {attrs["service.name"] for attrs, _ in spans} == {"otel-rollout"}
    by_name: dict[str, list] = {}
    for _, span in spans:
        by_name.setdefault(span.name, []).append(span)
    groups = {OtlpReceiver.attributes(s)["rollout.group_id"]: s for s in by_name["rollout.group"]}
    reserved = {e["group_id"]: e for e in events if e["event"] == "group.reserve"}
    assert groups.keys() == reserved.keys()
    for gid, span in groups.items():
        assert span.start_time_unix_nano == ns(reserved[gid]["t"]) and not span.parent_span_id
    for attempt in by_name["rollout.attempt"]:
        group = groups[OtlpReceiver.attributes(attempt)["rollout.group_id"]]
        assert attempt.parent_span_id == group.span_id and attempt.trace_id == group.trace_id
    steps = by_name["rollout.train.step"]
    assert len(steps) == sum(e["event"] == "train.step" for e in events)
    for step in steps:
        linked = {link.span_id for link in step.links}
        wanted = {groups[g].span_id for g in OtlpReceiver.attributes(step)["rollout.group_ids"]}
        assert linked == wanted
    refits = [ev for s in by_name["rollout.attempt"] for ev in s.events if ev.name == "refit"]
    assert refits
    times = {ns(e["t"]) for e in events} | {
        ns(e["t"] - e["duration_s"]) for e in events if "duration_s" in e
    }
    assert all(s.start_time_unix_nano in times and s.end_time_unix_nano in times for _, s in spans)


@pytest.mark.parametrize("protocol", PROTOCOLS)
class TestLiveExport:
    def test_simulated_run_sends_spans_and_metrics(self, tmp_path, protocol):
        """OTEL_EXPORTER_OTLP_ENDPOINT alone turns export on; spans and batch age arrive."""
        with OtlpReceiver(protocol) as rx:
            proc = run(
                [
                    "simulate",
                    "--log-dir",
                    str(tmp_path),
                    "--steps",
                    "5",
                    "--speed",
                    "15",
                    "--quiet",
                ],
                {
                    "OTEL_EXPORTER_OTLP_ENDPOINT": rx.endpoint,
                    "OTEL_EXPORTER_OTLP_PROTOCOL": protocol,
                    "OTEL_METRIC_EXPORT_INTERVAL": "200",
                },
            )
            assert proc.returncode == 0, proc.stderr
            events = list(read_events(tmp_path / "rollout_trace.jsonl"))
            check_structure(rx.spans(), events)
            last = max((e for e in events if e["event"] == "train.step"), key=lambda e: e["t"])
            points = rx.metric_points("rollout.batch_age")
            assert points and points[-1][1].as_double == last["batch_age"]


@pytest.mark.parametrize("protocol", PROTOCOLS)
class TestReplay:
    def test_export_replays_a_multi_run_file(self, tmp_path, protocol):
        """A file written with no collector (two runs) replays as the same spans, per run."""
        path = tmp_path / "rollout_trace.jsonl"
        for seed in (1, 2):  # two processes, one after the other, as after a restart
            log_dir = tmp_path / f"run{seed}"
            proc = run(
                [
                    "simulate",
                    "--log-dir",
                    str(log_dir),
                    "--steps",
                    "3",
                    "--speed",
                    "15",
                    "--quiet",
                    "--seed",
                    str(seed),
                ],
                {},
            )
            assert proc.returncode == 0, proc.stderr
            with open(path, "ab") as f:
                f.write((log_dir / "rollout_trace.jsonl").read_bytes())
        with OtlpReceiver(protocol) as rx:
            proc = run(["export", str(path), "--endpoint", rx.endpoint, "--protocol", protocol], {})
            assert proc.returncode == 0, proc.stderr
            events = list(read_events(path))
            assert len({e["run_id"] for e in events}) == 2
            check_structure(rx.spans(), events)

    def test_unreachable_endpoint_is_exit_1_with_a_count(self, tmp_path, protocol):
        """Spans that cannot be sent are counted and reported; no traceback."""
        path = tmp_path / "t.jsonl"
        path.write_text(
            '{"t":1.0,"run_id":"r","event":"checkpoint.publish","step":0,"weight_version":1}\n'
        )
        with OtlpReceiver(protocol) as rx:
            endpoint = rx.endpoint
        proc = run(
            ["export", str(path), "--endpoint", endpoint, "--protocol", protocol],
            {"OTEL_EXPORTER_OTLP_TIMEOUT": "2"},
        )
        assert proc.returncode == 1 and "1 spans could not be sent" in proc.stderr
        assert "Traceback" not in proc.stderr

    def test_the_sdks_off_switches_hold_for_a_replay(self, tmp_path, protocol):
        """OTEL_SDK_DISABLED=true, or OTEL_TRACES_EXPORTER=none without --endpoint, is one
        line and exit 2 at once, with no span sent to a receiver that is listening;
        --endpoint given on the command line outranks OTEL_TRACES_EXPORTER=none."""
        path = tmp_path / "t.jsonl"
        path.write_text(
            '{"t":1.0,"run_id":"r","event":"checkpoint.publish","step":0,"weight_version":1}\n'
        )
        with OtlpReceiver(protocol) as rx:
            base = ["export", str(path), "--protocol", protocol]
            off = run([*base, "--endpoint", rx.endpoint], {"OTEL_SDK_DISABLED": "true"})
            assert off.returncode == 2 and "OTEL_SDK_DISABLED=true" in off.stderr
            none = run(base, {"OTEL_TRACES_EXPORTER": "none",
                              "OTEL_EXPORTER_OTLP_ENDPOINT": rx.endpoint})  # fmt: skip
            assert none.returncode == 2 and "OTEL_TRACES_EXPORTER=none" in none.stderr
            assert rx.spans() == []
            flag = run([*base, "--endpoint", rx.endpoint], {"OTEL_TRACES_EXPORTER": "none"})
            assert flag.returncode == 0, flag.stderr
            assert len(rx.spans()) == 1
            # A name this version does not know, or otlp among others, still replays over OTLP.
            for named in ("zipkin", "otlp,console"):
                sent = run(base, {"OTEL_TRACES_EXPORTER": named,
                                  "OTEL_EXPORTER_OTLP_ENDPOINT": rx.endpoint})  # fmt: skip
                assert sent.returncode == 0 and "1 sent to" in sent.stderr, sent.stderr
            assert len(rx.spans()) == 3

    @pytest.mark.parametrize("endpoint", ["not a url", "http://x:abc", "localhost", "ftp://h:1"])
    def test_an_endpoint_that_is_no_url_is_a_usage_error_at_once(
        self, tmp_path, protocol, endpoint
    ):
        """--endpoint that is no http(s) URL is one line, exit 2, before any span is sent
        (the SDK retried one for half a minute)."""
        path = tmp_path / "t.jsonl"
        path.write_text('{"t":1.0,"run_id":"r","event":"run.start","schema":1}\n')
        proc = run(["export", str(path), "--endpoint", endpoint, "--protocol", protocol], {})
        assert proc.returncode == 2 and "must be a URL like http://" in proc.stderr
        assert "Traceback" not in proc.stderr


class TestNoNetworkByDefault:
    def test_plain_trace_exports_nothing(self, tmp_path):
        """Without OTEL_* settings, a trace builds no span or metric exporter at all."""
        proc = run(
            ["simulate", "--log-dir", str(tmp_path), "--steps", "2", "--speed", "15", "--quiet"], {}
        )
        assert proc.returncode == 0
        code = (
            "from otel_rollout.trace import RolloutTrace; import sys; "
            "t = RolloutTrace(sys.argv[1]); print(t.otel.active, len(t.exporters))"
        )
        out = subprocess.run(
            [sys.executable, "-c", code, str(tmp_path / "x.jsonl")],
            env={k: v for k, v in os.environ.items() if not k.startswith("OTEL_")},
            capture_output=True,
            text=True,
            check=True,
        )
        assert out.stdout.split() == ["False", "0"]


class TestReplayAtScale:
    def test_a_large_replay_loses_no_span(self, tmp_path):
        """Replay waits for the exporter instead of overrunning the SDK's span queue."""
        from otel_rollout.testing import synthetic_trace

        path = synthetic_trace(tmp_path / "big.jsonl", 30_000, runs=2)
        with OtlpReceiver("grpc", keep=False) as rx:
            proc = run(["export", str(path), "--endpoint", rx.endpoint], {})
            assert proc.returncode == 0, proc.stderr
            made = int(proc.stderr.split(" spans;")[0].rsplit("→ ", 1)[1].replace(",", ""))
            assert made > 10_000 and rx.span_count == made
