"""The rows the trackers log, against a naive model: batch age as the file gives it, counts
as one counts the events, over random runs killed and resumed from their checkpoints."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from otel_rollout.batch_age import step_ages
from otel_rollout.testing import TraceBuilder
from otel_rollout.trackers import RowBuilder
from otel_rollout.trackers._rows import SHARE_NAMES

_OUTCOMES = {"attempt.seal": "sealed", "attempt.refuse": "refused", "attempt.abandon": "abandoned"}


@st.composite
def resumed_runs(draw):
    """Runs that train steps, checkpoint now and then, and are killed; each next run restores
    the last checkpoint and trains again from there, with groups its predecessor sealed or
    trained after that checkpoint (a snapshot kept them) and groups of its own."""
    b = TraceBuilder("run-0")
    step, checkpoint, version, g = 0, -1, 0, 0
    trained_after: dict[int, list[str]] = {}  # step → the groups it trained, since the checkpoint
    untrained: list[str] = []
    for run in range(draw(st.integers(1, 3))):
        if run:
            b.new_run(f"run-{run}")
            b.event("checkpoint.restore", step=max(checkpoint, 0), weight_version=checkpoint + 1)
            step, version = checkpoint + 1, checkpoint + 1
            kept = [gid for s in sorted(trained_after) for gid in trained_after[s]]
            untrained = kept + untrained
            trained_after = {}
        for _ in range(draw(st.integers(1, 6))):
            for _ in range(draw(st.integers(0, 3))):
                outcome = draw(st.sampled_from(sorted(_OUTCOMES)))
                ids = {"attempt_id": f"a{g}", "group_id": "x", "prompt_id": 0,
                       "generation_index": 0}  # fmt: skip
                extra = {"tokens": 5} if outcome == "attempt.seal" else {"reason": "stale"}
                b.event(outcome, **ids, **extra)
            for _ in range(draw(st.integers(0, 3))):
                counts = draw(st.dictionaries(st.integers(max(version - 3, 0), version),
                                              st.integers(1, 50), max_size=3))  # fmt: skip
                gid = f"g{g}"
                g += 1
                b.sealed_group(gid, counts or None)
                untrained.append(gid)
            if draw(st.booleans()):
                b.event("weights.sync", replaced_version=version, new_version=version + 1,
                        cuts=[["c", 1]] * draw(st.integers(0, 2)))  # fmt: skip
            take = draw(st.integers(0, len(untrained)))
            groups, untrained = untrained[:take], untrained[take:]
            b.step(step, version + 1, groups)
            trained_after[step] = groups
            step, version = step + 1, version + 1
            if draw(st.integers(0, 3)) == 0:
                b.event("checkpoint.publish", step=step - 1, weight_version=version)
                checkpoint, trained_after = step - 1, {}
    return b.events


@settings(max_examples=150)
@given(events=resumed_runs(), cut=st.integers(1, 40))
def test_rows_equal_the_file_and_the_counts(events, cut) -> None:
    """Fed in batches of any size, every surviving step's row has the file's batch age and
    shares exactly, and each count equals the events of its run so far."""
    builder = RowBuilder(None)
    rows = []
    for i in range(0, len(events), cut):
        rows += builder.feed(events[i : i + cut])
    rows += builder.end_all()
    steps = [r for r in rows if not any(k.startswith("restore/") for k in r[2])]
    by_key = {(run_id, step): values for run_id, step, values in steps}
    assert len(by_key) == len(steps)  # one row per step a run trained
    for row in step_ages(events):
        values = by_key[(row.run_id, row.step)]
        assert values["rollout/tokens_trained"] == row.tokens
        assert values.get("rollout/batch_age") == row.batch_age
        if row.tokens:
            for age, name in SHARE_NAMES.items():
                assert values[name] == row.share(age)
    seen: Counter[tuple[str, str]] = Counter()  # the naive model: count as the events go by
    for e in events:
        if e["event"] in _OUTCOMES:
            seen[(e["run_id"], f"rollout/attempts_{_OUTCOMES[e['event']]}")] += 1
        elif e["event"] == "group.seal":
            seen[(e["run_id"], "rollout/groups_sealed")] += 1
        elif e["event"] == "weights.sync":
            seen[(e["run_id"], "rollout/refits")] += 1
            seen[(e["run_id"], "rollout/refit_paused_calls")] += len(e["cuts"])
        elif e["event"] == "train.step":
            values = by_key[(e["run_id"], e["step"])]
            for (run_id, name), n in seen.items():
                if run_id == e["run_id"]:
                    assert values[name] == n, name


def test_a_restore_row_needs_the_log_read_once(tmp_path) -> None:
    """A training process's builder reads the runs before its own once, at its first batch:
    its restore rows are cost's, though the log is gone after that first read."""
    from otel_rollout.cost import analyze
    from otel_rollout.trackers._rows import restore_values

    b = TraceBuilder("run-0")
    for s in range(4):
        b.sealed_group(f"g{s}", {s: 10})
        b.step(s, s + 1, [f"g{s}"])
        if s == 1:
            b.event("checkpoint.publish", step=1, weight_version=2)
    before = len(b.events)
    log = b.write(tmp_path / "log.jsonl")
    b.new_run("run-1")
    b.event("checkpoint.restore", step=1, weight_version=2)
    for s in range(2, 5):
        b.sealed_group(f"h{s}", {s: 10})
        b.step(s, s + 1, [f"h{s}"])
    builder = RowBuilder(log, None)  # made before run-1's first event was written
    mine = b.events[before:]
    rows = builder.feed(mine[:1])
    log.unlink()
    rows += builder.feed(mine[1:]) + builder.end_all()
    restores = [(step, v) for run_id, step, v in rows if "restore/downtime_s" in v]
    [boundary] = analyze(b.events).boundaries
    assert restores and restores[-1][1] == restore_values(boundary)
    assert restores[0][0] == 3  # due when the old run's last step was trained again


def test_an_event_whose_kind_is_no_string_changes_no_row() -> None:
    """A kind that is a list (unhashable) is passed over: the batch's other rows still come."""
    b = TraceBuilder("r")
    b.sealed_group("g", {0: 5})
    b.step(0, 1, ["g"])
    events = [{"t": 1.0, "run_id": "r", "event": ["group.seal"]}, *b.events]
    assert [(run_id, step) for run_id, step, _ in RowBuilder().feed(events)] == [("r", 0)]


def test_a_forked_childs_counts_are_its_parents_run() -> None:
    """Attempts a forked rollout worker sealed (its lines under its own run_id) count in its
    parent's step rows, one tracker run for the one run."""
    parent = TraceBuilder("P")
    child = {"run_id": "C"}
    events = list(parent.events)
    events.append({"t": 0.5, "event": "run.start", "schema": 1, "pid": 2,
                   "parent_run_id": "P", **child})  # fmt: skip
    parent.event("group.reserve", group_id="g", prompt_id=1, size=2, weight_version=0)
    events += parent.events[-1:]
    for i in range(2):
        ids = {"attempt_id": f"a{i}", "group_id": "g", "prompt_id": 1, "generation_index": i}
        events.append({"t": 1.0 + i, "event": "attempt.dispatch", "weight_version": 0,
                       **ids, **child})  # fmt: skip
        events.append({"t": 1.5 + i, "event": "attempt.seal", "tokens": 5, **ids, **child})
    parent.sealed_group("g", {0: 10})
    parent.step(0, 1, ["g"])
    events += parent.events[-2:]
    rows = RowBuilder(None).feed(events)
    assert [(run_id, step) for run_id, step, _ in rows] == [("P", 0)]
    assert rows[0][2]["rollout/attempts_sealed"] == 2
