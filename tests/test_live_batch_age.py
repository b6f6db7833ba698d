"""LiveBatchAge (the Prometheus gauge's and the trackers' batch age) against the file's
``batch_age_by_step``: restores from any checkpoint, a group trained twice, bounded memory."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from otel_rollout import live_age
from otel_rollout.batch_age import batch_age_by_step, step_ages
from otel_rollout.live_age import LiveBatchAge
from otel_rollout.testing import TraceBuilder

_counts = st.dictionaries(st.integers(0, 30), st.integers(1, 10_000), max_size=5)
_ACTIONS = ("seal", "seal", "train", "train", "discard", "publish", "restart")


def controller_trace(data: st.DataObject) -> TraceBuilder:
    """A controller's log drawn step by step: seals, steps (some training again a group trained
    before), discards, checkpoints (each with the sealed untrained groups its rollout
    snapshot keeps) and restarts from any checkpoint published, the latest or older."""
    b = TraceBuilder("run-0")
    in_flight: list[str] = []  # sealed, untrained, as the current run sees it
    trained: list[str] = []
    published: list[tuple[int, list[str]]] = []
    step = runs = groups = 0
    for action in data.draw(st.lists(st.sampled_from(_ACTIONS), max_size=40)):
        if action == "seal":
            gid = f"g{groups}"
            groups += 1
            b.sealed_group(gid, data.draw(st.one_of(st.none(), _counts)))
            in_flight.append(gid)
        elif action == "train":
            ids = (
                data.draw(st.lists(st.sampled_from(in_flight), unique=True, max_size=3))
                if in_flight
                else []
            )
            if trained and data.draw(st.booleans()):  # a group trained before, trained again
                ids.append(data.draw(st.sampled_from(trained)))
            ids = list(dict.fromkeys(ids))
            b.step(step, step + data.draw(st.integers(0, 3)), ids)
            in_flight = [g for g in in_flight if g not in ids]
            trained += ids
            step += 1
        elif action == "discard" and in_flight:
            gid = in_flight.pop(data.draw(st.integers(0, len(in_flight) - 1)))
            b.event("group.discard", group_id=gid, prompt_id=0, reason="stale")
        elif action == "publish" and step > 0:
            b.event("checkpoint.publish", step=step - 1, weight_version=step)
            published.append((step - 1, list(in_flight)))
        elif action == "restart" and published:
            at, kept = data.draw(st.sampled_from(published))
            runs += 1
            b.new_run(f"run-{runs}")
            b.event("checkpoint.restore", step=at, weight_version=at + 1)
            in_flight, step = list(kept), at + 1
    return b


def live_by_step(events: list[dict]) -> dict[int, tuple[int, float | None]]:
    """Each step number's live value, the last train.step of the number winning (as in the file)."""
    live = LiveBatchAge()
    return {r.step: (r.tokens, r.batch_age) for e in events if (r := live.observe(e)) is not None}


def known_live(events: list[dict], kept: int) -> dict[int, bool]:
    """A naive model of what the live tracker still holds: for each step number's last
    train.step, whether every group it names was sealed and in flight, or among the ``kept``
    newest groups to leave flight, or to be kept by a checkpoint (counted conservatively: a
    tie counts against the group)."""
    in_flight: set[str] = set()
    left: list[tuple[int, str]] = []  # (event index, group) each time a group leaves flight
    snapped: list[tuple[int, str]] = []  # (event index, group) at each checkpoint.publish
    lost: set[str] = set()

    def newest(log: list[tuple[int, str]], gid: str) -> bool:
        last = max((i for i, g in log if g == gid), default=None)
        return last is not None and len({g for i, g in log if i >= last}) <= kept

    known: dict[int, bool] = {}
    for i, e in enumerate(events):
        kind = e["event"]
        if kind == "group.seal":
            in_flight.add(e["group_id"])
            lost.discard(e["group_id"])
        elif kind == "group.discard" and e["group_id"] in in_flight:
            in_flight.discard(e["group_id"])
            left.append((i, e["group_id"]))
        elif kind == "checkpoint.publish":
            snapped += [(i, g) for g in in_flight]
        elif kind == "train.step":
            ok = True
            for gid in e["group_ids"]:
                held = gid in in_flight or (
                    gid not in lost and (newest(left, gid) or newest(snapped, gid))
                )
                if not held:
                    lost.add(gid)
                ok = ok and held
            known[e["step"]] = ok
            for gid in e["group_ids"]:
                in_flight.discard(gid)
                left.append((i, gid))
    return known


class TestLiveBatchAge:
    @settings(max_examples=150, deadline=None)
    @given(data=st.data())
    def test_live_equals_the_file_through_restores_and_retraining(self, data):
        """Fed a controller's log event by event, the live tracker gives every surviving step
        the file's tokens and batch age: restores from older checkpoints, groups trained twice."""
        events = controller_trace(data).events
        live = live_by_step(events)
        for row in step_ages(events):
            assert live[row.step] == (row.tokens, row.batch_age), row.step

    @settings(max_examples=150, deadline=None)
    @given(data=st.data(), kept=st.integers(1, 4))
    def test_a_lowered_cap_costs_only_groups_it_evicted(self, data, kept):
        """With room for only a few groups, a step whose groups the model says are still held
        gets the file's value; the cap costs nothing else."""
        events = controller_trace(data).events
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(live_age, "_KEPT", kept)
            live = live_by_step(events)
        known = known_live(events, kept)
        for row in step_ages(events):
            if known[row.step]:
                assert live[row.step] == (row.tokens, row.batch_age), row.step

    def test_groups_kept_by_a_checkpoint_outlast_any_number_trained_after_it(self, monkeypatch):
        """Groups a checkpoint's snapshot kept are counted when a resumed run trains them, even
        when the stopped run trained more groups than the cap after that checkpoint."""
        monkeypatch.setattr(live_age, "_KEPT", 4)
        b = TraceBuilder("run-0")
        for i in range(3):
            b.sealed_group(f"kept{i}", {0: 10 + i})
        b.event("checkpoint.publish", step=0, weight_version=1)
        for s in range(1, 20):
            b.sealed_group(f"g{s}", {s: 5})
            b.step(s, s + 1, [f"g{s}"] + ([f"kept{s - 1}"] if s <= 3 else []))
        b.new_run("run-1")
        b.event("checkpoint.restore", step=0, weight_version=1)
        b.step(1, 2, ["kept0", "kept1", "kept2"])
        live = live_by_step(b.events)
        assert live[1] == (33, 2.0)
        assert live[1][1] == batch_age_by_step(b.events)[1]

    def test_a_group_trained_twice_counts_twice(self):
        """A group the same run trains again counts again, as the file counts it."""
        b = TraceBuilder()
        b.sealed_group("g", {0: 10})
        b.step(0, 1, ["g"])
        b.step(1, 2, ["g"])
        assert [v for _, v in live_by_step(b.events).values()] == [1.0, 2.0]
        assert batch_age_by_step(b.events) == {0: 1.0, 1: 2.0}

    def test_memory_is_bounded_by_the_cap(self, monkeypatch):
        """However many groups are trained and checkpointed, at most the cap is kept of each."""
        monkeypatch.setattr(live_age, "_KEPT", 8)
        b = TraceBuilder()
        for s in range(100):
            b.sealed_group(f"g{s}", {s: 1})
            b.sealed_group(f"h{s}", {s: 1})
            b.event("checkpoint.publish", step=s, weight_version=s)
            b.step(s, s + 1, [f"g{s}"])
        live = LiveBatchAge()
        for e in b.events:
            live.observe(e)
        assert len(live._left) == 8 and len(live._snapped) == 8
        assert len(live._groups) == 100  # the h groups: sealed and never trained
