"""Reading trace files: events in file order, damaged lines skipped and counted.

A killed writer can leave a torn last line, and files are copied, gzipped and
concatenated; the reader survives all of that.  Analyses that need only a few
event kinds pass ``kinds=`` so lines of other kinds are never parsed: a
substring test on the raw bytes is several times cheaper than ``orjson.loads``.
Analyses that read nearly every line pass ``as_type=``, a ``msgspec.Struct``
naming the fields they use: msgspec skips the other fields in C and decodes a
whole block per call, about twice as fast as a dict per line.

Past 400 lines on purpose: :class:`EventReader`'s three ways through a block
(a whole block decoded at once, a block's found lines at once, line by line)
share one set of policies (the kinds asked for, typed or dict events, the
line limit, how a skipped line is reported and counted), and each falls back
to the next; apart, each would need all of them.  Bytes to lines is
``_blocks``; torn lines are ``_torn``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Collection, Generator, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import msgspec

from . import config, events
from ._blocks import (
    LazyLines,
    chunks,
    kind_pattern,
    locator,
    open_trace,
    scan,
    size,
)
from ._blocks import (
    numbered as number_lines,
)
from ._torn import cut_short, run_of
from ._warnings import MAX_WARNINGS, CappedWarnings
from .constants import ROLLOUT_TRACE_FILENAME
from .schema import json_type

__all__ = [
    "MAX_WARNINGS",
    "MOST_KINDS_SEARCHED",
    "EventReader",
    "EventStream",
    "read_events",
    "too_long",
    "trace_file",
    "unreadable",
]

_log = logging.getLogger("otel_rollout")

_BOM = b"\xef\xbb\xbf"
#: Up to this many wanted kinds, lines of other kinds are skipped without parsing.
MOST_KINDS_SEARCHED = 4
#: How a skip reason begins for a torn line with more lines after it (see ``on_skip``).
TORN_LINE = "torn line"

_TYPED_ERRORS = (msgspec.DecodeError, RecursionError)

Progress = Callable[[int, int], None]
OnSkip = Callable[[int, str], None]


#: ``(chunk, pos, end) → (pos, lines, cold_end)``: a pass's compiled path
#: (:func:`otel_rollout.analysis.hot.consumer`) applies the hot lines of ``chunk`` from
#: ``pos`` and says where they end, how many they were, and where the cold lines after
#: them end (see ``_hot.c``).
HotPath = Callable[[bytes, int, int], tuple[int, int, int]]


def too_long(length: int, limit: int) -> str:
    """Why a line of ``length`` bytes is skipped, in every reader's words."""
    return f"a line of {length:,} bytes, over the limit of {limit:,} (OTEL_ROLLOUT_MAX_LINE_BYTES)"


class EventReader:
    """Iterate the events of a trace file (plain or gzipped, or the log in a log directory)
    in the order they were written.

    After iteration, ``lines`` is the number of lines seen and ``skipped``
    the number that were not events (invalid JSON, torn, not an object).
    Each skipped line goes to ``on_skip(line_number, reason)``; by default
    the first few are logged as warnings and the rest summed up at the end.
    A torn line (a killed writer's fragment) is named as one: ``torn last
    line`` at the end of the file, ``torn line`` (:data:`TORN_LINE`) where a
    resumed run wrote after it, with the killed run when the fragment names it.

    With ``typed``, events are the schema's structs (:mod:`otel_rollout.events`)
    and a line ``validate`` calls an error is skipped with the validator's words;
    ``validate`` applies the same rule to dicts.
    Otherwise events are dicts, or with ``as_type`` instances of that ``msgspec.Struct``
    (which must have an ``event`` field); a line that does not fit the type
    (a required field missing, a value of the wrong type) is then skipped too.
    A line longer than ``max_line_bytes`` (``OTEL_ROLLOUT_MAX_LINE_BYTES``) is
    skipped without being held in memory.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        kinds: Collection[str] | None = None,
        on_skip: OnSkip | None = None,
        progress: Progress | None = None,
        as_type: type[msgspec.Struct] | None = None,
        max_line_bytes: int | None = None,
        typed: bool = False,
        validate: bool = False,
        end: int | None = None,
        warn_if_no_trace: bool = True,
    ) -> None:
        self.path = trace_file(path)  # a log directory: the log inside it
        #: Read only the file's first ``end`` bytes (a file still being appended to, read
        #: as it stood at a moment); a line they end inside is a torn last line.
        self.end = end
        self.max_line_bytes = config.MAX_LINE_BYTES.resolve(max_line_bytes)
        #: Lines ``validate`` calls errors are skipped (typed events are always checked).
        self.checked = typed or validate
        #: Events are the schema's structs (:mod:`otel_rollout.events`).
        self.typed = typed
        #: The compiled path of a pass (:mod:`otel_rollout.analysis.hot`): applies the
        #: commonest lines of a block itself; the reader decodes the rest (typed only).
        self.hot: HotPath | None = None
        self._check_dicts = validate and not typed and as_type is None
        if typed:
            self._typed: msgspec.json.Decoder[Any] | None = events.DECODER
            self._typed_lines: msgspec.json.Decoder[Any] | None = events.LINES_DECODER
        else:
            self._typed = msgspec.json.Decoder(as_type) if as_type is not None else None
            self._typed_lines = (
                msgspec.json.Decoder(list[tuple[as_type]]) if as_type is not None else None  # type: ignore[valid-type]
            )
        self.kinds = frozenset(kinds) if kinds is not None else None
        self.lines = 0
        #: Why a compressed file's data ended early (once read), and whether its cut last
        #: line was skipped with it: one warning for the one damaged line.
        self._damage: str | None = None
        self._damage_told = False
        self.events = 0  # counted block by block as they are read
        #: Whether line 1 is a JSON object with an ``event`` (None for an empty file).
        self.first_line_is_event: bool | None = None
        self._on_skip = on_skip
        self._progress = progress
        #: The default warnings: held while the file may prove no trace at all (line 1 is
        #: no event and no event is read yet), so a README read by mistake gets one line,
        #: not ten warnings about its lines.  ``warn_if_no_trace=False``: not even that
        #: line (a caller that raises its own error, as the CLI does).
        self._warnings = CappedWarnings(self.path)
        self._warn_if_no_trace = warn_if_no_trace
        self._skipped = 0

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return self._scan(numbered=False)

    def numbered(self) -> Iterator[tuple[int, dict[str, Any]]]:
        """Like iteration, but each event comes with its 1-based line number."""
        return self._scan(numbered=True)

    def _skip(
        self, lineno: int, reason: str, torn: bool, line: bytes = b"", judged: bool = True
    ) -> None:
        """Count and tell a skipped line; ``judged``: it was read and is no event (a line
        too long to read says nothing of whether the file is a trace)."""
        if self.first_line_is_event is None and judged:
            self.first_line_is_event = False
        if torn and self._damage is not None:  # cut short by the compressed data's end
            reason = f"torn last line (compressed data ends early or is corrupt: {self._damage})"
            self._damage_told = True
        elif torn:
            run = run_of(line)
            writer = "the writer" if run is None else f"the writer of run {run}"
            reason = f"torn last line ({reason}; was {writer} killed?)"
        elif line and cut_short(line):
            # A killed writer's fragment, ended by the next run that opened the file.
            run = run_of(line)
            writer = "its writer" if run is None else f"the writer of run {run}"
            reason = f"{TORN_LINE}: {writer} was killed mid-line ({reason})"
        self._skipped += 1
        if self._on_skip is not None:
            self._on_skip(lineno, reason)
        else:  # the file's end cut short is told past the cap of warnings too
            self.warn(lineno, f"{reason}; skipped", always=torn or self._damage is not None)

    def warn(self, where: int | str, message: str, always: bool = False) -> None:
        """Tell a problem with this file's lines (a skipped line, or one an analysis found)
        as the reader tells them: the first few (and, with ``always``, this one), then a
        count, held while the file may yet prove no trace at all."""
        maybe_no_trace = self.first_line_is_event is False and not self.events
        self._warnings.warn(where, message, hold=maybe_no_trace, always=always)

    def counted(self, n: int) -> None:
        """``n`` more events read; at the first, what was held while the file might have
        been no trace is told, before anything is made of them."""
        if n and not self.events and self._warnings.held:
            self._warnings.release()
        self.events += n

    @property
    def skipped(self) -> int:
        """Lines skipped so far (not events: invalid, torn, too long, …)."""
        return self._skipped

    @property
    def no_trace(self) -> bool:
        """Whether the file, read, proved no trace: line 1 is no JSON event and no line was
        one (a file of blank lines is an empty trace, as an empty file is)."""
        return self.first_line_is_event is False and not self.events

    def _recover(self, lineno: int, line: bytes, torn: bool) -> Any:
        """The slow path for a line the decoder rejects: a BOM, a blank line, or a skip."""
        if lineno == 1 and line.startswith(_BOM):
            line = line[len(_BOM) :]
        if not line.strip():
            return None
        if self._typed is events.DECODER:  # the one policy: keep, skip with why, or ignore
            event, why = events.from_line(line)
            if why is not None:
                if self.first_line_is_event is None:  # an invalid event still makes a trace
                    self.first_line_is_event = _names_a_kind(line)
                self._skip(lineno, why, torn, line)
            elif event is None and self.first_line_is_event is None:
                self.first_line_is_event = True  # an event of a kind this version does not know
            return event
        loads, errors = self._decoder()
        try:
            return loads(line)
        except errors as exc:
            error: Exception = exc
        if isinstance(error, msgspec.ValidationError) and self._typed is not None:
            self._skip(lineno, f"not an event: {error}", torn, line)  # does not fit as_type
        else:
            self._skip(lineno, events.parse_problem(error), torn, line)
        return None

    def _not_asked_for(self, line: bytes) -> bool:
        """Whether a line found by kind, that does not decode, is of no kind asked for: JSON
        whose ``event`` is another kind (found by a kind's name in another field, or by a
        backslash: see ``kind_pattern``), or no JSON and no kind's name in it (found by
        its backslash alone).  A reader that reads a few kinds says nothing of other
        kinds' lines, valid or not; a line that is no JSON but names a kind asked for may
        be a torn one of that kind, and is told."""
        kinds = self.kinds
        if kinds is None or self.first_line_is_event is None:
            return False  # (the file's first line is always looked at: is it a trace?)
        try:
            value = events.decode_plain(line)
        except _TYPED_ERRORS:
            return not any(kind.encode() in line for kind in kinds)
        kind = value.get("event") if value.__class__ is dict else None
        return not (kind.__class__ is str and kind in kinds)

    def _decoder(self) -> tuple[Callable[[bytes], Any], tuple[type[Exception], ...]]:
        """The line decoder and what it raises for a bad line (RecursionError for very
        deep nesting)."""
        if self._typed is events.DECODER:
            return events.decode, _TYPED_ERRORS  # checks UTF-8 as a plain parse does
        if self._typed is not None:
            return self._typed.decode, _TYPED_ERRORS
        # msgspec, not orjson: orjson reads integers past 64 bits as floats (or refuses
        # them), msgspec keeps them exact, at the same speed (0.39 against 0.36 s for
        # 200k bench lines).
        return events.decode_plain, _TYPED_ERRORS

    def _whole_block(
        self, chunk: bytes, start: int, end: int, every_kind: bool = False
    ) -> tuple[list[Any], int] | None:
        """Every event of a block of whole lines in one call, with the block's line count, or
        None if a line needs the per-line path (with ``every_kind``, events of kinds not
        asked for are left in).

        The block is decoded as one JSON array of one-element arrays, a line each (each
        newline made ``],\n[``): the decoder then proves that every line holds exactly one
        value, and a line that does not (blank, two events, an object or a string cut
        across lines: a raw newline is no JSON string's) sends the block line by line.  The
        block's line count is its events' once the newlines are counted to match: a line
        holding ``{...}],[{...}`` (no JSON value) would otherwise make two rows.
        """
        body = chunk[start : end - 1].replace(b"\n", b"],\n[")
        lines = self._rows(b"".join((b"[[", body, b"]]")), chunk.count(b"\n", start, end))
        if lines is None:
            return None
        decoded = [line[0] for line in lines]
        if self.first_line_is_event is None and decoded:
            self.first_line_is_event = True
        if self.kinds is not None and not every_kind:
            kinds = self.kinds
            decoded = [e for e in decoded if e.event in kinds]
        return decoded, len(lines)

    def _found_at_once(self, found: list[tuple[int, bytes]]) -> list[tuple[int, Any]] | None:
        """The found lines' events of the kinds asked for, keyed by offset, decoded in one
        call as :meth:`_whole_block` decodes a block (a call a line, through the line
        loop, was ~10% of ``batch-age``); None if a line needs the line-by-line path (a bad
        line, a torn one, a version key 0, a line holding ``{...}],[{...}``)."""
        if not found:
            return []
        rows = self._rows(b"".join((b"[[", b"],[".join([line for _, line in found]), b"]]")),
                          len(found))  # fmt: skip
        if rows is None:
            return None
        kinds = self.kinds
        return [
            (offset, row[0])
            for (offset, _), row in zip(found, rows, strict=True)
            if kinds is None or row[0].event in kinds
        ]

    def _rows(self, array: bytes, lines: int) -> list[Any] | None:
        """``array``, a JSON array of one-event arrays (a line each), decoded in one call; None
        if a line needs the line-by-line path: it fails to decode, it holds a version key 0
        (maybe written "-0": see :func:`events.zero_keys`), or the rows are not ``lines``
        (a line holding ``{...}],[{...}`` makes two rows and is no event)."""
        zeros = events.zero_keys()
        try:
            if self._typed is events.DECODER and not array.isascii():
                events.check_utf8(array)  # as a plain parse would (see events.decode)
            assert self._typed_lines is not None  # only called when typed
            rows: list[Any] = self._typed_lines.decode(array)
        except _TYPED_ERRORS:
            return None
        if events.zero_keys() != zeros or len(rows) != lines:
            return None
        return rows

    def batches(self) -> Iterator[list[Any]]:
        """The events block by block (128 KB of file each): with ``as_type``, the fastest
        way through a file, since each block is decoded in one call."""
        for batch in self._blocks(numbered=False):
            events = batch if batch.__class__ is list else list(batch)
            self.counted(len(events))
            yield events

    def numbered_batches(self) -> Iterator[tuple[list[Any], int | Sequence[int]]]:
        """The events block by block, each with where its events are: the line number
        of the first (the block is consecutive lines) or one line number per event."""
        for batch in self._blocks(numbered=True, whole_numbered=True):
            if batch.__class__ is tuple:
                self.counted(len(batch[0]))
                yield batch
            else:
                # A block read line by line (it has a line to skip): each event its own
                # batch, so that a skipped line is told in file order with what the pass
                # says of the events around it, however the lines were cut into blocks.
                for n, event in batch:
                    self.counted(1)
                    yield [event], n

    def numbered_block(
        self, data: bytes, before: int, final: bool = False
    ) -> tuple[list[Any], int | Sequence[int]]:
        """The events of ``data``, whole lines read by the caller (a follower of a growing
        file), numbered from line ``before + 1``, by the same rules and in the same shape
        as :meth:`numbered_batches`; ``final``: its last line has no newline (torn)."""
        if self.max_line_bytes < len(data):  # a line within the read may be over a short limit
            data = self._blank_long(data, before)
        plan = self._plan(True, True)
        batch, newlines = self._block(data, 0, len(data), final, before, True, True, *plan)
        self.lines = before + newlines + final
        return self._numbered(batch)

    def _blank_long(self, data: bytes, before: int) -> bytes:
        """``data`` with each line longer than ``max_line_bytes`` blanked and skipped with its
        number: a follower measures only a line that crosses its reads, and the file reader
        skips every longer line (``_blocks.chunks``)."""
        lines = data.split(b"\n")
        limit = self.max_line_bytes
        long = [i for i, line in enumerate(lines) if len(line) > limit]
        for i in long:
            self.skip_long_line(before + i + 1, len(lines[i]))
            lines[i] = b""
        return b"\n".join(lines) if long else data

    def skip_long_line(self, lineno: int, length: int) -> None:
        """Skip line ``lineno``, ``length`` bytes, over ``max_line_bytes`` (a follower's too)."""
        self._skip(lineno, too_long(length, self.max_line_bytes), False, judged=False)

    def _numbered(self, batch: Any) -> tuple[list[Any], int | Sequence[int]]:
        if batch.__class__ is tuple:
            self.counted(len(batch[0]))
            return batch
        pairs = list(batch)
        self.counted(len(pairs))
        return [e for _, e in pairs], [n for n, _ in pairs]

    def _scan(self, numbered: bool) -> Iterator[Any]:
        for batch in self._blocks(numbered):
            if batch.__class__ is list:
                self.counted(len(batch))
                yield from batch
            else:  # lazy, line by line: a skip is told between the events around it
                for event in batch:
                    self.counted(1)
                    yield event

    def _plan(self, numbered: bool, whole_numbered: bool) -> tuple[Any, bool]:
        """``(pattern, whole_blocks)``: how blocks are read for the kinds asked for."""
        kinds = self.kinds
        # Searching blocks for the wanted kinds pays when they are a few of a file's lines;
        # for many kinds nearly every line matches, and plain parsing then filtering is faster.
        few = kinds is not None and len(kinds) <= MOST_KINDS_SEARCHED
        pattern = kind_pattern(kinds) if few else None  # type: ignore[arg-type]  # few implies kinds
        return pattern, self._typed is not None and (whole_numbered or not numbered) and not few

    def _blocks(self, numbered: bool, whole_numbered: bool = False) -> Iterator[Iterable[Any]]:
        plan = self._plan(numbered, whole_numbered)
        lineno = 0
        with open_trace(self.path, self.end) as (stream, position, compressed):
            broken: list[str] = []
            total = size(self.path) if self._progress is not None else 0

            def long_line(length: int) -> None:
                nonlocal lineno
                lineno += 1
                self.skip_long_line(lineno, length)

            blocks = chunks(stream, broken if compressed else None, self.max_line_bytes, long_line)
            torn_tail = False  # the last block was a line without its newline
            self._damage, self._damage_told = None, False
            for chunk, start, end, final in blocks:
                if final and broken:  # the damage is known before the line it cut is read
                    self._damage = broken[0]
                if self.hot is not None and self.typed and whole_numbered and not final:
                    lineno = yield from self._hot_block(chunk, start, end, lineno, plan)
                else:
                    events, newlines = self._block(
                        chunk, start, end, final, lineno, numbered, whole_numbered, *plan
                    )
                    yield events
                    lineno += newlines + final
                torn_tail = final
                if self._progress is not None:
                    self._progress(position(), total)
            if broken and not self._damage_told:
                # The damage cut the last line short, or, after a whole line, is one more.
                lineno += not torn_tail
                reason = f"torn last line (compressed data ends early or is corrupt: {broken[0]})"
                self._skip(lineno, reason, False)
        if self._progress is not None:
            self._progress(total, total)
        self.lines = lineno
        warnings = self._warnings
        if warnings.held and self.no_trace:
            warnings.drop()
            if self._warn_if_no_trace:
                _log.warning(
                    "%s: not a trace file (none of its lines is a JSON event); %s skipped",
                    self.path,
                    f"{self.skipped:,} line{'s' if self.skipped != 1 else ''}",
                )
        else:
            warnings.done()

    def _hot_block(
        self, chunk: bytes, start: int, end: int, lineno: int, plan: tuple[Any, bool]
    ) -> Generator[Any, None, int]:
        """A block of whole lines, its hot lines applied by the compiled path and the
        others decoded here, each run of them a batch, in file order; the line count after
        it."""
        hot = self.hot
        assert hot is not None and self.kinds is None  # see analysis.engine.run_file
        pos = start
        while pos < end:
            done, lines, cold = hot(chunk, pos, end)
            lineno += lines
            if cold > done:
                # One line (a group seal, say: most of the lines left), decoded on its own:
                # the block path's joins and checks cost more for it (cost: 9,359 → 8,176
                # instructions a line; runs of a few lines decoded one by one gained nothing
                # more).  A line that does not decode takes the block path.
                if lineno and chunk.find(b"\n", done, cold) == cold - 1:
                    try:
                        event = events.decode(chunk[done : cold - 1])
                    except _TYPED_ERRORS:
                        event = None
                    if event is not None:
                        if self.first_line_is_event is None:  # line 1 was blank: as a block
                            self.first_line_is_event = True
                        lineno += 1
                        yield [event], lineno
                        pos = cold
                        continue
                batch, newlines = self._block(chunk, done, cold, False, lineno, True, True, *plan)
                yield batch
                lineno += newlines
            pos = cold
        return lineno

    def _block(
        self,
        chunk: bytes,
        start: int,
        end: int,
        final: bool,
        lineno: int,
        numbered: bool,
        whole_numbered: bool,
        pattern: tuple[bytes, ...] | None,
        whole_blocks: bool,
    ) -> tuple[Any, int]:
        """One block's events (in the shape its caller asked for) and its newlines."""
        if whole_blocks and not final and (lineno or not chunk.startswith(_BOM, start)):
            whole = self._whole_block(chunk, start, end, whole_numbered)
            if whole is not None:
                events, newlines = whole
                return ((events, lineno + 1) if whole_numbered else events), newlines
        if pattern is None:
            found, newlines = None, chunk.count(b"\n", start, end)
        else:  # the lines that may hold a wanted kind, and the newlines (in C, if built)
            found, newlines = scan(chunk, start, end, pattern, lineno == 0)
        if whole_numbered and found is not None:
            # Found lines of a few kinds: their line numbers are worked out only
            # when one is asked for (counting newlines up to each cost ~30%).
            pairs = self._found_at_once(found) if self._typed_lines and lineno else None
            if pairs is None:
                # Line by line, lazily (numbered_batches hands each event on as it comes), so
                # that a skipped line is told in file order with the pass's own warnings.
                return self._lines(chunk, start, end, final, lineno, found, True), newlines
            where = locator(chunk, start, lineno)
            lazy = LazyLines([offset for offset, _ in pairs], where)
            return ([e for _, e in pairs], lazy), newlines
        return self._lines(chunk, start, end, final, lineno, found, numbered), newlines

    def _lines(
        self,
        chunk: bytes,
        start: int,
        end: int,
        final: bool,
        before: int,
        found: list[tuple[int, bytes]] | None,
        numbered: bool,
        keyed: bool = False,
    ) -> Iterator[Any]:
        """The events of one block, line by line: each line decoded, or skipped and reported.

        A generator, so that each dict is dropped as soon as the caller is done with it
        (a list of a block's dicts would keep the cyclic GC busy: ~25% slower).
        """
        loads, decode_error = self._decoder()
        typed = self._typed is not None
        kinds = self.kinds
        first = self.first_line_is_event is None
        if found is None:
            whole = chunk if start == 0 and end == len(chunk) else chunk[start:end]
            lines = whole.split(b"\n")
            if not final:
                del lines[-1]  # after the block's last newline: nothing
            candidates: Iterable[tuple[int, bytes]] = enumerate(lines, before + 1)
            where = None
        else:
            if numbered and not keyed:
                candidates, where = number_lines(chunk, start, found, before), None
            else:  # keys are byte offsets; a line number is worked out only if needed
                candidates, where = found, locator(chunk, start, before)
        for n, line in candidates:
            try:
                event = loads(line)
            except decode_error:
                if found is not None and self._not_asked_for(line):
                    continue  # found by a name or a backslash, and of no kind asked for
                event = self._recover(where(n) if where else n, line, final)
                first = self.first_line_is_event is None
                if event is None:
                    continue
            if typed:
                if first:
                    first = False
                    self.first_line_is_event = True
                if kinds is not None and event.event not in kinds:
                    continue
            else:
                if event.__class__ is not dict:
                    what = f"a JSON {json_type(event)}, not an object"
                    self._skip(where(n) if where else n, what, final)
                    first = False
                    continue
                if first:
                    first = False
                    self.first_line_is_event = "event" in event
                if self._check_dicts:
                    typed_event, why = events.from_object(event)
                    if typed_event is None:
                        if why is not None:
                            self._skip(where(n) if where else n, why, final, line)
                        continue
                if kinds is not None:
                    kind = event.get("event")
                    if kind.__class__ is not str or kind not in kinds:
                        continue
            yield (n, event) if numbered else event


def _names_a_kind(line: bytes) -> bool:
    """Whether a line is a JSON object with an ``event`` string (an event, valid or not)."""
    try:
        value = events.decode_plain(line)
    except _TYPED_ERRORS:
        return False
    return value.__class__ is dict and value.get("event").__class__ is str


def trace_file(path: str | os.PathLike[str]) -> Path:
    """The trace a user names by ``path``: the file itself, or, for a directory holding a
    ``rollout_trace.jsonl`` (the log directory a trace or ``--log-dir`` writes into), or
    a ``rollout_trace.jsonl.gz``, that file."""
    target = Path(path)
    if target.is_dir():
        for name in (ROLLOUT_TRACE_FILENAME, ROLLOUT_TRACE_FILENAME + ".gz"):
            if (target / name).is_file():
                return target / name
    return target


def unreadable(path: Path) -> str | None:
    """Why a file someone named cannot be read as a trace (missing, a directory, not
    readable), in one line, or None."""
    if not path.exists():
        return f"{path}: no such file"
    if path.is_dir():
        return f"{path}: is a directory, with no {ROLLOUT_TRACE_FILENAME}(.gz) in it"
    if not os.access(path, os.R_OK):
        return f"{path}: permission denied"
    return None


class EventStream(Iterator[dict[str, Any]]):
    """What :func:`read_events` returns: an iterator of a file's events (dicts) that
    also names its file, so an analysis handed one unstarted can read the file itself
    with the least work (typed blocks, only the kinds it needs)."""

    def __init__(self, reader: EventReader) -> None:
        self.reader = reader
        self._events: Iterator[dict[str, Any]] | None = None

    @property
    def started(self) -> bool:
        return self._events is not None

    def __next__(self) -> dict[str, Any]:
        if self._events is None:
            self._events = iter(self.reader)
        return next(self._events)


def read_events(
    path: str | os.PathLike[str], *, kinds: Collection[str] | None = None
) -> Iterator[dict[str, Any]]:
    """Yield the events of a trace file in the order they were written.

    Invalid lines (a torn last line from a killed writer, say) are skipped
    with a warning naming the line number.  With ``kinds``, only events of
    those kinds are parsed and yielded.
    """
    return EventStream(EventReader(path, kinds=kinds))
