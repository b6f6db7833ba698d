"""Counts in words, the one way every command writes them: ``1 run``, ``2 runs``,
``12,819 steps`` (digits grouped by thousands)."""

from __future__ import annotations

__all__ = ["counted"]


def counted(n: int, noun: str, nouns: str | None = None) -> str:
    """``n`` and the noun, singular for exactly one (``nouns``: the plural when it is not
    ``noun`` + "s")."""
    return f"{n:,} {noun if n == 1 else nouns or noun + 's'}"
