"""A real SIGKILL of a process that emits steadily: how much recent history the file lost."""

from __future__ import annotations

import statistics

import pytest
from conftest import clean_env

from otel_rollout.reader import read_events
from otel_rollout.testing import OtlpReceiver, kill_loss_window

KILLS = 5


class TestKillLossBound:
    @pytest.mark.parametrize("spans", [False, True], ids=["jsonl-only", "with-otlp"])
    def test_newest_event_in_the_file_is_within_10ms_of_the_kill(self, tmp_path, spans):
        """Killed at 5,000 events/s, the file's newest event trails the kill by at most 10 ms
        (median of five kills), also with OTLP export on; the file reads cleanly."""
        receiver = OtlpReceiver("grpc", keep=False) if spans else None
        try:
            env = (
                clean_env(OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint)
                if receiver
                else clean_env()
            )
            results = [kill_loss_window(tmp_path / f"kill{i}.jsonl", env=env) for i in range(KILLS)]
        finally:
            if receiver is not None:
                receiver.close()
        windows = [r.window for r in results]
        assert statistics.median(windows) <= 0.010, windows
        for i, r in enumerate(results):
            assert r.events > 1000 and r.skipped_lines <= 1  # at most the torn last line
            events = list(read_events(tmp_path / f"kill{i}.jsonl"))
            seqs = [e["seq"] for e in events if e["event"] == "tick"]
            assert seqs == list(range(len(seqs)))  # nothing missing before the kill
