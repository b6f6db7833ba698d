"""Read back what the trackers logged, with each tracker's own code.

TensorBoard: ``EventAccumulator``.  MLflow: ``MlflowClient``.  W&B ships no
reader for a run's ``.wandb`` file any more, so its records are decoded with
wandb's own ``wandb_internal_pb2.Record`` from the documented framing (a
7-byte header ``:W&B``, magic 0xBEE1, version; then LevelDB-log blocks of
32 KiB whose records have a 7-byte header: CRC-32, length, type FULL / FIRST
/ MIDDLE / LAST).
"""

from __future__ import annotations

import json
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

Series = dict[str, dict[int, float]]  # metric → step → value


def tensorboard_runs(logdir: Path) -> dict[str, Series]:
    """Every run directory under ``logdir``: its scalars by tag and step."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    runs: dict[str, Series] = {}
    for run_dir in sorted(p for p in logdir.iterdir() if p.is_dir()):
        acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
        acc.Reload()
        runs[run_dir.name] = {
            tag: {e.step: e.value for e in acc.Scalars(tag)} for tag in acc.Tags()["scalars"]
        }
    return runs


def mlflow_runs(uri: str, experiment: str = "otel-rollout") -> dict[str, Series]:
    """Every run of ``experiment`` in the store at ``uri``, by run name: metrics by step."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    found = client.get_experiment_by_name(experiment)
    assert found is not None, f"no experiment {experiment} in {uri}"
    runs: dict[str, Series] = {}
    for run in client.search_runs([found.experiment_id]):
        runs[run.info.run_name] = mlflow_series(client, run.info.run_id)
    return runs


def mlflow_series(client: object, run_id: str) -> Series:
    run = client.get_run(run_id)  # type: ignore[attr-defined]
    return {
        key: {m.step: m.value for m in client.get_metric_history(run_id, key)}  # type: ignore[attr-defined]
        for key in run.data.metrics
    }


def _wandb_records(path: Path) -> list[Any]:
    """A finished run file's records, once it ends with its exit record: wandb-core may
    still be writing it when ``finish()`` returns (seen on a loaded machine: no run record
    yet, or a record cut short), so wait for it, up to 60 s."""
    from google.protobuf.message import DecodeError
    from wandb.proto import wandb_internal_pb2

    deadline = time.monotonic() + 60
    while True:
        records = []
        try:
            for raw in _records(path):
                record = wandb_internal_pb2.Record()
                record.ParseFromString(raw)
                records.append(record)
        except (DecodeError, struct.error):
            records = []  # a record still being written
        if records and records[-1].WhichOneof("record_type") == "exit":
            return records
        assert time.monotonic() < deadline, f"{path} has no exit record"
        time.sleep(0.1)


def _records(path: Path) -> Iterator[bytes]:
    data = path.read_bytes()
    ident, magic, _version = struct.unpack("<4sHB", data[:7])
    assert (ident, magic) == (b":W&B", 0xBEE1), f"{path} is not a W&B run file"
    pos, block, pending = 7, 32768, b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:  # a block's tail too short for a header is padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        pos += 7
        if kind == 0 and length == 0:
            break
        chunk = data[pos : pos + length]
        pos += length
        if kind == 1:
            yield chunk
        elif kind == 2:
            pending = chunk
        elif kind == 3:
            pending += chunk
        elif kind == 4:
            yield pending + chunk
            pending = b""


def wandb_runs(wandb_dir: Path) -> dict[str, Series]:
    """Every offline run under ``wandb_dir``, by display name: values by ``rollout/step``."""

    runs: dict[str, Series] = {}
    for path in sorted(wandb_dir.rglob("offline-run-*/*.wandb")):
        name, series = None, {}
        for record in _wandb_records(path):
            kind = record.WhichOneof("record_type")
            if kind == "run":
                name = record.run.display_name
            elif kind == "history":
                row = {  # a key with a slash is kept as its parts
                    item.key or "/".join(item.nested_key): json.loads(item.value_json)
                    for item in record.history.item
                }
                step = row.get("rollout/step")
                for key, value in row.items():
                    if step is not None and key.startswith(("rollout/", "restore/")):
                        series.setdefault(key, {})[int(step)] = value
        assert name is not None, f"{path} has no run record"
        runs[name] = series
    return runs


def wandb_history(wandb_dir: Path, name: str) -> list[dict[str, object]]:
    """The history rows (every key, ``_step`` too) of the offline run named ``name``."""

    for path in sorted(wandb_dir.rglob("offline-run-*/*.wandb")):
        rows, found = [], None
        for record in _wandb_records(path):
            kind = record.WhichOneof("record_type")
            if kind == "run":
                found = record.run.display_name
            elif kind == "history":
                rows.append({
                    item.key or "/".join(item.nested_key): json.loads(item.value_json)
                    for item in record.history.item
                })  # fmt: skip
        if found == name:
            return rows
    raise AssertionError(f"no offline run {name} under {wandb_dir}")
