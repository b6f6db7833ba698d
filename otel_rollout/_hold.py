"""When the writer thread waits between writes on its Python path: only while the
controller keeps the GIL busy.

In line mode (the log alone, the compiled emit) the writer writes the lines without
the GIL (``JsonlExporter.drain``, ``_emit_lines.h``) and takes it only to hand back,
a few times a second: no hold is needed there.  This policy serves the writer's
Python path: built without a compiler or in a forked child (event dicts queued),
and a log that cannot drain for now (a sync after every write, a line cut by a
failed write).

A controller that waits on I/O leaves the GIL free, and the writer takes an event
~0.1 ms after it was queued.  One that keeps the GIL busy hands it over only when
the interpreter's switch interval (5 ms) runs out, and each of those forced
switches cost this VM's CPU-bound controller 0.15-0.3 ms: the writer's 160-190
wakes a second took 5-7% of its throughput at 1,000 and 10,000 events/s
(bench/controller.py).  While that is so, the writer lets events gather for
``config.WRITER_HOLD`` seconds between writes (:meth:`Hold.wait`), and takes the
GIL ~18 times a second instead.  ``flush()`` and ``close()`` end a hold at once
(:meth:`Hold.wake`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from queue import Empty, SimpleQueue
from typing import Any

__all__ = ["BUSY_LAG", "BUSY_SHARE", "Hold", "PyWaker", "Waker", "others_cpu"]

#: Seconds the writer waited (for the oldest event's turn, or for the GIL after a hold)
#: past which it counts the GIL as busy, if this process also used :data:`BUSY_SHARE` of a
#: core meanwhile.  Two busy batches in a row start holding, so one slow wake does not.
BUSY_LAG = 0.002
#: The share of a core this process's other threads must have used while the writer
#: waited for its wait to count as the GIL's: on a loaded machine a writer can wait for a
#: core while the controller sleeps (the export sidecar at 45% of the other core made 2 ms
#: waits common for a controller emitting 10,000 events/s between sleeps, which uses ~5% of
#: a core).
BUSY_SHARE = 0.5


def others_cpu() -> float:
    """CPU seconds of this process's threads but the calling one (the writer): the
    writer's own work says nothing of the GIL.  Counting it made a writer that a
    higher-priority process starved of its core, and that found a backlog each time it
    ran, look like one the controller kept from the GIL, and hold."""
    return time.process_time() - time.thread_time()


class PyWaker:
    """The hold's wake-up where the compiled one (``_emit.Waker``) is not built: the same
    interface over a SimpleQueue, whose ``put`` takes no lock (a SIGTERM handler that
    closes the trace cannot deadlock on a flush it interrupted)."""

    def __init__(self) -> None:
        self._queue: SimpleQueue[None] = SimpleQueue()

    def wake(self) -> None:
        """End the wait (or the next one)."""
        self._queue.put(None)

    def clear(self) -> None:
        """Spend a wake left over."""
        while not self._queue.empty():
            self._queue.get_nowait()

    def wait(self, timeout: float | None = None) -> bool:
        """Until woken (True; every wake so far spent) or ``timeout`` seconds pass."""
        try:
            self._queue.get(timeout=None if timeout is None else max(timeout, 0.0))
        except Empty:
            return False
        self.clear()
        return True


try:
    from ._emit import Waker as _CWaker
except ImportError:  # no compiler at install time
    _CWaker = None

#: The compiled waker where built (its wait gives the GIL up in C).
Waker: Any = _CWaker if _CWaker is not None else PyWaker


class Hold:
    """The writer's hold policy: call :meth:`taken` with each batch's oldest item; once it
    is written, hold with :meth:`wait` while :meth:`due`.

    ``seconds`` 0 turns holding off.  The clocks are parameters so that tests can
    drive them: ``now`` is the clock events are stamped with, ``clock`` a monotonic
    one, ``cpu`` the CPU time of this process's other threads (called on the writer's).
    """

    def __init__(
        self,
        seconds: float,
        *,
        now: Callable[[], float] = time.time,
        clock: Callable[[], float] = time.monotonic,
        cpu: Callable[[], float] = others_cpu,
    ) -> None:
        self.seconds = seconds
        # Not an Event: a wake takes no lock a waiter holds, so a SIGTERM handler that
        # closes the trace cannot deadlock on a flush() it interrupted.
        self._waker = Waker()
        self._now, self._clock, self._cpu = now, clock, cpu
        self._busy = self._was_busy = False
        self._held_until: float | None = None  # when the last hold was to end, if it ran out
        self._since, self._cpu_since = clock(), cpu()  # when the last batch was taken

    def start(self) -> None:
        """Called first on the writer's thread: the CPU read is of the threads but the
        caller's, and the hold is made on the thread that makes the pipeline."""
        self._since, self._cpu_since = self._clock(), self._cpu()

    def taken(self, emitted: float | None) -> None:
        """The writer took a batch whose oldest event was emitted at ``emitted`` (None: a
        flush or stop marker came first): was it kept waiting by a busy GIL?"""
        if not self.seconds:
            return
        at, at_clock = self._now(), self._clock()
        emitted = at if emitted is None else emitted
        late = at - emitted  # the oldest event's wait for the writer
        if self._held_until is not None:  # ...or the GIL's return after the hold, if shorter
            late = min(late, at_clock - self._held_until)  # (an event may come after it)
            self._held_until = None
        # Late because the process's other threads ran (the GIL was busy), not because a
        # loaded machine was slow to give the writer a core (a hold would not help then):
        # their share of a core since the batch before was taken (a whole cycle, so that a
        # batch taken the moment the last one was written still sees who ran before it).
        cpu = self._cpu()
        ran = cpu - self._cpu_since >= BUSY_SHARE * (at_clock - self._since)
        self._since, self._cpu_since = at_clock, cpu
        self._was_busy, self._busy = self._busy, late > BUSY_LAG and ran

    def due(self) -> bool:
        """Two batches in a row found the GIL busy."""
        return self._busy and self._was_busy

    def wait(self, asked: Callable[[], bool]) -> None:
        """Hold ``seconds``, or less if :meth:`wake` is called; not at all if ``asked()``
        (a flush or close is already queued: asked after the old wakes are spent, so that
        one queued meanwhile still finds its wake)."""
        self._waker.clear()
        if asked():
            return
        start = self._clock()
        if not self._waker.wait(self.seconds):  # it ran out: the next GIL wait from its end
            self._held_until = start + self.seconds

    def wake(self) -> None:
        """End a hold now (a flush or close was queued); safe from a signal handler."""
        self._waker.wake()
