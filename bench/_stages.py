"""The faults bench/faults.py stages: each makes a :class:`Stage` (where the trace
writes, its options, how to start and clear the fault), or says why it cannot here."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from otel_rollout import RolloutTrace
from otel_rollout.testing import BlackHole, OtlpReceiver


@dataclass
class Stage:
    """A fault: where the trace writes, trace options, and how to start and clear it."""

    target: Path
    options: dict[str, Any] = field(default_factory=dict)
    inject: Callable[[RolloutTrace], None] = lambda tr: None
    clear: Callable[[], None] = lambda: None
    cleanup: Callable[[], None] = lambda: None
    log_faults: bool = False  # the log itself faults (and comes back): time the recovery
    readback: Path | None = None  # where to count what was written (default: the log)
    vanished: int = 0  # lines written, then deleted by the fault itself


def mount_tmpfs(where: Path, size: str) -> bool:
    where.mkdir(parents=True, exist_ok=True)
    command = ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)]
    return subprocess.run(command, capture_output=True).returncode == 0


def disk_full(tmp: Path) -> Stage | str:
    disk = tmp / "full"
    if not mount_tmpfs(disk, "64m"):
        return "needs root to mount a tmpfs"
    filler = disk / "filler"

    def inject(tr: RolloutTrace) -> None:
        stat = os.statvfs(disk)
        filler.write_bytes(b"\0" * (stat.f_bavail * stat.f_frsize - 4096))

    kept = tmp / "full.jsonl"

    def cleanup() -> None:
        shutil.copyfile(disk / "t.jsonl", kept)
        subprocess.run(["umount", "-l", str(disk)], check=False)
        for _ in range(100):  # a busy machine can take a moment to detach it
            if not os.path.ismount(disk):
                break
            time.sleep(0.02)

    return Stage(
        disk / "t.jsonl",
        inject=inject,
        clear=filler.unlink,
        cleanup=cleanup,
        readback=kept,
        log_faults=True,
    )


def immutable(tmp: Path) -> Stage | str:
    path = tmp / "immutable.jsonl"
    path.touch()
    if subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode:
        return "chattr +i not supported here"
    subprocess.run(["chattr", "-i", str(path)], check=True)
    return Stage(
        path,
        inject=lambda tr: subprocess.run(["chattr", "+i", str(path)], check=True),
        clear=lambda: subprocess.run(["chattr", "-i", str(path)], check=True),
        log_faults=True,
    )


def deleted_dir(tmp: Path) -> Stage:
    """The log's directory removed mid-run; what was in it is counted as it was deleted."""
    logs = tmp / "deleted" / "run"
    logs.mkdir(parents=True)
    stage = Stage(logs, log_faults=True)

    def inject(tr: RolloutTrace) -> None:
        tr.flush()
        stage.vanished = tr.stats.written
        shutil.rmtree(tmp / "deleted")

    stage.inject = inject
    return stage


def slow_disk(tmp: Path) -> Stage:
    """A named pipe drained at 256 KB/s during the fault: slower than the events come."""
    fifo = tmp / "slow.jsonl"
    os.mkfifo(fifo)
    slow = threading.Event()
    copy = tmp / "slow.copy.jsonl"

    def drain() -> None:
        with open(fifo, "rb", buffering=0) as src, open(copy, "wb") as dst:
            # The smallest pipe buffer (one page, not 64 KB): the overload shows even when a
            # loaded machine paces the events well under --rate.
            with contextlib.suppress(OSError):  # EBUSY if the writer filled more already
                fcntl.fcntl(src.fileno(), fcntl.F_SETPIPE_SZ, 4096)
            while chunk := src.read(4096):
                dst.write(chunk)
                if slow.is_set():
                    time.sleep(4096 / 256_000)

    drainer = threading.Thread(target=drain, daemon=True)
    drainer.start()
    stage = Stage(fifo, options={"capacity": 2_000}, inject=lambda tr: slow.set(), clear=slow.clear)
    stage.cleanup = lambda: drainer.join(30)
    stage.readback = copy
    return stage


def otlp(kind: str) -> Callable[[Path], Stage]:
    def make(tmp: Path) -> Stage:
        server: Any = BlackHole() if kind == "black hole" else None
        if kind == "refusing":
            server = OtlpReceiver("grpc", keep=False, fail=True)
        elif kind == "slow":
            server = OtlpReceiver("grpc", keep=False, delay=1.0)
        # In-process: these rows account for every span the trainer's own pipeline made.
        options = {"endpoint": server.endpoint, "export_mode": "inprocess"}
        stage = Stage(tmp / f"otlp-{kind}.jsonl", options=options)
        stage.cleanup = server.close
        return stage

    return make


def port_taken(tmp: Path) -> Stage:
    blocker = socket.create_server(("127.0.0.1", 0))
    port = blocker.getsockname()[1]
    stage = Stage(
        tmp / "prometheus.jsonl",
        options={"metrics": {"prometheus"}, "prometheus_port": port, "export_mode": "inprocess"},
        cleanup=blocker.close,
    )
    return stage
