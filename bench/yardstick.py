"""The plain design the reference describes, measured beside otel-rollout in every run.

Writer: the caller builds a dict and puts it on a ``queue.SimpleQueue``; one
thread writes ``orjson`` lines in batches and flushes each batch.  Reader:
``orjson.loads`` on every line.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from pathlib import Path
from queue import Empty, SimpleQueue
from typing import Any

import orjson


class PlainWriter:
    """dict + SimpleQueue.put on the caller; a thread appends orjson lines per batch (and,
    with ``sync_each_batch``, calls ``fdatasync`` after each one on that same thread)."""

    def __init__(self, path: Path, sync_each_batch: bool = False) -> None:
        self._sync = sync_each_batch
        self._queue: SimpleQueue[Any] = SimpleQueue()
        self._file = open(path, "ab")  # noqa: SIM115 - closed by the writer thread
        self._run_id = uuid.uuid4().hex
        self._thread = threading.Thread(target=self._write_lines, daemon=True)
        self._thread.start()

    def emit(self, event: str, **fields: Any) -> None:
        self._queue.put({"t": time.time(), "run_id": self._run_id, "event": event, **fields})

    def flush(self) -> None:
        done = threading.Event()
        self._queue.put(done)
        done.wait()

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join()

    def _write_lines(self) -> None:
        while True:
            batch = [self._queue.get()]
            while True:
                try:
                    batch.append(self._queue.get_nowait())
                except Empty:
                    break
            events = [e for e in batch if isinstance(e, dict)]
            if events:
                self._file.write(b"".join(orjson.dumps(e) + b"\n" for e in events))
                self._file.flush()
                if self._sync:
                    os.fdatasync(self._file.fileno())
            for item in batch:
                if isinstance(item, threading.Event):
                    item.set()
            if None in batch:
                self._file.close()
                return


def plain_read(path: Path) -> list[dict[str, Any]] | Any:
    """Yield every line's event, parsing each one."""
    with open(path, "rb") as f:
        for line in f:
            try:
                yield orjson.loads(line)
            except orjson.JSONDecodeError:
                continue
