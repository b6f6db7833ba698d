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


#: Each way the C scanner can run here: one pass for every needle in 32- or 16-byte
#: vector steps, and one memmem pass a needle (the way without SSE2, or past 8 needles).
_WAYS = ["once-32", "once-16", "each"]


@pytest.fixture(params=_WAYS)
def c_scan(request):
    """The compiled scan, run each way this machine can; the width is put back after."""
    if compiled is None:
        pytest.skip("the C scanner was not built here")
    from otel_rollout import _scan

    way = request.param
    before = _scan.vector_width()
    if way == "each":
        yield _scan.scan_each
        return
    width = int(way.split("-")[1])
    if before == 0 or (width == 32 and before != 32):
        pytest.skip(f"this machine runs no {width}-byte vector steps")
    _scan.vector_width(width)
    try:
        yield _scan.scan
    finally:
        _scan.vector_width(before)


@needs_compiled
def test_the_widest_vector_steps_are_the_default():
    """On a machine with AVX2 the scanner takes 32 bytes a step, else 16 (x86-64)."""
    import platform

    from otel_rollout import _scan

    if platform.machine() not in ("x86_64", "AMD64") or not os.path.exists("/proc/cpuinfo"):
        pytest.skip("the widths are known here only on x86-64 Linux")
    with open("/proc/cpuinfo") as f:
        avx2 = " avx2" in f.read()
    assert _scan.vector_width() == (32 if avx2 else 16)


@needs_compiled
@settings(max_examples=400, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    lines=st.lists(_LINE, max_size=12),
    trailing=st.booleans(),
    cut=st.tuples(st.integers(0, 400), st.integers(0, 400)),
    needles=st.lists(st.sampled_from(_NAMES), min_size=1, max_size=4, unique=True),
    first=st.booleans(),
)
def test_compiled_scan_equals_python_scan(c_scan, lines, trailing, cut, needles, first):
    """On any block, any window of it and any needles, C and Python find the same lines at
    the same offsets and count the same newlines."""
    chunk = b"\n".join(lines) + (b"\n" if trailing and lines else b"")
    start, end = sorted(min(c, len(chunk)) for c in cut)
    pattern = tuple(needles)
    assert c_scan(chunk, start, end, pattern, first) == _blocks.python_scan(
        chunk, start, end, pattern, first
    )


_KINDS = [b"group.seal", b"train.step", b"run.start", b"\\", b"ab", b"a", b"seal", b"z" * 40]
_FILLER = st.binary(max_size=90).map(lambda b: b.replace(b"\n", b""))
_LONG_LINE = st.lists(st.one_of(_FILLER, st.sampled_from(_KINDS)), max_size=6).map(b"".join)


@needs_compiled
@settings(max_examples=300, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    lines=st.lists(_LONG_LINE, max_size=30),
    trailing=st.booleans(),
    cut=st.tuples(st.integers(0, 4000), st.integers(0, 4000)),
    needles=st.lists(st.sampled_from(_KINDS), min_size=1, max_size=9, unique=True),
    first=st.booleans(),
)
def test_vector_steps_find_what_python_finds_in_long_lines(
    c_scan, lines, trailing, cut, needles, first
):
    """Lines long enough for many vector steps, needles anywhere in them (across a step's
    edge, at a window's end, two on one line), up to nine needles (past the eight one
    pass takes): C finds the lines Python finds, and counts the same newlines."""
    chunk = b"\n".join(lines) + (b"\n" if trailing and lines else b"")
    start, end = sorted(min(c, len(chunk)) for c in cut)
    pattern = tuple(needles)
    assert c_scan(chunk, start, end, pattern, first) == _blocks.python_scan(
        chunk, start, end, pattern, first
    )


@needs_compiled
@pytest.mark.parametrize("n", [0, 1, 15, 16, 17, 31, 32, 33, 255 * 32, 255 * 32 + 1, 70_000])
@pytest.mark.parametrize("every", [1, 3])
def test_newlines_are_counted_at_every_length(c_scan, n, every):
    """A window of n bytes with a newline every byte (each vector lane's count at its most
    before the sum every 255 steps) or every third, where the vector steps meet the bytes
    left over."""
    chunk = (b"ab\n"[-every:] * (n // every + 1))[:n]
    assert c_scan(chunk, 0, n, (b"zz",), False) == ([], chunk.count(b"\n"))


@needs_compiled
@pytest.mark.parametrize("first", [False, True])
def test_no_needle_finds_no_line_but_the_first(c_scan, first):
    """An empty pattern: no line is found (but the first, if asked), newlines are counted."""
    chunk = b"one\ntwo\nthree"
    assert c_scan(chunk, 0, len(chunk), (), first) == _blocks.python_scan(
        chunk, 0, len(chunk), (), first
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
