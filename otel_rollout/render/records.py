"""The JSON of the read commands: plain records, keyed as :mod:`.fields` describes them.

Times stay epoch seconds, with the same instant as ISO-8601 UTC beside each
(``stopped_at`` and ``stopped_at_utc``); run IDs stay whole.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..age import AGE_BUCKETS, StepAge
from .fields import BOUNDARY_FIELDS, iso_utc

if TYPE_CHECKING:  # the cost module only for its report type: batch-age need not load it
    from ..cost import CostReport

__all__ = ["AGE_KEYS", "cost_record", "step_record"]

#: The keys of ``token_share_by_age``: ``age0`` … ``age3+``.
AGE_KEYS = [f"age{a}" for a in AGE_BUCKETS[:-1]] + [f"age{AGE_BUCKETS[-1]}+"]

_TIMES = [f.key for f in BOUNDARY_FIELDS if f.kind == "time"]


def step_record(row: StepAge) -> dict[str, Any]:
    """One step as ``batch-age --json`` prints it (shares of a step without tokens: null)."""
    return {
        "step": row.step,
        "trained_version": row.trained_version,
        "groups": row.groups,
        "tokens": row.tokens,
        "batch_age": row.batch_age,
        "token_share_by_age": {
            key: (row.share(a) if row.tokens else None)
            for key, a in zip(AGE_KEYS, AGE_BUCKETS, strict=True)
        },
        "run_id": row.run_id,
    }


def cost_record(report: CostReport) -> dict[str, Any]:
    """The whole cost report as ``cost --json`` prints it."""
    record = report.report()
    for boundary in record["boundaries"]:
        for key in _TIMES:
            boundary[f"{key}_utc"] = iso_utc(boundary[key])
    return record
