"""The token ledger of `cost`: every logged token in exactly one bucket, checked exactly."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from otel_rollout.cost import LOST_AT_STOP, ROLLED_BACK, analyze
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
    are trained again), may keep sealed groups of the run before, regenerates, abandons,
    discards and refuses."""
    b = TraceBuilder(run_id="r0")
    counter = {"group": 0, "attempt": 0}
    kept: list[str] = []  # sealed, untrained groups a resumed run may train as they were
    next_step = 0
    for r in range(draw(st.integers(1, 4))):
        if r:
            b.new_run(f"r{r}")
            next_step = draw(st.integers(0, next_step))  # restore to an earlier checkpoint
            b.event("checkpoint.restore", step=max(next_step - 1, 0), weight_version=0)
        open_groups: dict[str, list[str]] = {}
        sealed = [g for g in kept if draw(st.booleans())]  # the snapshot kept these
        for _ in range(draw(st.integers(0, 25))):
            action = draw(
                st.sampled_from(
                    ["reserve", "attempt", "attempt", "seal", "discard", "train", "abandon"]
                )
            )
            if action == "reserve" or (not open_groups and action in ("attempt", "abandon")):
                counter["group"] += 1
                gid = f"g{counter['group']}"
                b.event("group.reserve", group_id=gid, prompt_id=counter["group"], size=2,
                        weight_version=0)  # fmt: skip
                open_groups[gid] = []
                continue
            if action in ("attempt", "abandon"):
                gid = draw(st.sampled_from(sorted(open_groups)))
                counter["attempt"] += 1
                ids = {
                    "attempt_id": f"a{counter['attempt']}",
                    "group_id": gid,
                    "prompt_id": int(gid[1:]),
                    "generation_index": len(open_groups[gid]),
                }
                tokens = draw(st.integers(0, 500))
                if action == "attempt":
                    b.event("attempt.dispatch", **ids, weight_version=0, epoch=0)
                    outcome = draw(st.sampled_from(["seal", "seal", "refuse", "running"]))
                    if outcome == "seal":
                        b.event("attempt.seal", **ids, tokens=tokens)
                    elif outcome == "refuse":
                        b.event("attempt.refuse", **ids, reason="capacity")
                else:
                    b.event("attempt.abandon", **ids, reason=draw(st.sampled_from(REASONS)),
                            tokens=tokens)  # fmt: skip
                open_groups[gid].append(ids["attempt_id"])
            elif action == "seal" and open_groups:
                gid = draw(st.sampled_from(sorted(open_groups)))
                del open_groups[gid]
                b.event("group.seal", group_id=gid, prompt_id=int(gid[1:]), tokens=0)
                sealed.append(gid)
            elif action == "discard" and open_groups:
                gid = draw(st.sampled_from(sorted(open_groups)))
                del open_groups[gid]
                b.event("group.discard", group_id=gid, prompt_id=int(gid[1:]),
                        reason=draw(st.sampled_from(REASONS)))  # fmt: skip
            elif action == "train" and sealed:
                batch = draw(st.lists(st.sampled_from(sealed), min_size=1, max_size=3, unique=True))
                sealed = [g for g in sealed if g not in batch]
                b.step(next_step, next_step + 1, batch)
                next_step += 1
        kept = sealed  # the run is killed here
    return b.events


def naive_ledger(events: list[dict[str, Any]]) -> dict[str, Any]:
    """Each sealed attempt's tokens are one lot; every lot's fate is decided from the whole
    file at once, with plain loops and no streaming state."""
    runs = [e["run_id"] for e in events if e["event"] == "run.start"] or [events[-1]["run_id"]]
    last_run = runs[-1]
    lots: list[tuple[str, int]] = []  # (group_id, tokens)
    wasted: Counter[str] = Counter()
    owner: dict[str, str] = {}
    discarded: dict[str, str] = {}
    latest_step: dict[int, list[str]] = {}
    ever_trained: set[str] = set()
    for e in events:
        kind = e["event"]
        if kind in ("group.reserve", "attempt.seal", "group.discard"):
            owner[e["group_id"]] = e["run_id"]
        if kind == "attempt.seal":
            lots.append((e["group_id"], e["tokens"]))
        elif kind == "attempt.abandon":
            lots.append(("", e["tokens"]))
            wasted[f"abandoned: {e['reason']}"] += e["tokens"]
        elif kind == "group.discard":
            discarded[e["group_id"]] = e["reason"]
        elif kind == "train.step":
            latest_step[e["step"]] = e["group_ids"]
            ever_trained.update(e["group_ids"])
    surviving = {g for groups in latest_step.values() for g in groups}
    trained = pending = 0
    for group, tokens in lots:
        if not group:
            continue  # an abandoned attempt, counted above
        if group in surviving:
            trained += tokens
        elif group in ever_trained:
            wasted[ROLLED_BACK] += tokens
        elif group in discarded:
            wasted[f"discarded: {discarded[group]}"] += tokens
        elif owner[group] == last_run:
            pending += tokens
        else:
            wasted[LOST_AT_STOP] += tokens
    return {
        "generated": sum(tokens for _, tokens in lots),
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
    """The random traces reach every kind of bucket (so the property test can fail)."""
    seen: defaultdict[str, int] = defaultdict(int)

    @settings(max_examples=500)  # enough that the rarest bucket (a step redone) shows up
    @given(traces())
    def collect(events):
        ledger = naive_ledger(events)
        for cause in ledger["wasted"]:
            seen[cause.split(":")[0]] += 1
        seen["trained"] += ledger["trained"] > 0
        seen["pending"] += ledger["pending"] > 0

    collect()
    for bucket in ("trained", "pending", "abandoned", "discarded", LOST_AT_STOP, ROLLED_BACK):
        assert seen[bucket], (bucket, dict(seen))
