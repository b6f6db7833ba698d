"""An async GRPO controller, simulated, that logs every event through the real API.

The controller reserves and admits prompt groups, dispatches one attempt per
generation (each a few sequential calls, as in multi-turn rollouts), seals
groups as their attempts finish, trains a step whenever enough groups are
sealed, refits the running engine after every step (recording the cuts with
:class:`RefitCuts`), discards groups past the staleness limit and publishes
checkpoints.  Each step's batch age is logged the way a real controller would:
per-group sums, then :func:`pop_batch_age`.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..age import RefitCuts, batch_age_group_metrics, pop_batch_age
from ..trace import RolloutTrace
from . import _snapshot
from ._engine import EngineFull, FakeEngine
from ._model import SimConfig, SimStatus, _Group
from ._snapshot import Calls


class Controller:
    """Drives one simulated run against a :class:`RolloutTrace`."""

    def __init__(
        self,
        trace: RolloutTrace,
        config: SimConfig,
        log_dir: Path,
        on_progress: Callable[[SimStatus], None] | None = None,
        resume: bool = False,
    ) -> None:
        self.trace = trace
        self.cfg = config
        self.log_dir = log_dir
        self.status = SimStatus()
        self._on_progress = on_progress
        self._rng = random.Random(config.seed)
        prefix = (trace.run_id or "sim")[:8]
        self._group_ids = (f"{prefix}-g{n}" for n in itertools.count())
        self._attempt_ids = (f"{prefix}-a{n}" for n in itertools.count())
        self._cursor = 0
        self.version = 0
        self.cuts = RefitCuts()
        self._sealed: deque[_Group] = deque()
        self._sealed_changed: asyncio.Event | None = None
        self._in_flight: set[_Group] = set()
        self._stop: asyncio.Event | None = None
        self._failure: BaseException | None = None
        self._resume = resume
        self._first_step = 0
        self._restored: list[_Group] = []
        self._snapshot_path = ""

    def _scaled(self, seconds: float) -> float:
        return seconds / self.cfg.speed

    async def run(self) -> SimStatus:
        """Train ``cfg.steps`` steps, then stop dispatching and close out what is in flight."""
        self._stop = asyncio.Event()
        self._sealed_changed = asyncio.Event()
        if self._resume:
            self._restore()
        self.engine = FakeEngine(
            version=self.version,
            token_rate=self.cfg.token_rate * self.cfg.speed,
            slots=self.cfg.engine_slots,
            id_prefix=(self.trace.run_id or "sim")[:8],
        )
        dispatcher = asyncio.create_task(self._guarded(self._dispatch_groups()))
        try:
            await self._train()
        finally:
            self._stop.set()
            await dispatcher
            for group in list(self._sealed):
                self._discard(group, "stop")
        if self._failure is not None:
            raise self._failure
        return self.status

    async def _guarded(self, work: Any) -> None:
        """Run a background task; if it fails, stop the run and re-raise from the trainer."""
        try:
            await work
        except Exception as exc:
            if self._failure is None:
                self._failure = exc
            assert self._stop is not None and self._sealed_changed is not None
            self._stop.set()
            self._sealed_changed.set()

    def _restore(self) -> None:
        """Continue from the latest trainer checkpoint and the rollout snapshot taken with it."""
        found = _snapshot.latest(self.log_dir)
        if found is None:
            return  # killed before the first checkpoint: a fresh start, appended to the file
        state = found.state
        self.trace.emit(
            "checkpoint.restore",
            step=found.step,
            weight_version=found.weight_version,
            path=str(found.checkpoint_path),
            from_run_id=state["run_id"],
        )
        self.version = self.status.version = found.weight_version
        self._first_step = found.step + 1
        self._cursor = state["cursor"]
        self.cuts = RefitCuts.restore(state["cuts"])
        self._snapshot_path = str(found.snapshot_path)
        for g in state["sealed"]:  # a restored replay buffer: trained under their old IDs
            group = _Group(g["group_id"], g["prompt_id"], g["epoch"], g["weight_version"])
            group.calls, group.tokens = _snapshot.calls_of(g["calls"]), g["tokens"]
            group.metrics = g["metrics"]
            self._sealed.append(group)
        for g in state["in_flight"]:  # re-reserved under new IDs, finished work carried over
            group = self._reserve(g["prompt_id"], g["epoch"], g["weight_version"])
            group.done = {int(i): _snapshot.calls_of(c) for i, c in g["done"].items()}
            group.calls = [c for calls in group.done.values() for c in calls]
            group.tokens = sum(c[2] for c in group.calls)
            group.resume_from = {int(i): _snapshot.calls_of(c) for i, c in g["partial"].items()}
            self._restored.append(group)

    async def _dispatch_groups(self) -> None:
        assert self._stop is not None
        tasks: set[asyncio.Task[None]] = set()
        for group in self._restored:
            task = asyncio.create_task(self._guarded(self._run_group(group)))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        while not self._stop.is_set():
            if len(self._in_flight) + len(self._sealed) >= self.cfg.max_groups_in_flight:
                await asyncio.sleep(self._scaled(0.01))
                continue
            task = asyncio.create_task(self._guarded(self._run_group(self._reserve())))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            await asyncio.sleep(0)
        if tasks:
            await asyncio.gather(*tasks)

    def _reserve(
        self, prompt_id: int | None = None, epoch: int = 0, weight_version: int | None = None
    ) -> _Group:
        if prompt_id is None:
            prompt_id, epoch = self._cursor % self.cfg.prompts, self._cursor // self.cfg.prompts
            self._cursor += 1
        version = self.version if weight_version is None else weight_version
        group = _Group(next(self._group_ids), prompt_id, epoch, version)
        self.trace.emit(
            "group.reserve",
            group_id=group.group_id,
            prompt_id=prompt_id,
            epoch=epoch,
            size=self.cfg.group_size,
            weight_version=version,
        )
        self._in_flight.add(group)
        self.trace.emit("group.admit", group_id=group.group_id, prompt_id=prompt_id)
        return group

    def _is_stale(self, group: _Group) -> bool:
        return self.version - group.weight_version > self.cfg.max_lag

    async def _run_group(self, group: _Group) -> None:
        todo = [i for i in range(self.cfg.group_size) if i not in group.done]
        results = await asyncio.gather(*(self._run_generation(group, i) for i in todo))
        self._in_flight.discard(group)
        if group.discarded:
            return
        if not all(results):
            self._discard(group, "stop" if self._stop and self._stop.is_set() else "stale")
            return
        counts = self.cuts.tokens_by_version(group.calls)
        self.trace.emit(
            "group.seal",
            group_id=group.group_id,
            prompt_id=group.prompt_id,
            tokens=group.tokens,
            tokens_by_version={str(v): n for v, n in sorted(counts.items())},
        )
        group.metrics = batch_age_group_metrics(counts)
        self._sealed.append(group)
        assert self._sealed_changed is not None
        self._sealed_changed.set()

    def _discard(self, group: _Group, reason: str) -> None:
        if group.discarded:
            return
        group.discarded = True
        self.trace.emit(
            "group.discard", group_id=group.group_id, prompt_id=group.prompt_id, reason=reason
        )

    def _ids(self, group: _Group, attempt_id: str, index: int) -> dict[str, Any]:
        return {
            "attempt_id": attempt_id,
            "group_id": group.group_id,
            "prompt_id": group.prompt_id,
            "generation_index": index,
        }

    async def _run_generation(self, group: _Group, index: int) -> bool:
        """Run attempts for one generation until one seals; False if the group cannot finish."""
        assert self._stop is not None
        while True:
            attempt_id = next(self._attempt_ids)
            ids = self._ids(group, attempt_id, index)
            if self._stop.is_set() or group.discarded or self._is_stale(group):
                reason = "stopping" if self._stop.is_set() else "stale"
                self.trace.emit("attempt.refuse", **ids, reason=reason)
                return False
            outcome = await self._run_attempt(group, ids)
            if outcome != "retry":
                return outcome == "sealed"

    def _open_call(self) -> Any:
        return self.engine.open_call(self._rng.randint(*self.cfg.tokens_per_call))

    async def _run_attempt(self, group: _Group, ids: dict[str, Any]) -> str:
        """One attempt: a few sequential calls, or the rest of a restored partial attempt.
        Returns "sealed", "retry" or "gone"."""
        assert self._stop is not None
        index = ids["generation_index"]
        resumed = group.resume_from.pop(index, None)
        try:
            call = self._open_call()
        except EngineFull:
            if resumed is not None:
                group.resume_from[index] = resumed
            self.trace.emit("attempt.refuse", **ids, reason="capacity")
            await asyncio.sleep(self._scaled(0.02))
            return "retry"
        calls: Calls = list(resumed or ())
        if resumed is not None:
            self.trace.emit(
                "attempt.resume",
                **ids,
                epoch=group.epoch,
                weight_version=call.began_version,
                resumed_tokens=sum(c[2] for c in calls),
                snapshot=self._snapshot_path,
            )
        else:
            self.trace.emit(
                "attempt.dispatch", **ids, epoch=group.epoch, weight_version=call.began_version
            )
        turns = self._rng.randint(*self.cfg.turns) - len(calls)
        turns = max(turns, 1)
        fails_at = self._rng.randrange(turns) if self._rng.random() < self.cfg.error_rate else None
        self.status.attempts_running += 1
        try:
            for turn in range(turns):
                if turn:
                    try:
                        call = self._open_call()
                    except EngineFull:
                        return self._abandon(ids, calls, "timeout")
                group.running[index] = (calls, call)
                await self.engine.generate(call, self._stop)
                calls.append((call.call_id, call.began_version, call.tokens))
                group.running[index] = (calls, None)
                self.status.tokens += call.tokens
                if self._stop.is_set():
                    return self._abandon(ids, calls, "stop")
                if group.discarded or self._is_stale(group):
                    return self._abandon(ids, calls, "stale")
                if turn == fails_at:
                    return self._abandon(ids, calls, "error")
        finally:
            group.running.pop(index, None)
            self.status.attempts_running -= 1
        tokens = sum(c[2] for c in calls)
        self.trace.emit("attempt.seal", **ids, tokens=tokens, calls=[list(c) for c in calls])
        group.done[index] = calls
        group.calls.extend(calls)
        group.tokens += tokens
        return "sealed"

    def _abandon(self, ids: dict[str, Any], calls: list[tuple[str, int, int]], reason: str) -> str:
        tokens = sum(c[2] for c in calls)
        self.trace.emit("attempt.abandon", **ids, reason=reason, tokens=tokens)
        return "retry" if reason in ("error", "timeout") else "gone"

    async def _next_batch(self) -> list[_Group]:
        assert self._sealed_changed is not None
        while True:
            if self._failure is not None:
                raise RuntimeError("a simulated task failed") from self._failure
            for group in [g for g in self._sealed if self._is_stale(g)]:
                self._sealed.remove(group)
                self._discard(group, "stale")
            if len(self._sealed) >= self.cfg.groups_per_step:
                return [self._sealed.popleft() for _ in range(self.cfg.groups_per_step)]
            self._sealed_changed.clear()
            await self._sealed_changed.wait()

    async def _train(self) -> None:
        for step in range(self._first_step, self.cfg.steps):
            batch = await self._next_batch()
            started = time.time()
            per_group: dict[str, list[Any]] = {"reward/mean": []}
            for group in batch:
                for key, value in group.metrics.items():
                    per_group.setdefault(key, []).append(value)
                per_group["reward/mean"].append(self._rng.random())
            trained = self.version
            age = pop_batch_age(per_group, trained)
            await asyncio.sleep(self._scaled(self.cfg.train_seconds))
            self.trace.emit(
                "train.step",
                step=step,
                trained_version=trained,
                group_ids=[g.group_id for g in batch],
                batch_age=age,
                duration_s=round(time.time() - started, 6),
            )
            if age is not None:
                self.status.live_batch_age[step] = age
            self.status.step, self.status.last_batch_age = step + 1, age
            await self._refit(trained + 1)
            if self.cfg.checkpoint_every and (step + 1) % self.cfg.checkpoint_every == 0:
                self._publish_checkpoint(step)
            self.status.groups_in_flight = len(self._in_flight)
            if self._on_progress is not None:
                self._on_progress(self.status)

    async def _refit(self, new_version: int) -> None:
        started = time.time()
        self.version = new_version
        replaced, cuts = self.engine.pause_for_refit(new_version)
        self.cuts.record(replaced, new_version, cuts)
        self.cuts.forget_before(new_version - self.cfg.max_lag)
        await self.engine.resume_after(self._scaled(self.cfg.refit_seconds))
        self.status.version = new_version
        self.trace.emit(
            "weights.sync",
            replaced_version=replaced,
            new_version=new_version,
            cuts=cuts,
            duration_s=round(time.time() - started, 6),
        )

    def _publish_checkpoint(self, step: int) -> None:
        """Write the trainer's state and the rollout snapshot of the same moment, then say so."""
        checkpoint, snapshot = _snapshot.paths(self.log_dir, step)
        _snapshot.write_atomically(
            snapshot,
            {
                "run_id": self.trace.run_id,
                "step": step,
                "cursor": self._cursor,
                "cuts": self.cuts.snapshot(),
                "sealed": [g.state() for g in self._sealed if not g.discarded],
                "in_flight": [g.state() for g in self._in_flight if not g.discarded],
            },
        )
        _snapshot.write_atomically(checkpoint, {"step": step, "weight_version": self.version})
        self.trace.emit(
            "checkpoint.publish", step=step, weight_version=self.version, path=str(checkpoint)
        )
