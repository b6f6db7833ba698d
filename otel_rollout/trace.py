"""A per-rollout event log for checking what a stop and restore cost.

The controller calls :meth:`RolloutTrace.emit` for every rollout event; a
background thread appends one JSON line per event to ``rollout_trace.jsonl``.
Every line carries the wall-clock time ``t`` and a ``run_id`` that is new
for each process, so runs that resume into the same log directory stay apart.

This module mirrors the reference API: a program written against it runs
unchanged with ``from otel_rollout import trace``.  Run it on a file
(``python -m otel_rollout.trace FILE``) to print each step's batch age.
"""

from __future__ import annotations

import atexit
import dataclasses
import logging
import os
import signal
import socket
import sys
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import config, otel, trackers
from ._pipeline import Pipeline, PipelineStats
from .batch_age import (
    BATCH_AGE_TOKENS_METRIC,
    BATCH_AGE_VERSION_SUM_METRIC,
    RefitCuts,
    batch_age_by_step,
    batch_age_group_metrics,
    pop_batch_age,
    tokens_by_version,
)
from .constants import ROLLOUT_TRACE_FILENAME
from .exporters import EventExporter, JsonlExporter, log_path
from .follow import file_size
from .reader import read_events
from .schema import SCHEMA_VERSION

if TYPE_CHECKING:
    from .sidecar.link import SidecarLink

__all__ = [
    "BATCH_AGE_TOKENS_METRIC",
    "BATCH_AGE_VERSION_SUM_METRIC",
    "ROLLOUT_TRACE_FILENAME",
    "RefitCuts",
    "RolloutTrace",
    "batch_age_by_step",
    "batch_age_group_metrics",
    "main",
    "new_run_id",
    "pop_batch_age",
    "read_events",
    "tokens_by_version",
]

_log = logging.getLogger("otel_rollout")


def new_run_id() -> str:
    """A run ID unique across processes, hosts and time."""
    return uuid.uuid4().hex


def _noop(*args: Any, **kwargs: Any) -> None:
    return None


class RolloutTrace:
    """Append rollout events to a JSONL file off the caller's thread, or drop them.

    ``RolloutTrace(path)`` opens ``path`` for appending (a directory, or a new path whose
    suffix is not a log file's, gets ``rollout_trace.jsonl`` inside it: see
    :func:`~otel_rollout.exporters.log_path`) and writes a ``run.start`` line;
    ``RolloutTrace(None)`` makes every call a no-op.  ``capacity`` bounds the
    events waiting to be written (``OTEL_ROLLOUT_QUEUE_SIZE``); past it, events
    are dropped, counted and reported in the file as ``trace.dropped``.
    ``fsync_interval`` is the most seconds between syncs of the file to disk
    (``OTEL_ROLLOUT_FSYNC_INTERVAL``, default 1; 0: every batch; ``math.inf``: off).
    ``exporters`` receive every event too, on the same background thread.

    Spans and metrics are built on that thread when configured: by the
    standard ``OTEL_*`` variables, :func:`otel_rollout.configure`, or keyword
    arguments here (any field of :class:`~otel_rollout.otel.OtelSettings`,
    e.g. ``endpoint=``, ``metrics={"prometheus"}``, ``tracer_provider=``).
    """

    def __init__(
        self,
        path: Path | str | None,
        *,
        capacity: int | None = None,
        fsync_interval: float | None = None,
        exporters: tuple[EventExporter, ...] | list[EventExporter] = (),
        config_fields: dict[str, Any] | None = None,
        **otel_options: Any,
    ) -> None:
        self.path: Path | None = None
        self.run_id: str | None = None
        self._root_run_id: str | None = None
        self._exporters = list(exporters)  # the caller's own; a forked child keeps them
        self._pipeline: Pipeline | None = None
        self._sidecar: SidecarLink | None = None
        #: The sidecar's counts when it answered this run's close (spans made, sent, failed).
        self.sidecar_counts: dict[str, Any] = {}
        self._closed = False
        self._pid = os.getpid()
        self.otel = otel.settings(**otel_options)  # misspelt options fail before any I/O
        if path is None:
            self.emit = _noop  # type: ignore[method-assign]  # emit is rebound per state: no branch on the hot path
            return
        # Absolute: a trainer that changes directory later (Hydra does) reopens the same log.
        path = log_path(path).absolute()
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.run_id = new_run_id()
        # Opened first: the sidecar's offset is where our lines begin.
        log = JsonlExporter(path, fsync_interval=fsync_interval)
        self._pipeline = Pipeline(
            self.run_id,
            log,
            [*exporters, *self._made_here(self.run_id)],
            capacity=config.QUEUE_SIZE.resolve(capacity),
            max_batch=config.MAX_BATCH.resolve(),
            retry_max_delay=config.RETRY_MAX_DELAY.resolve(),
            busy_hold=config.WRITER_HOLD.resolve(),
        )
        self._config_fields = config_fields
        self.emit = self._pipeline.make_emit()  # type: ignore[method-assign]  # the pipeline's emit (C, or a closure) is the fast one
        # A second trace this process opens on a log it already writes (by any spelling of its
        # path; in a forked child, one the child took over) is the same run, each process
        # being one: its run.start names the first's run as parent, as a forked child's
        # does, so analyses read its lines as that run's, not as a stop at every switch.
        # The run this trace's lines belong to: its own, or the one its run.start names.
        self._root_run_id = self.run_id
        here = path.resolve()
        first = next((t for t in _live if t.path is not None and t.path.resolve() == here), None)
        if first is not None:
            self._root_run_id = first._root_run_id
            self._submit_run_start(parent_run_id=first._root_run_id)
        else:
            self._submit_run_start()
        _live.add(self)
        _handle_sigterm()

    def _made_here(self, run_id: str) -> list[EventExporter]:
        """The span and metric exporters for this process's pipeline: none when a sidecar
        makes them from the log (it is asked for here, reading from the log's end now)."""
        chosen = self.otel
        # Your run objects belong to the process that made them: a forked child (a data
        # loader's worker, say) logs nothing into them.
        mine = os.getpid() == self._pid
        made = _tracker_exporters(chosen, self.path, mine) if chosen.trackers else []
        if chosen.active and chosen.in_process:
            made += _otel_exporters(run_id, chosen)
        if not chosen.wants_sidecar:
            from .sidecar.link import not_the_sidecars

            assert self.path is not None
            not_the_sidecars(self.path, run_id)  # one lingering after an earlier run: not ours
            return made
        from .sidecar.link import SidecarLink

        assert self.path is not None
        specs, _ = trackers.split(chosen.trackers)
        if specs:  # a missing library is said here, in the trainer's log, not the sidecar's
            kept = tuple(str(spec) for spec in trackers.usable(specs, _log.error))
            chosen = dataclasses.replace(chosen, trackers=kept)
            if not chosen.active and not kept:
                return made
        if not chosen.active:  # tracker specs alone: the sidecar makes no span or metric
            chosen = dataclasses.replace(chosen, traces="none", metrics=frozenset())
        offset = file_size(self.path)
        linger = config.SIDECAR_LINGER.resolve()
        self._sidecar = SidecarLink(self.path, run_id, chosen, offset, linger)
        return made

    def _submit_run_start(self, **extra: Any) -> None:
        assert self._pipeline is not None
        fields: dict[str, Any] = {
            "schema": SCHEMA_VERSION,
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "argv": list(sys.argv),
            **extra,
        }
        if self._config_fields:
            fields["config"] = self._config_fields
        assert self.run_id is not None
        self._pipeline.submit(
            {"t": time.time(), "run_id": self.run_id, "event": "run.start", **fields}
        )

    @property
    def enabled(self) -> bool:
        """True when events are written to a file."""
        return self._pipeline is not None

    @property
    def stats(self) -> PipelineStats:
        """Events written and dropped so far, with what the exporters count (spans made, sent,
        refused, dropped, queued at close; metric exports failed; syncs to disk) and, after
        :meth:`close`, the export sidecar's counts.  Call :meth:`flush` first for exact numbers.
        """
        if self._pipeline is None:
            return PipelineStats()
        stats = self._pipeline.snapshot()
        stats.add({k: v for k, v in self.sidecar_counts.items() if isinstance(v, int)})
        return stats

    @property
    def exporters(self) -> tuple[EventExporter, ...]:
        """The exporters that receive every event besides the log: yours, then the span and
        metric exporters when they are made in this process (none with the export sidecar)."""
        return tuple(self._pipeline.exporters) if self._pipeline is not None else ()

    def emit(self, event: str, /, **fields: Any) -> None:
        """Queue one event, stamped with the current wall-clock time.

        Never blocks on I/O and never raises; after :meth:`close` it does nothing.
        """
        # Replaced per instance by the pipeline's emit (or a no-op); this body
        # only runs when called through the class, e.g. RolloutTrace.emit(trace, ...).
        self.emit(event, **fields)

    def flush(self, *, durable: bool = False) -> bool:
        """Wait until every event queued before this call has been written; True once it is.

        With ``durable=True``, wait until it is on disk too (``fdatasync``, made by
        the log's syncer thread while the writer goes on), not only in the page
        cache: it then survives a node crash or power loss, not only a killed
        process.  Waits at most ``OTEL_ROLLOUT_CLOSE_TIMEOUT`` seconds, so a full
        disk cannot hang the caller; a flush that gives up, or whose sync to disk
        failed, says so in the log and returns False.
        """
        if self._pipeline is None:
            return True
        limit = config.CLOSE_TIMEOUT.resolve()
        if self._pipeline.flush(limit, durable=durable):
            return True
        if durable:
            _log.warning(
                "otel-rollout: flush(durable=True) could not make the log durable within %.1fs"
                " (a failed sync to disk is logged above)",
                limit,
            )
        else:
            _log.warning("otel-rollout: flush gave up after %.1fs; events are still queued", limit)
        return False

    def close(self) -> None:
        """Write every queued event, then stop the writer and close the file.

        Idempotent; also called at interpreter exit for traces left open.  A second call
        while the first is still writing (a SIGTERM handler's) waits for it too.
        """
        if self._pipeline is None:
            return
        self._closed = True
        self.emit = _noop  # type: ignore[method-assign]  # emit is rebound per state: no branch on the hot path
        timeout = config.CLOSE_TIMEOUT.resolve()
        deadline = time.monotonic() + timeout
        self._pipeline.close(timeout)
        sidecar, self._sidecar = self._sidecar, None
        if sidecar is not None and self.path is not None:
            # Everything this run wrote ends before the file's end now.
            offset = file_size(self.path)
            sidecar.close(offset, max(deadline - time.monotonic(), 0.0))
            self.sidecar_counts = sidecar.counts
        _live.discard(self)

    def __enter__(self) -> RolloutTrace:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "disabled" if self.path is None else ("closed" if self._closed else "open")
        return f"<RolloutTrace {state} path={str(self.path)!r} run_id={self.run_id!r}>"

    def _after_fork_in_child(self) -> None:
        """A forked child is a new run: a new run_id, its own writer, none of the parent's queue."""
        if self._pipeline is None or self._closed:
            return
        parent = self.run_id
        self.run_id = new_run_id()
        # Spans and metrics are rebuilt: their resource names the run, and the SDK's threads
        # did not survive the fork.
        if self._sidecar is not None:
            self._sidecar.abandon_in_child()
            self._sidecar = None
        run_id, mine = self.run_id, self._exporters
        self._pipeline.restart_in_child(run_id, lambda: [*mine, *self._made_here(run_id)])
        self.emit = self._pipeline.make_emit()  # type: ignore[method-assign]  # the pipeline's emit (C, or a closure) is the fast one
        self._submit_run_start(parent_run_id=parent)


def _tracker_exporters(
    chosen: otel.OtelSettings, path: Path | None, objects_too: bool
) -> list[EventExporter]:
    """The trackers logged from here: your run objects, and specs too when export runs in
    this process (otherwise the sidecar logs them from the log)."""
    specs, objects = trackers.split(chosen.trackers)
    if chosen.in_process and any(str(s).split(":")[0] == "wandb" for s in specs):
        problem = trackers.wandb_login_missing()
        if problem is not None:  # never a prompt on the trainer's terminal
            _log.error("otel-rollout: %s; wandb is off", problem)
            specs = tuple(s for s in specs if str(s).split(":")[0] != "wandb")
    here = [*(objects if objects_too else ()), *(specs if chosen.in_process else ())]
    if not here:
        return []
    try:
        hub = trackers.hub_for(here, path)
    except Exception as exc:  # a run object we cannot log into must not stop training
        _log.error("otel-rollout: trackers are off: %s", exc)
        return []
    return [hub] if hub is not None else []


def _otel_exporters(run_id: str, chosen: otel.OtelSettings) -> list[EventExporter]:
    try:
        from . import _providers  # the SDK is imported only when something is exported

        return _providers.build_exporters(run_id, chosen)
    except Exception as exc:  # a bad endpoint must not stop training; the log still works
        _log.error("otel-rollout: spans and metrics are off: %s", exc)
        return []


#: Open traces, held until closed so that interpreter exit can write what they queued.
_live: set[RolloutTrace] = set()


def _close_all() -> None:
    for trace in list(_live):
        trace.close()


def _after_fork() -> None:
    for trace in list(_live):
        trace._after_fork_in_child()


def _on_sigterm(signum: int, frame: Any) -> None:
    """Write what the traces queued, then die of SIGTERM as if no handler had been set."""
    try:
        _close_all()
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)


def _handle_sigterm() -> None:
    """Install :func:`_on_sigterm`, unless the program has its own handler (or we cannot)."""
    if not config.HANDLE_SIGTERM.resolve():
        return
    try:
        if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            signal.signal(signal.SIGTERM, _on_sigterm)
    except ValueError:  # not the main thread: signals are the main thread's to set
        global _sigterm_told
        if not _sigterm_told:
            _sigterm_told = True
            _log.warning(
                "otel-rollout: a trace opened off the main thread sets no SIGTERM handler; "
                "events still queued when SIGTERM ends the process are lost unless "
                "trace.close() runs first (open the first trace on the main thread)"
            )


_sigterm_told = False  # the note about a trace opened off the main thread, given once
atexit.register(_close_all)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


def main(argv: list[str] | None = None) -> None:
    """Print each step's batch age: ``python -m otel_rollout.trace FILE``."""
    from ._reference import print_batch_ages

    raise SystemExit(print_batch_ages(argv))


if __name__ == "__main__":
    main()
