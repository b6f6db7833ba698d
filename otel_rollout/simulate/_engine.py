"""A fake inference engine that behaves like vLLM where batch age is concerned.

Calls generate tokens over time; a refit installs new weights while calls
keep running, pausing them briefly, so a call's later tokens come from the
new version.  The refit reports how far each running call had got: the cuts.
"""

from __future__ import annotations

import asyncio
import itertools
import random
from dataclasses import dataclass


class EngineFull(Exception):
    """Every slot of the engine is busy; the caller should refuse and retry later."""


@dataclass
class Call:
    """One generation request: it begins on the engine's current version."""

    call_id: str
    began_version: int
    target: int
    tokens: int = 0


class FakeEngine:
    """Generates tokens at ``token_rate`` per call per second, with at most ``slots`` calls."""

    def __init__(self, *, version: int, token_rate: float, slots: int, id_prefix: str) -> None:
        self.version = version
        self.token_rate = token_rate
        self.slots = slots
        self.running: dict[str, Call] = {}
        self._ids = (f"{id_prefix}-c{n}" for n in itertools.count())
        self._unpaused = asyncio.Event()
        self._unpaused.set()
        self._tick = 0.02

    def open_call(self, target_tokens: int) -> Call:
        """Start a call on the current weights, or raise :class:`EngineFull`."""
        if len(self.running) >= self.slots:
            raise EngineFull
        call = Call(next(self._ids), self.version, target_tokens)
        self.running[call.call_id] = call
        return call

    async def generate(self, call: Call, stop: asyncio.Event | None = None) -> Call:
        """Generate until the call has its tokens (or ``stop`` is set), across refits."""
        step = max(1, round(self.token_rate * self._tick))
        try:
            while call.tokens < call.target and not (stop is not None and stop.is_set()):
                await self._unpaused.wait()
                await asyncio.sleep(self._tick * random.uniform(0.8, 1.2))
                if self._unpaused.is_set():
                    call.tokens = min(call.target, call.tokens + step)
        finally:
            self.running.pop(call.call_id, None)
        return call

    def pause_for_refit(self, new_version: int) -> tuple[int, list[list[object]]]:
        """Pause every running call and switch to ``new_version``.

        Returns the replaced version and the cuts ``[call_id, tokens_so_far]``;
        calls opened from now on begin on the new version.
        """
        self._unpaused.clear()
        replaced, self.version = self.version, new_version
        return replaced, [[c.call_id, c.tokens] for c in self.running.values()]

    async def resume_after(self, seconds: float) -> None:
        """Finish the refit: after ``seconds`` of loading weights, paused calls go on."""
        await asyncio.sleep(seconds)
        self._unpaused.set()
