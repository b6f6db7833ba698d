"""Names that many modules share, kept in a module that imports nothing from the package.

Importing this module starts no thread and installs no hook, so the command
line and the simulator can name the log file without loading the writer.
"""

from __future__ import annotations

import sys

__all__ = ["MOST_DIGITS", "ROLLOUT_TRACE_FILENAME"]

#: The log's file name inside a log directory.
ROLLOUT_TRACE_FILENAME = "rollout_trace.jsonl"

#: The longest integer, in decimal digits, that any reader reads and the writer writes:
#: msgspec reads at most 4,300 (Python's default limit on turning text into an int), and
#: fewer where Python's own limit (``PYTHONINTMAXSTRDIGITS``) is lower.
MOST_DIGITS = min(sys.get_int_max_str_digits() or 4300, 4300)
