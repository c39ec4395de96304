"""What the server knows of its models' reachability, for attached consoles and API clients.

The in-process console probes the models itself and follows its turns (aiops/tui/guidance.py); an
attached console sees the same through the server, which keeps the same picture: a probe (one cheap
list-models request per enabled model, aiops/integrations/model_probe.py) says which models answer;
a turn's `done` marks the model it ran on unreachable when its call failed for want of a key or a
connection, and reachable again on a whole answer (or an error its server answered with).

The server probes on demand, never on its own: the first `POST /api/v1/models/check` (an attached
console asks at start-up when the server has no picture yet, and on `check models`). Until then it
keeps only what turns showed. Once it has probed, every change is published as a `models` event
carrying every enabled model's state, so each attached console shows the same.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

from aiops.engine import events as ev
from aiops.integrations.model_probe import probe_model, turn_verdict

if TYPE_CHECKING:
    from aiops.engine.engine import Engine

REASON_WIDTH = 200  # as the console's banner cuts a model error's message


def _one_line(text: str) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= REASON_WIDTH else flat[: REASON_WIDTH - 1].rstrip() + "…"


class ModelHealth:
    """The last known reachability of each enabled model; a bus listener and the probe's owner."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.states: dict[str, ev.ModelState] = {}
        self.probed = False
        self._check: asyncio.Task[list[ev.ModelState]] | None = None

    def snapshot(self) -> list[ev.ModelState]:
        enabled = self.engine.config.models.enabled()
        return [self.states[k] for k in sorted(self.states) if k in enabled]

    def on_event(self, event: ev.Event) -> None:
        # A bus listener: synchronous, cheap, never raises.
        # `done` names the model the turn ran on (a one-turn `@model` too) and how its call failed.
        if isinstance(event, ev.Done) and (verdict := turn_verdict(event)) is not None:
            ok, why = verdict
            self._set(ev.ModelState(event.model, ok, _one_line(why.reason) if why else "", time.time(),
                                    why.cause if why else ""))

    def _set(self, state: ev.ModelState) -> None:
        old = self.states.get(state.key)
        self.states[state.key] = state
        if old is None or (old.ok, old.reason, old.cause) != (state.ok, state.reason, state.cause):
            self._publish()

    def _publish(self) -> None:
        if self.probed:  # before the first probe the picture is partial: a view would lose the rest
            self.engine.bus.publish(ev.ModelsChanged(session_id=None, models=tuple(self.snapshot())))

    async def check(self) -> list[ev.ModelState]:
        """Probe every enabled model (one probe at a time for all callers), publish, return the picture."""
        if self._check is None or self._check.done():
            self._check = asyncio.get_running_loop().create_task(self._probe_all(), name="aiops-model-check")
        return await asyncio.shield(self._check)

    async def _probe_all(self) -> list[ev.ModelState]:
        cfg = self.engine.config.models
        keys = sorted(cfg.enabled())
        reasons = await asyncio.gather(*(probe_model(cfg.models[k], self.engine.env) for k in keys))
        now = time.time()
        self.states = {k: ev.ModelState(k, why is None, why.reason if why else "", now, why.cause if why else "")
                       for k, why in zip(keys, reasons, strict=True)}
        self.probed = True
        self._publish()
        return self.snapshot()

    def close(self) -> None:
        if self._check is not None:
            self._check.cancel()
