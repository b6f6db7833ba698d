"""Counts in words, the one way every command writes them: ``1 run``, ``2 runs``,
``12,819 steps`` (digits grouped by thousands); and text from a trace made safe for a
terminal."""

from __future__ import annotations

__all__ = ["counted", "printable"]


def counted(n: int, noun: str, nouns: str | None = None) -> str:
    """``n`` and the noun, singular for exactly one (``nouns``: the plural when it is not
    ``noun`` + "s")."""
    return f"{n:,} {noun if n == 1 else nouns or noun + 's'}"


#: Control characters (C0, DEL, C1) as escapes: a group ID holding ESC ] 0 ; ... BEL retitled
#: the user's terminal from a warning, and broke the box of the watch screen.
_CONTROLS = {c: f"\\x{c:02x}" for c in (*range(0x20), *range(0x7F, 0xA0))}


_CONTROLS_BUT_NEWLINES = {c: e for c, e in _CONTROLS.items() if c != 0x0A}


def printable(text: str, newlines: bool = False) -> str:
    """``text`` with its control characters written as ``\\xNN`` escapes (newlines too, a
    warning being one line, unless ``newlines``: a traceback's)."""
    if text.isprintable():
        return text
    return text.translate(_CONTROLS_BUT_NEWLINES if newlines else _CONTROLS)
