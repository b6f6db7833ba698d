"""LiveTrace: a file fed in pieces across looks ends where one fresh pass over it ends."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from otel_rollout.analysis import StepAges, run_file
from otel_rollout.cost import CostAnalysis
from otel_rollout.live import LiveFigures, LiveTrace
from otel_rollout.reader import EventReader
from otel_rollout.render.live import frame_lines

# Lines a hostile or damaged file holds: a torn line (a killed writer), not JSON, an event
# breaking a rule, blank, a kind this version does not know, a step naming unsealed groups.
BAD_LINES = [
    b'{"t":1796132410.6,"run_id":"dead","event":"attempt.dispatch","attempt_id":"a',
    b"not json at all",
    b'{"t":1.0,"run_id":"x","event":"group.seal","group_id":"g","prompt_id":-1,"tokens":3}',
    b"",
    b'{"t":1.0,"run_id":"x","event":"some.future.kind"}',
    b'{"t":1.0,"run_id":"x","event":"train.step","step":99,"trained_version":1,'
    b'"group_ids":["never-sealed"]}',
]


@pytest.fixture
def demo_lines(demo_trace: Path) -> list[bytes]:
    """The lines of a real demo run's trace (killed twice with SIGKILL and resumed)."""
    return demo_trace.read_bytes().split(b"\n")[:-1]


def fresh_pass(path: Path) -> tuple[list, list]:
    """Every result and warning of one pass over the file, as the read commands make it."""
    warnings: list = []
    results = run_file(
        path,
        [LiveFigures(), StepAges(), CostAnalysis()],
        on_warning=lambda where, why: warnings.append((where, why)),
    )
    return results, warnings


def state_of(trace: LiveTrace) -> dict:
    s = trace.engine.state
    return {
        "runs": s.runs, "attempts": s.attempts, "groups": s.groups, "seals": s.seals,
        "steps": s.steps, "trained": s.trained, "epochs": s.epochs,
    }  # fmt: skip


@settings(max_examples=40)
@given(data=st.data())
def test_pieces_at_any_byte_give_one_passs_state_and_results(demo_trace, tmp_path_factory, data):
    """Cut at arbitrary byte offsets (mid-line too), with damaged lines mixed in, the file
    read look by look has the state, results and warnings of one fresh pass."""
    lines = demo_trace.read_bytes().split(b"\n")[:-1]
    for bad in data.draw(st.lists(st.sampled_from(BAD_LINES), max_size=4)):
        lines.insert(data.draw(st.integers(0, len(lines))), bad)
    content = b"".join(line + b"\n" for line in lines)
    end = data.draw(st.sampled_from([len(content), data.draw(st.integers(0, len(content)))]))
    content = content[:end]  # maybe ending mid-line, as a growing file does
    cuts = sorted(set(data.draw(st.lists(st.integers(0, end), max_size=25))))
    where = tmp_path_factory.mktemp("pieces")
    path = where / "rollout_trace.jsonl"
    path.touch()
    seen: list = []
    trace = LiveTrace(path, on_warning=lambda w, why: seen.append((w, why)))
    with open(path, "ab") as out:
        for a, b in zip([0, *cuts], [*cuts, end], strict=True):
            out.write(content[a:b])
            out.flush()
            trace.read()
            trace.frame()  # a refresh: the cost and the view are asked for between pieces
    whole = where / "whole.jsonl"  # what one pass reads: the complete lines
    whole.write_bytes(content[: content.rfind(b"\n") + 1])
    results, warnings = fresh_pass(whole)
    assert trace.results() == results
    # The same warnings; within a piece, a skipped line is reported as the piece is decoded,
    # before the pass warns about an earlier line's step, so they are compared by line.
    assert sorted(seen, key=str) == sorted(warnings, key=str)
    reference = LiveTrace(whole)
    reference.read(budget=60)
    assert state_of(trace) == state_of(reference)
    assert trace.frame().partial == len(content) - len(whole.read_bytes())
    trace.close()
    reference.close()


def test_a_truncated_or_replaced_file_is_read_again_and_said(demo_lines, tmp_path):
    """Truncating the file, or putting another in its place, starts a fresh pass over it
    and puts a note on the screen."""
    path = tmp_path / "rollout_trace.jsonl"
    path.write_bytes(b"".join(line + b"\n" for line in demo_lines))
    trace = LiveTrace(path)
    trace.read(budget=60)
    assert trace.frame().runs == 3
    half = demo_lines[: len(demo_lines) // 3]
    path.write_bytes(b"".join(line + b"\n" for line in half))  # truncated in place
    trace.read(budget=60)
    half_path = tmp_path / "half.jsonl"
    half_path.write_bytes(path.read_bytes())
    assert trace.results() == fresh_pass(half_path)[0]
    assert "truncated or replaced" in trace.frame().notes[-1]
    shown = dict(frame_lines(trace.frame()))  # and the screen says so
    assert "truncated or replaced" in shown["note"]
    os.rename(path, tmp_path / "old.jsonl")  # rotated: a new file at the path
    path.write_bytes(b"".join(line + b"\n" for line in demo_lines[:50]))
    trace.read(budget=60)
    trace.read(budget=60)
    assert len(trace.frame().notes) == 2 and trace.frame().lines == 50
    trace.close()


def test_a_file_that_appears_later_is_waited_for(tmp_path):
    """A path with no file yet is a frame that says it waits, then the file is read."""
    path = tmp_path / "rollout_trace.jsonl"
    trace = LiveTrace(path)
    trace.read()
    frame = trace.frame()
    assert not frame.exists and frame.lines == 0 and frame.step is None
    path.write_bytes(b'{"t":1.0,"run_id":"r","event":"run.start","schema":1,"pid":1}\n')
    trace.read()
    assert trace.frame().run_id == "r"
    trace.close()


def test_a_line_over_the_limit_is_skipped_with_the_readers_words_however_it_arrives(
    demo_lines, tmp_path, monkeypatch
):
    """A line over OTEL_ROLLOUT_MAX_LINE_BYTES, begun in one read and ended in the next
    (first under the limit, then over it; or past it at once), is skipped with its length
    as the reader says it, and its event is not read."""
    limit = max(len(line) for line in demo_lines) + 10
    monkeypatch.setenv("OTEL_ROLLOUT_MAX_LINE_BYTES", str(limit))
    event = demo_lines[1][:-1] + b',"pad":"' + b"x" * limit + b'"}'  # still a valid event
    for split in (limit // 2, limit + 5):  # held back, then completed; passed over
        path = tmp_path / f"rollout_trace{split}.jsonl"
        path.write_bytes(demo_lines[0] + b"\n" + event[:split])
        seen: list = []
        trace = LiveTrace(path, on_warning=lambda w, why, seen=seen: seen.append((w, why)))
        trace.read()
        with open(path, "ab") as out:
            out.write(event[split:] + b"\n" + demo_lines[2] + b"\n")
        trace.read()
        why = f"a line of {len(event):,} bytes, over the limit of {limit:,}"
        assert seen == [(2, f"{why} (OTEL_ROLLOUT_MAX_LINE_BYTES); skipped")]
        assert trace.reader.events == 2 and trace.frame().lines == 3
        trace.close()


def test_in_flight_is_the_current_runs_work(tmp_path):
    """Groups a killed run left untrained are lost at its stop, not in flight: the view's
    groups in flight are the current run's (cost counts the others as lost at a stop)."""
    lines = [
        '{"t":1.0,"run_id":"A","event":"group.reserve","group_id":"a1","prompt_id":1,"size":1,'
        '"weight_version":0}',
        '{"t":1.1,"run_id":"A","event":"group.seal","group_id":"a1","prompt_id":1,"tokens":5}',
        '{"t":1.2,"run_id":"A","event":"group.reserve","group_id":"a2","prompt_id":2,"size":1,'
        '"weight_version":0}',
        '{"t":5.0,"run_id":"B","event":"group.reserve","group_id":"b1","prompt_id":3,"size":1,'
        '"weight_version":0}',
        '{"t":5.1,"run_id":"B","event":"group.seal","group_id":"b1","prompt_id":3,"tokens":7}',
    ]
    path = tmp_path / "rollout_trace.jsonl"
    path.write_text("".join(line + "\n" for line in lines))
    trace = LiveTrace(path)
    trace.read(budget=60)
    frame = trace.frame()
    assert (frame.groups_in_flight, frame.groups_sealed) == (1, 1)
    shown = dict(frame_lines(frame))
    said = "0 attempts · 1 group reserved, not yet trained (1 of them sealed)"
    assert shown["in flight"].startswith(said)
    trace.close()


def test_a_short_limit_skips_every_longer_line_as_the_file_reader_does(demo_lines, tmp_path,
                                                                      monkeypatch):  # fmt: skip
    """With a limit shorter than a read, a longer line within one read is skipped by the live
    view with the line number and words the file reader gives it, not read as an event."""
    limit = sorted(len(line) for line in demo_lines)[len(demo_lines) // 2]  # half are longer
    monkeypatch.setenv("OTEL_ROLLOUT_MAX_LINE_BYTES", str(max(limit, 200)))
    path = tmp_path / "rollout_trace.jsonl"
    path.write_bytes(b"".join(line + b"\n" for line in demo_lines[:300]))
    from_file: list = []
    reader = EventReader(path, typed=True, on_skip=lambda n, why: from_file.append((n, why)))
    events = sum(len(batch) for batch, _ in reader.numbered_batches())
    seen: list = []
    trace = LiveTrace(path, on_warning=lambda w, why: seen.append((w, why)))
    trace.read()
    assert from_file and seen == [(n, f"{why}; skipped") for n, why in from_file]
    assert trace.reader.events == events
    trace.close()
