"""Coverage-guided fuzzing of the readers and analyses with atheris (libFuzzer).

Run: ``python tests/fuzz_reader.py -runs=100000`` (or without -runs, until stopped).
Any exception other than the ones the code documents is a crash libFuzzer reports.
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile

import atheris

with atheris.instrument_imports():
    from otel_rollout.batch_age import batch_age_by_step
    from otel_rollout.cost import analyze, analyze_file
    from otel_rollout.reader import EventReader
    from otel_rollout.schema import problems

logging.disable(logging.CRITICAL)
_FD, _PATH = tempfile.mkstemp(suffix=".jsonl")


def one_input(data: bytes) -> None:
    os.ftruncate(_FD, 0)
    os.pwrite(_FD, data, 0)
    events = list(EventReader(_PATH, on_skip=lambda *a: None))
    for event in events:
        problems(event)
    batch_age_by_step(events, on_malformed=lambda *a: None)
    analyze(events)
    analyze_file(EventReader(_PATH, on_skip=lambda *a: None, typed=True), on_warning=_quiet)


def _quiet(where: object, message: str) -> None:
    pass


if __name__ == "__main__":
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()
