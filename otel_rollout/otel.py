"""OpenTelemetry configuration: which spans and metrics leave the process, and how.

Nothing leaves by default: the embedded default is the JSONL file alone.
The standard variables turn export on, as in the SDK's auto-configuration:

==================================  ==========================================================
``OTEL_SDK_DISABLED``               ``true``: no spans, no metrics, whatever else is set
``OTEL_TRACES_EXPORTER``            ``otlp``, ``console`` or ``none``
``OTEL_METRICS_EXPORTER``           any of ``otlp``, ``prometheus``, ``console``; or ``none``
``OTEL_EXPORTER_OTLP_ENDPOINT``     setting it alone turns OTLP export of spans and metrics on
``OTEL_EXPORTER_OTLP_PROTOCOL``     ``grpc`` (default) or ``http/protobuf``
``OTEL_EXPORTER_PROMETHEUS_HOST``   scrape endpoint address (default ``127.0.0.1``)
``OTEL_EXPORTER_PROMETHEUS_PORT``   scrape endpoint port (default ``9464``)
``OTEL_SERVICE_NAME``               ``service.name`` (default ``otel-rollout``)
``OTEL_RESOURCE_ATTRIBUTES``        more resource attributes, ``k=v,k=v``
==================================  ==========================================================

The SDK's own variables (``OTEL_EXPORTER_OTLP_HEADERS``, ``OTEL_BSP_*``,
``OTEL_METRIC_EXPORT_INTERVAL``, ...) are read by the SDK as usual.  In code,
:func:`configure` sets defaults for every trace opened afterwards (an option
left at ``None`` changes nothing; :func:`reset` forgets them); keyword
arguments of :class:`~otel_rollout.trace.RolloutTrace` win over both.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from . import config

__all__ = ["OtelSettings", "configure", "reset", "settings"]

_log = logging.getLogger("otel_rollout")

DEFAULT_SERVICE_NAME = "otel-rollout"
_TRACE_EXPORTERS = {"otlp", "console", "none"}
_METRIC_EXPORTERS = {"otlp", "prometheus", "console", "none"}


@dataclass(frozen=True)
class OtelSettings:
    """Where spans and metrics go.  ``enabled`` false means neither is built."""

    enabled: bool = True
    traces: str = "none"
    metrics: frozenset[str] = frozenset()
    endpoint: str | None = None
    protocol: str = "grpc"
    prometheus_host: str = "127.0.0.1"
    prometheus_port: int = 9464
    service_name: str | None = None
    tracer_provider: Any = None
    meter_provider: Any = None
    resource_attributes: Mapping[str, Any] = field(default_factory=dict)
    #: ``"sidecar"`` or ``"inprocess"``; None: ``OTEL_ROLLOUT_EXPORT_MODE`` (default sidecar).
    #: Your own ``tracer_provider``/``meter_provider`` always mean in-process.
    export_mode: str | None = None
    #: Experiment trackers: specs (``"tensorboard:DIR"``, ``"mlflow"``, ``"wandb"``; logged
    #: from by the sidecar) and run objects of yours (logged from by this process's pipeline).
    trackers: tuple[Any, ...] = ()

    @property
    def in_process(self) -> bool:
        """Whether spans and metrics are made on the trainer's background thread."""
        if self.tracer_provider is not None or self.meter_provider is not None:
            return True
        return config.EXPORT_MODE.resolve(self.export_mode) == "inprocess"

    @property
    def wants_sidecar(self) -> bool:
        """Whether the export sidecar is needed: export on, or tracker specs, out of process."""
        specs = any(isinstance(t, str) for t in self.trackers)
        return (self.active or specs) and not self.in_process

    @property
    def active(self) -> bool:
        """Whether anything beyond the JSONL file is produced."""
        wants = self.traces != "none" or self.metrics or self.tracer_provider or self.meter_provider
        return self.enabled and bool(wants)


#: What :func:`configure` set; a setting absent here comes from the environment.
_defaults: dict[str, Any] = {}


def configure(*, reset: bool = False, **options: Any) -> None:
    """Set defaults (any :class:`OtelSettings` field) for traces opened after this call.

    As in structlog, an option left out or passed as ``None`` leaves that
    setting as it was, and ``reset=True`` (or :func:`reset`) first restores
    the defaults.  ``configure(endpoint="http://collector:4317")`` exports
    spans and metrics over OTLP; ``configure(metrics={"prometheus"})`` serves
    a scrape endpoint; ``configure(tracer_provider=tp, meter_provider=mp)``
    uses yours.  Only an endpoint, an exporter name or an ``OTEL_*`` variable
    turns network export on.  ``configure(trackers="tensorboard:DIR,mlflow,wandb")``
    (or run objects of yours) logs each step and restore into experiment trackers
    (:mod:`otel_rollout.trackers`).
    """
    _check_names("configure()", options)
    if reset:
        _defaults.clear()
    _defaults.update(_normalize({k: v for k, v in options.items() if v is not None}))


def reset() -> None:
    """Forget every :func:`configure` call: the environment's settings apply again."""
    _defaults.clear()


def settings(environ: Mapping[str, str] | None = None, **overrides: Any) -> OtelSettings:
    """The settings in force: the environment, then :func:`configure`, then ``overrides``."""
    _check_names("OpenTelemetry settings", overrides)
    env = os.environ if environ is None else environ
    endpoint = env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get(
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
    )
    traces = _choice(env, "OTEL_TRACES_EXPORTER", _TRACE_EXPORTERS)
    metrics = _choices(env, "OTEL_METRICS_EXPORTER", _METRIC_EXPORTERS)
    base = OtelSettings(
        enabled=env.get("OTEL_SDK_DISABLED", "").strip().lower() != "true",
        traces=traces if traces is not None else ("otlp" if endpoint else "none"),
        metrics=metrics if metrics is not None else frozenset({"otlp"} if endpoint else ()),
        endpoint=None,  # the SDK's exporters read the variable themselves
        protocol=_protocol(env.get("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")),
        prometheus_host=env.get("OTEL_EXPORTER_PROMETHEUS_HOST") or "127.0.0.1",
        prometheus_port=_port(env.get("OTEL_EXPORTER_PROMETHEUS_PORT"), 9464),
        service_name=env.get("OTEL_SERVICE_NAME") or None,
        trackers=_env_trackers(environ),
    )
    chosen = {**_defaults, **_normalize({k: v for k, v in overrides.items() if v is not None})}
    # An endpoint given in code turns OTLP on, as the variable does; nothing else does.
    if chosen.get("endpoint") and "traces" not in chosen and traces is None:
        chosen["traces"] = "otlp"
    if chosen.get("endpoint") and "metrics" not in chosen and metrics is None:
        chosen["metrics"] = frozenset({"otlp"})
    return replace(base, **chosen)


def _check_names(where: str, options: Mapping[str, Any]) -> None:
    unknown = set(options) - set(OtelSettings.__dataclass_fields__)
    if unknown:
        known = ", ".join(sorted(OtelSettings.__dataclass_fields__))
        raise TypeError(f"{where}: unknown options {sorted(unknown)}; known: {known}")


def _normalize(options: dict[str, Any]) -> dict[str, Any]:
    """Options given in code, checked: a name or a port that cannot work raises at once
    (the same mistake in an ``OTEL_*`` variable is warned of and passed over)."""
    out = dict(options)
    if "traces" in out and out["traces"] not in _TRACE_EXPORTERS:
        raise ValueError(f"traces: one of {sorted(_TRACE_EXPORTERS)}, got {out['traces']!r}")
    if "metrics" in out and not isinstance(out["metrics"], frozenset):
        value = out["metrics"]
        out["metrics"] = frozenset([value] if isinstance(value, str) else value) - {"none"}
    if "metrics" in out and not out["metrics"] <= _METRIC_EXPORTERS:
        unknown = sorted(map(str, out["metrics"] - _METRIC_EXPORTERS))
        raise ValueError(f"metrics: each of {sorted(_METRIC_EXPORTERS)}, got {unknown}")
    port = out.get("prometheus_port")
    if port is not None and not (
        isinstance(port, int) and not isinstance(port, bool) and 0 <= port < 65536
    ):
        raise ValueError(f"prometheus_port: a port number from 0 to 65535, got {port!r}")
    if "protocol" in out:
        out["protocol"] = _protocol(out["protocol"])
    if "trackers" in out:
        out["trackers"] = _trackers(out["trackers"])
    if "export_mode" in out:
        try:
            out["export_mode"] = config.EXPORT_MODE.parse(str(out["export_mode"]))
        except ValueError as exc:
            raise ValueError(f"export_mode: {exc}, got {out['export_mode']!r}") from None
    return out


def _env_trackers(environ: Mapping[str, str] | None) -> tuple[str, ...]:
    if environ is None:
        return config.TRACKERS.resolve()
    raw = environ.get(config.TRACKERS.env, "")
    try:
        return config.TRACKERS.parse(raw) if raw.strip() else ()
    except ValueError as exc:
        _log.warning("ignoring %s=%r (%s)", config.TRACKERS.env, raw, exc)
        return ()


def _trackers(value: Any) -> tuple[Any, ...]:
    """Specs as text (checked by the one parser) and run objects, in the order given."""
    from .trackers._spec import parse_specs

    items = [value] if isinstance(value, str) or not isinstance(value, (list, tuple)) else value
    out: list[Any] = []
    for item in items:
        if isinstance(item, str):
            out += [str(spec) for spec in parse_specs(item)]  # raises on a bad spec
        elif item is not None:
            out.append(item)
    return tuple(out)


def _choice(env: Mapping[str, str], name: str, allowed: set[str]) -> str | None:
    values = _choices(env, name, allowed)
    if values is None:
        return None
    return next(iter(sorted(values)), "none")


def _choices(env: Mapping[str, str], name: str, allowed: set[str]) -> frozenset[str] | None:
    raw = env.get(name)
    if raw is None or not raw.strip():
        return None
    values = {v.strip().lower() for v in raw.split(",") if v.strip()}
    unknown = values - allowed
    if unknown:
        _log.warning("ignoring %s values %s (known: %s)", name, sorted(unknown), sorted(allowed))
    return frozenset(values & allowed - {"none"})


def _protocol(raw: str) -> str:
    value = raw.strip().lower()
    if value in ("http", "http/protobuf"):
        return "http/protobuf"
    if value != "grpc":
        _log.warning("unsupported OTLP protocol %r; using grpc", raw)
    return "grpc"


def _port(raw: str | None, default: int) -> int:
    if not raw:
        return default
    try:
        port = int(raw)
        if 0 <= port < 65536:
            return port
    except ValueError:
        pass
    _log.warning("ignoring OTEL_EXPORTER_PROMETHEUS_PORT=%r; using %d", raw, default)
    return default
