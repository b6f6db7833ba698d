"""Tracker specs: the one parser for ``OTEL_ROLLOUT_TRACKERS``, ``configure(trackers=…)``,
``RolloutTrace(trackers=…)`` and ``otel-rollout log-to``.  Imports nothing of the package."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["KINDS", "MissingExtra", "Spec", "TrackerSpecError", "missing_extra", "parse_specs",
           "wandb_login_missing"]  # fmt: skip

#: Each tracker: the module it imports, the extra that installs it, what follows the colon.
KINDS: dict[str, tuple[str, str, str]] = {
    "tensorboard": ("tensorboardX", "tensorboard", "DIR (required): event files go in DIR/RUN_ID"),
    "mlflow": ("mlflow", "mlflow", "TRACKING_URI (optional; default: MLflow's own)"),
    "wandb": ("wandb", "wandb", "PROJECT (optional; default: WANDB_PROJECT, else otel-rollout)"),
}


class TrackerSpecError(ValueError):
    """A tracker spec that names no known tracker, or lacks what it needs."""


class MissingExtra(ImportError):
    """A tracker whose library is not installed: the message says which extra to install."""


@dataclass(frozen=True)
class Spec:
    """One tracker to log into: ``kind`` and its target (a directory, a URI, a project)."""

    kind: str
    target: str | None = None

    def __str__(self) -> str:
        return self.kind if self.target is None else f"{self.kind}:{self.target}"


def _one(text: str) -> Spec:
    kind, _, rest = text.strip().partition(":")
    kind = kind.strip().lower()
    if kind == "tb":
        kind = "tensorboard"
    if kind not in KINDS:
        known = ", ".join(f"{k}:{KINDS[k][2].split(' ', 1)[0]}" for k in KINDS)
        raise TrackerSpecError(f"unknown tracker {text.strip()!r} (known: {known})")
    target = rest.strip() or None
    if kind == "tensorboard":
        if target is None:
            raise TrackerSpecError("tensorboard needs a directory: tensorboard:DIR")
        # Absolute where it is parsed (the trainer's cwd), not where the sidecar runs
        target = os.path.abspath(os.path.expanduser(target))
    return Spec(kind, target)


def parse_specs(value: str | Iterable[str]) -> tuple[Spec, ...]:
    """``"tensorboard:/tmp/tb,mlflow,wandb"`` (or a list of such items) as specs, in order.

    A URI's own colons are kept (``mlflow:sqlite:////tmp/m.db``); only the first colon
    parts a kind from its target.  An unknown kind raises :class:`TrackerSpecError`.
    """
    items = value.split(",") if isinstance(value, str) else list(value)
    specs: list[Spec] = []
    for item in items:
        if not isinstance(item, str):
            raise TrackerSpecError(f"a tracker spec is text, got {type(item).__name__}")
        if item.strip():
            spec = _one(item)
            if spec not in specs:
                specs.append(spec)
    return tuple(specs)


def missing_extra(kind: str) -> str | None:
    """The one-line message for a tracker whose library is not installed, else None."""
    module, extra, _ = KINDS[kind]
    if importlib.util.find_spec(module) is not None:
        return None
    return f"the {kind} tracker needs {module}: pip install 'otel-rollout[{extra}]'"


def wandb_login_missing() -> str | None:
    """The one-line message when wandb would ask for a login (no ``WANDB_API_KEY``, no
    ``wandb login`` entry in ~/.netrc, mode neither offline nor disabled), else None.

    In the training process wandb's prompt would take the trainer's terminal."""
    mode = os.environ.get("WANDB_MODE", "").strip().lower()
    if mode in ("offline", "disabled", "dryrun") or os.environ.get("WANDB_API_KEY"):
        return None
    host = (os.environ.get("WANDB_BASE_URL") or "https://api.wandb.ai").split("//")[-1]
    try:
        import netrc

        if netrc.netrc().authenticators(host.split("/")[0].split(":")[0]):
            return None
    except (OSError, netrc.NetrcParseError):
        pass
    return (
        "the wandb tracker would ask for a login here: set WANDB_API_KEY, run `wandb login`, "
        "or set WANDB_MODE=offline"
    )
