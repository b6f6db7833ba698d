"""Where events go once the background pipeline has them.

An exporter is anything with ``export(events) -> int`` and ``shutdown()``: the
pipeline hands it each batch of event dicts on the background thread, in the
order they were emitted, and the exporter returns how many of them it could
not take.  The JSONL log is the canonical exporter; the pipeline turns its
losses into ``trace.dropped`` lines.
"""

from __future__ import annotations

import enum
import logging
import os
from collections.abc import Sequence
from pathlib import Path, PurePath
from typing import Any, Protocol, runtime_checkable

import orjson

__all__ = ["EventExporter", "JsonlExporter", "encode_event"]

_log = logging.getLogger("otel_rollout")

#: Options for the careful path only: on the fast path they cost up to 50% (NON_STR_KEYS).
_OPTIONS = orjson.OPT_NON_STR_KEYS | orjson.OPT_SERIALIZE_NUMPY


@runtime_checkable
class EventExporter(Protocol):
    """Receives batches of events on the pipeline's background thread."""

    def export(self, events: Sequence[dict[str, Any]]) -> int:
        """Take a batch of events; return how many of them were lost."""
        ...

    def shutdown(self) -> None:
        """Release resources; called once, after the last export."""
        ...


def _default(value: Any) -> Any:
    """Encode what orjson does not know natively, losing as little as possible."""
    if isinstance(value, PurePath):
        return str(value)
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, (set, frozenset)):
        try:
            return sorted(value)
        except TypeError:
            return list(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).decode("utf-8", "backslashreplace")
    item = getattr(value, "item", None)  # numpy scalars, 0-d tensors
    if callable(item):
        try:
            return item()
        except Exception:
            pass
    tolist = getattr(value, "tolist", None)  # arrays orjson cannot take directly
    if callable(tolist):
        try:
            return tolist()
        except Exception:
            pass
    if isinstance(value, (tuple, list)):
        return list(value)
    return repr(value)


def _coerce(value: Any) -> Any:
    """A copy of ``value`` that orjson can always encode (the slow, rare path)."""
    if isinstance(value, dict):
        return {str(k) if not isinstance(k, str) else k: _coerce(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_coerce(v) for v in value]
    if isinstance(value, bool) or value is None or isinstance(value, (str, float)):
        return value
    if isinstance(value, int):
        return value if -(2**63) <= value < 2**64 else str(value)
    try:
        orjson.dumps(value, default=_default, option=_OPTIONS)
        return value
    except (TypeError, RecursionError):
        return _coerce(_default(value)) if not isinstance(value, (set, frozenset)) else repr(value)


def encode_event(event: dict[str, Any]) -> bytes:
    """One event as one JSON line, never raising: exotic values become their closest JSON."""
    try:
        return orjson.dumps(event, default=_default, option=_OPTIONS) + b"\n"
    except (TypeError, RecursionError):
        try:
            return orjson.dumps(_coerce(event), default=_default, option=_OPTIONS) + b"\n"
        except (TypeError, RecursionError) as exc:
            fallback = {k: event[k] for k in ("t", "run_id", "event") if k in event}
            fallback["unencodable"] = f"{type(exc).__name__}: {exc}"
            return orjson.dumps(_coerce(fallback), option=_OPTIONS) + b"\n"


class JsonlExporter:
    """Append each batch to a JSONL file with one ``write`` call, so a kill tears at most one line.

    The file is opened unbuffered in append mode: every batch is in the
    kernel's page cache when ``export`` returns, which survives ``kill -9``.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._failing = False

    def export(self, events: Sequence[dict[str, Any]]) -> int:
        if self._fd is None:
            return len(events)
        dumps = orjson.dumps
        lines = []
        for event in events:
            try:
                # ``+ b"\n"`` copies the line into a right-sized object and frees orjson's
                # oversized buffer at once; holding a batch of those buffers until the join
                # (as OPT_APPEND_NEWLINE would) costs 2-3 us an event in malloc, not 0.25.
                lines.append(dumps(event, default=_default) + b"\n")
            except TypeError:
                lines.append(encode_event(event))
        data = b"".join(lines)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(self._fd, view) :]
        except OSError as exc:
            if not self._failing:
                _log.error(
                    "otel-rollout: cannot write %s: %s; counting lost events", self.path, exc
                )
            self._failing = True
            return len(events)
        if self._failing:
            _log.warning("otel-rollout: writing %s again", self.path)
            self._failing = False
        return 0

    def shutdown(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
