"""What a killed writer leaves: a line cut short, and the run it belonged to (for naming it)."""

from __future__ import annotations

import re

import orjson

__all__ = ["cut_short", "run_of"]

_RUN_ID = re.compile(rb'"run_id"\s*:\s*"([^"\\]{1,200})"')


def cut_short(line: bytes) -> bool:
    """Whether ``line`` is the start of a JSON object that ends too early, as a killed
    writer leaves it (a character cut in two at the end counts too)."""
    if not line.startswith(b"{"):
        return False
    for trim in range(4):  # a UTF-8 character is at most 4 bytes: up to 3 may be left
        if trim and (trim >= len(line) or line[-trim] < 0x80):
            return False
        piece = line[: len(line) - trim]
        try:
            orjson.loads(piece)
        except orjson.JSONDecodeError as exc:
            if exc.pos >= len(piece.rstrip()):
                return True
            if "UTF-8" not in str(exc):
                return False
        else:
            return False
    return False


def run_of(line: bytes) -> str | None:
    """The ``run_id`` a line's text names, if it got that far."""
    match = _RUN_ID.search(line, 0, 400)
    return match.group(1).decode("utf-8", "replace") if match else None
