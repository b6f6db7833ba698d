"""The log's ``fdatasync`` on a thread of its own, so that writing never waits for the disk.

The writer thread numbers its writes (:meth:`Syncer.wrote`); the syncer thread
syncs whatever has been written when a sync falls due (at most every
``interval`` seconds, at once after a checkpoint line) and notes the last write
the sync covered.  Writes made while a sync runs are folded into the next one.
Only :meth:`Syncer.durable` (``flush(durable=True)``) and :meth:`Syncer.close`
wait for a sync (and :meth:`Syncer.replace`, for one in flight when the log was
deleted and is made again).

Why a thread: ``fdatasync`` takes as long as the disk's writeback queue, from
under a millisecond to tens of milliseconds behind other I/O (a checkpoint
being written beside the log), and while the writer thread waited in it the
caller's events waited in the queue.  Measured at 10,000 events/s with a sync
after every batch (``bench/run.py --only fsync``), the emit→file p99 fell from
1.6–94 ms to 0.6–2.8 ms once the sync left the writer thread, and beside a
checkpoint being written from 79–152 ms to 4–40 ms (bench/README.md).
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
import weakref

__all__ = ["RETRY_AFTER", "Syncer"]

_log = logging.getLogger("otel_rollout")

#: Seconds at least between a failed sync and the next one on schedule (a disk that fails
#: every sync would otherwise be asked again after every write at interval 0).
RETRY_AFTER = 1.0

#: Every live syncer, so that a forked child can give each a lock and thread of its own.
_LIVE: weakref.WeakSet[Syncer] = weakref.WeakSet()


class Syncer:
    """Syncs one file descriptor at an interval, at once on request, on a daemon thread.

    ``interval`` is the most seconds a write waits for its sync (0: after every
    write; infinity: never on its own, only for :meth:`durable` and a final
    :meth:`close`).  The thread starts with the first write that wants a sync.
    A failed sync is logged once (until one succeeds), counted in
    :attr:`failures`, and tried again after :data:`RETRY_AFTER` seconds at the
    soonest; the writes it was to cover stay unsynced, so :meth:`durable` says so.
    """

    def __init__(self, fd: int, interval: float, path: str) -> None:
        self._fd = fd
        self.interval = interval
        self._path = path  # for messages
        self._reset()
        _LIVE.add(self)

    def _reset(self) -> None:
        """Fresh counts, lock and thread state (at start, and in a forked child, where the
        parent's thread does not exist and its lock may have been held at the fork)."""
        #: Successful syncs so far, and failed ones.
        self.syncs = 0
        self.failures = 0
        self._failing = False  # the last sync failed (logged once until one succeeds)
        self._cond = threading.Condition(threading.Lock())
        self._written = 0  # writes made so far, numbered from 1
        self._synced = 0  # the last write a finished sync covers
        self._urgent = False  # a checkpoint line, a durable flush or close: sync at once
        self._syncing = False  # the thread is in fdatasync on self._fd
        self._stopping = False
        self._stopped = False  # the thread has ended (after close): nothing more gets synced
        self._synced_at = -math.inf  # time.monotonic() when the last sync ended
        self._retry_at = -math.inf  # after a failure, no sync on schedule before this
        self._thread: threading.Thread | None = None

    def wrote(self, urgent: bool = False) -> None:
        """Writer thread: bytes reached the file; ``urgent`` (a checkpoint line) syncs them at
        once unless syncing is off."""
        with self._cond:
            self._written += 1
            if self.interval == math.inf:
                return  # only durable() and close() sync: nothing to wake
            if urgent:
                self._urgent = True
            if self._thread is None:
                self._start()
            # The thread only needs waking when it would not wake by itself in time.
            if self._urgent or self.interval == 0 or self._written == self._synced + 1:
                self._cond.notify_all()

    def durable(self, timeout: float | None) -> bool:
        """Wait until every write made before this call is synced; False if the sync failed,
        the timeout passed, or the syncer was closed first without syncing them."""
        with self._cond:
            target = self._written
            if self._synced >= target:
                return True
            if self._stopping:
                return False
            failures = self.failures
            self._urgent = True
            if self._thread is None:
                self._start()
            self._cond.notify_all()
            self._cond.wait_for(
                lambda: self._synced >= target or self.failures > failures or self._stopped,
                timeout,
            )
            return self._synced >= target

    def replace(self, fd: int) -> int:
        """Writer thread: sync ``fd`` from now on (the file was recreated); returns the old
        descriptor, which the thread no longer uses and the caller may close.  Waits for a
        sync in flight on the old descriptor (a rare case: the log was deleted)."""
        with self._cond:
            self._cond.wait_for(lambda: not self._syncing)
            old, self._fd = self._fd, fd
            self._synced = self._written  # the old file is gone: nothing of it to sync
            self._cond.notify_all()
            return old

    def close(self, final_sync: bool) -> None:
        """Stop the thread, after a last sync of what is unsynced if ``final_sync``."""
        with self._cond:
            if final_sync and self._written > self._synced:
                self._urgent = True
                if self._thread is None:
                    self._start()
            self._stopping = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join()

    def _start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="otel-rollout-syncer", daemon=True)
        self._thread.start()

    def _due(self) -> float | None:
        """Under the lock: 0 if a sync is due now, the seconds until one is, or None when
        nothing waits for one (or the thread should stop)."""
        if self._written <= self._synced:
            return None
        if self._urgent:
            return 0.0
        if self._stopping or self.interval == math.inf:
            return None
        due = max(self._synced_at + self.interval, self._retry_at)
        return max(due - time.monotonic(), 0.0)

    def _run(self) -> None:
        cond = self._cond
        while True:
            with cond:
                while (wait := self._due()) != 0.0:
                    if wait is None and self._stopping:
                        self._stopped = True
                        cond.notify_all()  # a durable() waiting on what close did not sync
                        return
                    cond.wait(wait)
                target, fd = self._written, self._fd
                self._urgent = False
                self._syncing = True
            ok = self._sync(fd)
            with cond:
                self._syncing = False
                self._synced_at = time.monotonic()
                if ok:
                    self._synced = max(self._synced, target)
                else:
                    self._retry_at = self._synced_at + RETRY_AFTER
                cond.notify_all()

    def _sync(self, fd: int) -> bool:
        try:
            os.fdatasync(fd)
        except OSError as exc:
            self.failures += 1
            if not self._failing:
                _log.error("otel-rollout: cannot sync %s to disk: %s", self._path, exc)
            self._failing = True
            return False
        self.syncs += 1
        self._failing = False
        return True


def _after_fork_in_child() -> None:
    for syncer in list(_LIVE):
        syncer._reset()


os.register_at_fork(after_in_child=_after_fork_in_child)
