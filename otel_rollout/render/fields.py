"""Every field the read commands show, described once: its JSON key, its label in words,
its unit, a line of help, and how a value of it is written.

Text, JSON and HTML all come from these descriptions (:mod:`.text`, :mod:`.records`,
:mod:`.html`), so a field added here appears in all three, and a test checks that
every value of the JSON appears in the text and the HTML.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from ..age import AGE_BUCKETS
from .words import printable

__all__ = [
    "AGE_LABELS",
    "BOUNDARY_FIELDS",
    "LEDGER_FIELDS",
    "PLAIN",
    "RUN_ID_CHARS",
    "STEP_FIELDS",
    "SUMMARY_FIELDS",
    "Field",
    "Style",
    "as_html",
    "as_text",
    "iso_utc",
    "ledger_balance",
    "ledger_rows",
    "share",
    "short_run",
]

#: How many characters of a run ID the reports show (``--full-ids`` shows all).
RUN_ID_CHARS = 8

#: The token-age buckets, as words: ``age 0`` … ``age 3+``.
AGE_LABELS = [f"age {a}" for a in AGE_BUCKETS[:-1]] + [f"age {AGE_BUCKETS[-1]}+"]


@dataclass(frozen=True)
class Field:
    """One field: ``key`` in the JSON, ``label`` for people, ``kind`` for its format."""

    key: str
    label: str
    kind: str = "count"  # count | number | seconds | time | run | checkpoint | shares | causes
    unit: str = ""
    help: str = ""


@dataclass(frozen=True)
class Style:
    """How values are written: run IDs shortened unless ``full_ids``."""

    full_ids: bool = False


#: The default style: run IDs shortened.
PLAIN = Style()


def short_run(run_id: str | None, style: Style = PLAIN) -> str:
    """A run ID as every report shows it: the first characters, or all with ``--full-ids``."""
    if run_id is None:
        return "-"
    shown = run_id if style.full_ids or len(run_id) <= RUN_ID_CHARS else run_id[:RUN_ID_CHARS]
    return printable(shown)


def iso_utc(t: float) -> str:
    """Epoch seconds as ISO-8601 UTC, to the millisecond."""
    try:
        when = datetime.fromtimestamp(t, tz=timezone.utc)
    except (OverflowError, OSError, ValueError):  # past what a date holds
        return f"{t:.3f} (epoch s)"
    return when.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def share(part: int, whole: int) -> str:
    """``part`` of ``whole`` as a percentage; a share of nothing is ``n/a``, not 0.0%."""
    return f"{part / whole:.1%}" if whole else "n/a"


def _number(value: float | str) -> str:
    if isinstance(value, str):  # ±inf as a JSON record holds it (render.records.json_number)
        return value
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return f"{value:,.4f}"


def as_text(f: Field, value: Any, style: Style = PLAIN) -> str:
    """A value of field ``f`` as the text and HTML reports write it."""
    if value is None:
        return "-"
    kind = f.kind
    if kind == "time":
        return iso_utc(value)
    if kind == "run":
        return short_run(value, style)
    if kind == "seconds":
        return f"{value:,.3f} s"
    if kind == "number":
        return _number(value)
    if kind == "checkpoint":
        text = f"step {value.get('step', '-')} (version {value.get('weight_version', '-')})"
        if value.get("path"):
            text += f" at {value['path']}"
        if value.get("from_run_id"):
            text += f" from run {short_run(value['from_run_id'], style)}"
        return text
    if kind == "shares":
        return " ".join(
            f"{label} {value[label]:.1%}" if value[label] is not None else f"{label} n/a"
            for label in value
        )
    if kind == "causes":
        return ", ".join(f"{cause}: {n:,}" for cause, n in value.items()) or "none"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return str(value)


def as_html(f: Field, value: Any, style: Style = PLAIN) -> str:
    """A value of ``f`` as an HTML table cell: the text form, escaped; a run's full ID and
    a time's epoch seconds in its tooltip."""
    from html import escape  # html.entities: ~1 ms of every command's start-up otherwise

    text = escape(as_text(f, value, style))
    numeric = f.kind in ("count", "number", "seconds") and value is not None
    title = ""
    if f.kind == "run" and value is not None:
        title = f' title="{escape(str(value))}"'
    elif f.kind == "time" and value is not None:
        title = f' title="{value!r} epoch seconds"'
    css = ' class="n"' if numeric else ""
    return f"<td{css}{title}>{text}</td>"


BOUNDARY_FIELDS: Sequence[Field] = (
    Field("old_run", "run that stopped", "run"),
    Field("new_run", "run that resumed", "run"),
    Field("stopped_at", "stopped at (its last event)", "time"),
    Field("resumed_at", "resumed at (the new run's first event)", "time"),
    Field("downtime_s", "downtime", "seconds", "s"),
    Field("old_last_step", "last step of the run that stopped"),
    Field("old_last_checkpoint", "last checkpoint it published", "checkpoint"),
    Field("restored_checkpoint", "checkpoint restored", "checkpoint"),
    Field("attempts_in_flight", "attempts running at the stop", unit="attempts"),
    Field("groups_in_flight", "groups in flight at the stop (not sealed)", unit="groups"),
    Field("sealed_groups_untrained", "groups sealed but not trained at the stop", unit="groups"),
    Field("tokens_at_risk", "tokens of finished attempts not yet trained", unit="tokens"),
    Field("rollouts_interrupted", "rollouts running at the stop"),
    Field("resumed", "  of those: resumed from a snapshot"),
    Field("redispatched", "  of those: dispatched again from scratch"),
    Field("never_ran_again", "  of those: not run again by the next run"),
    Field("rollouts_at_risk", "rollouts finished but not yet trained at the stop"),
    Field("at_risk_kept", "  of those: kept and trained as they were"),
    Field("at_risk_resumed", "  of those: resumed from a snapshot"),
    Field("at_risk_redispatched", "  of those: dispatched again from scratch"),
    Field("at_risk_never_ran_again", "  of those: not run again by the next run"),
    Field("tokens_recovered", "tokens recovered from snapshots", unit="tokens"),
    Field("tokens_regenerated", "tokens generated again", unit="tokens"),
    Field("steps_retrained", "steps trained again", unit="steps"),
    Field("catch_up_s", "time to get back to the last step", "seconds", "s"),
    Field("batch_age_before", "batch age, mean of the steps before", "number", "updates"),
    Field("batch_age_after", "batch age, mean of the steps after", "number", "updates"),
)

SUMMARY_FIELDS: Sequence[Field] = (
    Field("steps", "training steps run (repeats included)", unit="steps"),
    Field("tokens_generated", "tokens generated", unit="tokens"),
    Field("tokens_trained", "tokens trained", unit="tokens"),
    Field("tokens_pending", "tokens pending (sealed or running when the file ends)"),
    Field("tokens_wasted_by_cause", "tokens wasted, by cause", "causes", "tokens"),
    Field("refused_attempts", "attempts refused", unit="attempts"),
)

#: The ledger's rows, in the order every report shows them; ``wasted`` is one row a cause.
LEDGER_FIELDS: Sequence[Field] = (
    Field("generated", "generated", help="every logged token of a sealed or abandoned attempt"),
    Field("trained", "trained", help="its group is in the surviving train.step of its step"),
    Field("wasted", "wasted", "causes", help="one row per cause (see the README's table)"),
    Field("pending", "pending (sealed or running when the file ends)"),
)

STEP_FIELDS: Sequence[Field] = (
    Field("step", "step"),
    Field("trained_version", "version"),
    Field("groups", "groups"),
    Field("tokens", "tokens", unit="tokens"),
    Field("batch_age", "batch age", "number", "updates"),
    Field("token_share_by_age", "share of tokens by age", "shares"),
    Field("run_id", "run", "run"),
)


def ledger_rows(ledger: dict[str, Any]) -> list[tuple[str, int, str]]:
    """The ledger as ``(label, tokens, share of generated)`` rows, for every report:
    generated, trained, one row per wasted cause, pending."""
    total = ledger["generated"]
    rows = [("generated", total), ("trained", ledger["trained"])]
    rows += [(f"wasted: {cause}", n) for cause, n in ledger["wasted"].items()]
    rows.append((LEDGER_FIELDS[-1].label, ledger["pending"]))
    return [(label, n, share(n, total)) for label, n in rows]


def ledger_balance(ledger: dict[str, Any]) -> str:
    """The ledger's identity in numbers, and whether it holds."""
    wasted = sum(ledger["wasted"].values())
    holds = ledger["generated"] == ledger["trained"] + wasted + ledger["pending"]
    return (
        f"{ledger['generated']:,} generated = {ledger['trained']:,} trained + "
        f"{wasted:,} wasted + {ledger['pending']:,} pending"
        + ("" if holds else "  (DOES NOT BALANCE: please report this)")
    )
