"""A flag that a signal handler may set: a sidecar's stop, a flush's done."""

from __future__ import annotations

import contextlib
from queue import Empty, SimpleQueue

__all__ = ["Flag"]


class Flag:
    """A ``threading.Event`` for one waiter whose :meth:`set` takes no lock, so a signal
    handler may call it.  An Event's ``set`` takes the lock its ``wait`` holds for a few
    bytecodes: SIGTERM landing there, a handler that stops the sidecar (or closes the
    trace, whose writer then sets a flush's Event) waited on its own thread for good (an
    ``export --follow`` under load once outlived 30 s after SIGTERM)."""

    def __init__(self) -> None:
        self._set = False
        self._wake: SimpleQueue[None] = SimpleQueue()  # its put takes no lock

    def set(self) -> None:
        self._set = True
        self._wake.put(None)

    def is_set(self) -> bool:
        return self._set

    def wait(self, timeout: float) -> bool:
        """Until :meth:`set` or ``timeout`` seconds; whether it is set."""
        if not self._set:
            with contextlib.suppress(Empty):
                self._wake.get(timeout=max(timeout, 0.0))
        return self._set
