"""The trainer's side of the sidecar: find the one following the log, or start it.

:class:`SidecarLink` works on a thread of its own, so opening a trace never
waits for an interpreter to start: the sidecar reads the log from the offset
where this run's lines begin, so nothing written meanwhile is missed.  The
sidecar is a fresh interpreter (``python -m otel_rollout.sidecar``), never a
fork of a process that may hold CUDA or NCCL state, in a session of its own
(a Ctrl-C of the trainer does not stop it from exporting what is left).  Its
own messages go to ``<log>.sidecar.log``, so that no pipe a caller reads
stays open after the trainer exits.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import select
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

from ..otel import OtelSettings
from ._control import connect, encode_settings, receive, send, settings_key, sidecar_log

__all__ = ["SidecarLink", "not_the_sidecars", "sidecar_log"]

_log = logging.getLogger("otel_rollout")

#: Seconds a new sidecar may take to say it is ready (an interpreter and the SDK, on a
#: loaded machine); the trainer never waits for this, only its close does.
START_TIMEOUT = 30.0
_REPLY_TIMEOUT = 10.0
_HELLO_TIMEOUT = 2.0
_READY_FD = 3  # where the sidecar finds the pipe to say it is ready on


def not_the_sidecars(path: Path, run_id: str) -> None:
    """Tell a sidecar still following ``path`` (lingering after a run that used it) that
    ``run_id``'s spans are not its to make: this run makes them in its own process, or
    none.  Said before the run writes a line; nothing happens where no sidecar listens
    (one refused connect on a local socket)."""
    sock = connect(path, _HELLO_TIMEOUT)
    if sock is None:
        return
    try:
        with sock.makefile("rb") as stream:
            if send(sock, {"op": "skip", "run_id": run_id}):
                receive(stream)
    except OSError:
        pass
    finally:
        sock.close()


class SidecarLink:
    """Attaches run ``run_id`` (whose lines start at byte ``offset`` of ``path``) to the sidecar."""

    def __init__(
        self, path: Path, run_id: str, chosen: OtelSettings, offset: int, linger: float
    ) -> None:
        self.path = path
        self.run_id = run_id
        self.chosen = chosen
        self.offset = offset
        self.linger = linger
        #: The sidecar's counts when it answered this run's close (spans made, sent, failed).
        self.counts: dict[str, Any] = {}
        self.sidecar_pid: int | None = None
        self._sock: socket.socket | None = None
        self._stream: Any = None
        self._thread: threading.Thread | None = None
        self._closing = False
        # A sidecar already following the file is asked now, before this run writes a line,
        # so that one set up otherwise can stop short of our lines (a few ms; a sidecar busy
        # exporting may take up to _HELLO_TIMEOUT).  Starting a new one is left to a thread.
        self._lock_fd: int | None = None
        try:
            if self._hello(connect(self.path, _HELLO_TIMEOUT)):
                return
            # Starting a sidecar is done by one trace at a time, under a lock on the log: a
            # forked child (or a second trainer) waits for the first one's sidecar instead of
            # starting one that reads from its own, later, offset.  Taken here, before this
            # call returns, so that a fork right after it finds the lock held.
            self._lock_fd = os.open(self.path, os.O_RDONLY)
            with contextlib.suppress(BlockingIOError):  # held: the thread waits for it
                fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except Exception:
            _log.exception("otel-rollout: asking the export sidecar failed")
        self._thread = threading.Thread(
            target=self._attach, name="otel-rollout-sidecar-link", daemon=True
        )
        self._thread.start()

    # Attaching, on the link's thread.

    def _attach(self) -> None:
        try:
            if self._lock_fd is not None:  # (a no-op if we hold it already)
                fcntl.flock(self._lock_fd, fcntl.LOCK_EX)  # wait while another trace starts one
            for _ in range(3):  # the one it started, or one leaving as we arrive: start ours
                if self._hello(connect(self.path, _REPLY_TIMEOUT)):
                    return
                status = self._spawn()
                if status.startswith("error"):
                    _log.error(
                        "otel-rollout: the export sidecar could not start (%s); spans and "
                        "metrics are off for this run, the log is written as usual",
                        status.removeprefix("error: "),
                    )
                    return
                if status.startswith("ready; "):
                    _log.warning("otel-rollout: export sidecar: %s", status.removeprefix("ready; "))
                if self._hello(self._connect_until(time.monotonic() + START_TIMEOUT)):
                    return
            _log.error("otel-rollout: no export sidecar answered; spans and metrics are off")
        except Exception:  # never let the link hurt the trainer
            _log.exception("otel-rollout: attaching to the export sidecar failed")
        finally:
            self._unlock()

    def _unlock(self) -> None:
        fd, self._lock_fd = self._lock_fd, None
        if fd is not None:
            os.close(fd)  # releases the lock (this process's; a fork's copy is closed there)

    def _connect_until(self, deadline: float) -> socket.socket | None:
        while time.monotonic() < deadline:
            sock = connect(self.path, _REPLY_TIMEOUT)
            if sock is not None:
                return sock
            time.sleep(0.02)
        return None

    def _hello(self, sock: socket.socket | None) -> bool:
        if sock is None:
            return False
        stream = sock.makefile("rb")
        message = {"op": "hello", "run_id": self.run_id, "pid": os.getpid(), "offset": self.offset}
        reply = receive(stream) if send(sock, message) else None
        if reply is None or reply.get("op") != "ok":
            stream.close()
            sock.close()
            return False
        if reply.get("settings") != settings_key(self.chosen):
            # Another run's sidecar, set up otherwise: ask for the file from our lines on.
            answer = (
                receive(stream) if send(sock, {"op": "handover", "offset": self.offset}) else None
            )
            if answer is None or answer.get("op") == "handed":
                stream.close()
                sock.close()
                return False  # the caller starts a sidecar with our settings
            _log.warning(
                "otel-rollout: the sidecar exporting %s (pid %s) was started with other "
                "OpenTelemetry settings and is still in use; this run's spans and metrics go "
                "where it sends them",
                self.path,
                reply.get("pid"),
            )
        if self._closing:  # close() gave up waiting for us: do not hold the run open
            stream.close()
            sock.close()
            return True
        self.sidecar_pid = reply.get("pid")
        self._sock, self._stream = sock, stream
        return True

    def _spawn(self) -> str:
        """Start a sidecar; its first word: ``ready``, ``busy`` (another won) or ``error: …``.

        ``posix_spawn``, not ``subprocess``: ``Popen`` waits for its exec on a pipe that a
        ``fork`` of the trainer made meanwhile (a DataLoader worker, say) inherits, so the
        trainer's link hung until that child exited, and the child waited for the link:
        the start lock held for a whole close timeout.  ``posix_spawn`` has no such pipe,
        and does not copy a trainer's large address space either."""
        read_end, write_end = os.pipe()
        command = [
            sys.executable,
            "-m",
            "otel_rollout.sidecar",
            str(self.path),
            "--offset",
            str(self.offset),
            "--linger",
            str(self.linger),
            "--settings",
            encode_settings(self.chosen),
            "--ready-fd",
            str(_READY_FD),
        ]
        log = str(sidecar_log(self.path))
        actions = [
            (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
            (os.POSIX_SPAWN_OPEN, 1, log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644),
            (os.POSIX_SPAWN_DUP2, 1, 2),
            (os.POSIX_SPAWN_DUP2, write_end, _READY_FD),
        ]
        try:
            pid = os.posix_spawn(
                sys.executable, command, os.environ, file_actions=actions, setsid=True
            )
        except OSError as exc:
            os.close(read_end)
            return f"error: {exc}"
        finally:
            os.close(write_end)
        exited: list[int] = []

        def reap() -> None:  # so that a long-lived trainer keeps no zombie
            exited.append(os.waitpid(pid, 0)[1])

        threading.Thread(target=reap, name="otel-rollout-sidecar-reaper", daemon=True).start()
        try:
            status = _read_status(read_end, START_TIMEOUT)
        finally:
            os.close(read_end)
        if not status:
            time.sleep(0.1)
            where = sidecar_log(self.path)
            if not exited:
                return f"error: it did not answer within {START_TIMEOUT:.0f}s (see {where})"
            return (
                f"error: it exited with code {os.waitstatus_to_exitcode(exited[0])} (see {where})"
            )
        return status

    # The trainer's calls.

    def close(self, offset: int, timeout: float) -> bool:
        """Tell the sidecar the run ended cleanly at ``offset``; wait (at most ``timeout``
        seconds) until it has exported everything up to there.  True if it answered."""
        deadline = time.monotonic() + timeout
        if self._thread is not None:
            self._thread.join(timeout)
        self._closing = True
        sock = self._sock
        if sock is None:
            if self._thread is not None and self._thread.is_alive():
                _log.warning(
                    "otel-rollout: the export sidecar was not attached within %.1fs "
                    "(OTEL_ROLLOUT_CLOSE_TIMEOUT); its log, %s, may say why",
                    timeout,
                    sidecar_log(self.path),
                )
            return False
        try:
            sock.settimeout(max(deadline - time.monotonic(), 0.01))
            if not send(sock, {"op": "close", "run_id": self.run_id, "offset": offset}):
                return False
            reply = receive(self._stream)
            if reply is None or reply.get("op") != "closed":
                _log.warning(
                    "otel-rollout: the sidecar had not exported everything within %.1fs "
                    "(OTEL_ROLLOUT_CLOSE_TIMEOUT); it goes on in the background",
                    timeout,
                )
                return False
            self.counts = {k: v for k, v in reply.items() if k not in ("op", "run_id")}
            if self.counts.get("sidecar_spans_failed"):
                _log.warning(
                    "otel-rollout: spans could not be exported: %s of the sidecar's %s were not "
                    "accepted (its log: %s)",
                    self.counts["sidecar_spans_failed"],
                    self.counts.get("sidecar_spans_made"),
                    sidecar_log(self.path),
                )
            return True
        finally:
            self._drop()

    def abandon_in_child(self) -> None:
        """After ``fork``: close the child's copy of the parent's connection (no word is sent:
        it stays the parent's, and the parent's death still closes it); the child attaches
        its own run with a link of its own."""
        self._drop()
        if self._lock_fd is not None:  # the parent's start lock: the child must not hold it
            os.close(self._lock_fd)
            self._lock_fd = None

    def _drop(self) -> None:
        if self._stream is not None:
            self._stream.close()
        if self._sock is not None:
            self._sock.close()
        self._sock = self._stream = None


def _read_status(fd: int, timeout: float) -> str:
    """The sidecar's one status line from its ready pipe ('' if it closed it or timed out)."""
    deadline = time.monotonic() + timeout
    data = b""
    while b"\n" not in data:
        left = deadline - time.monotonic()
        if left <= 0:
            return ""
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            return ""
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        data += chunk
    return data.split(b"\n", 1)[0].decode("utf-8", "replace").strip()
