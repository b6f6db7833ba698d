"""``python -m otel_rollout.sidecar LOG``: the export sidecar a trace starts (see the package)."""

from __future__ import annotations

import argparse
import contextlib
import errno
import logging
import os
import sys

from ._control import decode_settings

NICENESS = 19


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m otel_rollout.sidecar",
        description="Follow a rollout trace and export its spans and metrics (started by "
        "RolloutTrace; by hand, use 'otel-rollout export FILE --follow').",
    )
    parser.add_argument("file")
    parser.add_argument("--offset", type=int, default=0, help="byte to start reading at")
    parser.add_argument("--linger", type=float, default=None, help="seconds to stay after")
    parser.add_argument("--settings", required=True, help="OpenTelemetry settings as JSON")
    parser.add_argument("--ready-fd", type=int, help="write one status line here, then close")
    args = parser.parse_args(argv)
    logging.basicConfig(
        format="%(asctime)s sidecar[%(process)d] %(levelname)s %(message)s",
        level=logging.INFO,
    )
    ready = os.fdopen(args.ready_fd, "w") if args.ready_fd is not None else None

    def status(line: str) -> None:
        if ready is not None:
            try:
                ready.write(line + "\n")
                ready.close()
            except OSError:  # the trainer is gone already: export what it wrote all the same
                pass

    from . import Sidecar, handle_signals

    # A helper of the trainer's: when the two compete for a core, the trainer goes first
    # (the log is the buffer, so a sidecar that falls behind catches up and loses nothing).
    # At nice 10 a controller kept 3-4 points less at 10k events/s than with the log alone
    # on 2 cores; at nice 19 the difference was within noise (bench/README.md).
    os.nice(NICENESS)
    # The sidecar runs in a session of its own, and where the kernel groups tasks by session
    # (sched_autogroup_enabled, the default of most distributions) nice ranks threads only
    # within their group: the group as a whole would compete with the trainer's as an equal.
    # The group's own nice value puts it (and a tracker's helper process, wandb-core) behind.
    # Only when the session is the sidecar's own (it leads it): run by hand from a shell, the
    # group is the user's whole terminal session, which is not ours to renice.
    if os.getsid(0) == os.getpid():
        with contextlib.suppress(OSError), open("/proc/self/autogroup", "w") as f:
            f.write(str(NICENESS))

    try:
        sidecar = Sidecar(
            args.file,
            decode_settings(args.settings),
            offset=args.offset,
            linger=args.linger,
            hand_over=True,
        )
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:  # EADDRINUSE: another sidecar follows it
            status("busy")
            return 0
        status(f"error: {exc}")
        return 2
    except Exception as exc:  # a bad endpoint or protocol: say it in one line
        status(f"error: {type(exc).__name__}: {exc}")
        return 2
    handle_signals(sidecar)
    logging.getLogger("otel_rollout").info(
        "otel-rollout: following %s from byte %d", args.file, args.offset
    )
    status("ready" + "".join(f"; {problem}" for problem in sidecar.problems))
    sidecar.run()
    t = sidecar.telemetry
    if t.trackers is not None:  # final: the counts a trace's close got were as of then
        counts = t.trackers.counts()
        logging.getLogger("otel_rollout").info(
            "otel-rollout: trackers: %s", ", ".join(f"{k} {v}" for k, v in counts.items())
        )
    logging.getLogger("otel_rollout").info(
        "otel-rollout: done: %d events, %d spans made, %d sent, %d not accepted",
        t.events,
        t.spans_made,
        t.spans_sent,
        t.spans_failed,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
