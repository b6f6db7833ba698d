"""Hostile and broken input to every reader and command: each ends in events, counted
skips or a one-line error with exit code 1 or 2, never a traceback or unbounded memory."""

from __future__ import annotations

import contextlib
import io
import subprocess
import sys
import textwrap
from pathlib import Path

import orjson
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from otel_rollout import _blocks as blocks_module
from otel_rollout._blocks import GZIP_MAGIC
from otel_rollout.cli import run
from otel_rollout.reader import EventReader, read_events
from otel_rollout.testing import OtlpReceiver, synthetic_trace

FUZZ = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@pytest.fixture(scope="module")
def valid_events(tmp_path_factory) -> list[dict]:
    """Real events of every common kind, from a two-run synthetic trace."""
    path = synthetic_trace(tmp_path_factory.mktemp("seed") / "t.jsonl", 400, runs=2)
    events = list(read_events(path))
    by_kind: dict[str, list[dict]] = {}
    for e in events:
        by_kind.setdefault(e["event"], []).append(e)
    return [e for kind in by_kind.values() for e in kind[:5]]


#: JSON texts a field may hold instead of what the schema says.
hostile_values = st.one_of(
    st.sampled_from(
        [b"NaN", b"Infinity", b"-Infinity", b"1e400", b"-0", b"null", b"true", b'""', b"{}"]
    ),
    st.integers(20, 2000).map(lambda n: b"9" * n),  # integers far past 64 bits
    st.integers(1, 5000).map(lambda d: b"[" * d + b"]" * d),  # deep nesting
    st.integers(1, 5000).map(lambda d: b'{"a":' * d + b"1" + b"}" * d),
    st.binary(max_size=12).map(lambda b: b'"' + b.replace(b'"', b"").replace(b"\\", b"") + b'"'),
    st.from_type(int).map(lambda i: str(i).encode()),
    st.text(max_size=8).map(lambda s: orjson.dumps(s)),
)


@st.composite
def hostile_line(draw, events: list[dict]) -> bytes:
    event = draw(st.sampled_from(events))
    parts = {k: orjson.dumps(v) for k, v in event.items()}
    if draw(st.booleans()):  # a field of the wrong type, or an absurd value
        parts[draw(st.sampled_from(sorted(parts)))] = draw(hostile_values)
    if draw(st.booleans()):  # a field removed
        parts.pop(draw(st.sampled_from(sorted(parts))))
    line = b"{" + b",".join(orjson.dumps(k) + b":" + v for k, v in parts.items()) + b"}"
    how = draw(st.sampled_from(["whole", "whole", "truncated", "garbage", "not utf-8", "two",
                                "blank", "split"]))  # fmt: skip
    if how == "two":  # two events on one line (the second valid): not JSON to a plain parse
        line += draw(st.sampled_from([b"", b" ", b"\t", b","])) + orjson.dumps(events[0])
    elif how == "split":  # one event cut across two lines (inside a string, or between fields)
        at = draw(st.integers(1, max(len(line) - 1, 1)))
        line = line[:at] + b"\n" + line[at:]
    elif how == "blank":
        line = draw(st.sampled_from([b"", b" ", b"\t "]))
    elif how == "truncated":
        line = line[: draw(st.integers(0, len(line)))]
    elif how == "garbage":
        line = draw(st.binary(max_size=60)).replace(b"\n", b"")
    elif how == "not utf-8":
        at = draw(st.integers(0, len(line)))
        line = line[:at] + b"\xff\xfe" + line[at:]
    return line


@st.composite
def hostile_file(draw, events: list[dict]) -> bytes:
    lines = draw(st.lists(hostile_line(events), max_size=25))
    if lines and draw(st.booleans()):  # duplicated lines
        lines += draw(st.lists(st.sampled_from(lines), max_size=5))
    end = draw(st.sampled_from([b"\n", b"\r\n"]))
    body = end.join(lines) + (end if draw(st.booleans()) else b"")
    return (b"\xef\xbb\xbf" if draw(st.booleans()) else b"") + body


def command(*argv: str) -> tuple[int, str]:
    """Run ``otel-rollout ARGV`` in this process: an exception here is a failed test."""
    out, err = io.TextIOWrapper(io.BytesIO()), io.StringIO()  # --json writes bytes
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = run(list(argv))
    return code, err.getvalue()


class TestReaders:
    @FUZZ
    @given(data=st.data())
    def test_readers_yield_events_or_count_skips(self, tmp_path, valid_events, data):
        """Dict and typed reading of a hostile file never raise, and count what they skip."""
        path = tmp_path / "t.jsonl"
        path.write_bytes(data.draw(hostile_file(valid_events)))
        for reader in (
            EventReader(path, on_skip=lambda *a: None),
            EventReader(path, on_skip=lambda *a: None, typed=True),
            EventReader(path, on_skip=lambda *a: None, validate=True),
        ):
            events = [e for batch in reader.batches() for e in batch]
            assert len(events) + reader.skipped <= reader.lines


    @FUZZ
    @given(data=st.data(), block=st.integers(64, 4096))
    def test_found_lines_decoded_at_once_equal_line_by_line(
        self, tmp_path, valid_events, monkeypatch, data, block
    ):
        """Reading seals, steps and run starts as batch-age does (found lines decoded a block
        at a time) gives the events, line numbers and skipped lines of decoding them one by
        one, on hostile files cut into many small blocks."""
        from otel_rollout.age import BATCH_AGE_EVENTS

        body = data.draw(hostile_file(valid_events))
        body += b"\n".join(orjson.dumps(e) for e in valid_events) * 3  # found lines, at once
        path = tmp_path / "t.jsonl"
        path.write_bytes(body)
        monkeypatch.setattr(blocks_module, "_CHUNK", block)

        def read() -> tuple[list[tuple[int, object]], list[tuple[int, str]], int]:
            skipped: list[tuple[int, str]] = []
            reader = EventReader(path, kinds=BATCH_AGE_EVENTS, typed=True,
                                 on_skip=lambda n, why: skipped.append((n, why)))  # fmt: skip
            numbered = []
            for batch, where in reader.numbered_batches():
                numbers = range(where, where + len(batch)) if isinstance(where, int) else where
                numbered += zip(numbers, batch, strict=True)
            return numbered, skipped, reader.lines

        at_once = read()
        monkeypatch.setattr(EventReader, "_found_at_once", lambda self, found: None)
        assert at_once == read()
        assert any(e.event == "group.seal" for _, e in at_once[0])


class TestCommands:
    @FUZZ
    @given(data=st.data())
    def test_analysis_commands_end_in_a_result_or_a_clear_error(self, tmp_path, valid_events, data):
        """validate, batch-age, cost, staleness and timeline on a hostile file: exit 0, 1 or
        2, no traceback."""
        path = tmp_path / "t.jsonl"
        path.write_bytes(data.draw(hostile_file(valid_events)))
        for argv in (
            ["validate", str(path)],
            ["batch-age", str(path)],
            ["batch-age", "--json", str(path)],
            ["cost", str(path)],
            ["cost", "--json", str(path)],
            ["staleness", str(path)],
            ["staleness", "--json", str(path)],
            ["timeline", str(path), "-o", str(tmp_path / "t.json")],
        ):
            code, err = command(*argv)
            assert code in (0, 1, 2) and "Traceback" not in err

    @settings(FUZZ, max_examples=25)
    @given(data=st.data())
    def test_export_ends_in_a_result_or_a_clear_error(self, tmp_path, valid_events, data):
        """export of a hostile file to a real OTLP receiver: exit 0, 1 or 2, no traceback."""
        path = tmp_path / "t.jsonl"
        path.write_bytes(data.draw(hostile_file(valid_events)))
        with OtlpReceiver() as receiver:
            code, err = command("export", str(path), "--endpoint", receiver.endpoint)
        assert code in (0, 1, 2) and "Traceback" not in err

    def test_files_that_are_not_traces(self, tmp_path):
        """A directory, a missing file and a binary file each end in one error line, exit 2."""
        binary = tmp_path / "x.bin"
        binary.write_bytes(bytes(range(256)) * 100)
        for target in (tmp_path, tmp_path / "missing.jsonl", binary):
            for name in ("validate", "batch-age", "cost", "export"):
                code, err = command(name, str(target))
                last = err.strip().splitlines()[-1]
                assert code == 2 and last.startswith("otel-rollout: error: "), (name, err)


class TestHugeLines:
    def test_a_100_mb_line_is_skipped_in_bounded_memory(self, tmp_path):
        """A 100 MB line between two events is skipped and counted; the reader's memory
        grows by about the line limit, not by the line."""
        path = tmp_path / "huge.jsonl"
        with open(path, "wb") as f:
            f.write(b'{"t":1,"run_id":"r","event":"a"}\n{"t":2,"run_id":"r","event":"x","v":"')
            chunk = b"y" * (1 << 20)
            for _ in range(100):
                f.write(chunk)
            f.write(b'"}\n{"t":3,"run_id":"r","event":"b"}\n')
        script = textwrap.dedent(
            """
            import sys
            from otel_rollout.reader import EventReader

            def high_water_mb():
                for line in open("/proc/self/status"):
                    if line.startswith("VmHWM"):
                        return int(line.split()[1]) / 1024

            base = high_water_mb()
            reader = EventReader(sys.argv[1], on_skip=lambda n, why: print(n, why))
            kinds = [e["event"] for e in reader]
            print(kinds, reader.skipped, reader.lines, round(high_water_mb() - base))
            """
        )
        proc = subprocess.run(
            [sys.executable, "-c", script, str(path)],
            capture_output=True,
            text=True,
            timeout=120,
            env={"OTEL_ROLLOUT_MAX_LINE_BYTES": str(8 << 20), "PATH": "/usr/bin:/bin"},
        )
        assert proc.returncode == 0, proc.stderr
        skip, summary = proc.stdout.strip().splitlines()
        assert skip.startswith("2 a line of 104,857,6") and "over the limit" in skip
        kinds, skipped, lines, grew_mb = summary.rsplit(" ", 3)
        assert kinds == "['a', 'b']" and (skipped, lines) == ("1", "3")
        assert int(grew_mb) < 40


@pytest.mark.skipif(
    not Path(__file__).with_name("fuzz_reader.py").exists(), reason="no atheris harness"
)
def test_atheris_harness_runs_clean(tmp_path):
    """The coverage-guided harness (fuzz_reader.py) runs its iterations without a crash,
    where atheris installs."""
    pytest.importorskip("atheris")
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("fuzz_reader.py")), "-runs=3000"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]


def _validate_lines(path: Path) -> dict[int, str]:
    """The lines ``validate --json`` says are not events a reader may use, with why."""
    out = io.BytesIO()
    wrapper = io.TextIOWrapper(out)
    with contextlib.redirect_stdout(wrapper), contextlib.redirect_stderr(io.StringIO()):
        run(["validate", "--json", "--max-report", "100000", str(path)])
    wrapper.flush()
    found = {}
    for line in out.getvalue().splitlines():
        problem = orjson.loads(line)
        if "summary" in problem:  # the counts, last
            continue
        usable = problem["severity"] == "warning" and not problem["problem"].startswith("torn")
        if not usable:  # unknown kinds and steps naming unsealed groups are still read
            found[problem["line"]] = problem["problem"]
    return found


class TestOneValidationPolicy:
    @settings(FUZZ, max_examples=150)
    @given(data=st.data())
    def test_validate_and_every_reader_skip_the_same_lines(
        self, tmp_path, monkeypatch, valid_events, data
    ):
        """On hostile files read in blocks of any size, the lines validate rejects are
        exactly the lines the typed reader, the checked dict reader (export), the one
        analysis pass (cost, report) and the reference functions skip; batch-age, which
        parses only seals and steps, skips exactly the rejected lines among those."""
        from otel_rollout.analysis import StepAges, run_file
        from otel_rollout.batch_age import BATCH_AGE_EVENTS, batch_age_by_step
        from otel_rollout.cost import CostAnalysis
        from otel_rollout.report import ReportData, ReportSeries

        path = tmp_path / "t.jsonl"
        body = data.draw(hostile_file(valid_events))
        # Gzip's magic makes every reader (and validate) read the file as gzip: its lines
        # are then no lines of the plain model below (test_reader covers damaged gzip).
        assume(not body.startswith(GZIP_MAGIC))
        path.write_bytes(body)
        # Small reads: most blocks are whole lines with more after them, which the readers
        # decode in one call (a file of 25 lines is otherwise one final block).
        monkeypatch.setattr(blocks_module, "_CHUNK", data.draw(st.integers(64, 2048)))
        rejected = _validate_lines(path)

        def skipped_by(reader: EventReader) -> set[int]:
            lines: set[int] = set()
            reader._on_skip = lambda n, why: lines.add(n)
            for _ in reader.numbered_batches():
                pass
            return lines

        # validate finds its errors fast (a line that converts to its kind's struct has
        # none): the validator's Python rules, on every plain line that is a JSON object, are
        # the independent word on which lines those are.
        from otel_rollout import schema
        from otel_rollout.events import decode_plain

        by_rules, objects = set(), set()
        for n, line in enumerate(path.read_bytes().split(b"\n"), 1):
            if not line.isascii() or b"\r" in line:
                continue
            with contextlib.suppress(Exception):
                value = decode_plain(line)
                if isinstance(value, dict):
                    objects.add(n)
                    if any(not p.startswith("unknown event kind") for p in schema.problems(value)):
                        by_rules.add(n)
        assert set(rejected) & objects == by_rules
        assert skipped_by(EventReader(path, typed=True)) == set(rejected)
        assert skipped_by(EventReader(path, validate=True)) == set(rejected)
        warned: list[tuple[object, str]] = []
        analyses = [CostAnalysis(), StepAges(), ReportSeries(ReportData(""))]
        run_file(path, analyses, on_warning=lambda where, why: warned.append((where, why)))
        assert {w for w, why in warned if why.endswith("; skipped")} == set(rejected)
        reference: list[object] = []
        batch_age_by_step(read_events(path), on_malformed=lambda e, why: reference.append(e))
        assert {e["where"] for e in reference if e} >= set()  # reported, never raised
        few: list[tuple[object, str]] = []
        run_file(path, [StepAges()], on_warning=lambda where, why: few.append((where, why)))
        wanted = {
            n
            for n, line in enumerate(path.read_bytes().split(b"\n"), 1)
            if any(f'"event":"{k}"'.encode() in line for k in BATCH_AGE_EVENTS)
        }
        skipped_few = {w for w, why in few if why.endswith("; skipped")}
        assert skipped_few <= set(rejected)
        assert skipped_few >= set(rejected) & wanted
