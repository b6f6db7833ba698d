"""Names that many modules share, kept in a module that imports nothing from the package.

Importing this module starts no thread and installs no hook, so the command
line and the simulator can name the log file without loading the writer.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["ROLLOUT_TRACE_FILENAME", "log_path"]

#: The log's file name inside a log directory.
ROLLOUT_TRACE_FILENAME = "rollout_trace.jsonl"


def log_path(path: str | os.PathLike[str]) -> Path:
    """The log file a writer given ``path`` writes: ``path`` itself, or
    ``path/rollout_trace.jsonl`` when ``path`` is a directory, one that exists, or a new
    path that ends in a separator or has no suffix (``runs/exp1``: a log directory, as the
    simulator's ``--log-dir`` is; ``runs/exp1.jsonl``: a file)."""
    text = os.fspath(path)
    target = Path(text)
    ends_in_separator = text.endswith((os.sep, "/"))
    new_directory = not target.exists() and (ends_in_separator or not target.suffix)
    if target.is_dir() or new_directory:
        return target / ROLLOUT_TRACE_FILENAME
    return target
