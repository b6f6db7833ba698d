"""Odd but possible lines read alike by every path: ``validate``, the file readers (whole
blocks, line by line, lines found by kind in C or Python) and dicts in memory."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import orjson
import pytest

from otel_rollout import _blocks, events
from otel_rollout.analysis import StepAges, run_file
from otel_rollout.cost import analyze_file
from otel_rollout.live_age import LiveBatchAge
from otel_rollout.reader import EventReader, read_events
from otel_rollout.trace import batch_age_by_step

START = {"t": 1.0, "run_id": "r1", "event": "run.start", "schema": 1, "pid": 1}


def seal(group: str, counts: dict[str, int], t: float = 5.0) -> dict:
    total = sum(counts.values())
    return {"t": t, "run_id": "r1", "event": "group.seal", "group_id": group, "prompt_id": 1,
            "tokens": total, "tokens_by_version": counts}  # fmt: skip


def step(n: int, groups: list[str], t: float = 6.0) -> dict:
    return {"t": t, "run_id": "r1", "event": "train.step", "step": n, "trained_version": 2,
            "group_ids": groups}  # fmt: skip


def write(path: Path, lines: list[bytes]) -> Path:
    path.write_bytes(b"".join(line + b"\n" for line in lines))
    return path


def validate(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "otel_rollout", "validate", str(path)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


@pytest.fixture(params=["C", "Python"])
def scanner(request, monkeypatch):
    """Lines found by kind with the compiled scan (if built) and with the Python one."""
    if request.param == "Python":
        monkeypatch.setattr(_blocks, "_compiled_scan", None)
    elif _blocks._compiled_scan is None:
        pytest.skip("the C scan is not built")
    return request.param


def test_a_kind_written_with_an_escape_is_read_by_every_path(tmp_path, scanner) -> None:
    """``"group\\u002eseal"`` is a group.seal: reading by kind finds it as reading all does."""
    line = orjson.dumps(seal("g1", {"0": 10})).replace(b"group.seal", b"group\\u002eseal")
    path = write(tmp_path / "t.jsonl", [orjson.dumps(START), line, orjson.dumps(step(1, ["g1"]))])
    assert batch_age_by_step(read_events(path)) == {1: 2.0}  # read by kind
    assert batch_age_by_step(list(read_events(path))) == {1: 2.0}  # every line
    assert validate(path).returncode == 0


def test_a_line_holding_two_rows_is_skipped_in_a_whole_block(tmp_path) -> None:
    """A line ``{...}],[{...}`` is no JSON value: skipped in a block decoded at once too, and
    the lines after it keep their numbers."""
    steps = [orjson.dumps(step(n, [])) for n in range(3000)]  # several 128 KB blocks
    steps[1] = steps[1] + b"],[" + orjson.dumps(step(99_999, []))
    path = write(tmp_path / "t.jsonl", [orjson.dumps(START), *steps])
    skipped: list[tuple[int, str]] = []
    reader = EventReader(path, typed=True, on_skip=lambda n, why: skipped.append((n, why)))
    numbered = []
    for batch, where in reader.numbered_batches():
        numbers = range(where, where + len(batch)) if isinstance(where, int) else where
        numbered += zip(numbers, batch, strict=True)
    assert [n for n, _ in skipped] == [3] and "trailing characters" in skipped[0][1]
    assert reader.lines == 3001
    assert all(getattr(e, "step", None) != 99_999 for _, e in numbered)
    assert numbered[-1][0] == 3001 and numbered[-1][1].step == 2999
    assert "line 3" in validate(path).stdout.replace(":3:", "line 3")


@pytest.mark.parametrize("pad", [0, 3000], ids=["alone", "in a block decoded at once"])
@pytest.mark.parametrize("key", [b'"-0"', b'"\\u002d0"', b'"-\\u0030"'])
def test_a_signed_version_key_is_skipped_by_every_reader(tmp_path, scanner, key, pad) -> None:
    """A version key ``"-0"`` (msgspec alone would read it as 0) is an error to ``validate``
    and skipped by every reader, however the minus is written, wherever it stands."""
    line = orjson.dumps(seal("g1", {"0": 10})).replace(b'"0"', key)
    filler = [orjson.dumps(step(1000 + n, [])) for n in range(pad)]
    lines = [orjson.dumps(START), *filler, line, *filler, orjson.dumps(step(1, ["g1"]))]
    path = write(tmp_path / "t.jsonl", lines)
    assert validate(path).returncode == 1
    ages = {n: None for n in range(1000, 1000 + pad)}
    assert {**batch_age_by_step(read_events(path)), **ages} == ages  # read by kind
    assert {**batch_age_by_step(list(read_events(path))), **ages} == ages  # dicts
    typed = [e.event for batch in EventReader(path, typed=True).batches() for e in batch]
    assert "group.seal" not in typed and len(typed) == 2 + 2 * pad  # every line, typed


def test_a_step_naming_a_group_twice_is_an_error_everywhere(tmp_path) -> None:
    """A step naming a group twice would count its tokens twice: ``validate`` calls it an
    error, every reader skips it, and the ledger still balances."""
    attempt = {"run_id": "r1", "attempt_id": "a1", "group_id": "g1", "prompt_id": 1,
               "generation_index": 0}  # fmt: skip
    lines = [
        START,
        {"t": 2.0, "event": "attempt.dispatch", "weight_version": 0, **attempt},
        {"t": 3.0, "event": "attempt.seal", "tokens": 10, **attempt},
        seal("g1", {"0": 10}),
        step(1, ["g1", "g1"]),
    ]
    path = write(tmp_path / "t.jsonl", [orjson.dumps(e) for e in lines])
    checked = validate(path)
    assert checked.returncode == 1 and "group_ids names g1 more than once" in checked.stdout
    assert batch_age_by_step(read_events(path)) == {}
    assert batch_age_by_step(lines) == {}
    ledger = analyze_file(path).ledger
    assert ledger["generated"] == ledger["pending"] == 10 and ledger["trained"] == 0


def test_dicts_in_memory_take_int_version_keys_and_report_a_bad_kind() -> None:
    """Int version keys (what a refit's cuts give) are read; a kind that is no string is
    reported as ``event N``, never raised."""
    assert batch_age_by_step([seal("g1", {1: 5}), step(0, ["g1"])]) == {0: 1.0}  # type: ignore[dict-item]
    said: list[tuple[object, str]] = []
    assert (
        batch_age_by_step(
            [{**START, "event": ["x"]}], on_malformed=lambda e, p: said.append((e, p))
        )
        == {}
    )
    assert said == [
        ({"where": "event 1"}, "field 'event' must be a non-empty string (got [\"x\"]); skipped")
    ]
    live: list[str] = []
    watcher = LiveBatchAge(on_malformed=lambda e, p: live.append(p))
    watcher.observe({**START, "event": ["x"]})
    assert live and "field 'event'" in live[0]
    watcher.observe(seal("g1", {1: 5}))  # type: ignore[dict-item]
    assert watcher.observe(step(0, ["g1"])) is not None


def test_events_in_memory_are_numbered_past_the_kinds_not_read() -> None:
    """A warning names the event by its place in the whole list, counting the events of
    kinds batch age does not read."""
    reserve = {"t": 2.0, "run_id": "r1", "event": "group.reserve", "group_id": "g", "prompt_id": 1,
               "size": 1, "weight_version": 0}  # fmt: skip
    said: list[object] = []
    batch_age_by_step([START, reserve, step(0, ["zz"])], on_malformed=lambda e, p: said.append(e))
    assert said == [{"where": "event 3"}]


def test_a_first_line_of_an_unknown_kind_is_still_a_trace(tmp_path, cli) -> None:
    """A file from a newer writer, whose first line is a kind this version does not know,
    is read (``validate`` warns of the kind), not refused as "not a trace file"."""
    first = {"t": 0.5, "run_id": "r1", "event": "run.meta"}
    lines = [first, START, seal("g1", {"0": 10}), step(1, ["g1"])]
    path = write(tmp_path / "t.jsonl", [orjson.dumps(e) for e in lines])
    for command in ("batch-age", "cost", "staleness"):
        proc = cli(command, str(path))
        assert proc.returncode == 0 and "not a trace file" not in proc.stderr, command
    assert validate(path).returncode == 0


@pytest.mark.parametrize("how", ["typed", "dicts", "by kind"])
def test_a_short_line_limit_skips_every_longer_line_wherever_it_stands(tmp_path, how) -> None:
    """With a limit shorter than a read, each longer line (newline aside) is skipped with its
    own number, not only one that crosses a read; a last line with no newline too."""
    lines = [orjson.dumps(START)]
    for n in range(4000):  # several reads; every seventh step is long
        pad = {"pad": "x" * 400} if n % 7 == 3 else {}
        lines.append(orjson.dumps({**step(n, []), **pad}))
    path = write(tmp_path / "t.jsonl", lines)
    lines.append(orjson.dumps({**step(9999, []), "pad": "x" * 400}))  # last, no newline
    path.write_bytes(path.read_bytes() + lines[-1])
    long = [i + 1 for i, line in enumerate(lines) if len(line) > 300]  # newlines aside
    skipped: list[int] = []
    options = {"typed": {"typed": True}, "dicts": {}, "by kind": {"kinds": {"train.step"}}}[how]
    reader = EventReader(path, max_line_bytes=300, on_skip=lambda n, why: skipped.append(n),
                         **options)  # type: ignore[arg-type]  # fmt: skip
    got = [e["step"] if isinstance(e, dict) else e.step for e in reader if
           (e["event"] if isinstance(e, dict) else e.event) == "train.step"]  # fmt: skip
    assert skipped == long and len(long) == len(range(3, 4000, 7)) + 1
    assert got == [n for n in range(4000) if n % 7 != 3]
    assert reader.lines == len(lines)


def test_control_characters_from_a_trace_never_reach_the_terminal(tmp_path, cli) -> None:
    """A group or run ID holding ESC ] 0 ; ... BEL (which retitles a terminal) is shown
    escaped in warnings, errors, tables and the watch screen."""
    evil = "g\x1b]0;PWNED\x07"
    run = {"run_id": "r\x1b[2J"}
    lines = [{**START, **run}, {**step(1, [evil]), **run}, {**step(2, [evil, evil]), **run}]
    path = write(tmp_path / "t.jsonl", [orjson.dumps(e) for e in lines])
    for args in (("batch-age", "--full-ids"), ("cost",), ("staleness",), ("watch", "--once"),
                 ("validate",)):  # fmt: skip
        proc = cli(*args, str(path))
        shown = proc.stdout + proc.stderr
        assert proc.returncode == (1 if args == ("validate",) else 0), (args, proc.stderr)
        assert "\x1b" not in shown and "\x07" not in shown, args
    assert "g\\x1b]0;PWNED\\x07" in cli("batch-age", str(path)).stderr


def test_a_number_past_a_float_is_named_alike_by_validate_and_the_readers(tmp_path, cli):
    """``1e400`` is JSON but no event's number: ``validate`` and every reader say so in the
    same words, without msgspec's ``$[...]`` path."""
    line = orjson.dumps({**START, "event": "group.admit", "group_id": "g", "prompt_id": 1})
    path = write(
        tmp_path / "t.jsonl", [orjson.dumps(START), line.replace(b'"t":1.0', b'"t":1e400')]
    )
    words = "t.jsonl:2: error: not an event: number out of range (past a float)"
    assert words in validate(path).stdout
    for command in ("cost", "staleness"):  # (batch-age passes a group.admit over unread)
        said = cli(command, str(path)).stderr
        assert "t.jsonl:2: not an event: number out of range (past a float); skipped" in said
        assert "$[" not in said


def test_a_traceback_keeps_its_lines_while_its_message_is_escaped() -> None:
    """The CLI's log line escapes a message's control characters, but a logged exception's
    traceback stays on its own lines."""
    import logging
    import sys

    from otel_rollout._reference import _OneLine

    try:
        raise ZeroDivisionError("x")
    except ZeroDivisionError:
        exc_info = sys.exc_info()
    record = logging.LogRecord("otel_rollout", logging.ERROR, __file__, 1, "boom \x1b[2J",
                               None, exc_info)  # fmt: skip
    shown = _OneLine("otel-rollout: %(levelname)s: %(message)s").format(record)
    assert shown.startswith("otel-rollout: ERROR: boom \\x1b[2J\nTraceback (most recent call")
    assert "\x1b" not in shown


def test_reading_a_few_kinds_says_nothing_of_other_kinds_lines_with_a_backslash(tmp_path, scanner):
    """A reader of seals and steps warns of no other kind's bad line, backslash or not (a
    backslash makes a line a candidate for an escaped kind); an escaped seal's is warned of."""
    bad_seal = {"t": 3.0, "run_id": "r1", "event": "attempt.seal", "attempt_id": "a\\b",
                "group_id": "g1", "prompt_id": 1, "generation_index": 0, "tokens": -1}  # fmt: skip
    escaped = orjson.dumps({**seal("g2", {"0": 10}), "tokens": -10})
    escaped = escaped.replace(b"group.seal", b"group\\u002eseal")
    lines = [orjson.dumps(START), orjson.dumps(bad_seal), b"not json \\ at all", escaped,
             orjson.dumps(step(1, []))]  # fmt: skip
    path = write(tmp_path / "t.jsonl", lines)
    said: list[int] = []
    batch_age_by_step(read_events(path), on_malformed=lambda e, why: said.append(e["where"]))
    assert said == [4]
    assert validate(path).stdout.count(": error:") == 3  # validate reads every line


def test_a_kinds_name_in_another_field_does_not_make_a_few_kinds_reader_warn(tmp_path, scanner):
    """An invalid ``attempt.dispatch`` whose group_id holds the text ``group.seal`` is found
    by a seal reader's search and then passed over in silence, as the same line with
    another group_id is; a reader of every kind warns of both."""
    bad = {"t": 1.0, "run_id": "r1", "event": "attempt.dispatch", "attempt_id": "a",
           "prompt_id": 1, "generation_index": 0, "weight_version": -1}  # fmt: skip
    lines = [orjson.dumps(START), orjson.dumps({**bad, "group_id": "x-group.seal"}),
             orjson.dumps({**bad, "group_id": "y"}), orjson.dumps(step(1, []))]  # fmt: skip
    path = write(tmp_path / "t.jsonl", lines)
    said: list[int] = []
    batch_age_by_step(read_events(path), on_malformed=lambda e, why: said.append(e["where"]))
    assert said == []
    warned: list[int | str] = []
    run_file(path, [StepAges()], on_warning=lambda where, why: warned.append(where))
    assert warned == []
    every: list[int | str] = []
    analyze_file(path, on_warning=lambda where, why: every.append(where))
    assert every == [2, 3]


def test_a_file_of_blank_lines_is_an_empty_trace(tmp_path, cli):
    """Blank lines are passed over: a file of only blank lines reads as an empty file does
    (exit 0), not as "not a trace file"."""
    path = tmp_path / "t.jsonl"
    path.write_bytes(b"\n\r\n\n")
    for command in ("batch-age", "cost", "staleness", "validate"):
        proc = cli(command, str(path))
        assert proc.returncode == 0 and "not a trace" not in proc.stderr, (command, proc.stderr)


def test_every_view_shows_the_counts_age_over_the_logged_one(tmp_path):
    """A step whose logged live ``batch_age`` (7.5) disagrees with its groups' counts (age
    1.0) shows 1.0 in batch-age, the report's chart and cost's means alike; a step whose
    groups carry no counts shows its logged value where a view can show one."""
    from otel_rollout.cost import analyze
    from otel_rollout.report import collect
    from otel_rollout.testing import TraceBuilder

    b = TraceBuilder(run_id="A")
    b.sealed_group("g", {0: 5})
    b.event("train.step", step=0, trained_version=1, group_ids=["g"], batch_age=7.5)
    b.event("group.seal", group_id="h", prompt_id=1, tokens=4)  # no counts
    b.event("train.step", step=1, trained_version=2, group_ids=["h"], batch_age=2.5)
    assert batch_age_by_step(b.events) == {0: 1.0}
    assert [age for _, _, _, age in collect(b.events).steps] == [1.0, 2.5]
    b.events.append({"t": 99.0, "run_id": "B", "event": "run.start", "schema": 1, "pid": 2})
    [boundary] = analyze(b.events).report()["boundaries"]
    assert boundary["batch_age_before"] == (1.0 + 2.5) / 2


def test_a_seal_after_the_step_that_trained_it_is_warned_of_alike(tmp_path, cli):
    """A group sealed after a train.step trained it (the views' counts then differ for
    that step) gets the same warning, on the same line, from validate and batch-age."""
    lines = [orjson.dumps(START), orjson.dumps(seal("g1", {"0": 10})),
             orjson.dumps(step(0, ["g1"])), orjson.dumps(seal("g1", {"1": 10}))]  # fmt: skip
    path = write(tmp_path / "t.jsonl", lines)
    said = "group g1 is sealed after a train.step trained it"
    checked = validate(path)
    assert f"{path}:4: warning: {said}" in checked.stdout
    read = cli("batch-age", str(path))
    assert read.returncode == 0 and f"{path}:4: {said}" in read.stderr


def test_an_integer_past_pythons_digit_limit_is_named_alike(tmp_path, cli):
    """A version of 4,301 digits (past what Python reads from text) is "not an event" in
    the same words from validate and the readers, which name the limit, not a float."""
    reserve = {**START, "event": "group.reserve", "group_id": "g", "prompt_id": 1, "size": 1,
               "weight_version": 7}  # fmt: skip
    line = orjson.dumps(reserve).replace(b'"weight_version":7', b'"weight_version":1' + b"0" * 4300)
    path = write(tmp_path / "t.jsonl", [orjson.dumps(START), line])
    words = "not an event: an integer of more than 4,300 digits (Python's limit)"
    assert f"t.jsonl:2: error: {words}" in validate(path).stdout
    assert f"t.jsonl:2: {words}; skipped" in cli("cost", str(path)).stderr


def test_lines_too_long_to_read_do_not_make_a_file_no_trace(tmp_path):
    """A trace whose lines are all over ``OTEL_ROLLOUT_MAX_LINE_BYTES`` is warned of line
    by line and read as empty (exit 0), not called "not a trace file": a line too long to
    read says nothing of whether it is an event."""
    path = write(tmp_path / "t.jsonl", [orjson.dumps(START), orjson.dumps(step(0, ["g"]))])
    env = {**os.environ, "OTEL_ROLLOUT_MAX_LINE_BYTES": "20"}
    for command in ("batch-age", "cost"):
        proc = subprocess.run([sys.executable, "-m", "otel_rollout", command, str(path)],
                              capture_output=True, text=True, env=env, timeout=60)  # fmt: skip
        assert proc.returncode == 0, (command, proc.stderr)
        assert "not a trace" not in proc.stderr and "over the limit of 20" in proc.stderr


def test_a_line_that_is_json_but_no_object_is_named_by_its_json_type(tmp_path, cli):
    """``null``, a string and an array on a line are named by JSON's words, not Python's
    (``NoneType``, ``str``, ``list``), by validate and the readers alike."""
    path = write(tmp_path / "t.jsonl", [orjson.dumps(START), b"null", b'"x"', b"[1]"])
    checked, read = validate(path).stdout, cli("cost", str(path)).stderr
    for n, name in ((2, "null"), (3, "string"), (4, "array")):
        assert f":{n}: error: a JSON {name}, not an object" in checked
        assert f":{n}: is a JSON {name}, not an object; skipped" in read
    assert "NoneType" not in checked + read


def test_a_warning_about_events_in_memory_reads_as_a_sentence(caplog):
    """Events handed in as dicts are warned of as ``events in memory, event N: …``."""
    with caplog.at_level("WARNING", logger="otel_rollout"):
        batch_age_by_step([START, {"t": 2, "run_id": "r1", "event": "train.step", "step": -1}])
    [said] = [r.getMessage() for r in caplog.records]
    assert said.startswith("events in memory, event 2: train.step: field 'step'")


def test_a_signed_version_key_is_skipped_in_a_thread_of_its_own(tmp_path) -> None:
    """The count of version keys 0 is kept by thread: a reader in a new thread (whose count
    starts at the class's 0) skips a ``"-0"`` key too, and the main thread's count stays."""
    line = orjson.dumps(seal("g1", {"0": 10})).replace(b'"0"', b'"-0"')
    path = write(tmp_path / "t.jsonl", [orjson.dumps(START), line, orjson.dumps(step(1, ["g1"]))])
    before = events.zero_keys()
    found: list[Any] = []
    reader = threading.Thread(
        target=lambda: found.append(
            [e.event for batch in EventReader(path, typed=True).batches() for e in batch]
        )
    )
    reader.start()
    reader.join()
    assert found == [["run.start", "train.step"]]
    assert events.zero_keys() == before
