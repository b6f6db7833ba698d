"""Names that many modules share, kept in a module that imports nothing from the package.

Importing this module starts no thread and installs no hook, so the command
line and the simulator can name the log file without loading the writer.
"""

from __future__ import annotations

__all__ = ["ROLLOUT_TRACE_FILENAME"]

#: The log's file name inside a log directory.
ROLLOUT_TRACE_FILENAME = "rollout_trace.jsonl"
