"""The token ledger of `cost`: every logged token in exactly one bucket, checked exactly."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from otel_rollout.analysis import run_events
from otel_rollout.cost import LOST_AT_STOP, ROLLED_BACK, CostAnalysis, analyze
from otel_rollout.ledger import LOGGED_AGAIN
from otel_rollout.testing import TraceBuilder


def seal(b: TraceBuilder, aid: str, gid: str, prompt: int, gen: int, tokens: int) -> None:
    ids = {"attempt_id": aid, "group_id": gid, "prompt_id": prompt, "generation_index": gen}
    b.event("attempt.dispatch", **ids, weight_version=0, epoch=0)
    b.event("attempt.seal", **ids, tokens=tokens)


def balanced(report: Any) -> bool:
    ledger = report.ledger
    return ledger["generated"] == (
        ledger["trained"] + sum(ledger["wasted"].values()) + ledger["pending"]
    )


class TestKnownAnswers:
    def test_a_rollout_sealed_then_regenerated_after_a_stop_counts_once(self, tmp_path, cli):
        """Run A seals 100 tokens and stops; run B regenerates the rollout (150) and trains
        it: generated 250 = trained 150 + lost at a stop 100 + pending 0 (not 400)."""
        b = TraceBuilder(run_id="A")
        b.event("group.reserve", group_id="ga", prompt_id=7, size=1, weight_version=0)
        seal(b, "a", "ga", 7, 0, 100)
        b.event("group.seal", group_id="ga", prompt_id=7, tokens=100)
        b.new_run("B")
        b.event("group.reserve", group_id="gb", prompt_id=7, size=1, weight_version=0)
        seal(b, "b", "gb", 7, 0, 150)
        b.event("group.seal", group_id="gb", prompt_id=7, tokens=150)
        b.step(0, 1, ["gb"])
        out = cli("cost", str(b.write(tmp_path / "t.jsonl")), "--json")
        assert out.returncode == 0, out.stderr
        ledger = json.loads(out.stdout)["ledger"]
        assert ledger == {
            "generated": 250,
            "trained": 150,
            "wasted": {LOST_AT_STOP: 100},
            "pending": 0,
        }

    def test_a_step_redone_after_a_restore_rolls_its_groups_back(self):
        """A trains step 1 on g1 and is killed; B restores step 0 and trains step 1 again on
        g2: g1's tokens were trained only by a step the restore rolled back."""
        b = TraceBuilder(run_id="A")
        for gid, tokens in (("g0", 10), ("g1", 40)):
            b.event("group.reserve", group_id=gid, prompt_id=0, size=1, weight_version=0)
            seal(b, f"a-{gid}", gid, 0, 0, tokens)
        b.step(0, 1, ["g0"])
        b.step(1, 2, ["g1"])
        b.new_run("B")
        b.event("checkpoint.restore", step=0, weight_version=1)
        b.event("group.reserve", group_id="g2", prompt_id=1, size=1, weight_version=1)
        seal(b, "b", "g2", 1, 0, 60)
        b.step(1, 2, ["g2"])
        b.event("group.reserve", group_id="g3", prompt_id=2, size=1, weight_version=1)
        seal(b, "c", "g3", 2, 0, 5)  # sealed, untrained, when the file ends
        report = analyze(b.events)
        assert report.ledger == {
            "generated": 115,
            "trained": 70,
            "wasted": {ROLLED_BACK: 40},
            "pending": 5,
        }

    def test_abandoned_and_discarded_by_reason(self):
        """Abandoned attempts' tokens and discarded groups' tokens are wasted by reason."""
        b = TraceBuilder(run_id="A")
        b.event("group.reserve", group_id="g", prompt_id=0, size=2, weight_version=0)
        seal(b, "a", "g", 0, 0, 30)
        ids = {"attempt_id": "x", "group_id": "g", "prompt_id": 0, "generation_index": 1}
        b.event("attempt.abandon", **ids, reason="error", tokens=12)
        b.event("attempt.refuse", **ids, reason="capacity")
        b.event("group.discard", group_id="g", prompt_id=0, reason="stale")
        report = analyze(b.events)
        assert report.ledger["wasted"] == {"abandoned: error": 12, "discarded: stale": 30}
        assert balanced(report)


# Random multi-run traces, and a naive model that follows every lot of tokens.

REASONS = ("stale", "error", "stop")


@st.composite
def traces(draw: st.DrawFn) -> list[dict[str, Any]]:
    """Runs killed at random points; each resumes from a random earlier checkpoint (so steps
    are trained again), may keep sealed groups of the run before, re-reserves groups the
    stop left in flight under new IDs with their finished work carried over, regenerates,
    abandons, discards and refuses."""
    b = TraceBuilder(run_id="r0")
    counter = {"group": 0, "attempt": 0}
    kept: list[str] = []  # sealed, untrained groups a resumed run may train as they were
    next_step = 0
    open_groups: dict[str, list[str]] = {}
    lots: dict[str, list[int]] = {}  # group → tokens of each attempt sealed into it
    prompt_of: dict[str, int] = {}
    carried: dict[str, int] = {}  # group → tokens carried into it from a stopped run's
    settled: list[str] = []  # groups this run trained or discarded since its last publish
    used: dict[str, list[str]] = {}  # group → its attempts (their generation indexes)
    for r in range(draw(st.integers(1, 4))):
        if r:
            b.new_run(f"r{r}")
            next_step = draw(st.integers(0, next_step))  # restore to an earlier checkpoint
            b.event("checkpoint.restore", step=max(next_step - 1, 0), weight_version=0)
        # Re-reserved under a new ID, its finished work carried: a group the stop left in
        # flight, or one trained or discarded after the last checkpoint (the restore undid
        # that, and the snapshot held the group in flight).
        left = {**open_groups, **{g: used[g] for g in settled if g not in open_groups}}
        open_groups, settled = {}, []
        for old in sorted(left):
            if not draw(st.booleans()):
                continue
            counter["group"] += 1
            gid = f"g{counter['group']}"
            prompt_of[gid] = prompt_of[old]
            b.event("group.reserve", group_id=gid, prompt_id=prompt_of[gid], size=2,
                    weight_version=0)  # fmt: skip
            open_groups[gid] = used[gid] = list(left[old])  # new attempts, new generations
            carried[gid] = sum(lots.get(old, ())) + carried.get(old, 0)  # all it finished
        sealed = [g for g in kept if draw(st.booleans())]  # the snapshot kept these
        trained_here = False  # this run logged a step: it may log that number again
        for _ in range(draw(st.integers(0, 25))):
            action = draw(
                st.sampled_from(
                    [
                        "reserve",
                        "attempt",
                        "attempt",
                        "seal",
                        "discard",
                        "train",
                        "abandon",
                        "publish",
                    ]
                )
            )
            if action == "reserve" or (not open_groups and action in ("attempt", "abandon")):
                counter["group"] += 1
                gid = f"g{counter['group']}"
                prompt_of[gid] = counter["group"]
                b.event("group.reserve", group_id=gid, prompt_id=prompt_of[gid], size=2,
                        weight_version=0)  # fmt: skip
                open_groups[gid] = used[gid] = []
                continue
            if action in ("attempt", "abandon"):
                gid = draw(st.sampled_from(sorted(open_groups)))
                counter["attempt"] += 1
                ids = {
                    "attempt_id": f"a{counter['attempt']}",
                    "group_id": gid,
                    "prompt_id": prompt_of[gid],
                    "generation_index": len(open_groups[gid]),
                }
                tokens = draw(st.integers(0, 500))
                if action == "attempt":
                    b.event("attempt.dispatch", **ids, weight_version=0, epoch=0)
                    outcome = draw(st.sampled_from(["seal", "seal", "refuse", "running"]))
                    if outcome == "seal":
                        b.event("attempt.seal", **ids, tokens=tokens)
                        lots.setdefault(gid, []).append(tokens)
                    elif outcome == "refuse":
                        b.event("attempt.refuse", **ids, reason="capacity")
                else:
                    b.event("attempt.abandon", **ids, reason=draw(st.sampled_from(REASONS)),
                            tokens=tokens)  # fmt: skip
                open_groups[gid].append(ids["attempt_id"])
            elif action == "seal" and open_groups:
                gid = draw(st.sampled_from(sorted(open_groups)))
                del open_groups[gid]
                # A carrying group seals its own and the carried tokens (others seal 0).
                tokens = carried[gid] + sum(lots.get(gid, ())) if gid in carried else 0
                b.event("group.seal", group_id=gid, prompt_id=prompt_of[gid], tokens=tokens)
                sealed.append(gid)
            elif action == "discard" and open_groups:
                gid = draw(st.sampled_from(sorted(open_groups)))
                del open_groups[gid]
                b.event("group.discard", group_id=gid, prompt_id=prompt_of[gid],
                        reason=draw(st.sampled_from(REASONS)))  # fmt: skip
                settled.append(gid)
            elif action == "train" and sealed:
                batch = draw(st.lists(st.sampled_from(sealed), min_size=1, max_size=3, unique=True))
                sealed = [g for g in sealed if g not in batch]
                if trained_here and draw(st.integers(0, 7)) == 0:  # the last step logged again
                    b.step(next_step - 1, next_step, batch)
                else:
                    b.step(next_step, next_step + 1, batch)
                    next_step += 1
                trained_here = True
                settled += batch
            elif action == "publish":
                b.event("checkpoint.publish", step=max(next_step - 1, 0), weight_version=0)
                settled = []
        kept = sealed  # the run is killed here
    return b.events


def naive_ledger(events: list[dict[str, Any]]) -> dict[str, Any]:
    """Each sealed attempt's tokens are one lot; a group that seals more tokens than its
    lots hold takes, if they make up the difference exactly, the lots of its prompt that
    earlier runs' groups still hold (untrained and undiscarded, or trained or discarded
    by the run before after its last checkpoint), of generations it did not run itself;
    every lot's fate is then decided from the whole file at once, with plain loops over
    every lot."""
    runs = [e["run_id"] for e in events if e["event"] == "run.start"] or [events[-1]["run_id"]]
    last_run = runs[-1]
    lots: list[list[Any]] = []  # [group_id, tokens, prompt_id, generation_index]
    wasted: Counter[str] = Counter()
    owner: dict[str, str] = {}
    discarded: dict[str, str] = {}
    latest_step: dict[int, tuple[str, list[str]]] = {}  # step → its last (run, groups)
    logged_again: set[str] = set()  # groups of a step its own run logged again
    ever_trained: set[str] = set()
    run = None
    since_publish: set[str] = set()  # groups this run first trained or discarded since then
    restorable: set[str] = set()  # the same of the run before
    for e in events:
        kind = e["event"]
        if e["run_id"] != run:
            run, restorable, since_publish = e["run_id"], since_publish, set()
        if kind in ("group.discard", "train.step"):
            for g in e["group_ids"] if kind == "train.step" else [e["group_id"]]:
                if g not in ever_trained and g not in discarded and g in owner:
                    since_publish.add(g)
        elif kind == "checkpoint.publish":
            since_publish = set()
        if kind in ("group.reserve", "attempt.seal", "group.discard"):
            owner[e["group_id"]] = e["run_id"]
        if kind == "attempt.seal":
            lots.append([e["group_id"], e["tokens"], e["prompt_id"], e["generation_index"]])
        elif kind == "attempt.abandon":
            lots.append(["", e["tokens"], None, None])
            wasted[f"abandoned: {e['reason']}"] += e["tokens"]
        elif kind == "group.discard":
            discarded[e["group_id"]] = e["reason"]
        elif kind == "train.step":
            before = latest_step.get(e["step"])
            if before is not None and before[0] == e["run_id"]:
                logged_again.update(before[1])
            latest_step[e["step"]] = (e["run_id"], e["group_ids"])
            ever_trained.update(e["group_ids"])
        elif kind == "group.seal":
            gid = e["group_id"]
            mine = [lot for lot in lots if lot[0] == gid]
            short = e["tokens"] - sum(lot[1] for lot in mine)
            gens = {lot[3] for lot in mine}
            theirs = [
                lot
                for lot in lots
                if lot[0] not in ("", gid)
                and lot[2] == e["prompt_id"]
                and lot[3] not in gens
                and owner[lot[0]] != e["run_id"]
                and (
                    (lot[0] not in ever_trained and lot[0] not in discarded) or lot[0] in restorable
                )
            ]
            if short > 0 and theirs and sum(lot[1] for lot in theirs) == short:
                for lot in theirs:
                    lot[0] = gid
    surviving = {g for _, groups in latest_step.values() for g in groups}
    trained = pending = 0
    for group, tokens, _, _ in lots:
        if not group:
            continue  # an abandoned attempt, counted above
        if group in surviving:
            trained += tokens
        elif group in logged_again:
            wasted[LOGGED_AGAIN] += tokens
        elif group in ever_trained:
            wasted[ROLLED_BACK] += tokens
        elif group in discarded:
            wasted[f"discarded: {discarded[group]}"] += tokens
        elif owner[group] == last_run:
            pending += tokens
        else:
            wasted[LOST_AT_STOP] += tokens
    return {
        "generated": sum(lot[1] for lot in lots),
        "trained": trained,
        "wasted": {k: v for k, v in sorted(wasted.items()) if v},
        "pending": pending,
    }


@given(traces())
def test_the_ledger_balances_and_equals_the_naive_model(events):
    """On random multi-run traces the ledger equals the naive model bucket by bucket, every
    bucket is an integer ≥ 0, and generated == trained + wasted + pending exactly."""
    report = analyze(events)
    ledger = report.ledger
    assert ledger == naive_ledger(events)
    assert all(isinstance(v, int) and v >= 0 for v in ledger["wasted"].values())
    assert min(ledger["trained"], ledger["pending"], ledger["generated"]) >= 0
    assert balanced(report)


def test_the_generator_makes_every_bucket():
    """The random traces reach every kind of bucket, and finished work carried into a new
    group (so the property test can fail)."""
    seen: defaultdict[str, int] = defaultdict(int)

    # Enough examples that the rarest bucket (a step redone) shows up, drawn the same way on
    # every machine: drawn at random, 500 examples now and then missed it.
    @settings(max_examples=500, derandomize=True)
    @given(traces())
    def collect(events):
        ledger = naive_ledger(events)
        cost = CostAnalysis()
        run_events(events, [cost])
        # finished work moved to a new group, from one in flight and from one settled
        seen["carried"] += any(not move.settled for move in cost.state.carries.moved)
        seen["carried, settled"] += any(move.settled for move in cost.state.carries.moved)
        for cause in ledger["wasted"]:
            seen[cause.split(":")[0]] += 1
        seen["trained"] += ledger["trained"] > 0
        seen["pending"] += ledger["pending"] > 0

    collect()
    buckets = ("trained", "pending", "abandoned", "discarded", LOST_AT_STOP, ROLLED_BACK,
               LOGGED_AGAIN, "carried", "carried, settled")  # fmt: skip
    for bucket in buckets:
        assert seen[bucket], (bucket, dict(seen))


def test_the_demo_trains_what_its_steps_trained(demo_trace):
    """On the demo's real killed and resumed runs (finished work carried into new groups
    after each restore), the ledger's trained tokens are exactly the tokens of the
    surviving steps' groups, as batch age counts them."""
    from otel_rollout.batch_age import step_ages
    from otel_rollout.reader import read_events

    report = analyze(read_events(demo_trace))
    steps = step_ages(read_events(demo_trace))
    assert report.ledger["trained"] == sum(row.tokens for row in steps)
    assert balanced(report)


class TestCarriedWork:
    """Finished work a resumed run carried into a group of its own, in the cases that once
    went wrong."""

    def test_a_group_listed_at_two_stops_gives_its_work_once(self):
        """A seals G; B trains G after its checkpoint (so G is a donor at B's stop as well as
        A's); C carries G's work into H: trained once, no KeyError, balanced."""
        b = TraceBuilder(run_id="A")
        b.event("group.reserve", group_id="G", prompt_id=7, size=2, weight_version=0)
        seal(b, "a0", "G", 7, 0, 100)
        b.event("group.seal", group_id="G", prompt_id=7, tokens=100)
        b.new_run("B")
        b.event("checkpoint.publish", step=0, weight_version=0)
        seal(b, "b1", "G", 7, 1, 50)  # B seals into G too: G is B's now
        b.step(0, 1, ["G"])
        b.new_run("C")
        b.event("checkpoint.restore", step=0, weight_version=0)
        b.event("group.reserve", group_id="H", prompt_id=7, size=2, weight_version=0)
        b.event("group.seal", group_id="H", prompt_id=7, tokens=150)
        b.step(0, 1, ["H"])
        report = analyze(b.events)
        assert report.ledger == naive_ledger(b.events)
        assert report.ledger["trained"] == 150 and balanced(report)
        twice = [
            {**e, "tokens": 300} if e.get("group_id") == "H" and e["event"] == "group.seal" else e
            for e in b.events
        ]
        assert balanced(analyze(twice))  # the work named twice over: nothing moves

    def test_two_groups_holding_one_rollout_both_give_it(self):
        """G1 (run A) and G2 (run B) each sealed generation 0 of prompt 7 (30 and 20 tokens);
        C's H seals 50: both lots are H's, and the ledger balances."""
        b = TraceBuilder(run_id="A")
        b.event("group.reserve", group_id="G1", prompt_id=7, size=1, weight_version=0)
        seal(b, "a", "G1", 7, 0, 30)
        b.new_run("B")
        b.event("group.reserve", group_id="G2", prompt_id=7, size=1, weight_version=0)
        seal(b, "b", "G2", 7, 0, 20)
        b.new_run("C")
        b.event("group.reserve", group_id="H", prompt_id=7, size=1, weight_version=0)
        b.event("group.seal", group_id="H", prompt_id=7, tokens=50)
        b.step(0, 1, ["H"])
        report = analyze(b.events)
        assert report.ledger["trained"] == 50 and balanced(report)
        assert report.ledger == naive_ledger(b.events)

    def test_staleness_moves_every_seal_of_a_carried_rollout(self):
        """Generation 0 sealed twice into G (30 and 25 tokens), then carried into H: the
        staleness outcomes say trained 55, as the ledger does."""
        from otel_rollout.staleness import staleness

        b = TraceBuilder(run_id="A")
        b.event("group.reserve", group_id="G", prompt_id=7, size=1, weight_version=0)
        seal(b, "a", "G", 7, 0, 30)
        seal(b, "a2", "G", 7, 0, 25)
        b.new_run("B")
        b.event("group.reserve", group_id="H", prompt_id=7, size=1, weight_version=0)
        b.event("group.seal", group_id="H", prompt_id=7, tokens=55)
        b.step(0, 1, ["H"])
        assert analyze(b.events).ledger["trained"] == 55
        outcomes = staleness(b.events).record()["length_bias"]["outcomes"]
        assert outcomes["trained"]["tokens"] == 55 and outcomes["trained"]["attempts"] == 2

    def test_a_run_that_never_checkpoints_keeps_a_bounded_set_of_donors(self):
        """Groups trained with no checkpoint.publish are kept as possible donors only up to
        SETTLED_KEPT (they were kept for the whole run, ~110 bytes an attempt)."""
        from otel_rollout.analysis import run_events
        from otel_rollout.analysis.carry import SETTLED_KEPT

        b = TraceBuilder(run_id="A")
        for i in range(SETTLED_KEPT + 500):
            gid = f"g{i}"
            b.event("group.reserve", group_id=gid, prompt_id=i, size=1, weight_version=0)
            seal(b, f"a{i}", gid, i, 0, 1)
            b.step(i, i + 1, [gid])
        cost = CostAnalysis()
        run_events(b.events, [cost])
        assert len(cost.state.carries._settled) == SETTLED_KEPT


def test_a_step_number_its_run_logs_again_is_no_restore(tmp_path, cli):
    """One run logs step 0 twice (no stop, no restore): the first step's tokens are
    wasted as trained by a step its run logged again, not by a restore, and validate and
    cost warn of the second step on its line."""
    b = TraceBuilder(run_id="A")
    for n, (group, tokens) in enumerate((("g", 5), ("h", 7))):
        ids = {"group_id": group, "prompt_id": n}
        b.event("group.reserve", size=1, weight_version=n, **ids)
        b.event("attempt.dispatch", attempt_id=f"a{n}", generation_index=0, weight_version=n,
                **ids)  # fmt: skip
        b.event("attempt.seal", attempt_id=f"a{n}", generation_index=0, tokens=tokens, **ids)
        b.event("group.seal", tokens=tokens, tokens_by_version={str(n): tokens}, **ids)
        b.step(0, n + 1, [group])
    ledger = analyze(b.events).ledger
    assert ledger == {"generated": 12, "trained": 7, "wasted": {LOGGED_AGAIN: 5}, "pending": 0}
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in b.events))
    said = "train.step 0 again in the same run"
    assert f"{path}:{len(b.events)}: warning: {said}" in cli("validate", str(path)).stdout
    assert f"{path}:{len(b.events)}: {said}" in cli("cost", str(path)).stderr


def test_a_step_redone_after_a_restore_in_the_same_run_is_rolled_back(tmp_path, cli):
    """A run that restores a checkpoint of its own (a NaN, rolled back in-process) and
    trains steps 1 and 2 again: the first steps' tokens are trained by a step a restore
    redid, not logged again, and nobody warns of the steps."""
    b = TraceBuilder(run_id="A")

    def group(gid: str, n: int) -> None:
        ids = {"group_id": gid, "prompt_id": n}
        b.event("group.reserve", size=1, weight_version=n, **ids)
        b.event("attempt.dispatch", attempt_id=f"a{gid}", generation_index=0,
                weight_version=n, **ids)  # fmt: skip
        b.event("attempt.seal", attempt_id=f"a{gid}", generation_index=0, tokens=10, **ids)
        b.event("group.seal", tokens=10, tokens_by_version={str(n): 10}, **ids)

    for s in range(3):
        group(f"g{s}", s)
        b.step(s, s + 1, [f"g{s}"])
    b.event("checkpoint.restore", step=0, weight_version=1, from_run_id="A")
    for s in (1, 2):
        group(f"r{s}", s)
        b.step(s, s + 1, [f"r{s}"])
    assert analyze(b.events).ledger == {
        "generated": 50, "trained": 30, "wasted": {ROLLED_BACK: 20}, "pending": 0,
    }  # fmt: skip
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in b.events))
    assert "0 warnings" in cli("validate", str(path)).stderr
    assert "again in the same run" not in cli("batch-age", str(path)).stderr
