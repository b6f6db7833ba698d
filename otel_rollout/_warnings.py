"""Warnings about a file's lines, told as every reader tells them: the first few, each
with the file and where, then one count at the end.

The reader warns of the lines it skips, the one pass of the problems it finds; a
long-running follower (the sidecar) tells the first few and stops, with the same limit.
"""

from __future__ import annotations

import logging
import os

__all__ = ["MAX_WARNINGS", "CappedWarnings"]

_log = logging.getLogger("otel_rollout")

#: Warnings told one by one before the rest are only counted.
MAX_WARNINGS = 10


def _tell(path: str | os.PathLike[str], where: int | str, message: str) -> None:
    """``FILE:LINE: message``, or ``events in memory, event N: message``."""
    if isinstance(where, int):
        _log.warning("%s:%d: %s", path, where, message)
    else:
        _log.warning("%s, %s: %s", path, where, message)


class CappedWarnings:
    """Up to :data:`MAX_WARNINGS` warnings ``path:line: message`` (``path, where:
    message`` for a place that is no line number), then, at :meth:`done`,
    ``path: N more <what> (M in all)``.

    A warning given with ``hold`` is kept instead of told (a reader that may yet find the
    file is no trace at all); :meth:`release` tells those, :meth:`drop` forgets them.  One
    given with ``always`` is told past the cap too (the end of the file cut short: the
    warning a reader of a crashed run looks for).
    """

    def __init__(self, path: str | os.PathLike[str], what: str = "warnings") -> None:
        self.path = path
        self.what = what
        self.count = 0
        self._past_cap = 0  # told past the cap (always)
        self._held: list[tuple[int | str, str]] = []

    def warn(
        self, where: int | str, message: str, hold: bool = False, always: bool = False
    ) -> None:
        self.count += 1
        if self.count > MAX_WARNINGS and not (always and not hold):
            return
        if self.count > MAX_WARNINGS:
            self._past_cap += 1
        if hold:
            self._held.append((where, message))
            return
        self.release()
        _tell(self.path, where, message)

    @property
    def held(self) -> bool:
        return bool(self._held)

    def release(self) -> None:
        """Tell the held warnings, in the order they came."""
        for where, message in self._held:
            _tell(self.path, where, message)
        self._held.clear()

    def drop(self) -> None:
        """Forget the held warnings (their file was said to be no trace instead)."""
        self._held.clear()

    def done(self) -> None:
        """The end of the file: what was held is told, and what was only counted."""
        self.release()
        more = self.count - MAX_WARNINGS - self._past_cap
        if more > 0:
            _log.warning("%s: %d more %s (%d in all)", self.path, more, self.what, self.count)
