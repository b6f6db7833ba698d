"""Bytes to lines for the reader: blocks of whole lines from a plain or gzipped file,
the lines of a block that may hold some event kinds, and their line numbers.

No JSON here: :mod:`otel_rollout.reader` decodes what these functions find.
:func:`scan` runs in C (``otel_rollout/_scan.c``) where the package was built with a
compiler, and in Python otherwise, with the same results.
"""

from __future__ import annotations

import functools
import zlib
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import IO, cast

__all__ = [
    "GZIP_MAGIC",
    "LazyLines",
    "chunks",
    "is_gzipped",
    "kind_pattern",
    "locator",
    "matching_lines",
    "numbered",
    "open_trace",
    "scan",
    "size",
]

GZIP_MAGIC = b"\x1f\x8b"
_CHUNK = 1 << 17  # small enough that a block and its events stay in the CPU cache


try:
    from ._scan import scan as _compiled_scan
except ImportError:  # installed without a C compiler: the Python scan below
    _compiled_scan = None

Found = list[tuple[int, bytes]]


def scan(
    chunk: bytes, start: int, end: int, pattern: tuple[bytes, ...], first: bool
) -> tuple[Found, int]:
    """:func:`matching_lines` and the newlines of ``chunk[start:end]``: in C if it was built
    (one pass over the block for every kind at once, in vector steps; one ``bytes.find``
    pass per kind and a ``bytes.count`` one took ~10× as long), else in Python."""
    if _compiled_scan is not None and _searchable_in_c(pattern):
        return _compiled_scan(chunk, start, end, pattern, first)
    return python_scan(chunk, start, end, pattern, first)


@functools.lru_cache(maxsize=64)
def _searchable_in_c(pattern: tuple[bytes, ...]) -> bool:
    """No needle holds a newline (asked once a pattern, not once a block: ~1% of batch-age)."""
    return not any(b"\n" in name for name in pattern)


def python_scan(
    chunk: bytes, start: int, end: int, pattern: tuple[bytes, ...], first: bool
) -> tuple[Found, int]:
    """:func:`scan` in Python (what the C one must equal)."""
    return matching_lines(chunk, start, end, pattern, first), chunk.count(b"\n", start, end)


def kind_pattern(kinds: frozenset[str]) -> tuple[bytes, ...]:
    """What a line of one of ``kinds`` may contain: the kind's name, as bytes, or a backslash
    (a name written with a JSON escape, ``"group\\u002eseal"``, holds one; the caller
    confirms the kind after parsing)."""
    return (*(k.encode() for k in sorted(kinds)), b"\\")


def matching_lines(
    chunk: bytes, start: int, end: int, pattern: tuple[bytes, ...], first: bool
) -> list[tuple[int, bytes]]:
    """``(offset, line)`` for the lines in ``chunk[start:end]`` that may hold a wanted kind,
    plus the first line when it is the file's first.

    Each kind's name is found with ``bytes.find``, in C over the whole block, so lines
    of other kinds cost no Python work (a regular expression for ``"event": "<kind>"``
    made reading seals and steps of the bench trace ~2.5× slower: it stops at every
    ``"event"``).  A match can be a false positive (the name in another field); the
    caller confirms the kind after parsing.
    """
    starts = set()
    find, rfind = chunk.find, chunk.rfind
    if first:
        starts.add(start)
    for name in pattern:
        at = find(name, start, end)
        while at >= 0:
            line_start = rfind(b"\n", start, at) + 1 or start
            starts.add(line_start)
            stop = find(b"\n", at, end)
            if stop < 0:
                break
            at = find(name, stop, end)
    found = []
    for line_start in sorted(starts):
        stop = find(b"\n", line_start, end)
        found.append((line_start, chunk[line_start:stop] if stop >= 0 else chunk[line_start:end]))
    return found


class LazyLines(Sequence[int]):
    """The line numbers of a block's found events, each counted only when asked for."""

    def __init__(self, offsets: list[int], where: Callable[[int], int]) -> None:
        self._offsets = offsets
        self._where = where

    def __len__(self) -> int:
        return len(self._offsets)

    def __getitem__(self, i: int) -> int:  # type: ignore[override]  # ints only, no slices
        return self._where(self._offsets[i])


def numbered(
    chunk: bytes, start: int, found: list[tuple[int, bytes]], before: int
) -> list[tuple[int, bytes]]:
    """The same lines keyed by 1-based line number, counting newlines once, left to right."""
    numbered, lineno, counted = [], before, start
    for offset, line in found:
        lineno += chunk.count(b"\n", counted, offset)
        counted = offset
        numbered.append((lineno + 1, line))
    return numbered


def locator(chunk: bytes, start: int, before: int) -> Callable[[int], int]:
    """Turns a byte offset in ``chunk`` into a file line number (for the rare report)."""
    return lambda offset: before + chunk.count(b"\n", start, offset) + 1


def chunks(
    stream: IO[bytes],
    broken: list[str] | None,
    max_line: int,
    on_long: Callable[[int], None],
) -> Iterator[tuple[bytes, int, int, bool]]:
    """Blocks ``(data, start, end, final)`` where ``data[start:end]`` is whole lines.

    Blocks are not copied: a line split across reads is yielded as its own
    small block.  The block with ``final`` set is an unterminated tail, a torn
    last line.  A line longer than ``max_line`` (without its newline, as the
    follower of a growing file counts it) is never held whole: its bytes are
    passed over and ``on_long(length)`` is called where it ends.  For a
    compressed stream (``broken`` given), a truncated or corrupt end stops the
    blocks and is noted in ``broken`` rather than raised.
    """
    pieces: list[bytes] = []  # the start of a line that began in an earlier read
    held = 0  # its length so far
    too_long = False  # the current line passed max_line: its bytes are dropped
    while True:
        try:
            block = stream.read(_CHUNK)
        except (EOFError, OSError, zlib.error) as exc:
            if broken is None:
                raise
            broken.append(str(exc) or type(exc).__name__)
            block = b""
        if not block:
            if too_long or held > max_line:  # a last line with no newline, over the limit
                on_long(held)
            elif pieces:
                joined = b"".join(pieces)
                yield joined, 0, len(joined), True
            return
        start = 0
        if held:
            newline = block.find(b"\n")
            if newline < 0:
                held += len(block)
                if not too_long:
                    pieces.append(block)
                    if held > max_line:
                        pieces, too_long = [], True
                continue
            start = newline + 1
            held += start
            if too_long or held - 1 > max_line:  # its length without the newline
                on_long(held - 1)
            else:
                pieces.append(block[:start])
                joined = b"".join(pieces)
                yield joined, 0, len(joined), False
            pieces, held, too_long = [], 0, False
        end = block.rfind(b"\n") + 1
        if end > start:
            if max_line < _CHUNK:  # a line inside the block may be over the limit too
                yield from _around_long(block, start, end, max_line, on_long)
            else:
                yield block, start, end, False
        tail = block[max(start, end) :]
        if tail:
            pieces, held = [tail], len(tail)


def _around_long(
    block: bytes, start: int, end: int, max_line: int, on_long: Callable[[int], None]
) -> Iterator[tuple[bytes, int, int, bool]]:
    """The whole lines of ``block[start:end]`` as blocks around those longer than
    ``max_line``, each of those passed to ``on_long`` where it stands (a limit shorter
    than a read: line by line, in Python)."""
    piece = at = start
    find = block.find
    while at < end:
        stop = find(b"\n", at, end) + 1
        if stop - at - 1 > max_line:  # its length without the newline, as everywhere
            if at > piece:
                yield block, piece, at, False
            on_long(stop - at - 1)
            piece = stop
        at = stop
    if end > piece:
        yield block, piece, end, False


_GZ_PIECE = 4096  # compressed bytes inflated at a time


class _Gunzip:
    """A gzip stream read so that a truncated or corrupt end loses only what cannot be
    decompressed: ``read`` returns every byte decompressed before the damage, and raises
    (``EOFError`` or ``zlib.error``) on the call after.  ``gzip.GzipFile.read`` raises
    at once and drops what that read had decompressed (for a file of one block: all of
    it).  Members written one after another (``cat a.gz b.gz``) are read in turn."""

    def __init__(self, raw: IO[bytes]) -> None:
        self._raw = raw
        self._inflate = zlib.decompressobj(16 + zlib.MAX_WBITS)
        self._member_started = False  # the current member has had compressed bytes
        self._pending = bytearray()
        self._error: Exception | None = None
        self._done = False

    def read(self, size: int) -> bytes:
        while len(self._pending) < size and not self._done and self._error is None:
            self._fill()
        if not self._pending and self._error is not None:
            error, self._error = self._error, None
            self._done = True
            raise error
        out = bytes(self._pending[:size])
        del self._pending[:size]
        return out

    def _fill(self) -> None:
        data = self._raw.read(1 << 16)
        if not data:
            if self._member_started and not self._inflate.eof:
                self._error = EOFError("compressed file ended before the end-of-stream marker")
            self._done = True
            return
        try:
            while data:
                if not self._member_started:
                    data = data.lstrip(b"\0")  # zeros after a member: padding (gzip's too)
                    if not data:
                        break
                self._member_started = True
                # In pieces: an error loses only the output of the piece it is found in.
                piece, data = data[:_GZ_PIECE], data[_GZ_PIECE:]
                self._pending += self._inflate.decompress(piece)
                if not self._inflate.eof:
                    continue
                data = self._inflate.unused_data + data  # the next member, or padding
                self._inflate = zlib.decompressobj(16 + zlib.MAX_WBITS)
                self._member_started = False
        except zlib.error as exc:
            self._error = exc


class _Prefix:
    """The first ``left`` bytes of a stream."""

    def __init__(self, stream: IO[bytes], left: int) -> None:
        self._stream = stream
        self._left = left

    def read(self, size: int) -> bytes:
        data = self._stream.read(min(size, self._left)) if self._left > 0 else b""
        self._left -= len(data)
        return data


class open_trace:
    """Open a trace file, plain or gzipped (by its first bytes, not its name); with ``end``,
    only its first ``end`` bytes (of its content, for a gzipped file) are read."""

    def __init__(self, path: Path, end: int | None = None) -> None:
        self._raw: IO[bytes] = open(path, "rb")  # noqa: SIM115 - closed in __exit__
        self._end = end

    def __enter__(self) -> tuple[IO[bytes], Callable[[], int], bool]:
        raw = self._raw
        compressed = raw.peek(2)[:2] == GZIP_MAGIC  # type: ignore[attr-defined]  # a BufferedReader has peek
        stream = cast(IO[bytes], _Gunzip(raw)) if compressed else raw
        if self._end is not None:
            stream = cast(IO[bytes], _Prefix(stream, self._end))
        return stream, raw.tell, compressed

    def __exit__(self, *exc: object) -> None:
        self._raw.close()


def is_gzipped(path: str | Path) -> bool:
    """Whether the file at ``path`` is gzipped (by its first bytes, as every reader tells)."""
    try:
        with open(path, "rb") as f:
            return f.read(2) == GZIP_MAGIC
    except OSError:
        return False


def size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0
