"""FileFollower on real files: what tail -F does, and nothing read twice."""

from __future__ import annotations

import os

from hypothesis import given
from hypothesis import strategies as st

from otel_rollout.follow import FileFollower


def test_a_file_that_does_not_exist_yet_is_waited_for(tmp_path):
    """Before the file exists the follower hands out nothing; then it reads it from the start."""
    path = tmp_path / "later.jsonl"
    follower = FileFollower(path)
    assert follower.read().lines == []
    path.write_bytes(b'{"a":1}\n')
    got = follower.read()
    assert got.lines == [b'{"a":1}'] and (got.start, got.end) == (0, 8)


def test_a_partial_last_line_waits_for_its_newline(tmp_path):
    """A line still being written is held back until it is whole."""
    path = tmp_path / "t.jsonl"
    path.write_bytes(b'{"a":1}\n{"b":')
    follower = FileFollower(path)
    assert follower.read().lines == [b'{"a":1}']
    assert follower.read().lines == []
    with open(path, "ab") as f:
        f.write(b'2}\n{"c":3}\n')
    got = follower.read()
    assert got.lines == [b'{"b":2}', b'{"c":3}'] and got.start == 8 and got.end == 24


def test_only_appended_bytes_are_read(tmp_path):
    """Starting at an offset skips what came before; later reads see only what was appended."""
    path = tmp_path / "t.jsonl"
    path.write_bytes(b"old\n" * 1000)
    follower = FileFollower(path, offset=path.stat().st_size)
    assert follower.read().lines == []
    with open(path, "ab") as f:
        f.write(b"new\n")
    assert follower.read().lines == [b"new"]


def test_a_replaced_file_is_read_from_its_start(tmp_path):
    """A new file at the path (rotated, or deleted and recreated) is followed from byte 0,
    after what was left in the old one."""
    path = tmp_path / "t.jsonl"
    path.write_bytes(b"one\n")
    follower = FileFollower(path)
    assert follower.read().lines == [b"one"]
    with open(path, "ab") as f:
        f.write(b"two\n")
    os.rename(path, tmp_path / "old.jsonl")
    path.write_bytes(b"fresh\n")
    assert follower.read().lines == [b"two"]  # the old file's tail first
    got = follower.read()
    assert got.lines == [b"fresh"] and got.reopened and got.start == 0


def test_a_truncated_file_is_read_again(tmp_path):
    """A file cut shorter than what was read is read again from its start."""
    path = tmp_path / "t.jsonl"
    path.write_bytes(b"aaaa\nbbbb\n")
    follower = FileFollower(path)
    follower.read()
    path.write_bytes(b"c\n")
    got = follower.read()
    assert got.lines == [b"c"] and got.reopened


def test_a_line_over_the_limit_is_passed_over_without_being_held(tmp_path):
    """A line longer than max_line_bytes becomes one empty line and a count, however it arrives."""
    path = tmp_path / "t.jsonl"
    follower = FileFollower(path, max_line_bytes=100)
    path.write_bytes(b"x" * 150)
    assert follower.read().lines == []
    with open(path, "ab") as f:
        f.write(b"x" * 150 + b"\nok\n")
    got = follower.read()
    assert got.lines == [b"", b"ok"] and got.data == b"\nok\n"  # the raw block says the same
    assert follower.long_lines == 1 and follower.offset == path.stat().st_size
    assert follower.long_line_bytes == 300


def test_a_held_line_that_ends_over_the_limit_is_passed_over_too(tmp_path):
    """A partial line held under the limit whose newline brings it over is no line either."""
    path = tmp_path / "t.jsonl"
    follower = FileFollower(path, max_line_bytes=100)
    path.write_bytes(b"ok\n" + b"x" * 60)
    assert follower.read().lines == [b"ok"]
    with open(path, "ab") as f:
        f.write(b"x" * 60 + b"\nnext\n")
    got = follower.read()
    assert got.lines == [b"", b"next"] and got.data == b"\nnext\n"
    assert (follower.long_lines, follower.long_line_bytes) == (1, 120)


@given(
    lines=st.lists(st.binary(max_size=30).map(lambda b: b.replace(b"\n", b"")), max_size=30),
    cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=10),
    limit=st.integers(min_value=1, max_value=64),
)
def test_any_way_of_appending_gives_the_same_lines(tmp_path_factory, lines, cuts, limit):
    """However the bytes are appended and read, the lines handed out are exactly the whole
    lines of the file, in order, each once, and offsets add up to the bytes consumed."""
    path = tmp_path_factory.mktemp("f") / "t.jsonl"
    data = b"".join(line + b"\n" for line in lines) + b"tail-without-newline"
    points = sorted({min(c, len(data)) for c in cuts} | {len(data)})
    follower = FileFollower(path)
    got: list[bytes] = []
    written = 0
    with open(path, "wb") as f:
        for point in points:
            f.write(data[written:point])
            f.flush()
            written = point
            while True:
                batch = follower.read(limit)
                assert batch.start + sum(len(x) + 1 for x in batch.lines) == batch.end
                assert batch.data == b"".join(x + b"\n" for x in batch.lines)
                got += batch.lines
                if batch.end == batch.start and follower._read_at >= written:
                    break
    assert got == lines
    assert follower.offset == len(data) - len(b"tail-without-newline")
