"""Rollout metrics, computed from events on the background thread.

:class:`MetricsExporter` is an exporter of the pipeline.  Batch age comes
from :class:`~otel_rollout.live_age.LiveBatchAge`, the same code the
offline reader uses, so the gauge equals ``batch_age_by_step`` for every
step.  The step number is a gauge of its own, never a label: unbounded label
values are a Prometheus anti-pattern.

Instruments are listed in :data:`INSTRUMENTS`.  In Prometheus a name's dots
become underscores and counters gain ``_total``: ``rollout.batch_age`` is
``rollout_batch_age``, ``rollout.attempts`` is
``rollout_attempts_total{outcome,reason}``, ``rollout.tokens.trained`` is
``rollout_tokens_trained_total{age}`` with ages ``0``, ``1``, ``2``, ``3+``.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from opentelemetry.metrics import Meter

from .age import AGE_BUCKETS
from .live_age import LiveBatchAge
from .metric_values import metric_value

__all__ = ["AGE_LABELS", "INSTRUMENTS", "MetricsExporter"]

AGE_LABELS = {a: str(a) for a in AGE_BUCKETS[:-1]} | {AGE_BUCKETS[-1]: f"{AGE_BUCKETS[-1]}+"}

#: Every instrument: name → (kind, unit, description).  The dashboards and tests read this.
INSTRUMENTS: dict[str, tuple[str, str, str]] = {
    "rollout.batch_age": ("gauge", "{update}", "Batch age of the last step trained"),
    "rollout.step": ("gauge", "{step}", "The last step trained"),
    "rollout.trained_version": ("gauge", "{version}", "Policy version the last step updated"),
    "rollout.weight_version": ("gauge", "{version}", "Weight version installed in the engine"),
    "rollout.tokens.trained": ("counter", "{token}", "Trained tokens by age"),
    "rollout.attempts": ("counter", "{attempt}", "Attempts ended, by outcome and reason"),
    "rollout.groups": ("counter", "{group}", "Groups ended, by outcome and reason"),
    "rollout.refits": ("counter", "{refit}", "Weight syncs into the engine"),
    "rollout.refit.paused_calls": ("counter", "{call}", "Running calls paused by a refit"),
    "rollout.checkpoints": ("counter", "{checkpoint}", "Checkpoints published and restored"),
    "rollout.trace.events": ("counter", "{event}", "Trace events exported"),
    "rollout.trace.dropped": ("counter", "{event}", "Trace events dropped"),
}

_OUTCOMES = {
    "attempt.seal": ("rollout.attempts", "sealed"),
    "attempt.refuse": ("rollout.attempts", "refused"),
    "attempt.abandon": ("rollout.attempts", "abandoned"),
    "group.seal": ("rollout.groups", "sealed"),
    "group.discard": ("rollout.groups", "discarded"),
}


class MetricsExporter:
    """Updates the rollout instruments of ``meter`` from each batch of events."""

    def __init__(
        self,
        meter: Meter,
        on_shutdown: Callable[[], None] | None = None,
        *,
        live: LiveBatchAge | None = None,
        counts: Callable[[], Mapping[str, int]] | None = None,
    ) -> None:
        self._on_shutdown = on_shutdown
        self._counts = counts  # what the metric exporters behind the meter counted
        # Shared by the sidecar across a file's runs: a resumed run trains groups sealed before.
        self._live = live if live is not None else LiveBatchAge()
        self._i: dict[str, Any] = {}
        #: Events whose fields were missing or mistyped (they update no instrument).
        self.malformed = 0
        for name, (kind, unit, description) in INSTRUMENTS.items():
            create = meter.create_gauge if kind == "gauge" else meter.create_counter
            self._i[name] = create(name, unit=unit, description=description)
        # Present (as 0) before the first increment, so increase() sees the step to 1.
        self._i["rollout.trace.dropped"].add(0)
        for kind in ("publish", "restore"):
            self._i["rollout.checkpoints"].add(0, {"kind": kind})

    def export(self, events: Sequence[dict[str, Any]]) -> int:
        i = self._i
        i["rollout.trace.events"].add(len(events))
        ended: Counter[tuple[str, str, str]] = Counter()  # one SDK call per outcome per batch
        for event in events:
            try:
                self._observe(event, ended)
            except (LookupError, TypeError, ValueError, AttributeError):
                self.malformed += 1  # a field missing or mistyped: no update from this event
        for (name, label, reason), n in ended.items():
            i[name].add(n, {"outcome": label, "reason": reason} if reason else {"outcome": label})
        return 0

    def _observe(self, event: dict[str, Any], ended: Counter[tuple[str, str, str]]) -> None:
        i = self._i
        kind = event.get("event")
        outcome = _OUTCOMES.get(kind) if kind.__class__ is str else None
        if outcome is not None:
            key = (*outcome, str(event.get("reason", "")))
            ended[key] += 1
        row = self._live.observe(event)
        if row is not None:
            self._record_step(row)
        elif kind == "weights.sync":
            version = event["new_version"]
            i["rollout.refits"].add(1)
            i["rollout.refit.paused_calls"].add(len(event.get("cuts") or ()))
            _set(i["rollout.weight_version"], version)
        elif kind == "trace.dropped":
            _add(i["rollout.trace.dropped"], event.get("count", 0))
        elif kind in ("checkpoint.publish", "checkpoint.restore"):
            i["rollout.checkpoints"].add(1, {"kind": kind.split(".")[1]})

    def _record_step(self, row: Any) -> None:
        i = self._i
        _set(i["rollout.step"], row.step)
        _set(i["rollout.trained_version"], row.trained_version)
        if row.batch_age is not None:
            _set(i["rollout.batch_age"], row.batch_age)
        for age, n in row.tokens_by_age.items():
            _add(i["rollout.tokens.trained"], n, {"age": AGE_LABELS[age]})

    def counts(self) -> dict[str, int]:
        """Failed metric exports, as the exporters behind the meter counted them."""
        return dict(self._counts()) if self._counts is not None else {}

    def shutdown(self) -> None:
        if self._on_shutdown is not None:
            self._on_shutdown()


# Integers of any size are valid in the file; not every backend takes them: a value past
# 64 bits is a float (metric_value), and one past a float's range is left out (the SDK
# would drop it with a warning at every event).


def _set(gauge: Any, value: Any) -> None:
    value = metric_value(value)
    if -math.inf < value < math.inf:
        gauge.set(value)


def _add(counter: Any, value: Any, attributes: Mapping[str, str] | None = None) -> None:
    value = metric_value(value)
    if -math.inf < value < math.inf:
        counter.add(value, attributes)
