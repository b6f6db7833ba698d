"""The link between a trainer and the sidecar that exports its file: one socket per file.

The sidecar listens on an address derived from the log's real path (an
abstract Unix socket on Linux, a socket file in the temp directory
elsewhere), so every trainer that appends to a file finds the one sidecar
following it.  Each trainer keeps one connection open for its run; the
kernel closes it when the process dies, even by ``kill -9``, which is how
the sidecar learns at once that a run stopped.  Messages are JSON lines:

=================================================  =======================================
trainer → sidecar                                  sidecar → trainer
=================================================  =======================================
``{"op": "hello", "run_id", "pid", "settings"}``   ``{"op": "ok", "pid", "settings"}``
``{"op": "close", "run_id", "offset"}``            ``{"op": "closed", "run_id", counts…}``
``{"op": "handover", "offset"}``                   ``{"op": "handed"}`` or ``{"op": "kept"}``
``{"op": "skip", "run_id"}``                        ``{"op": "skipping"}``
=================================================  =======================================

``close`` says the run ended cleanly and its lines end before ``offset``;
the answer comes once the sidecar has exported everything up to there.
``handover`` comes from a trainer whose settings differ from the sidecar's
(a restart pointed at another collector, say): a sidecar that no live
trainer uses stops listening, exports what comes before ``offset`` and
exits (``handed``), and the new trainer starts a sidecar with its own
settings from there; one still in use keeps its settings (``kept``).
``skip`` comes from a trainer that makes its spans in its own process, or none,
appending to a file a trace-started sidecar still follows (lingering for a
resumed run): that run is not the sidecar's to export.  It is answered once
noted, before the trainer writes a line.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import socket
import sys
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from queue import SimpleQueue
from typing import Any

import orjson

from ..otel import OtelSettings

__all__ = [
    "ControlServer",
    "Note",
    "address",
    "connect",
    "decode_settings",
    "encode_settings",
    "receive",
    "send",
    "settings_key",
    "sidecar_log",
]

_log = logging.getLogger("otel_rollout")


def sidecar_log(path: Path) -> Path:
    """Where the sidecar following ``path`` writes its own messages."""
    return path.with_name(path.name + ".sidecar.log")


def address(path: str | os.PathLike[str]) -> str:
    """The control address of the sidecar that follows ``path``."""
    key = hashlib.sha256(os.path.realpath(path).encode()).hexdigest()[:32]
    if sys.platform.startswith("linux"):
        return f"\0otel-rollout-{key}"
    return os.path.join(tempfile.gettempdir(), f"otel-rollout-{key}.sock")


def connect(path: str | os.PathLike[str], timeout: float) -> socket.socket | None:
    """A connection to the sidecar following ``path``, or None if none listens."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect(address(path))
    except OSError:
        sock.close()
        return None
    return sock


def send(sock: socket.socket, message: dict[str, Any]) -> bool:
    try:
        sock.sendall(orjson.dumps(message) + b"\n")
    except OSError:
        return False
    return True


def receive(stream: Any) -> dict[str, Any] | None:
    """The next message from a socket's ``makefile("rb")``, or None at its end."""
    try:
        line = stream.readline()
    except (OSError, ValueError):
        return None
    if not line:
        return None
    try:
        message = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None
    return message if isinstance(message, dict) else None


def _bind(where: str) -> socket.socket:
    """A listening socket at ``where``; a socket file left by a dead sidecar is replaced."""
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        server.bind(where)
    except OSError:
        stale = not where.startswith("\0") and os.path.exists(where)
        if stale:
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                probe.connect(where)
                stale = False  # a live sidecar answers
            except OSError:
                pass
            finally:
                probe.close()
        if not stale:
            server.close()
            raise
        os.unlink(where)
        server.bind(where)
    return server


#: Variables the SDK's exporters read for themselves: part of where a sidecar sends things.
_SDK_VARIABLES = (
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
    "OTEL_EXPORTER_OTLP_HEADERS",
    "OTEL_EXPORTER_OTLP_PROTOCOL",
)


_SENT = ("traces", "endpoint", "protocol", "prometheus_host", "prometheus_port", "service_name")


def encode_settings(chosen: OtelSettings) -> str:
    """``chosen`` as JSON for the sidecar's command line (providers cannot cross processes)."""
    fields: dict[str, Any] = {name: getattr(chosen, name) for name in _SENT}
    fields["metrics"] = sorted(chosen.metrics)
    fields["trackers"] = [t for t in chosen.trackers if isinstance(t, str)]  # specs only
    fields["resource_attributes"] = {
        str(k): v if isinstance(v, (str, int, float, bool)) else str(v)
        for k, v in dict(chosen.resource_attributes).items()
    }
    return orjson.dumps(fields).decode()


def decode_settings(text: str) -> OtelSettings:
    fields = orjson.loads(text)
    fields["metrics"] = frozenset(fields.get("metrics", ()))
    fields["trackers"] = tuple(fields.get("trackers", ()))
    return OtelSettings(**fields)


def settings_key(chosen: OtelSettings) -> str:
    """Where ``chosen`` and this process's OTLP variables (which the SDK reads itself) send
    things, as text: a trainer compares it with the sidecar's to spot one set up otherwise."""
    return orjson.dumps(
        [encode_settings(chosen), [os.environ.get(name) for name in _SDK_VARIABLES]]
    ).decode()


@dataclass
class Note:
    """What a connection told the sidecar, for its main loop: hello, close or gone.

    ``offset`` is where the run's lines end: the trainer's word for ``close``,
    the file's size when the connection dropped for ``gone``."""

    kind: str
    conn: socket.socket
    run_id: str | None = None
    offset: int = 0
    message: dict[str, Any] | None = None


class ControlServer:
    """Accepts trainers' connections on the file's address; notes go to ``notes``.

    Binding fails with ``OSError`` when another sidecar already follows the file.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        notes: SimpleQueue[Note],
        file_size: Callable[[], int],
        settings_key: str,
    ) -> None:
        self.notes = notes
        self._file_size = file_size
        self.settings_key = settings_key
        self._address = address(path)
        self._server = _bind(self._address)
        self._server.listen(64)
        self._lock = threading.Lock()
        self.connections = 0  # open now
        self.closed = False
        threading.Thread(target=self._accept, name="otel-rollout-control", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return  # closed
            with self._lock:
                self.connections += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        stream = conn.makefile("rb")
        run_id: str | None = None
        closed = False
        try:
            while (message := receive(stream)) is not None:
                op = message.get("op")
                if op == "hello" and isinstance(message.get("run_id"), str):
                    run_id = message["run_id"]
                    send(conn, {"op": "ok", "pid": os.getpid(), "settings": self.settings_key})
                    self.notes.put(Note("hello", conn, run_id, message=message))
                elif op == "skip" and isinstance(message.get("run_id"), str):
                    self.notes.put(Note("skip", conn, message["run_id"]))
                    send(conn, {"op": "skipping"})
                elif op == "handover" and isinstance(message.get("offset"), int):
                    self.notes.put(Note("handover", conn, run_id, message["offset"]))
                elif op == "close" and run_id is not None:
                    closed = True
                    offset = message.get("offset")
                    offset = offset if isinstance(offset, int) else self._file_size()
                    self.notes.put(Note("close", conn, run_id, offset))
        finally:
            if run_id is not None and not closed:
                # Its process is gone (or let go of us): every line it wrote is in the file now.
                self.notes.put(Note("gone", conn, run_id, self._file_size()))
            with self._lock:
                self.connections -= 1
            stream.close()
            conn.close()

    def close(self) -> None:
        """Stop listening: a trainer that connects from now on starts a sidecar of its own."""
        if self.closed:
            return
        self.closed = True
        # shutdown() first: close() alone neither wakes the thread blocked in accept() nor
        # frees an abstract address, and a trainer could still attach to a leaving sidecar.
        with contextlib.suppress(OSError):
            self._server.shutdown(socket.SHUT_RDWR)
        self._server.close()
        if not self._address.startswith("\0"):
            with contextlib.suppress(OSError):
                os.unlink(self._address)
