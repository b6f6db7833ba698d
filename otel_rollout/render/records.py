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

__all__ = ["AGE_KEYS", "cost_record", "json_number", "staleness_record", "step_record"]

#: The keys of ``token_share_by_age``: ``age0`` … ``age3+``.
AGE_KEYS = [f"age{a}" for a in AGE_BUCKETS[:-1]] + [f"age{AGE_BUCKETS[-1]}+"]

_SHARES = tuple(zip(AGE_KEYS, AGE_BUCKETS, strict=True))
_TIMES = [f.key for f in BOUNDARY_FIELDS if f.kind == "time"]


def json_number(value: float | None) -> float | str | None:
    """A float as the JSON outputs write it: ±inf as the strings ``"inf"`` and ``"-inf"``,
    as the text reports print them (JSON has no infinity; orjson writes ``null``, which
    already means "no value": a step without tokens, a ratio of nothing)."""
    if value is not None and value - value != 0:  # inf - inf is nan; a finite float gives 0
        return str(value)
    return value


def step_record(row: StepAge) -> dict[str, Any]:
    """One step as ``batch-age --json`` prints it (shares of a step without tokens: null)."""
    tokens, by_age = row.tokens, row.tokens_by_age
    return {
        "step": row.step,
        "trained_version": row.trained_version,
        "groups": row.groups,
        "tokens": row.tokens,
        "batch_age": json_number(row.batch_age),
        "token_share_by_age": (
            {key: by_age.get(a, 0) / tokens for key, a in _SHARES}  # row.share(a), inline
            if tokens
            else dict.fromkeys(AGE_KEYS)
        ),
        "run_id": row.run_id,
    }


def staleness_record(record: dict[str, Any]) -> dict[str, Any]:
    """The staleness report as ``staleness --json`` prints it (an infinite starvation ratio,
    only long rollouts gone stale, is ``"inf"``; ``null`` is none gone stale)."""
    bias = record["length_bias"]
    bias["long_rollout_starvation"] = json_number(bias["long_rollout_starvation"])
    return record


def cost_record(report: CostReport) -> dict[str, Any]:
    """The whole cost report as ``cost --json`` prints it."""
    record = report.report()
    for boundary in record["boundaries"]:
        for key in _TIMES:
            boundary[f"{key}_utc"] = iso_utc(boundary[key])
    return record
