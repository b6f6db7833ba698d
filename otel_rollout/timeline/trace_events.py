"""The Chrome Trace Event Format as the timeline writes it: the streaming writer, the
struct of the commonest event (a sealed attempt's slice), thread numbers and colours."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, BinaryIO

import msgspec
import orjson

__all__ = [
    "LANE_TID0",
    "PALETTE",
    "PAUSED_COLOUR",
    "TRAINER_TID",
    "WEIGHTS_TID",
    "OutputError",
    "Slice",
    "SliceArgs",
    "TraceEventWriter",
    "colour_of",
    "js",
]

#: Reserved colour names of the trace viewer (``cname``); weight version v gets
#: ``PALETTE[v % len(PALETTE)]``, so neighbouring versions differ.
PALETTE = (
    "rail_response",
    "rail_load",
    "rail_idle",
    "rail_animation",
    "cq_build_passed",
    "heap_dump_child_node_arrow",
    "olive",
    "startup",
)
PAUSED_COLOUR = "grey"

TRAINER_TID = 1
WEIGHTS_TID = 2
LANE_TID0 = 2  # engine lane n (from 1) is thread 2 + n


def colour_of(version: int) -> str:
    """The colour name of the slices weight version ``version`` generated."""
    return PALETTE[version % len(PALETTE)]


def js(text: str) -> str:
    """``text`` escaped for a JSON string's inside (IDs rarely need it)."""
    if text.isascii() and text.isprintable() and '"' not in text and "\\" not in text:
        return text
    return orjson.dumps(text).decode()[1:-1]


class OutputError(OSError):
    """Writing the timeline failed (a full disk, say): told apart from reading the trace."""


class TraceEventWriter:
    """Writes a trace-event JSON object to a binary file, event by event, in chunks.

    An event is a dict, a :class:`msgspec.Struct` or JSON text; each chunk is
    encoded by msgspec in one call (in C, escaping strings as JSON wants).
    """

    def __init__(self, out: BinaryIO, chunk: int = 4096) -> None:
        self.out = out
        self.events = 0
        self.buffer: list[Any] = []
        self.chunk = chunk
        self._first = True
        self._encode = msgspec.json.Encoder().encode
        self._put(b'{"traceEvents":[\n')

    def _put(self, data: bytes | memoryview) -> None:
        try:
            self.out.write(data)
        except OSError as exc:
            raise OutputError(exc.errno, exc.strerror or str(exc)) from exc

    def add(self, event: str) -> None:
        """One event, already JSON text."""
        self.add_object(msgspec.Raw(event))

    def add_object(self, event: Any) -> None:
        """One event as a dict or a struct."""
        buf = self.buffer
        buf.append(event)
        if len(buf) >= self.chunk:
            self.flush()

    def flush(self) -> None:
        buf = self.buffer
        if not buf:
            return
        data = memoryview(self._encode(buf))[1:-1]  # the list's items, without its brackets
        if not self._first:
            self._put(b",\n")
        self._put(data)
        self._first = False
        self.events += len(buf)
        buf.clear()

    def close(self, other: Mapping[str, Any]) -> None:
        """End the object with ``displayTimeUnit`` and ``otherData``."""
        self.flush()
        tail = {"displayTimeUnit": "ms", "otherData": dict(other)}
        self._put(b"\n]," + orjson.dumps(tail)[1:] + b"\n")


class SliceArgs(msgspec.Struct, gc=False):
    attempt_id: str
    group_id: str
    outcome: str
    tokens: int
    version: int


class Slice(msgspec.Struct, gc=False):
    """A sealed attempt no refit touched: one complete event (the commonest by far)."""

    ph: str
    name: str
    cat: str
    ts: int
    dur: int
    pid: int
    tid: int
    cname: str
    args: SliceArgs
