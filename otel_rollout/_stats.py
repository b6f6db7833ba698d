"""What happened to the events a trace was handed: the pipeline's counts, with the
exporters' own added (:data:`otel_rollout.exporters.COUNTS` names those)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields

__all__ = ["COUNTED", "PipelineStats"]


@dataclass
class PipelineStats:
    """What happened to the events the caller handed over (read them after ``flush``).

    The first fields are the pipeline's own; the rest add up what the exporters
    report through ``counts()`` (see :data:`otel_rollout.exporters.COUNTS`),
    and counts of other names are kept in ``other``.
    """

    written: int = 0
    dropped_queue_full: int = 0
    dropped_write_error: int = 0
    #: Events with a field named t, run_id or event (kept as t_, …), or a name that was no
    #: string (written as its text); each counted once.
    renamed_fields: int = 0
    exporter_errors: int = 0
    #: Events not yet counted written or lost when these stats were read: waiting, or being
    #: written.
    queued: int = 0
    spans_made: int = 0
    spans_sent: int = 0
    spans_failed: int = 0
    spans_dropped: int = 0
    spans_queued: int = 0
    metric_exports_failed: int = 0
    events_oversized: int = 0
    log_syncs: int = 0
    log_sync_errors: int = 0
    other: dict[str, int] = field(default_factory=dict)

    @property
    def dropped(self) -> int:
        return self.dropped_queue_full + self.dropped_write_error

    def add(self, counts: Mapping[str, int]) -> None:
        """Add an exporter's counts to these."""
        for name, value in counts.items():
            if name in COUNTED:
                setattr(self, name, getattr(self, name) + value)
            else:
                self.other[name] = self.other.get(name, 0) + value


OWN = ("written", "dropped_queue_full", "dropped_write_error", "renamed_fields", "exporter_errors")
#: The counts exporters report (``counts()``), added up by name.
COUNTED = frozenset(f.name for f in fields(PipelineStats)) - {*OWN, "other", "queued"}
