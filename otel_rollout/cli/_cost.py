"""``otel-rollout cost FILE``: what each stop and restore cost, and where tokens went."""

from __future__ import annotations

import argparse
import sys
from datetime import datetime, timezone
from typing import Any, TextIO

from ..cost import CostReport, analyze_file
from ._common import check_is_trace, print_json, trace_reader, without_cyclic_gc


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "cost",
        help="what each stop and restore cost (downtime, work lost and redone, staleness)",
        description=(
            "For every boundary between a run and the run that resumed into the same file: "
            "downtime; the old run's last step and checkpoint; the checkpoint restored; "
            "attempts and groups in flight at the stop and the tokens at risk; what became "
            "of the interrupted rollouts (matched by epoch, prompt_id, generation_index): "
            "resumed from a snapshot, re-dispatched from scratch, or never run again; tokens "
            "recovered and generated again; steps trained again and the time to get back; "
            "batch age over the last N steps before and the first N after. Then "
            "the token ledger: every logged token once, as trained, wasted (by cause) or "
            "pending, with its balance. Streams: memory is the work in flight plus one small "
            "record per group and per step, not the file."
        ),
    )
    parser.add_argument("file", help="a rollout_trace.jsonl (or .jsonl.gz)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument(
        "--window", type=int, default=5, metavar="N", help="steps before/after for batch age (5)"
    )
    parser.set_defaults(handler=run)


def load_report(path: str, window: int = 5, progress: bool = True) -> CostReport:
    reader = trace_reader(path, progress=progress, typed=True)
    report = analyze_file(reader, window=window)
    check_is_trace(reader, reader.events)
    return report


def _fmt(value: Any, unit: str = "") -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}{unit}"
    return f"{value:,}{unit}" if isinstance(value, int) else str(value)


def _utc(t: float) -> str:
    """Epoch seconds as ISO-8601 UTC, to the millisecond."""
    when = datetime.fromtimestamp(t, tz=timezone.utc)
    return when.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def write_report(report: CostReport, out: TextIO) -> None:
    """The human-readable report."""
    out.write(f"{len(report.runs)} runs, {len(report.boundaries)} stops and restores\n")
    for n, b in enumerate(report.boundaries, 1):
        restored = b.restored_checkpoint or {}
        last_ckpt = b.old_last_checkpoint or {}
        rows = [
            ("runs", f"{b.old_run[:8]} → {b.new_run[:8]}"),
            ("downtime", _fmt(b.downtime_s, " s")),
            ("old run's last step", _fmt(b.old_last_step)),
            ("old run's last checkpoint", f"step {_fmt(last_ckpt.get('step'))}"),
            (
                "checkpoint restored",
                f"step {_fmt(restored.get('step'))} "
                f"(version {_fmt(restored.get('weight_version'))})",
            ),
            ("stopped at (last event of the old run)", _utc(b.stopped_at)),
            ("resumed at (first event of the new run)", _utc(b.resumed_at)),
            ("attempts in flight at the stop", _fmt(b.attempts_in_flight)),
            (
                "groups in flight / sealed, untrained",
                f"{b.groups_in_flight} / {b.sealed_groups_untrained}",
            ),
            ("tokens at risk (sealed, not trained)", _fmt(b.tokens_at_risk)),
            ("rollouts interrupted (running at the stop)", _fmt(b.rollouts_interrupted)),
            ("interrupted rollouts: resumed", _fmt(b.resumed)),
            ("                      re-dispatched", _fmt(b.redispatched)),
            ("                      never ran again", _fmt(b.never_ran_again)),
            ("rollouts sealed but untrained at the stop", _fmt(b.rollouts_at_risk)),
            ("sealed, untrained: trained as kept", _fmt(b.at_risk_kept)),
            ("                   resumed", _fmt(b.at_risk_resumed)),
            ("                   re-dispatched", _fmt(b.at_risk_redispatched)),
            ("                   not run again", _fmt(b.at_risk_never_ran_again)),
            ("tokens recovered from snapshots", _fmt(b.tokens_recovered)),
            ("tokens generated again", _fmt(b.tokens_regenerated)),
            ("steps trained again", _fmt(b.steps_retrained)),
            ("time to get back to the last step", _fmt(b.catch_up_s, " s")),
            ("batch age before → after", f"{_fmt(b.batch_age_before)} → {_fmt(b.batch_age_after)}"),
        ]
        out.write(f"\nstop {n}\n")
        for label, value in rows:
            out.write(f"  {label:<44} {value}\n")
    out.write("\nwhole file\n")
    out.write(f"  {'training steps run (repeats included)':<48} {report.steps:,}\n")
    out.write(f"  {'attempts refused':<48} {report.refused_attempts:,}\n")
    out.write("\ntoken ledger (every logged token in one bucket)\n")
    for label, tokens, share in report.ledger_rows():
        out.write(f"  {label:<48} {tokens:>12,}  {share:>6}\n")
    out.write(f"  {report.balance()}\n")


def run(args: argparse.Namespace) -> int:
    without_cyclic_gc()
    report = load_report(args.file, args.window)
    if args.json:
        print_json(report.report(), indent=True)
    else:
        write_report(report, sys.stdout)
    return 0
