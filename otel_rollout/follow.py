"""Following a growing trace file the way ``tail -F`` does.

:class:`FileFollower` hands out the complete lines appended since the last
call.  A partial last line (a batch still being written, or torn by a kill)
is held back until its newline arrives; a file that does not exist yet is
waited for; a file that is replaced (a new inode at the path) or truncated
is read again from its start.  Only appended bytes are ever read, so one
follower costs the same on a 10 MB file and a 10 GB one.

The export sidecar, the demo's kill loop and the benchmarks' latency tail
all follow files through this one class.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from . import config

__all__ = ["FileFollower", "Lines", "file_size"]

#: Most bytes read per call: large enough for 10k events/s at a 20 ms poll many times over,
#: small enough that a follower started on a large file hands out bounded batches.
_READ = 1 << 20


def file_size(path: str | os.PathLike[str]) -> int:
    """The size of the file at ``path`` now, 0 if there is none."""
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return 0


@dataclass
class Lines:
    """Complete lines read by one :meth:`FileFollower.read` call.

    ``data`` is their bytes as the file holds them, each line with its newline (a
    line too long to hold is an empty one); ``lines`` the same lines split, without
    newlines, made only when asked for (a caller decoding whole blocks never needs
    them).  ``start`` is the file offset of the first line, ``end`` the offset just
    past the last one's newline (the follower's :attr:`~FileFollower.offset` after
    the call).  ``reopened`` says the file was replaced or truncated before these
    lines, so they are read from its start.
    """

    data: bytes
    start: int
    end: int
    reopened: bool = False

    @cached_property
    def lines(self) -> list[bytes]:
        return self.data[:-1].split(b"\n") if self.data else []


class FileFollower:
    """Complete lines appended to ``path`` from byte ``offset`` on (0: the whole file)."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        offset: int = 0,
        *,
        max_line_bytes: int | None = None,
    ) -> None:
        self.path = Path(path)
        #: Offset just past the last complete line handed out.
        self.offset = offset
        self.max_line_bytes = config.MAX_LINE_BYTES.resolve(max_line_bytes)
        #: Lines longer than ``max_line_bytes``, passed over without being handed out.
        self.long_lines = 0
        #: The length of the last of them (at most one ends in each :meth:`read`).
        self.long_line_bytes = 0
        self._skipping = False  # inside a line too long to hold, until its newline
        self._long_from = 0  # where that line began
        self._fd: int | None = None
        self._inode: tuple[int, int] | None = None
        self._pending = b""
        self._read_at = offset  # where the next os.pread starts (offset + len(pending))

    def _open(self) -> bool:
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            return False
        st = os.fstat(fd)
        self._fd, self._inode = fd, (st.st_dev, st.st_ino)
        return True

    def _replaced(self) -> bool:
        """True when the path now names another file, or ours shrank below what we read."""
        assert self._fd is not None
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return False  # deleted, not yet recreated: keep reading what we have open
        if (st.st_dev, st.st_ino) != self._inode:
            # Read to the end of the old file first: a writer may still have appended to it.
            return os.fstat(self._fd).st_size <= self._read_at
        return st.st_size < self._read_at

    def read(self, limit: int = _READ) -> Lines:
        """The complete lines appended since the last call (maybe none); never blocks."""
        reopened = False
        if self._fd is None and not self._open():
            return Lines(b"", self.offset, self.offset)
        assert self._fd is not None
        if self._replaced():
            os.close(self._fd)
            self._fd = None
            if not self._open():
                return Lines(b"", self.offset, self.offset)
            self.offset = self._read_at = 0
            self._pending, self._skipping = b"", False
            reopened = True
        chunk = os.pread(self._fd, limit, self._read_at)  # type: ignore[arg-type]  # the fd is open while reading
        if not chunk:
            return Lines(b"", self.offset, self.offset, reopened)
        self._read_at += len(chunk)
        held = self._pending
        data = held + chunk if held else chunk
        cut = data.rfind(b"\n") + 1
        start = self.offset
        self.offset += cut
        block = data[:cut]
        if cut and (held or self._skipping):  # the first line began in an earlier read
            first = block.index(b"\n")
            length = start + first - (self._long_from if self._skipping else start)
            # Over the limit in all (as the reader's chunks() counts a line across reads):
            # an empty line in its place, however little of it was held.
            if self._skipping or length > self.max_line_bytes:
                block = block[first:]
                self._skipping = False
                self.long_lines += 1
                self.long_line_bytes = length
        rest = data[cut:]
        if len(rest) > self.max_line_bytes:  # hold no more of a line past the limit
            if not self._skipping:
                self._long_from = self.offset
            self.offset += len(rest)
            rest, self._skipping = b"", True
        self._pending = rest
        return Lines(block, start, self.offset, reopened)

    @property
    def read_to(self) -> int:
        """Offset just past the last byte read, a partial last line included."""
        return self._read_at

    def size(self) -> int:
        """The file's size now (0 if it does not exist)."""
        return file_size(self.path)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> FileFollower:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
