"""``otel-rollout timeline``: the Chrome Trace Event file, its known answers, its cuts, and
the file loaded in a real viewer (speedscope in headless Chromium)."""

from __future__ import annotations

import functools
import gzip
import http.server
import io
import itertools
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
import urllib.request
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from otel_rollout.analysis import StepAges, run_events, run_file
from otel_rollout.render.html import CHROMIUM_FLAGS, chromium
from otel_rollout.testing import TraceBuilder, synthetic_trace
from otel_rollout.timeline import PALETTE, Timeline, TraceEventWriter

SPEEDSCOPE_VERSION = "1.25.0"
SPEEDSCOPE_CACHE = Path.home() / ".cache" / "otel-rollout-test" / "speedscope"
INSTALL_CHROMIUM = "apt-get install -y --no-install-recommends chromium"


def attempt(b: TraceBuilder, kind: str, aid: str, group: str, **fields: Any) -> None:
    ids = {"attempt_id": aid, "group_id": group, "prompt_id": 0, "generation_index": 0}
    b.event(kind, **ids, **fields)


def known_trace() -> TraceBuilder:
    """Two runs: a refit that cuts one attempt's call, one it does not touch, one abandoned
    across it, a refusal, a step with a known batch age, and work in flight at the stop and
    at the end of the file."""
    b = TraceBuilder(run_id="run-A")
    b.event("group.reserve", group_id="g1", prompt_id=0, size=3, weight_version=0, epoch=0)
    attempt(b, "attempt.dispatch", "a1", "g1", weight_version=0, epoch=0)
    attempt(b, "attempt.dispatch", "a2", "g1", weight_version=0, epoch=0)
    attempt(b, "attempt.dispatch", "a3", "g1", weight_version=0, epoch=0)
    attempt(b, "attempt.refuse", "a4", "g1", reason="capacity")
    b.event("weights.sync", replaced_version=0, new_version=1, cuts=[["c1", 40]], duration_s=0.005)
    attempt(b, "attempt.seal", "a1", "g1", tokens=100, calls=[["c1", 0, 100]])
    attempt(b, "attempt.seal", "a2", "g1", tokens=50, calls=[["c2", 0, 50]])
    attempt(b, "attempt.abandon", "a3", "g1", reason="stale", tokens=30)
    b.event("group.seal", group_id="g1", prompt_id=0, tokens=150,
            tokens_by_version={"0": 90, "1": 60})  # fmt: skip
    b.step(0, trained_version=1, group_ids=["g1"], duration_s=0.015)
    b.event("checkpoint.publish", step=0, weight_version=1)
    b.event("group.reserve", group_id="g2", prompt_id=1, size=1, weight_version=1, epoch=0)
    attempt(b, "attempt.dispatch", "a5", "g2", weight_version=1, epoch=0)
    b.new_run("run-B", gap=2.0)
    b.event("checkpoint.restore", step=0, weight_version=1, from_run_id="run-A")
    b.event("group.reserve", group_id="g3", prompt_id=2, size=1, weight_version=1, epoch=0)
    attempt(b, "attempt.dispatch", "b1", "g3", weight_version=1, epoch=0)
    return b


def timeline_of(events: list[dict[str, Any]], **options: Any) -> dict[str, Any]:
    out = io.BytesIO()
    run_events(events, [Timeline(TraceEventWriter(out), **options)])
    return json.loads(out.getvalue())


def slices(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in doc["traceEvents"] if e["ph"] == "X"]


def of_attempt(doc: dict[str, Any], aid: str) -> list[dict[str, Any]]:
    found = [e for e in doc["traceEvents"] if e.get("args", {}).get("attempt_id") == aid]
    return sorted(found, key=lambda e: e["ts"])


def counter(doc: dict[str, Any], name: str, pid: int, series: str) -> list[Any]:
    return [
        e["args"][series]
        for e in sorted(doc["traceEvents"], key=lambda e: e["ts"])
        if e["ph"] == "C" and e["name"] == name and e["pid"] == pid
    ]


def assert_valid(doc: dict[str, Any]) -> None:
    """The format's fields on every event, and no overlap on any thread."""
    assert isinstance(doc["traceEvents"], list) and doc["displayTimeUnit"] == "ms"
    for e in doc["traceEvents"]:
        assert {"ph", "ts", "pid", "tid", "name"} <= e.keys(), e
        assert e["ph"] in {"X", "i", "C", "M"}
        assert isinstance(e["ts"], int) and isinstance(e["pid"], int)
        if e["ph"] == "X":
            assert isinstance(e["dur"], int) and e["dur"] >= 0, e
        if e["ph"] == "i":
            assert e["s"] in {"t", "p", "g"}
        if e["ph"] == "C":
            assert all(isinstance(v, (int, float)) for v in e["args"].values()), e
        if "cname" in e:
            assert e["cname"] in (*PALETTE, "grey")
    by_thread: dict[tuple[int, int], list[tuple[int, int]]] = defaultdict(list)
    for e in slices(doc):
        by_thread[e["pid"], e["tid"]].append((e["ts"], e["ts"] + e["dur"]))
    for spans in by_thread.values():
        spans.sort()
        for (_, end), (start, _) in itertools.pairwise(spans):
            assert start >= end, spans


class TestKnownAnswer:
    def test_every_event_has_the_formats_fields(self):
        """ph, ts, pid, tid and name on every event; slices on one thread never overlap."""
        assert_valid(timeline_of(known_trace().events))

    def test_processes_are_named_by_run_id(self):
        """One process per run, its process_name metadata holding the run's ID."""
        doc = timeline_of(known_trace().events)
        names = {
            e["pid"]: e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "process_name"
        }
        assert names == {1: "run 1: run-A", 2: "run 2: run-B"}
        threads = {e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "thread_name"}
        assert {"trainer", "weights", "engine lane 1", "engine lane 3"} <= threads

    def test_a_run_of_only_its_start_is_a_process(self):
        """A run that wrote only its run.start (killed at once) is a process of its own, as
        cost counts it a run."""
        b = known_trace()
        b.new_run("run-C")
        doc = timeline_of(b.events)
        names = [e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "process_name"]
        assert names == ["run 1: run-A", "run 2: run-B", "run 3: run-C"]

    def test_a_cut_call_is_split_at_the_refit_by_version(self):
        """The attempt whose call the refit cut: v0 until the pause, the pause, then v1, with
        the tokens each version generated (40 and 60, from the cut)."""
        doc = timeline_of(known_trace().events)
        pieces = of_attempt(doc, "a1")
        assert [p["name"] for p in pieces] == ["v0", "paused: refit v0\u2192v1", "v1"]
        assert [p["cname"] for p in pieces] == [PALETTE[0], "grey", PALETTE[1]]
        assert [p["args"].get("segment_tokens") for p in pieces] == [40, None, 60]
        assert pieces[0]["ts"] + pieces[0]["dur"] == pieces[1]["ts"]
        assert pieces[1]["ts"] + pieces[1]["dur"] == pieces[2]["ts"]
        assert pieces[1]["dur"] == 5000  # the refit's duration_s, in microseconds
        assert {p["tid"] for p in pieces} == {3} and pieces[0]["args"]["tokens"] == 100

    def test_an_attempt_the_refit_did_not_touch_stays_whole(self):
        """Its calls known and none cut: one slice, at the version it began on."""
        pieces = of_attempt(timeline_of(known_trace().events), "a2")
        assert [(p["name"], p["args"]["outcome"]) for p in pieces] == [("v0", "sealed")]

    def test_without_calls_every_refit_while_it_ran_splits_it(self):
        """An abandoned attempt (no calls logged) is split at each refit while it ran."""
        pieces = of_attempt(timeline_of(known_trace().events), "a3")
        assert [p["name"] for p in pieces] == ["v0", "v1 (abandoned: stale)"]
        assert pieces[0]["ts"] + pieces[0]["dur"] == pieces[1]["ts"]

    def test_refusals_stops_and_the_end_of_the_file(self):
        """A refusal is an instant; work in flight at a stop or at the end is drawn to its
        run's last event."""
        doc = timeline_of(known_trace().events)
        [refused] = of_attempt(doc, "a4")
        assert refused["ph"] == "i" and refused["name"] == "refused: capacity"
        [lost] = of_attempt(doc, "a5")
        assert lost["args"]["outcome"] == "lost at stop" and lost["pid"] == 1
        [running] = of_attempt(doc, "b1")
        assert running["args"]["outcome"] == "running at end of file" and running["pid"] == 2
        ends = {e["pid"]: e["ts"] + e.get("dur", 0) for e in doc["traceEvents"]}
        assert lost["ts"] + lost["dur"] == ends[1]

    def test_the_step_slice_and_batch_age_agree_with_batch_age(self):
        """The step's slice and counter carry the batch age the batch-age analysis gives."""
        events = known_trace().events
        doc = timeline_of(events)
        [row] = run_events(events, [StepAges()])[0]
        [step] = [e for e in slices(doc) if e["tid"] == 1]
        assert step["name"] == "step 0" and step["dur"] == 15000
        assert step["args"]["batch_age"] == pytest.approx(0.6) == row.batch_age
        assert step["args"]["trained_version"] == 1
        assert counter(doc, "batch age", 1, "batch_age") == [pytest.approx(0.6)]
        names = {e["name"] for e in doc["traceEvents"] if e["ph"] == "i"}
        assert {"refit v0\u2192v1", "checkpoint publish (step 0)"} <= names
        assert "checkpoint restore (step 0)" in names

    def test_counters(self):
        """The engine's weight version, attempts and groups in flight, every change (no
        resolution), back to zero at the stop."""
        doc = timeline_of(known_trace().events, counter_resolution=0.0)
        assert counter(doc, "weight version", 1, "version") == [0, 1]
        assert counter(doc, "weight version", 2, "version") == [1]
        attempts = counter(doc, "attempts in flight", 1, "attempts")
        assert max(attempts) == 3 and attempts[-1] == 0
        groups = counter(doc, "groups in flight", 1, "generating")
        assert max(groups) == 1 and groups[-1] == 0
        assert max(counter(doc, "groups in flight", 1, "sealed")) == 1
        [refit] = [e for e in doc["traceEvents"] if e["ph"] == "i" and e["s"] == "p"]
        assert refit["args"]["paused_calls"] == 1 and refit["tid"] == 2


class TestPacking:
    def test_random_concurrent_attempts_pack_without_overlap(self):
        """Random overlapping attempts, refits and refusals: no lane overlaps, and the lanes
        used are the most attempts ever in flight at once (a refusal adds none)."""
        rng = random.Random(7)
        b = TraceBuilder(run_id="r")
        running: list[str] = []
        peak = version = 0
        for n in range(400):
            if running and rng.random() < 0.45:
                aid = running.pop(rng.randrange(len(running)))
                kind = rng.choice(("attempt.seal", "attempt.abandon"))
                extra = {"tokens": 10} if kind == "attempt.seal" else {"reason": "stale"}
                attempt(b, kind, aid, "g", **extra)
            elif rng.random() < 0.1:
                b.event("weights.sync", replaced_version=version, new_version=version + 1)
                version += 1
            elif rng.random() < 0.1:
                attempt(b, "attempt.refuse", f"r{n}", "g", reason="capacity")
            else:
                aid = f"a{n}"
                running.append(aid)
                attempt(b, "attempt.dispatch", aid, "g", weight_version=version)
                peak = max(peak, len(running))
        doc = timeline_of(b.events)
        assert_valid(doc)
        lanes = {e["tid"] for e in slices(doc)}
        assert len(lanes) == peak
        refusals = [e for e in doc["traceEvents"] if e["name"] == "refused: capacity"]
        assert refusals and {e["tid"] for e in refusals} <= lanes


@pytest.fixture(scope="module")
def bench_trace(tmp_path_factory) -> Path:
    return synthetic_trace(tmp_path_factory.mktemp("tl") / "t.jsonl", 4000, runs=3)


def load(path: Path) -> dict[str, Any]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        return json.load(f)


class TestCommand:
    def test_writes_the_file_and_gzips_by_name(self, tmp_path, cli, bench_trace):
        """-o x.json writes the trace-event object; -o x.json.gz the same, gzipped."""
        plain, packed = tmp_path / "t.json", tmp_path / "t.json.gz"
        assert cli("timeline", str(bench_trace), "-o", str(plain)).returncode == 0
        proc = cli("timeline", str(bench_trace), "-o", str(packed))
        assert proc.returncode == 0 and "3 runs" in proc.stderr
        assert packed.read_bytes()[:2] == b"\x1f\x8b"
        doc = load(plain)
        assert load(packed) == doc
        assert_valid(doc)
        [steps] = run_file(bench_trace, [StepAges()])
        assert len([e for e in slices(doc) if e["tid"] == 1]) == len(steps) + 6  # 2 redone × 3
        argv = [sys.executable, "-m", "otel_rollout", "timeline", str(bench_trace), "-o", "-"]
        piped = subprocess.run(argv, capture_output=True, cwd=tmp_path, timeout=120)
        assert piped.returncode == 0 and json.loads(piped.stdout) == doc  # -o -: stdout
        assert not (tmp_path / "-").exists()

    def test_runs_by_position_or_id_prefix(self, tmp_path, cli, bench_trace):
        """--runs 2 and --runs <prefix> keep that run's process only, on the file's time axis."""
        whole = tmp_path / "all.json"
        cli("timeline", str(bench_trace), "-o", str(whole))
        first_ts = {e["pid"]: e["ts"] for e in reversed(load(whole)["traceEvents"])}
        for selector in ("2", "00000001"):
            out = tmp_path / f"r{selector}.json"
            assert (
                cli("timeline", str(bench_trace), "-o", str(out), "--runs", selector).returncode
                == 0
            )
            doc = load(out)
            assert {e["pid"] for e in doc["traceEvents"]} == {2}
            [name] = [e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "process_name"]
            assert name == "run 2: 00000001" + "0" * 24
            assert min(e["ts"] for e in doc["traceEvents"] if e["ph"] != "M") >= first_ts[2] - 1

    def test_a_prefix_of_several_runs_is_said_and_case_does_not_matter(
        self, tmp_path, cli, bench_trace
    ):
        """--runs 0000 (a prefix of every run of the bench trace, here in capitals as
        --runs 0000000A would be) draws them all and says which it matched."""
        out = tmp_path / "p.json"
        proc = cli("timeline", str(bench_trace), "-o", str(out), "--runs", "0000")
        assert proc.returncode == 0 and "--runs 0000 matches 3 runs" in proc.stderr
        assert {e["pid"] for e in load(out)["traceEvents"]} == {1, 2, 3}
        from otel_rollout.timeline import RunSelector

        pick = RunSelector.parse("ABCD")
        assert pick(0, "abcd1234") and not pick(1, "abce1234") and pick.ambiguous() == {}

    def test_steps_cut_the_time(self, tmp_path, cli, bench_trace):
        """--steps 5:8 keeps the slices of steps 5, 6 and 7 and what happened in their time."""
        out = tmp_path / "s.json"
        assert cli("timeline", str(bench_trace), "-o", str(out), "--steps", "5:8").returncode == 0
        doc = load(out)
        assert_valid(doc)
        steps = [e for e in slices(doc) if e["tid"] == 1]
        assert sorted(e["args"]["step"] for e in steps) == [5, 6, 7]
        start = min(e["ts"] for e in steps)
        end = max(e["ts"] + e["dur"] for e in steps)
        drawn = [e for e in doc["traceEvents"] if e["ph"] in "iC"] + slices(doc)
        assert drawn and all(e["ts"] <= end and e["ts"] + e.get("dur", 0) >= start for e in drawn)
        assert {e["pid"] for e in steps} == {1}

    def test_steps_warn_of_a_bad_line_once_and_refuse_a_pipe(self, tmp_path, cli, bench_trace):
        """--steps reads the file twice but warns of a bad line once; a pipe, which cannot
        be read twice, gets one clear line instead of a wrong "no step" error."""
        path = tmp_path / "t.jsonl"
        with open(bench_trace, "rb") as f:
            head = [next(f) for _ in range(200)]
        bad = b'{"t": 1, "run_id": "r", "event": "train.step", "step": -1}\n'
        path.write_bytes(b"".join(head[:5]) + bad + b"".join(head[5:]))
        proc = cli("timeline", str(path), "--steps", "0:2", "-o", str(tmp_path / "o.json"))
        assert proc.returncode == 0, proc.stderr
        assert [w for w in proc.stderr.splitlines() if "WARNING" in w and ":6:" in w] == [
            w for w in proc.stderr.splitlines() if "WARNING" in w
        ] and proc.stderr.count(":6:") == 1
        piped = subprocess.run(
            f"cat {path} | {sys.executable} -m otel_rollout timeline --steps 0:2 /dev/stdin "
            f"-o {tmp_path / 'p.json'}",
            shell=True, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert piped.returncode == 2 and "save it to a file first" in piped.stderr
        assert len(piped.stderr.strip().splitlines()) == 1

    def test_a_trace_that_fails_to_read_is_not_blamed_on_the_output(self, tmp_path, cli):
        """A read error in the middle of the pass (``/proc/self/mem`` reads as EIO) names the
        trace, not the output, and leaves no partial output behind."""
        out = tmp_path / "t.json"
        proc = cli("timeline", "/proc/self/mem", "-o", str(out))
        assert proc.returncode == 2 and "/proc/self/mem: cannot read" in proc.stderr
        assert "cannot write" not in proc.stderr and not out.exists()

    def test_clear_errors(self, tmp_path, cli, bench_trace):
        """Bad cuts, a cut that keeps nothing and a missing file: exit 2, one line each."""
        cases = [
            (["--steps", "9:3"], "B must be greater than A"),
            (["--steps", "x"], "expected A:B"),
            (["--runs", "7"], "--runs matches none of the file's 3 runs"),
            (["--runs", "ab"], "at least 4 characters"),
            (["--steps", "90000:"], "no train.step in --steps 90000:"),
        ]
        for args, words in cases:
            out = tmp_path / "e.json"
            proc = cli("timeline", str(bench_trace), "-o", str(out), *args)
            assert proc.returncode == 2 and words in proc.stderr, (args, proc.stderr)
            assert len(proc.stderr.strip().splitlines()) == 1 and not out.exists()
        proc = cli("timeline", str(tmp_path / "none.jsonl"))
        assert proc.returncode == 2 and "no such file" in proc.stderr

    def test_a_file_of_one_run_start_is_an_empty_timeline(self, tmp_path, cli):
        """A run that has only begun (its run.start alone) gives a valid timeline with no
        events, and exit 0 (an empty file is no trace: test_cli)."""
        begun, out = tmp_path / "begun.jsonl", tmp_path / "t.json"
        begun.write_bytes(b'{"t":1.5,"run_id":"r","event":"run.start","schema":1}\n')
        assert cli("timeline", str(begun), "-o", str(out)).returncode == 0
        assert [e for e in load(out)["traceEvents"] if e.get("ph") != "M"] == []

    def test_help_explains(self, cli):
        """--help names the viewers, the cuts and the gzip rule."""
        text = cli("timeline", "--help").stdout
        for words in ("Perfetto", "speedscope", "--runs", "--steps", ".gz", "engine lanes"):
            assert words in text


# The viewer: speedscope's static build from the npm registry, cached between runs.


def speedscope_build() -> Path:
    """speedscope's release directory (index.html and its assets), fetched once with npm
    (or from the registry's tarball URL when npm is missing) into the cache."""
    release = SPEEDSCOPE_CACHE / SPEEDSCOPE_VERSION / "package" / "dist" / "release"
    if (release / "index.html").exists():
        return release
    with tempfile.TemporaryDirectory() as tmp:
        tarball = None
        npm = shutil.which("npm")
        if npm is not None:
            proc = subprocess.run(
                [npm, "pack", f"speedscope@{SPEEDSCOPE_VERSION}", "--pack-destination", tmp],
                capture_output=True,
                text=True,
                timeout=300,
            )
            if proc.returncode == 0:
                tarball = Path(tmp) / f"speedscope-{SPEEDSCOPE_VERSION}.tgz"
        if tarball is None or not tarball.exists():
            url = f"https://registry.npmjs.org/speedscope/-/speedscope-{SPEEDSCOPE_VERSION}.tgz"
            try:
                with urllib.request.urlopen(url, timeout=60) as response:
                    data = response.read()
            except OSError as exc:
                why = "npm is not installed" if npm is None else "npm pack failed"
                pytest.skip(
                    f"speedscope unavailable: {why} and the registry is unreachable ({exc})"
                )
            tarball = Path(tmp) / "speedscope.tgz"
            tarball.write_bytes(data)
        target = SPEEDSCOPE_CACHE / SPEEDSCOPE_VERSION
        SPEEDSCOPE_CACHE.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=SPEEDSCOPE_CACHE))  # renamed into place whole
        with tarfile.open(tarball) as tar:
            tar.extractall(staging, filter="data")
        shutil.rmtree(target, ignore_errors=True)
        staging.rename(target)
    return release


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args: Any) -> None:
        pass


def speedscope_dom(root: Path, profile: str, tmp_path: Path) -> str:
    """The page speedscope shows for ``root/profile`` (served from 127.0.0.1), as headless
    Chromium dumps it once the profile is loaded."""
    browser = chromium()
    if browser is None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"Chromium is not installed ({INSTALL_CHROMIUM})")
        pytest.skip(f"Chromium is not installed ({INSTALL_CHROMIUM})")
    handler = functools.partial(_Quiet, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_port}/speedscope/index.html#profileURL=/{profile}"
        proc = subprocess.run(
            [browser, *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'chromium'}",
             "--window-size=1400,900", "--virtual-time-budget=20000", "--dump-dom", url],
            capture_output=True,
            text=True,
            timeout=180,
        )  # fmt: skip
    finally:
        server.shutdown()
        server.server_close()
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


class TestInSpeedscope:
    def test_speedscope_loads_every_lane(self, tmp_path):
        """speedscope imports the file without an error and lists one profile per thread
        with slices, named by run ID and lane."""
        release = speedscope_build()
        root = tmp_path / "site"
        root.mkdir()
        (root / "speedscope").symlink_to(release, target_is_directory=True)
        events = known_trace().events
        doc = timeline_of(events)
        (root / "timeline.json").write_text(json.dumps(doc))
        html = speedscope_dom(root, "timeline.json", tmp_path)
        assert "<title>timeline.json - speedscope</title>" in html
        assert "Something went wrong" not in html and "Unrecognized format" not in html
        threads = {(e["pid"], e["tid"]) for e in slices(doc)}
        assert f"(1/{len(threads)})" in html
        listed = re.findall(r'<tr title="([^"]+)"', html)
        names = {
            e["pid"]: e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "process_name"
        }
        thread_names = {
            (e["pid"], e["tid"]): e["args"]["name"]
            for e in doc["traceEvents"]
            if e["name"] == "thread_name"
        }
        expected = [
            f"{names[pid]} (pid {pid}), {thread_names[pid, tid]} (tid {tid})"
            for pid, tid in sorted(threads)
        ]
        assert listed == expected
        assert "run 1: run-A (pid 1), engine lane 1 (tid 3)" in listed
        assert "run 2: run-B (pid 2), engine lane 1 (tid 3)" in listed
