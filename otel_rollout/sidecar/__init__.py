"""The export sidecar: spans and metrics made from the JSONL log, in a process of its own.

A training process with export on writes only the log; this process follows
the log (:class:`~otel_rollout.follow.FileFollower`), builds spans and metric
updates from each line it reads (:class:`._telemetry.Telemetry`, the same
builders as the in-process pipeline) and sends them: OTLP spans and metrics,
and a Prometheus scrape endpoint it serves.  The controller's GIL is left
alone, and a ``kill -9`` of the trainer loses no span the file can describe.

When a run is over, what it left open is ended and exported:

* its trainer's connection to the sidecar drops without a clean close
  (``kill -9``, a crash): at once, ``rollout.ended_by=run.stopped``;
* its trainer closed the trace: ``rollout.ended_by=trace.close``;
* no connection, same host: its ``pid`` (from ``run.start``) has exited,
  checked every second (``run.stopped``);
* no connection, another host, or a file replayed by ``otel-rollout export``:
  when a later run that is not its forked child starts (``run.stopped``).

Started by a trace, the sidecar exits ``linger`` seconds after the last run
it follows is over and exported, unless a resumed run appends to the file
first, in which case it follows that run too: one sidecar, one scrape
endpoint through a kill and a resume.  Run by hand (``otel-rollout export
FILE --follow``) it follows until stopped; what is open then is ended with
``sidecar.stopped``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import time
from collections.abc import Callable
from pathlib import Path
from queue import Empty, SimpleQueue
from typing import Any

import msgspec

from .._flag import Flag
from .._warnings import MAX_WARNINGS
from ..events import decode_plain, from_object, parse_problem
from ..follow import FileFollower
from ..otel import OtelSettings
from ..reader import too_long
from ._control import ControlServer, Note, send, settings_key, sidecar_log
from ._process import collect_less, follow_log, freeze_loaded, pid_alive, writes_to

__all__ = ["Sidecar", "pid_alive"]

_log = logging.getLogger("otel_rollout")

#: Seconds between reads of a file that had nothing new.  The lag from a line to its
#: span is this plus one export; 20 ms costs the idle sidecar ~0.1% of a core.
POLL = 0.02
#: Seconds between checks that the trainers without a connection still run.
_PID_CHECK = 1.0
#: Most seconds the sidecar spends exporting what is left when it stops (a dead collector
#: must not hold a Ctrl-C or a container's stop for minutes); a second signal ends it at once.
FINISH_TIMEOUT = 5.0


class Sidecar:
    """Follows ``path`` from byte ``offset`` and exports what each run's events describe.

    ``linger`` (seconds) makes a following sidecar exit once every run it saw is
    over and exported and nothing new came for that long; None follows forever.
    ``control`` serves the trainers' connections; binding it raises ``OSError``
    when another sidecar already follows the file.  With ``hand_over`` (a
    sidecar a trace started) a trainer with other settings may take the file
    over once no live trainer uses this one; one run by hand keeps it.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        chosen: OtelSettings,
        *,
        offset: int = 0,
        linger: float | None = None,
        control: bool = True,
        hand_over: bool = False,
    ) -> None:
        self.path = Path(path)
        self.linger = linger
        self.hand_over = hand_over
        self.skipped = 0
        #: Whether our stdout is the sidecar log beside the file (a sidecar a trainer
        #: started): only then does it follow the file when the file is made again, never
        #: the terminal of ``otel-rollout export --follow``.
        self._log_is_ours = writes_to(sidecar_log(self.path))
        self._follower = FileFollower(self.path, offset)
        self._begin = offset  # the first byte this sidecar follows
        self._notes: SimpleQueue[Note] = SimpleQueue()
        self._stop = Flag()  # set by a signal handler too
        self._host = socket.gethostname()
        self._connected: dict[str, socket.socket] = {}  # runs whose trainer holds a connection
        self._stop_at: int | None = None  # handed over: read up to here, then finish
        self._foreign: set[str] = set()  # runs of other hosts (with hand_over: not ours)
        #: Runs whose trainers make their spans themselves, or none (with hand_over)
        self._skipped_runs: set[str] = set()
        self._ending: dict[str, tuple[int, str, socket.socket | None]] = {}
        self.control: ControlServer | None = None
        if control:  # first: if another sidecar follows the file, touch nothing else
            self.control = ControlServer(
                self.path, self._notes, self._follower.size, settings_key(chosen)
            )
        #: What works only in part, for the trainer that started us to log.
        self.problems: list[str] = []
        self._stop_prometheus: Callable[[], None] = lambda: None
        registry = None
        try:
            from ._telemetry import Telemetry  # the SDK: only once the file is ours to follow

            if "prometheus" in chosen.metrics:
                from .._providers import serve_prometheus

                registry, self._stop_prometheus = serve_prometheus(chosen)
                if registry is None:
                    self.problems.append(
                        f"cannot serve Prometheus metrics on {chosen.prometheus_host}:"
                        f"{chosen.prometheus_port} (see the sidecar's log)"
                    )
            self.telemetry = Telemetry(
                chosen, prometheus_registry=registry, path=self.path, start=self._begin
            )
        except BaseException:
            self._stop_prometheus()
            if self.control is not None:
                self.control.close()
            raise

    def stop(self) -> None:
        """Ask :meth:`run` to finish (from a signal handler or another thread)."""
        self._stop.set()

    def run(self) -> None:
        """Follow and export until ``linger`` runs out, the file is handed over, or :meth:`stop`.
        The process's collector is tuned for the sidecar (``_process.collect_less``,
        ``freeze_loaded``): it runs in a process of its own (``python -m
        otel_rollout.sidecar``, ``otel-rollout export --follow``)."""
        telemetry = self.telemetry
        collect_less()
        quiet_since = time.monotonic()
        next_pid_check = 0.0
        frozen = -1  # tracker runs made at the last gc.freeze (none yet)
        try:
            while not self._stop.is_set():
                trackers = telemetry.trackers
                frozen = freeze_loaded(trackers.opened if trackers is not None else 0, frozen)
                # Notes first: a run that attaches before its lines are read is backfilled
                # (if it began before our first byte) ahead of its later lines.
                if self._handle_notes():
                    quiet_since = time.monotonic()
                batch = self._follower.read()
                # Notes again: a trainer's skip is noted before it writes a line, so every
                # line read now is judged by the notes already queued.
                if batch.lines and self._handle_notes():
                    quiet_since = time.monotonic()
                if batch.reopened:
                    if self._log_is_ours:
                        follow_log(sidecar_log(self.path))
                    _log.warning("otel-rollout: %s was replaced; following the new file", self.path)
                lines, handed = batch.lines, False
                if self._stop_at is not None:  # handed over: nothing from the offset on is ours
                    lines = _before(lines, batch.start, self._stop_at)
                    handed = self._follower.read_to >= self._stop_at
                events = self._parse(lines, batch.start)
                if events and self.hand_over:
                    events = self._ours(events)
                if events:
                    telemetry.export(events)
                    self._after_run_starts(events)
                    quiet_since = time.monotonic()
                if handed:
                    break
                if self._end_due_runs():
                    quiet_since = time.monotonic()
                if batch.lines:
                    continue
                telemetry.ship()
                now = time.monotonic()
                if now >= next_pid_check:
                    self._check_pids()
                    next_pid_check = now + _PID_CHECK
                if self._idle_for(now - quiet_since):
                    break
                self._stop.wait(POLL)
        finally:
            self._finish()

    # Reading.

    def _parse(self, lines: list[bytes], offset: int) -> list[dict[str, Any]]:
        """The lines' events, by the rules every reader follows (otel_rollout.events): an
        event validate calls an error is skipped with its words, an unknown kind kept."""
        events = []
        loads, check, limit = decode_plain, from_object, self._follower.max_line_bytes
        for line in lines:
            size = len(line) + 1
            if line.strip():
                if len(line) > limit:  # within one read: a limit shorter than a read
                    self._skip(offset, too_long(len(line), limit))
                    offset += size
                    continue
                try:
                    event = loads(line)  # integers of any size exact, as every reader
                except (msgspec.DecodeError, RecursionError) as exc:
                    self._skip(offset, parse_problem(exc))
                else:
                    _, why = check(event)
                    if why is None:  # valid, or of a kind this version does not know
                        events.append(event)
                    else:
                        self._skip(offset, why)
            offset += size
        return events

    def _ours(self, events: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """A sidecar a trace started leaves the runs of other hosts (appending to a shared
        log) to their own sidecars: it would export them twice, and wait on them forever;
        and the runs whose trainers said they make their spans themselves, or none."""
        foreign, skipped = self._foreign, self._skipped_runs
        for event in events:
            if event["event"] == "run.start":
                run_id = event["run_id"]
                if event.get("host") != self._host and run_id not in self._connected:
                    foreign.add(run_id)
                else:
                    foreign.discard(run_id)
        if not (foreign or skipped):
            return events
        return [e for e in events if e["run_id"] not in foreign and e["run_id"] not in skipped]

    def _skip(self, offset: int, reason: str) -> None:
        self.skipped += 1
        if self.skipped <= MAX_WARNINGS:  # the readers' limit
            _log.warning("%s: the line at byte %d: %s; skipped", self.path, offset, reason)

    # When runs are over.

    def _after_run_starts(self, events: list[dict[str, Any]]) -> None:
        """A run that starts ends every open run that cannot be checked otherwise: of another
        host, or of this host with the same pid (the pid reused, by a container's trainer
        as pid 1, say, so it would never be seen to exit); and a run that restores another
        run's checkpoint ends that run."""
        for event in events:
            kind = event["event"]
            if kind == "checkpoint.restore":
                old = event.get("from_run_id")
                unchecked = old not in self._connected and old not in self._ending
                if old in self.telemetry.open_runs() and old != event["run_id"] and unchecked:
                    self.telemetry.end_run(old, "run.stopped")
                continue
            if kind != "run.start":
                continue
            new, parent = event["run_id"], event.get("parent_run_id")
            for run_id in self.telemetry.open_runs():
                if run_id in (new, parent) or run_id in self._connected or run_id in self._ending:
                    continue
                start = self.telemetry.runs[run_id].start
                same_pid = start.get("pid") is not None and start.get("pid") == event.get("pid")
                if start.get("host") == self._host and not same_pid:
                    continue  # its pid says when it is over
                self.telemetry.end_run(run_id, "run.stopped")

    def _handle_notes(self) -> bool:
        handled = False
        while True:
            try:
                note = self._notes.get_nowait()
            except Empty:
                return handled
            handled = True
            if note.kind == "handover":
                self._hand_over(note)
                continue
            if note.kind == "skip":
                if self.hand_over and note.run_id is not None:  # (export --follow takes all)
                    self._skipped_runs.add(note.run_id)
                continue
            assert note.run_id is not None
            if note.kind == "hello":
                self._connected[note.run_id] = note.conn
                self._ending.pop(note.run_id, None)  # a pid check may have misjudged it
                _log.info("otel-rollout: run %s attached", note.run_id)
                offset = (note.message or {}).get("offset")
                if isinstance(offset, int) and 0 <= offset < self._begin:
                    self._backfill(note.run_id, offset)
            else:
                self._connected.pop(note.run_id, None)
                reason = "trace.close" if note.kind == "close" else "run.stopped"
                conn = note.conn if note.kind == "close" else None
                self._ending[note.run_id] = (note.offset, reason, conn)

    def _backfill(self, run_id: str, offset: int) -> None:
        """Export the lines ``run_id`` wrote before this sidecar's first byte (it lost the
        race to start a sidecar, and ours began later in the file)."""
        events: list[dict[str, Any]] = []
        with FileFollower(self.path, offset) as follower:
            while follower.read_to < self._begin:
                batch = follower.read()
                if not batch.lines and batch.end == batch.start:
                    break
                lines = _before(batch.lines, batch.start, self._begin)
                events += [e for e in self._parse(lines, batch.start) if e["run_id"] == run_id]
        if events:
            _log.info(
                "otel-rollout: run %s began before us: %d earlier events", run_id, len(events)
            )
            self.telemetry.export(events)
            self._after_run_starts(events)

    def _hand_over(self, note: Note) -> None:
        """A trainer with other settings asks for the file from ``note.offset`` on."""
        others = set(self._connected) - {note.run_id}
        if others or self.control is None or not self.hand_over:
            send(note.conn, {"op": "kept"})
            return
        _log.info(
            "otel-rollout: a trainer with other settings takes the file over from byte %d",
            note.offset,
        )
        self.control.close()  # first, so that its new sidecar can bind the address
        self._stop_at = note.offset
        send(note.conn, {"op": "handed"})

    def _end_due_runs(self) -> bool:
        """End the runs whose lines have all been read; answer the trainers that asked."""
        # read_to, not offset: a torn last line (the killed writer's) never becomes whole.
        read_to = self._follower.read_to
        due = [r for r, (offset, _, _) in self._ending.items() if read_to >= offset]
        for run_id in due:
            _, reason, conn = self._ending.pop(run_id)
            _log.info("otel-rollout: run %s is over (%s)", run_id, reason)
            self.telemetry.end_run(run_id, reason)
            if conn is not None:
                self.telemetry.flush()
                t = self.telemetry
                run = t.runs.get(run_id)
                shipper = t.shipper
                send(
                    conn,
                    {
                        "op": "closed",
                        "run_id": run_id,
                        # This run's own (a sidecar lingers for later runs, and follows a
                        # forked child's too), and the sidecar's since it started.
                        "spans_made": run.spans_made if run is not None else 0,
                        "spans_sent": shipper.sent_by_run[run_id] if shipper else 0,
                        "spans_failed": shipper.failed_by_run[run_id] if shipper else 0,
                        "sidecar_spans_made": t.spans_made,
                        "sidecar_spans_sent": t.spans_sent,
                        "sidecar_spans_failed": t.spans_failed,
                        **(t.trackers.counts() if t.trackers is not None else {}),
                    },
                )
        return bool(due)

    def _check_pids(self) -> None:
        for run_id in self.telemetry.open_runs():
            if run_id in self._connected or run_id in self._ending:
                continue
            start = self.telemetry.runs[run_id].start
            if start.get("host") != self._host:
                continue
            t = start.get("t")
            if not pid_alive(start.get("pid"), t if isinstance(t, (int, float)) else None):
                self._ending[run_id] = (self._follower.size(), "run.stopped", None)

    def _idle_for(self, quiet: float) -> bool:
        """Whether a lingering sidecar may exit: nothing open, nothing owed, quiet long enough."""
        if self.linger is None or quiet < self.linger:
            return False
        if self._connected or self._ending or self.telemetry.open_runs():
            return False
        if self.control is not None and self.control.connections:
            return False
        if self.control is not None:
            self.control.close()  # from here on, a new trainer starts a sidecar of its own
            # One that connected just before is ours to follow; lines appended from now on
            # without a connection belong to the sidecar their trainer starts.
            time.sleep(0.1)
            if not self._notes.empty() or self.control.connections:
                _log.info("otel-rollout: a run arrived as the sidecar was leaving; following it")
                try:  # and stay findable for the runs after it
                    self.control = ControlServer(
                        self.path, self._notes, self._follower.size, self.control.settings_key
                    )
                except OSError:  # another sidecar has the address now: leave after this run
                    self.linger = 0.0
                return False
        return True

    def _finish(self) -> None:
        if self.control is not None:
            self.control.close()
        self.telemetry.finish("sidecar.stopped", timeout=FINISH_TIMEOUT)
        self._stop_prometheus()
        self._follower.close()


def _before(lines: list[bytes], start: int, stop: int) -> list[bytes]:
    """The lines (the first at byte ``start``) that begin before byte ``stop``."""
    kept = []
    for line in lines:
        if start >= stop:
            break
        kept.append(line)
        start += len(line) + 1
    return kept


def handle_signals(sidecar: Sidecar) -> None:
    """SIGTERM and SIGINT finish the export instead of killing it."""

    def stop(signum: int, frame: Any) -> None:
        if sidecar._stop.is_set():  # the second Ctrl-C: stop now
            os._exit(128 + signum)
        sidecar.stop()

    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(ValueError):  # not the main thread: the caller stops us
            signal.signal(sig, stop)
