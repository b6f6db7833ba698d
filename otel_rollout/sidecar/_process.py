"""The sidecar's own process: whether a trainer it follows still runs, and where its own
messages go."""

from __future__ import annotations

import gc
import os
from pathlib import Path
from typing import Any

__all__ = ["YOUNG_OBJECTS", "collect_less", "follow_log", "freeze_loaded", "pid_alive", "writes_to"]


#: Allocations between the sidecar's young collections (Python's default: 700).  Each line
#: it reads is a dict or two that live until its batch is exported, so at 700 every batch
#: was walked by a young collection and again by an older one: with the three trackers on
#: at 10,000 events/s, 0.72 s of collections in a 20 s bench run at 700, 0.11 s at 50,000.
YOUNG_OBJECTS = 50_000


def collect_less() -> None:
    """The sidecar's collector: young collections every :data:`YOUNG_OBJECTS` allocations
    (the older generations' thresholds as Python's), for the sidecar process only."""
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_OBJECTS, older, oldest)


def freeze_loaded(loaded: int, frozen: int) -> int:
    """Move every object the sidecar holds to the collector's permanent generation
    (``gc.freeze``) when ``loaded``, the libraries and runs it has made (the trackers'
    runs), is not what it was at the last freeze (``frozen``, -1 for none); the count
    to pass as ``frozen`` next time.

    A tracker's library is hundreds of thousands of long-lived objects (MLflow's
    SQLAlchemy, W&B), and every full collection walked them all: ~200 ms each, a third
    of the sidecar's CPU with the three trackers on at 10,000 events/s (the decoded
    lines' dicts set the collections off).  Each freeze first thaws what the last one
    froze and collects it all once: the objects of a tracker run that has ended since
    (a sidecar follows a killed run's resume too) are freed, not kept for good.  Only
    the sidecar does this; a training process's collector is its own.
    """
    if loaded != frozen:
        gc.unfreeze()
        gc.collect()
        gc.freeze()
    return loaded


def pid_alive(pid: Any, started_before: float | None = None) -> bool:
    """Whether process ``pid`` runs on this host (and, if /proc says, began before
    ``started_before``: a later process with the same pid is not the one that wrote)."""
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):
        return False
    except PermissionError:
        pass
    if started_before is None:
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            ticks = int(f.read().rsplit(b")", 1)[1].split()[19])
        with open("/proc/stat", "rb") as f:
            boot = next(int(line.split()[1]) for line in f if line.startswith(b"btime"))
    except (OSError, ValueError, IndexError, StopIteration):
        return True
    return boot + ticks / os.sysconf("SC_CLK_TCK") <= started_before + 1.0


def writes_to(path: Path) -> bool:
    """Whether this process's stdout is the file at ``path`` (False if either is gone)."""
    try:
        ours, there = os.fstat(1), os.stat(path)
    except OSError:
        return False
    return (ours.st_dev, ours.st_ino) == (there.st_dev, there.st_ino)


def follow_log(path: Path) -> None:
    """Point stdout and stderr at ``path`` again if they write another file: a run directory
    deleted and made again while a sidecar lingered left it writing a deleted log, and the
    new trainer's message named a log that was not there."""
    if writes_to(path):
        return
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    except OSError:
        return  # no directory to write it in (yet): keep what we have
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)

