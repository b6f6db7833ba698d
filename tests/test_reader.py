"""read_events / EventReader: file order, damaged lines, gzip and the kind pre-filter."""

from __future__ import annotations

import contextlib
import gzip
import logging
import math

import msgspec
import orjson
import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from otel_rollout import _blocks as blocks_module
from otel_rollout.reader import MAX_WARNINGS, EventReader, read_events
from otel_rollout.testing import TraceBuilder

KINDS = ["group.seal", "train.step", "attempt.seal", "weights.sync", "x.y"]


def sample() -> TraceBuilder:
    b = TraceBuilder()
    b.sealed_group("g1", {0: 5})
    b.step(0, 1, ["g1"])
    return b


class TestReadEvents:
    def test_yields_events_in_file_order(self, tmp_path):
        """Every line comes back as the dict that was written, in order."""
        b = sample()
        assert list(read_events(b.write(tmp_path / "t.jsonl"))) == b.events

    def test_torn_last_line_is_skipped_with_its_line_number(self, tmp_path, caplog):
        """A killed writer's half line is skipped, counted and named in a warning."""
        b = sample()
        path = tmp_path / "t.jsonl"
        path.write_bytes(b.lines() + b'{"t": 1, "run_id": "r", "ev')
        reader = EventReader(path)
        assert list(reader) == b.events
        assert reader.skipped == 1 and reader.lines == len(b.events) + 1
        assert f"{path}:{len(b.events) + 1}: torn last line" in caplog.text

    def test_invalid_lines_anywhere_are_skipped_and_counted(self, tmp_path):
        """Garbage, JSON that is not an object and blank lines never stop the reader."""
        path = tmp_path / "t.jsonl"
        path.write_bytes(b'{"event":"a"}\nnot json\n[1,2]\n\n{"event":"b"}\n\xff\xfe\n')
        seen = []
        reader = EventReader(path, on_skip=lambda n, why: seen.append(n))
        assert [e["event"] for e in reader] == ["a", "b"]
        assert seen == [2, 3, 6] and reader.skipped == 3

    def test_warnings_are_capped_then_summed_up(self, tmp_path, caplog):
        """A trace of one event then garbage logs a few line warnings and one summary, not
        one per line."""
        path = tmp_path / "t.jsonl"
        path.write_bytes(b'{"t": 1, "run_id": "r", "event": "tick"}\n' + b"bad\n" * 1000)
        with caplog.at_level(logging.WARNING, logger="otel_rollout"):
            assert [e["event"] for e in read_events(path)] == ["tick"]
        assert len(caplog.records) == MAX_WARNINGS + 1
        assert "(1000 in all)" in caplog.records[-1].getMessage()

    @pytest.mark.parametrize("zipped", [False, True])
    def test_a_file_cut_short_is_told_past_the_cap(self, tmp_path, caplog, zipped):
        """Past the cap of warnings, the last line torn (or the compressed data ending
        early) is still told, as the one a reader of a crashed run looks for; the summary
        counts the rest."""
        body = b'{"t": 1, "run_id": "r", "event": "tick"}\n' + b"bad\n" * 30
        body += b'{"t": 2, "run_id": "r", "ev'
        path = tmp_path / "t.jsonl"
        path.write_bytes(body)
        if zipped:  # many different lines after the bad ones: the cut lands among them
            tail = b"".join(b'{"t": %d, "run_id": "r", "event": "e%d"}\n' % (i, i * 7919)
                            for i in range(3, 600))  # fmt: skip
            path = tmp_path / "t.jsonl.gz"
            path.write_bytes(gzip.compress(body[: body.rindex(b"\n") + 1] + tail)[:-30])
        with caplog.at_level(logging.WARNING, logger="otel_rollout"):
            list(read_events(path))
        told = [r.getMessage() for r in caplog.records]
        assert len(told) == MAX_WARNINGS + 2 and "torn last line" in told[-2], told[-2:]
        assert told[-1].endswith("20 more warnings (31 in all)"), told[-1]

    @settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(cut=st.integers(0, 400), block=st.integers(1, 90), zipped=st.booleans())
    @example(cut=len(sample().lines().split(b"\n")[0]), block=90, zipped=False)
    def test_end_reads_the_file_as_it_stood_at_that_byte(
        self, tmp_path, monkeypatch, cut, block, zipped
    ):
        """With ``end``, the reader gives the lines whole in the first ``end`` bytes (of the
        content, for a gzipped file), and a line ``end`` falls inside is a torn last line,
        with reads of any size."""
        monkeypatch.setattr(blocks_module, "_CHUNK", block)
        b = sample()
        b.sealed_group("g2", {1: 7})
        content = b.lines() + b.lines()
        path = tmp_path / "t.jsonl"
        path.write_bytes(gzip.compress(content) if zipped else content)
        skipped: list[int] = []
        reader = EventReader(path, end=cut, on_skip=lambda n, why: skipped.append(n))
        head = content[:cut]
        whole = head[: head.rfind(b"\n") + 1]
        expected = [orjson.loads(line) for line in whole.splitlines()]
        tail = head[len(whole) :]  # kept if it is an event all the same, as at a file's end
        if tail:
            with contextlib.suppress(orjson.JSONDecodeError):
                expected.append(orjson.loads(tail))
        assert list(reader) == expected
        torn = bool(tail) and len(expected) == whole.count(b"\n")
        assert skipped == ([whole.count(b"\n") + 1] if torn else [])

    def test_gzip_is_read_by_content_not_name(self, tmp_path):
        """A gzipped trace reads the same, whatever it is called."""
        b = sample()
        path = tmp_path / "trace.data"
        path.write_bytes(gzip.compress(b.lines()))
        assert list(read_events(path)) == b.events

    def test_a_truncated_gzip_keeps_every_line_it_can_decompress(self, demo_trace, tmp_path, cli):
        """Cut in half, a gzipped trace still gives every whole line zlib can decompress
        (a torn last line and the early end are warnings, on one line, not two), and
        batch-age reads it."""
        import zlib

        whole = gzip.compress(demo_trace.read_bytes())
        path = tmp_path / "half.jsonl.gz"
        path.write_bytes(whole[: len(whole) // 2])
        recoverable = zlib.decompressobj(31).decompress(whole[: len(whole) // 2])
        expected = [orjson.loads(line) for line in recoverable.split(b"\n")[:-1]]
        assert expected and list(read_events(path)) == expected
        skips: list[tuple[int, str]] = []
        reader = EventReader(path, on_skip=lambda n, why: skips.append((n, why)))
        list(reader)  # the early end is the torn last line, or one line after a whole one
        assert reader.lines == recoverable.count(b"\n") + 1
        [(line, why)] = skips  # one warning for the one damaged line
        assert line == reader.lines and "compressed data ends early" in why
        checked = cli("validate", str(path))
        assert f":{line}: warning: torn last line (compressed" in checked.stdout + checked.stderr
        assert "0 errors, 1 warning" in checked.stderr
        assert cli("batch-age", str(path)).returncode == 0
        members = tmp_path / "members.jsonl.gz"  # gzip -c a >> b: members one after another
        data = demo_trace.read_bytes()
        members.write_bytes(gzip.compress(data[:5000]) + gzip.compress(data[5000:]))
        assert list(read_events(members)) == list(read_events(demo_trace))

    @pytest.mark.parametrize("zeros", [10, 5000, 100_000])
    def test_zeros_after_a_gzip_member_are_padding(self, demo_trace, tmp_path, zeros):
        """Zeros after a member (a tape block's padding, which gzip allows) are no damage,
        however many reads they span, before another member or at the end."""
        data = demo_trace.read_bytes()
        cut = data.index(b"\n", 5000) + 1
        path = tmp_path / "padded.jsonl.gz"
        path.write_bytes(gzip.compress(data[:cut]) + bytes(zeros) + gzip.compress(data[cut:])
                         + bytes(zeros))  # fmt: skip
        skips: list[int] = []
        reader = EventReader(path, on_skip=lambda n, why: skips.append(n))
        assert list(reader) == list(read_events(demo_trace)) and skips == []
        assert reader.lines == data.count(b"\n")

    def test_bom_and_crlf(self, tmp_path):
        """A byte-order mark and Windows line ends do not cost any event."""
        b = sample()
        path = tmp_path / "t.jsonl"
        path.write_bytes(b"\xef\xbb\xbf" + b.lines().replace(b"\n", b"\r\n"))
        assert list(read_events(path)) == b.events

    def test_unknown_fields_are_kept(self, tmp_path):
        """Fields the schema does not know survive reading."""
        path = tmp_path / "t.jsonl"
        path.write_bytes(b'{"t":1,"run_id":"r","event":"x","future":{"a":[1]}}\n')
        assert next(read_events(path))["future"] == {"a": [1]}

    def test_numbered_gives_line_numbers(self, tmp_path):
        """numbered() pairs each event with its 1-based line number."""
        path = tmp_path / "t.jsonl"
        path.write_bytes(b'{"event":"a"}\nbad\n{"event":"b"}\n')
        reader = EventReader(path, on_skip=lambda *a: None)
        assert [(n, e["event"]) for n, e in reader.numbered()] == [(1, "a"), (3, "b")]

    def test_first_line_tells_a_trace_from_other_files(self, tmp_path):
        """first_line_is_event is False for random bytes, True for a trace, even filtered."""
        junk, trace = tmp_path / "junk", sample().write(tmp_path / "t.jsonl")
        junk.write_bytes(b"\x00\x01garbage\nmore\n")
        r1 = EventReader(junk, kinds={"train.step"}, on_skip=lambda *a: None)
        r2 = EventReader(trace, kinds={"train.step"})
        list(r1), list(r2)
        assert r1.first_line_is_event is False and r2.first_line_is_event is True

    def test_progress_reports_reach_the_total(self, tmp_path):
        """The progress callback ends with done == total bytes."""
        path = sample().write(tmp_path / "t.jsonl")
        calls = []
        list(EventReader(path, progress=lambda d, t: calls.append((d, t))))
        assert calls[-1] == (path.stat().st_size, path.stat().st_size)


_event = st.fixed_dictionaries(
    {"event": st.sampled_from(KINDS)},
    optional={
        "t": st.floats(0, 2e9),
        "note": st.text(max_size=20),
        "value": st.sampled_from(
            KINDS
        ),  # a kind's name as a value: the pre-filter must not be fooled
    },
)


class TestKindFilter:
    @settings(max_examples=150, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(
        events=st.lists(_event, max_size=30),
        kinds=st.sets(st.sampled_from(KINDS), max_size=5),  # both search and parse paths
        junk=st.lists(st.binary(max_size=30), max_size=5),
    )
    def test_filtered_read_equals_read_then_filter(self, tmp_path, events, kinds, junk):
        """Reading with kinds= yields exactly the unfiltered events of those kinds."""
        body = b"".join(orjson.dumps(e) + b"\n" for e in events)
        body += b"".join(j.replace(b"\n", b"") + b"\n" for j in junk)
        path = tmp_path / "t.jsonl"
        path.write_bytes(body)
        everything = list(EventReader(path, on_skip=lambda *a: None))
        filtered = list(EventReader(path, kinds=kinds, on_skip=lambda *a: None))
        assert filtered == [e for e in everything if e.get("event") in kinds]

    def test_filter_accepts_other_writers_spacing(self, tmp_path):
        """Files from json.dumps (spaces after colons) are filtered just as well."""
        path = tmp_path / "t.jsonl"
        path.write_text(
            '{"t": 1, "run_id": "r", "event": "train.step", "step": 0}\n'
            '{"t": 2, "run_id": "r", "event" :"group.seal"}\n'
            '{"t": 3, "run_id": "r", "event": "attempt.seal", "note": "train.step"}\n'
        )
        got = [e["t"] for e in EventReader(path, kinds={"train.step", "group.seal"})]
        assert got == [1, 2]

    @settings(max_examples=200, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(
        events=st.lists(_event, max_size=25),
        junk=st.lists(st.binary(max_size=20), max_size=4),
        block=st.integers(1, 90),
        torn=st.booleans(),
    )
    def test_block_boundaries_change_nothing(
        self, tmp_path, monkeypatch, events, junk, block, torn
    ):
        """With reads of any size, every mode yields what a naive line split gives, with the
        same line numbers, and the same line count."""
        monkeypatch.setattr(blocks_module, "_CHUNK", block)
        raw = [orjson.dumps(e) for e in events] + [j.replace(b"\n", b"") for j in junk]
        body = b"\n".join(raw) + (b"" if torn else b"\n")
        assume(not body.startswith(b"\x1f\x8b"))  # gzip is detected by content: not plain text
        path = tmp_path / "t.jsonl"
        path.write_bytes(body)
        truth = []
        for n, line in enumerate(body.split(b"\n")[: len(raw)], 1):
            try:
                value = orjson.loads(line)
            except orjson.JSONDecodeError:
                continue
            if isinstance(value, dict):
                truth.append((n, value))
        kinds = {"train.step", "group.seal"}
        skips: list[int] = []
        everything = EventReader(path, on_skip=lambda n, why: skips.append(n))
        assert list(everything.numbered()) == truth
        lines = body.count(b"\n") + (1 if body and not body.endswith(b"\n") else 0)
        assert everything.lines == lines
        wanted = [(n, e) for n, e in truth if e.get("event") in kinds]
        assert list(EventReader(path, kinds=kinds, on_skip=lambda *a: None).numbered()) == wanted
        filtered = EventReader(path, kinds=kinds, on_skip=lambda *a: None)
        assert list(filtered) == [e for _, e in wanted] and filtered.lines == lines

    @settings(max_examples=150, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(data=st.binary(max_size=400))
    def test_any_bytes_never_raise(self, tmp_path, data):
        """Arbitrary bytes are events or counted skips, never an exception."""
        path = tmp_path / "t.jsonl"
        path.write_bytes(data)
        reader = EventReader(path, on_skip=lambda *a: None)
        events = list(reader)
        assert all(isinstance(e, dict) for e in events)
        assert reader.skipped <= reader.lines


class Narrow(msgspec.Struct):
    event: str
    t: float = 0.0
    note: str | None = None


class TestTypedReading:
    def test_a_struct_type_yields_structs_with_only_its_fields(self, tmp_path):
        """as_type= decodes each line into that Struct; other fields are dropped."""
        path = tmp_path / "t.jsonl"
        path.write_bytes(b'{"event":"a","t":1,"other":[1,2]}\n{"event":"b","note":"n"}\n')
        assert list(EventReader(path, as_type=Narrow)) == [
            Narrow("a", 1.0),
            Narrow("b", note="n"),
        ]

    def test_a_line_that_does_not_fit_is_skipped_with_its_number(self, tmp_path):
        """A wrong type or a missing required field skips that line only, and says why."""
        path = tmp_path / "t.jsonl"
        path.write_bytes(b'{"event":"a"}\n{"event":"b","t":"soon"}\n{"t":1}\n{"event":"c"}\n')
        seen: list[tuple[int, str]] = []
        reader = EventReader(path, as_type=Narrow, on_skip=lambda n, why: seen.append((n, why)))
        assert [e.event for e in reader] == ["a", "c"]
        assert [n for n, _ in seen] == [2, 3] and reader.lines == 4
        assert "not an event" in seen[0][1] and "$.t" in seen[0][1]

    @settings(max_examples=200, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(
        events=st.lists(_event, max_size=25),
        junk=st.lists(st.binary(max_size=20), max_size=4),
        block=st.integers(1, 120),
        torn=st.booleans(),
        bom=st.booleans(),
    )
    def test_typed_equals_dicts_converted(
        self, tmp_path, monkeypatch, events, junk, block, torn, bom
    ):
        """Whatever the block size, typed reading yields the dict reader's events that fit
        the type, converted, and counts the same lines."""
        monkeypatch.setattr(blocks_module, "_CHUNK", block)
        raw = [orjson.dumps(e) for e in events] + [j.replace(b"\n", b"") for j in junk]
        body = (b"\xef\xbb\xbf" if bom else b"") + b"\n".join(raw) + (b"" if torn else b"\n")
        assume(not body.startswith(b"\x1f\x8b"))
        path = tmp_path / "t.jsonl"
        path.write_bytes(body)
        expected = []
        for e in EventReader(path, on_skip=lambda *a: None):
            with contextlib.suppress(msgspec.ValidationError):
                expected.append(msgspec.convert(e, Narrow))
        typed = EventReader(path, as_type=Narrow, on_skip=lambda *a: None)
        got = [e for batch in typed.batches() for e in batch]
        assert got == expected
        assert typed.lines == body.count(b"\n") + (1 if body and not body.endswith(b"\n") else 0)

    @settings(max_examples=150, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(data=st.binary(max_size=400))
    def test_any_bytes_never_raise_typed(self, tmp_path, data):
        """Arbitrary bytes read as a Struct type are events or counted skips, never an error."""
        path = tmp_path / "t.jsonl"
        path.write_bytes(data)
        reader = EventReader(path, as_type=Narrow, on_skip=lambda *a: None)
        assert all(isinstance(e, Narrow) for e in reader)
        assert reader.skipped <= reader.lines


class TestEventsInMemory:
    def test_a_resume_with_a_snapshot_is_read_from_a_dict_as_from_its_line(self):
        """An attempt.resume whose snapshot is any JSON value is kept when the analyses are
        given dicts (read_events' output), as when they read the line itself."""
        from otel_rollout.events import from_line, from_object

        for snapshot in ("/ckpt/rollouts/step_7.json", {"step": 7, "calls": [1, 2]}, None, 3):
            event = {"t": 1.0, "run_id": "r", "event": "attempt.resume", "attempt_id": "a",
                     "group_id": "g", "prompt_id": 1, "generation_index": 0,
                     "weight_version": 8, "resumed_tokens": 141, "snapshot": snapshot}  # fmt: skip
            typed, why = from_object(event)
            assert why is None, why
            assert typed == from_line(orjson.dumps(event))[0]

    @pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
    @pytest.mark.parametrize("field", ["t", "batch_age", "duration_s"])
    def test_a_number_that_is_not_finite_is_refused_as_the_rules_refuse_it(self, field, value):
        """A NaN or infinity in a dict (no JSON line can hold one) is an error to the fast
        C path as to the schema's rules, and the reference functions skip it with the
        rules' words, not compute with it."""
        from otel_rollout.batch_age import batch_age_by_step
        from otel_rollout.events import from_object, problems
        from otel_rollout.schema import problems as rule_problems

        event = {"t": 1.0, "run_id": "r", "event": "train.step", "step": 0,
                 "trained_version": 1, "group_ids": ["g"], field: value}  # fmt: skip
        found = problems(event)
        assert found and found == rule_problems(event)
        typed, why = from_object(event)
        assert typed is None and why is not None and field in why
        assert f"(got {value!r})" in why  # not "null", which JSON would have written
        seal = {"t": 0.5, "run_id": "r", "event": "group.seal", "group_id": "g",
                "prompt_id": 1, "tokens": 4, "tokens_by_version": {"0": 4}}  # fmt: skip
        warned: list[str] = []
        ages = batch_age_by_step([seal, event], on_malformed=lambda e, why: warned.append(why))
        assert ages == {} and len(warned) == 1 and field in warned[0]


class TestWholeBlocks:
    """A block of whole lines is decoded in one call; any line that is not exactly one
    event sends it line by line, so the typed reader skips what validate rejects."""

    @pytest.mark.parametrize(
        "bad",
        [
            pytest.param(lambda a, b: [a + b"," + b], id="two-events-joined-by-a-comma"),
            pytest.param(lambda a, b: [a + b" " + b, b""], id="two-events-and-a-blank-line"),
            pytest.param(
                lambda a, b: [a[: a.index(b"group-") + 3], a[a.index(b"group-") + 3 :]],
                id="an-event-cut-inside-a-string",  # its group_id: it would still be an event
            ),
            pytest.param(
                lambda a, b: [a[: a.index(b',"event"')], a[a.index(b',"event"') :]],
                id="an-event-cut-between-fields",
            ),
        ],
    )
    def test_a_bad_line_in_a_block_is_skipped_with_its_number(self, tmp_path, bad, cli):
        """In a file of many blocks, a bad line amid good ones is skipped as validate says,
        with the line numbers validate gives, and the lines after it keep theirs."""
        b = TraceBuilder()
        for i in range(3000):
            b.event("group.admit", group_id=f"group-{i:05d}", prompt_id=i)
        lines = b.lines().splitlines()
        middle = 1500
        first, second = lines[middle], lines[middle + 1]
        body = lines[:middle] + bad(first, second) + lines[middle + 2 :]
        path = tmp_path / "t.jsonl"
        path.write_bytes(b"\n".join(body) + b"\n")
        skipped: list[int] = []
        reader = EventReader(path, typed=True, on_skip=lambda n, why: skipped.append(n))
        seen = {}
        for batch, where in reader.numbered_batches():
            numbers = range(where, where + len(batch)) if isinstance(where, int) else where
            for n, e in zip(numbers, batch, strict=True):
                seen[n] = getattr(e, "prompt_id", None)
        out = cli("validate", "--json", "--max-report", "100", str(path))
        problems = map(orjson.loads, out.stdout.splitlines())
        errors = sorted(p["line"] for p in problems if p.get("severity") == "error")
        assert errors and skipped == errors
        after = len(body)  # the last line keeps its number and prompt
        assert seen[after] == 2999 and reader.lines == after
