"""otel-rollout: instrumentation for asynchronous RL rollouts.

Events in (:class:`RolloutTrace`) → one background pipeline → exporters (the
JSONL log first); files in (:func:`read_events`) → analyses (batch age per
step, what a stop and restore cost) → the ``otel-rollout`` command.
"""

from .batch_age import (
    BATCH_AGE_TOKENS_METRIC,
    BATCH_AGE_VERSION_SUM_METRIC,
    RefitCuts,
    StepAge,
    batch_age_by_step,
    batch_age_group_metrics,
    pop_batch_age,
    step_ages,
    tokens_by_version,
)
from .constants import ROLLOUT_TRACE_FILENAME
from .exporters import EventExporter, JsonlExporter
from .otel import OtelSettings, configure
from .reader import EventReader, read_events
from .schema import SCHEMA_VERSION

__version__ = "0.1.0"

_FROM_TRACE = ("RolloutTrace",)


def __getattr__(name: str) -> object:
    # Imported on first use so that `python -m otel_rollout.trace` runs the module once.
    if name in _FROM_TRACE:
        from . import trace

        return getattr(trace, name)
    if name == "JsonlSpanExporter":  # imports the OpenTelemetry SDK: only when asked for
        from .span_exporter import JsonlSpanExporter

        return JsonlSpanExporter
    raise AttributeError(f"module 'otel_rollout' has no attribute {name!r}")


__all__ = [
    "BATCH_AGE_TOKENS_METRIC",
    "BATCH_AGE_VERSION_SUM_METRIC",
    "ROLLOUT_TRACE_FILENAME",
    "SCHEMA_VERSION",
    "EventExporter",
    "EventReader",
    "JsonlExporter",
    "JsonlSpanExporter",
    "OtelSettings",
    "RefitCuts",
    "RolloutTrace",
    "StepAge",
    "__version__",
    "batch_age_by_step",
    "batch_age_group_metrics",
    "configure",
    "pop_batch_age",
    "read_events",
    "step_ages",
    "tokens_by_version",
]
