"""otel-rollout: instrumentation for asynchronous RL rollouts.

Events in (:class:`RolloutTrace`) → one background pipeline → exporters (the
JSONL log first); files in (:func:`read_events`) → analyses (batch age per
step, what a stop and restore cost) → the ``otel-rollout`` command.

Every public name is imported on first use (PEP 562): ``import otel_rollout``
loads no submodule, so a command that reads seals and steps does not import
the writer or OpenTelemetry's settings.  With the rare paths' imports moved
into the functions that need them, ``otel-rollout batch-age`` on an empty file
starts in 298M instructions instead of 331M (a process that only imports
orjson: 152M).  Type checkers see ordinary imports.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

#: Each public name and the module that defines it.
_WHERE = {
    "BATCH_AGE_TOKENS_METRIC": "batch_age",
    "BATCH_AGE_VERSION_SUM_METRIC": "batch_age",
    "RefitCuts": "batch_age",
    "StepAge": "batch_age",
    "batch_age_by_step": "batch_age",
    "batch_age_group_metrics": "batch_age",
    "pop_batch_age": "batch_age",
    "step_ages": "batch_age",
    "tokens_by_version": "batch_age",
    "ROLLOUT_TRACE_FILENAME": "constants",
    "EventExporter": "exporters",
    "JsonlExporter": "exporters",
    "OtelSettings": "otel",
    "configure": "otel",
    "EventReader": "reader",
    "read_events": "reader",
    "SCHEMA_VERSION": "schema",
    # Imported on first use so that `python -m otel_rollout.trace` runs the module once.
    "RolloutTrace": "trace",
    # Imports the OpenTelemetry SDK: only when asked for.
    "JsonlSpanExporter": "span_exporter",
}

if TYPE_CHECKING:
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
    from .span_exporter import JsonlSpanExporter
    from .trace import RolloutTrace


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is not None:
        value = getattr(importlib.import_module(f".{module}", __name__), name)
        globals()[name] = value  # the next lookup is an ordinary one
        return value
    if not name.startswith("__"):  # a submodule: otel_rollout.otel.reset() after the import
        try:
            return importlib.import_module(f".{name}", __name__)
        except ModuleNotFoundError as exc:
            if exc.name != f"{__name__}.{name}":
                raise  # the submodule exists and failed to import: say so
    raise AttributeError(f"module 'otel_rollout' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_WHERE})


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
