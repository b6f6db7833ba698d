"""Reading trace files: events in file order, damaged lines skipped and counted.

A killed writer can leave a torn last line, and files are copied, gzipped and
concatenated; the reader survives all of that.  Analyses that need only a few
event kinds pass ``kinds=`` so lines of other kinds are never parsed: a
substring test on the raw bytes is several times cheaper than ``orjson.loads``.
"""

from __future__ import annotations

import gzip
import logging
import os
import zlib
from collections.abc import Callable, Collection, Iterable, Iterator
from pathlib import Path
from typing import IO, Any

import orjson

__all__ = ["EventReader", "read_events"]

_log = logging.getLogger("otel_rollout")

_GZIP_MAGIC = b"\x1f\x8b"
_BOM = b"\xef\xbb\xbf"
_PROGRESS_EVERY = 1 << 16
#: Lines reported one by one before the rest are only counted.
MAX_WARNINGS = 10

Progress = Callable[[int, int], None]
OnSkip = Callable[[int, str], None]


class EventReader:
    """Iterate the events of a trace file (plain or gzipped) in the order they were written.

    After iteration, ``lines`` is the number of lines seen and ``skipped``
    the number that were not events (invalid JSON, torn, not an object).
    Each skipped line goes to ``on_skip(line_number, reason)``; by default
    the first few are logged as warnings and the rest summed up at the end.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        kinds: Collection[str] | None = None,
        on_skip: OnSkip | None = None,
        progress: Progress | None = None,
    ) -> None:
        self.path = Path(path)
        self.kinds = frozenset(kinds) if kinds is not None else None
        self.lines = 0
        self.skipped = 0
        #: Whether line 1 is a JSON object with an ``event`` (None for an empty file).
        self.first_line_is_event: bool | None = None
        self._on_skip = on_skip
        self._progress = progress

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return self._scan(numbered=False)  # type: ignore[return-value]

    def numbered(self) -> Iterator[tuple[int, dict[str, Any]]]:
        """Like iteration, but each event comes with its 1-based line number."""
        return self._scan(numbered=True)  # type: ignore[return-value]

    def _skip(self, lineno: int, line: bytes, reason: str) -> None:
        if lineno == 1:
            self.first_line_is_event = False
        if not line.endswith(b"\n"):
            reason = f"torn last line ({reason}; was the writer killed?)"
        self.skipped += 1
        if self._on_skip is not None:
            self._on_skip(lineno, reason)
        elif self.skipped <= MAX_WARNINGS:
            _log.warning("%s:%d: %s; skipped", self.path, lineno, reason)

    def _scan(self, numbered: bool) -> Iterator[Any]:
        loads = orjson.loads
        decode_error = orjson.JSONDecodeError
        wanted = _prefilter(self.kinds)
        lineno = 0
        with _open(self.path) as (stream, position, compressed):
            broken: list[str] = []
            lines: Iterable[bytes] = _guarded(stream, broken) if compressed else stream
            if self._progress is not None:
                lines = _reporting(stream, position, self._progress, _size(self.path))
            for lineno, line in enumerate(lines, 1):
                if wanted is not None and not wanted(line) and lineno > 1:
                    continue
                try:
                    event = loads(line)
                except decode_error as exc:
                    if lineno == 1 and line.startswith(_BOM):
                        try:
                            event = loads(line[len(_BOM) :])
                        except decode_error:
                            self._skip(lineno, line, f"not valid JSON: {exc}")
                            continue
                    elif line.strip():
                        self._skip(lineno, line, f"not valid JSON: {exc}")
                        continue
                    else:
                        continue
                if lineno == 1:
                    self.first_line_is_event = event.__class__ is dict and "event" in event
                if event.__class__ is not dict:
                    self._skip(lineno, line, f"a JSON {type(event).__name__}, not an object")
                    continue
                if wanted is not None and event.get("event") not in self.kinds:  # type: ignore[operator]
                    continue
                yield (lineno, event) if numbered else event
            if broken:
                lineno += 1
                self._skip(lineno, b"", f"compressed data ends early or is corrupt: {broken[0]}")
        self.lines = lineno
        if self._on_skip is None and self.skipped > MAX_WARNINGS:
            _log.warning(
                "%s: %d more lines skipped (%d in all)",
                self.path,
                self.skipped - MAX_WARNINGS,
                self.skipped,
            )


def read_events(
    path: str | os.PathLike[str], *, kinds: Collection[str] | None = None
) -> Iterator[dict[str, Any]]:
    """Yield the events of a trace file in the order they were written.

    Invalid lines (a torn last line from a killed writer, say) are skipped
    with a warning naming the line number.  With ``kinds``, only events of
    those kinds are parsed and yielded.
    """
    return iter(EventReader(path, kinds=kinds))


def _prefilter(kinds: frozenset[str] | None) -> Callable[[bytes], bool] | None:
    """A cheap test that a raw line may hold one of ``kinds`` (confirmed after parsing)."""
    if kinds is None:
        return None
    needles = [orjson.dumps(k) for k in sorted(kinds)]
    if not needles:
        return lambda line: False
    if len(needles) == 1:
        (a,) = needles
        return lambda line: a in line
    if len(needles) == 2:
        a, b = needles
        return lambda line: a in line or b in line
    return lambda line: any(n in line for n in needles)


class _open:
    """Open a trace file, plain or gzipped (by its first bytes, not its name)."""

    def __init__(self, path: Path) -> None:
        self._raw: IO[bytes] = open(path, "rb")  # noqa: SIM115 - closed in __exit__

    def __enter__(self) -> tuple[IO[bytes], Callable[[], int], bool]:
        raw = self._raw
        if raw.peek(2)[:2] == _GZIP_MAGIC:  # type: ignore[attr-defined]
            return gzip.GzipFile(fileobj=raw), raw.tell, True
        return raw, raw.tell, False

    def __exit__(self, *exc: object) -> None:
        self._raw.close()


def _guarded(stream: IO[bytes], broken: list[str]) -> Iterator[bytes]:
    """Lines of a compressed stream; a truncated or corrupt end is noted in ``broken``."""
    try:
        yield from stream
    except (EOFError, OSError, zlib.error) as exc:
        broken.append(str(exc) or type(exc).__name__)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _reporting(
    lines: Iterable[bytes], position: Callable[[], int], progress: Progress, total: int
) -> Iterator[bytes]:
    for count, line in enumerate(lines, 1):
        yield line
        if count % _PROGRESS_EVERY == 0:
            progress(position(), total)
    progress(total, total)
