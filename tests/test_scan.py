"""The reader's line finder: the compiled scan equals the Python one, and readers give the
same events, line numbers and line counts with either."""

from __future__ import annotations

import os

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from otel_rollout import _blocks
from otel_rollout.reader import EventReader
from otel_rollout.testing import synthetic_trace

compiled = _blocks._compiled_scan
needs_compiled = pytest.mark.skipif(
    compiled is None and os.environ.get("CI") != "true",
    reason="the C scanner was not built here (no compiler when the package was installed)",
)

_NAMES = [b"group.seal", b"train.step", b"seal", b"a", b"ab", b'"event"']
_LINE = st.lists(
    st.one_of(st.sampled_from(_NAMES), st.binary(max_size=12).map(lambda b: b.replace(b"\n", b""))),
    max_size=4,
).map(b"".join)


@needs_compiled
def test_the_compiled_scan_was_built_under_ci():
    """CI installs with a compiler: the C scanner is what its readers run."""
    assert compiled is not None


@needs_compiled
@settings(max_examples=400)
@given(
    lines=st.lists(_LINE, max_size=12),
    trailing=st.booleans(),
    cut=st.tuples(st.integers(0, 400), st.integers(0, 400)),
    needles=st.lists(st.sampled_from(_NAMES), min_size=1, max_size=4, unique=True),
    first=st.booleans(),
)
def test_compiled_scan_equals_python_scan(lines, trailing, cut, needles, first):
    """On any block, any window of it and any needles, C and Python find the same lines at
    the same offsets and count the same newlines."""
    chunk = b"\n".join(lines) + (b"\n" if trailing and lines else b"")
    start, end = sorted(min(c, len(chunk)) for c in cut)
    pattern = tuple(needles)
    assert compiled(chunk, start, end, pattern, first) == _blocks.python_scan(
        chunk, start, end, pattern, first
    )


@needs_compiled
def test_compiled_scan_refuses_what_it_cannot_search():
    """A window outside the block, or a needle with a newline, is an error, not a wrong
    answer (the Python wrapper never passes a newline: it searches those itself)."""
    with pytest.raises(ValueError):
        compiled(b"abc\n", 0, 9, (b"a",), False)
    with pytest.raises(ValueError):
        compiled(b"abc\n", 0, 4, (b"c\na",), False)
    assert _blocks.scan(b"abc\nabd\n", 0, 8, (b"c\na",), False) == ([(0, b"abc")], 2)


@pytest.fixture(params=["compiled", "python"])
def scanner(request, monkeypatch):
    """Readers run with the compiled scan, then with the Python one."""
    if request.param == "compiled":
        if compiled is None:
            pytest.skip("the C scanner was not built here")
    else:
        monkeypatch.setattr(_blocks, "_compiled_scan", None)
    return request.param


def test_few_kinds_read_the_same_with_either_scan(tmp_path, scanner):
    """A synthetic multi-run trace read for seals and steps gives the events and line
    numbers that reading every line and keeping those kinds gives."""
    path = tmp_path / "t.jsonl"
    synthetic_trace(path, 6_000, runs=3)
    kinds = {"group.seal", "train.step"}
    wanted = [(n, e) for n, e in EventReader(path).numbered() if e["event"] in kinds]
    reader = EventReader(path, kinds=kinds)
    assert list(reader.numbered()) == wanted and wanted
    assert reader.lines == len(path.read_bytes().splitlines())


@settings(max_examples=100, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    kinds_on_lines=st.lists(
        st.sampled_from(["group.seal", "train.step", "attempt.seal", "group.admit"]), max_size=40
    ),
    block=st.integers(1, 300),
)
def test_any_block_size_finds_the_same_lines(tmp_path, monkeypatch, scanner, kinds_on_lines, block):
    """With reads of any size (lines split across blocks), the few-kinds read finds each
    wanted line once, with its number."""
    monkeypatch.setattr(_blocks, "_CHUNK", block)
    lines = [
        orjson.dumps({"t": i, "run_id": "r", "event": k, "note": "train.step" if i % 3 else ""})
        for i, k in enumerate(kinds_on_lines)
    ]
    path = tmp_path / "t.jsonl"
    path.write_bytes(b"".join(line + b"\n" for line in lines))
    kinds = {"group.seal", "train.step"}
    got = [(n, e["t"]) for n, e in EventReader(path, kinds=kinds).numbered()]
    assert got == [(i + 1, i) for i, k in enumerate(kinds_on_lines) if k in kinds]
