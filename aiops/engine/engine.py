"""The engine: sessions, turns, tools, commands and plugins, headless.

Every client (console, API, proxy, Slack, swarm, MCP) goes through this facade (the operations of
facade.py): `submit` a message, watch the events it publishes, `stop` a turn, read history, answer
gates. The engine never imports Textual or an integration; integrations arrive as plugins. What it
holds that is not the facade lives beside it: the live-session cache (sessions.py), the intake of
a message (intake.py), each session's turn queue (turn_queue.py), admission (admission.py) and the
plugin host (plugin_host.py).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager, ExitStack
from typing import TYPE_CHECKING, Any

from aiops.config import Config, ModelConfig
from aiops.engine import events as ev
from aiops.engine.admission import Admissions
from aiops.engine.backends import Backend
from aiops.engine.builtin_commands import register_builtin_commands
from aiops.engine.bus import EventBus, Subscription
from aiops.engine.client_tools import OpenClientCalls, offer, open_client_calls, returned, unanswered
from aiops.engine.commands import CommandRegistry, ParsedInput
from aiops.engine.errors import STOPPING, EngineError, EngineStopping
from aiops.engine.gate_commands import register_gate_commands
from aiops.engine.gatekeeper import SESSION_DELETED, Gatekeeper, GateOutcome
from aiops.engine.intake import MAX_COMMANDS, Intake, Outcome, Refused
from aiops.engine.lock import DataDirLock
from aiops.engine.models import Models
from aiops.engine.plugin_host import PluginHost
from aiops.engine.plugins import Plugin, PluginStatus
from aiops.engine.prompt_tools import register_prompt_tools
from aiops.engine.recovery import INTERRUPTED_NOTICE, close_left_open
from aiops.engine.sessions import SESSION_KINDS, HeldDeletions, LiveSession, SessionCache
from aiops.engine.store import Store
from aiops.engine.tools import Classification, Tool, ToolContext, ToolRegistry
from aiops.engine.turn import Turn, TurnResult, clipped
from aiops.engine.turn_queue import TurnQueue
from aiops.engine.types import Completion, Message, SessionKey, ToolSpec, new_id

if TYPE_CHECKING:
    from aiops.engine.commands import CommandHost
    from aiops.engine.facade import EngineFacade
    from aiops.engine.gatekeeper import GateHost
    from aiops.engine.intake import IntakeHost
    from aiops.engine.plugins import PluginEngine
    from aiops.engine.turn import TurnHost

# Names other layers import from here.
__all__ = ["INTERRUPTED_NOTICE", "MAX_COMMANDS", "SESSION_KINDS", "STOPPING", "Engine", "EngineError",
           "EngineStopping", "LiveSession"]

log = logging.getLogger(__name__)


def _warm_backend_imports(types: set[str]) -> None:
    import importlib

    for t in sorted(types):
        try:
            importlib.import_module(f"aiops.engine.backends.{t}_backend")
        except Exception:  # noqa: BLE001 - the turn that needs it reports the real error
            log.debug("could not pre-import the %s backend", t, exc_info=True)


class Engine:
    def __init__(self, config: Config, *, env: Mapping[str, str] | None = None,
                 plugins: list[Plugin] | None = None, discover_plugins: bool = True) -> None:
        self.config = config
        self.env: Mapping[str, str] = env if env is not None else os.environ
        self.bus = EventBus(config.app.engine.queue_size)
        self.store = Store(config.paths.db_path)
        self.tools = ToolRegistry()
        self.commands = CommandRegistry()
        self.limits = config.limits
        self.gatekeeper = Gatekeeper(self, config.gates, config.limits)
        self.cache = SessionCache(config.app.engine.cached_sessions, self.store)
        self.held = HeldDeletions()
        self.turns = TurnQueue(self)
        self.intake = Intake(self, self.bus, self.cache, self.held, self.turns)
        self.plugin_host = PluginHost(config, self, self.env, self.tools, self.commands, plugins=plugins,
                                      discover_plugins=discover_plugins)
        self.admissions = Admissions()
        self.catalog = Models(config, self.env)
        self._background: set[asyncio.Task[Any]] = set()
        self._prompts: Any = None
        self.started = False
        self.started_at = time.time()

    # ---- lifecycle ----

    async def start(self, *, warm: Iterable[str] | None = None, one_turn: bool = False) -> None:
        """Open the store, register the tools and commands, start the plugins.

        `warm`: the model keys whose provider SDK to import now (default: every enabled model's). A
        one-turn command (`aiops chat`) names the one model it uses: google-genai alone takes about
        half a second to import, which a run on an OpenAI model should not pay. `one_turn`: this
        process runs one turn and exits; plugins then start only what the turn may need
        (PluginAPI.one_turn).
        """
        await self.store.open()
        register_builtin_commands(self)
        register_gate_commands(self)
        register_prompt_tools(self)
        self.plugin_host.one_turn = one_turn
        await self.plugin_host.load()
        # Importing a provider SDK takes about a second; do it in a thread now rather than on the
        # loop during the first turn (the import lock makes a turn that comes earlier just wait).
        self._spawn(self.warm_backends(warm))
        self.started = True

    async def warm_backends(self, keys: Iterable[str] | None = None) -> None:
        """Import the provider SDKs of the models `keys` (default: every enabled model) in a thread,
        so that a turn does not import its model's on the loop."""
        models = self.config.models.enabled()
        types: set[str] = ({m.type for m in models.values()} if keys is None
                           else {models[k].type for k in keys if k in models})
        await asyncio.to_thread(_warm_backend_imports, types)

    async def close_left_open(self, lock: DataDirLock | None) -> tuple[int, int]:
        """Record what the data dir's last process left open when it died (see recovery.py)."""
        return await close_left_open(self.store, self.record, lock)

    def admission(self) -> AbstractContextManager[None]:
        """Bracket the taking in of a new message (a session made, a history imported, the
        submit): refused with EngineStopping once a stop has begun, and waited for by the stop,
        so that a turn it queues is stopped and recorded like every other, never left half
        taken in, nor started on a closed store."""
        return self.admissions.admit()

    @property
    def stopping(self) -> bool:
        return self.admissions.stopping

    async def stop(self) -> None:
        """Cancel running turns cleanly (recorded as cancelled), stop plugins, close the store."""
        await self.admissions.close()
        dropped = await self.turns.shutdown(list(self.cache))
        for sid, t in dropped:
            # Their user messages are already stored: a notice says why no answer follows.
            try:
                await self.record(sid, Message("notice", "turn cancelled before it started: aiops was "
                                               "shutting down", turn_id=t.id, meta={"kind": "cancelled"}))
            except Exception:  # noqa: BLE001 - shutting down: the store may already be failing
                log.warning("could not record the cancelled turn %s of %s", t.id, sid, exc_info=True)
        for live in self.cache:
            if live.worker:
                live.worker.cancel()
        await self.plugin_host.stop()
        await self.catalog.aclose()
        if self._background:
            await asyncio.wait(self._background, timeout=5)
        await self.gatekeeper.broker.drain()
        await self.store.close()
        self.started = False

    # ---- plugins ----

    @property
    def plugin_status(self) -> list[PluginStatus]:
        return self.plugin_host.status

    async def plugins_ready(self) -> None:
        """Wait for the plugins' background start-up checks (each bounds its own)."""
        await self.plugin_host.ready()

    async def tools_ready(self) -> None:
        """Wait for the tools plugins register in the background (an MCP server's), each plugin
        bounding its own wait; at once when none does."""
        await self.plugin_host.tools_ready()

    def tool_unavailable(self, name: str) -> str | None:
        """Why the unregistered tool `name` is one a plugin cannot offer yet, or None."""
        return self.plugin_host.tool_unavailable(name)

    def plugin(self, name: str) -> Plugin | None:
        return self.plugin_host.get(name)

    # ---- models ----

    def model_config(self, key: str) -> ModelConfig:
        return self.catalog.config(key)

    def check_model(self, key: str) -> str | None:
        """Why `key` cannot be used, or None."""
        return self.catalog.check(key)

    def backend(self, key: str) -> Backend:
        return self.catalog.backend(key)

    async def complete_plain(self, model_key: str, messages: list[Message],
                             system: str | None = None) -> Completion:
        """One model call with no tools, no gates and no session: chat UIs' background tasks."""
        return await self.catalog.complete_plain(model_key, messages, system)

    async def complete(self, model_key: str, messages: list[Message], tools: list[ToolSpec],
                       system: str | None = None) -> Completion:
        """One model call with exactly these messages, tools and system prompt, outside any
        session: a delegation's call to another model (plugins.PluginAPI.complete)."""
        return await self.catalog.complete(model_key, messages, tools, system)

    # ---- system prompt ----

    @property
    def prompts(self) -> Any:
        if self._prompts is None:
            from aiops.prompts.tree import PromptStore

            self._prompts = PromptStore()
        return self._prompts

    def prompt_folder(self, model_key: str | None = None) -> Any:
        """The model's system-prompt tree in the user's config dir, copied from the shipped
        default the first time it is used (see Paths.ensure_prompt_folder)."""
        key = model_key or self.config.models.default_model
        return self.config.paths.ensure_prompt_folder(self.model_config(key).system_prompt_folder)

    def system_prompt(self, model_key: str, text_tools: list[ToolSpec] | None = None, *,
                      session_id: str | None = None, turn_id: str | None = None) -> str | None:
        from aiops.engine.prompt_tools import turn_prompt

        # Sections are kept to the registered tools; a missing folder is announced in the session.
        parts = [turn_prompt(self, model_key, session_id, turn_id)]
        if text_tools:
            from aiops.engine.textcalls import describe_tools_for_prompt

            parts.append(describe_tools_for_prompt(text_tools))
        return "\n\n".join(p for p in parts if p) or None

    def tool_guidance(self, model_key: str, tool: str) -> str:
        from aiops.engine.prompt_tools import tool_guidance

        return tool_guidance(self, model_key, tool)

    # ---- sessions ----

    async def session(self, ref: str, *, kind: str = "api", create: bool = False,
                      model: str | None = None, meta: dict[str, Any] | None = None,
                      wait_for_delete: bool = True) -> LiveSession | None:
        """A live session by full or shorthand id; created when asked and missing (with `model`,
        which must be a usable model key: a session must not store one it cannot run on, and
        with `meta`, written in the same transaction: an existing session's is left alone).

        A session being deleted is waited for: what comes after the delete finds no such session
        (or a new one, when asked to create it), never the one going away. With `wait_for_delete`
        false it is returned as it is (`deleting` set): a second delete wants to know it lost."""
        live = await self._session(ref, kind=kind, create=create, model=model, meta=meta)
        if live is not None and live.deleting is not None and wait_for_delete:
            await asyncio.shield(live.deleting)
            live = await self._session(ref, kind=kind, create=create, model=model, meta=meta)
        return live

    async def _session(self, ref: str, *, kind: str, create: bool, model: str | None,
                       meta: dict[str, Any] | None) -> LiveSession | None:
        live = self.cache.use(ref)
        if live is not None:
            return live
        if create and model is not None and (why := self.check_model(model)):
            raise EngineError(why)
        live, created = await self.cache.load(ref, kind=kind, create=create, model=model, meta=meta)
        if created and live is not None:
            self.bus.publish(ev.SessionChanged(session_id=live.id, change="created", session=live.to_dict(self)))
        return live

    async def open_session(self, client_id: str | None = None, *, kind: str = "console",
                           model: str | None = None) -> LiveSession:
        if model and (why := self.check_model(model)):
            raise EngineError(why)
        cid = client_id or f"{kind}-{new_id()[:8]}"
        live = await self.session(cid, kind=kind, create=True, model=model)
        assert live is not None
        return live

    async def list_sessions(self, kind: str | None = None, limit: int = 1000, offset: int = 0, *,
                            owner: str | None = None, before: SessionKey | None = None) -> list[dict[str, Any]]:
        """Sessions, most recently active first (then by id); only those of `kind` and of `owner`
        (the server caller that created them) when given, and those after `before` (the key of the
        last session of the previous page: `SessionKey.of(row)`)."""
        rows = await self.store.list_sessions(kind, limit=limit, offset=offset, owner=owner, before=before)
        out = []
        for r in rows:
            live = self.cache.get(r.id)
            d = r.to_dict()
            d["model"] = r.model if r.model in self.config.models.models else self.config.models.default_model
            d["state"] = self.session_state(r.id)
            if live:
                d["title"] = live.row.title or r.title
            out.append(d)
        return out

    def watch_history(self, fn: Callable[[str], None]) -> Callable[[], None]:
        """Call `fn(session_id)` whenever a session's stored history changes (a message added, a
        reset, a delete), synchronously: it must be cheap and never raise. Returns the function
        that stops it. (A cache of something derived from histories learns which entries went
        stale without re-reading all of them.)"""
        watchers = self.cache.history_watchers
        watchers.append(fn)
        return lambda: watchers.remove(fn) if fn in watchers else None

    async def history(self, ref: str, *, limit: int | None = None,
                      before_id: int | None = None) -> list[Message]:
        live = await self.session(ref)
        if live is None:
            raise EngineError(f"no session {ref!r}")
        return await self.store.history(live.id, limit=limit, before_id=before_id)

    async def history_page(self, ref: str, *, limit: int,
                           before_id: int | None = None) -> tuple[list[Message], bool]:
        """A page of history that keeps turns whole, and whether older messages exist (see
        `Store.history_page`)."""
        live = await self.session(ref)
        if live is None:
            raise EngineError(f"no session {ref!r}")
        return await self.store.history_page(live.id, limit=limit, before_id=before_id)

    async def delete_session(self, ref: str) -> bool:
        live = await self.session(ref)  # (a delete in progress is waited for: then it is gone)
        if live is None:
            return False
        # Marked first: a message sent meanwhile waits for the deletion and starts a new session
        # of that id, and a turn queued here just before never runs on a session going away.
        live.deleting = asyncio.get_running_loop().create_future()
        try:
            # Its gates first, so that they (and an operator answering one late) say why they closed.
            self.gatekeeper.broker.cancel_session(live.id, by=SESSION_DELETED)
            self.stop_turn(live.id, clear_queue=True)
            if live.current and live.current.task:
                await asyncio.wait([live.current.task], timeout=10)
            self.gatekeeper.broker.cancel_session(live.id, by=SESSION_DELETED)
            try:
                ok = await self.store.delete_session(live.id)
            finally:
                # In memory until the row is gone: a lookup in between would admit a second copy.
                self.cache.drop(live)
                self.cache.history_changed(live.id)
                await self.gatekeeper.forget_session(live.id)
        finally:
            pending, live.deleting = live.deleting, None
            if not self.cache.holds(live):
                live.deleting = pending  # gone: anyone still holding this copy sees it deleted
            # else the delete was cancelled (or failed) before the row went: the session goes on.
            pending.set_result(None)
        deleted = ev.SessionChanged(session_id=live.id, change="deleted",
                                    session={"client_id": live.id, "short_id": live.row.short_id})
        if not self.held.hold(deleted):  # (else announced when the commands' message is answered)
            self.bus.publish(deleted)
        return ok

    async def reset_session(self, ref: str) -> None:
        live = await self.session(ref)
        if live is None:
            raise EngineError(f"no session {ref!r}")
        with self.cache.pinned(live):
            try:
                await self.store.reset_session(live.id)
            finally:
                live.forget_history()
                self.cache.history_changed(live.id)
        live.row.title = ""
        live.row.message_count = 0  # the new epoch's
        self.session_changed(live)

    async def set_session_model(self, ref: str, model: str) -> None:
        live = await self.session(ref)
        if live is None:
            raise EngineError(f"no session {ref!r}")
        if why := self.check_model(model):
            raise EngineError(why)
        with self.cache.pinned(live):
            await self.store.update_session(live.id, model=model)
        live.row.model = model
        self.session_changed(live)

    def session_changed(self, live: LiveSession) -> None:
        """Announce the session's record as it is now (its state, title, model)."""
        self.bus.publish(ev.SessionChanged(session_id=live.id, change="updated", session=live.to_dict(self)))

    def live_state_changed(self, session_id: str | None) -> None:
        live = self.cache.get(session_id or "")
        if live is not None:
            self.session_changed(live)

    def session_state(self, session_id: str) -> str:
        live = self.cache.get(session_id)
        if live is None:
            return "idle"
        if live.state == "running" and self.gatekeeper.broker.pending(session_id):
            return "waiting"
        return live.state

    # ---- history records ----

    async def record(self, session_id: str, msg: Message, *, publish: bool = False) -> Message:
        """Commit a message; it is durable when this returns."""
        try:
            await self.store.add_message(session_id, msg)
        finally:
            # Even when the caller is cancelled: the write may still commit (group commit).
            self.cache.history_changed(session_id)
        live = self.cache.get(session_id)
        if live is not None:
            live.remember(msg)
        if publish:
            self.bus.publish(
                ev.UserPosted(session_id=session_id, turn_id=msg.turn_id, text=msg.content) if msg.role == "user"
                else ev.Notice(session_id=session_id, turn_id=msg.turn_id, text=msg.content))
        return msg

    def notice(self, session_id: str | None, text: str, turn_id: str | None = None, *,
               persist: bool = True) -> None:
        self.bus.publish(ev.Notice(session_id=session_id, turn_id=turn_id, text=text))
        if persist and session_id:
            self._spawn(self.record(session_id, Message("notice", text, turn_id=turn_id)))

    def _spawn(self, coro: Any) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    # ---- turns ----

    def parse(self, text: str, kind: str) -> ParsedInput:
        """A message from a client of `kind` as read (see CommandRegistry.parse); EngineError when
        it holds more than MAX_COMMANDS commands. Callers that create a session for a message
        parse it first, so a refused one leaves none behind."""
        return self.intake.parse(text, kind)

    async def submit(self, client_id: str | None, text: str, *, kind: str = "api",
                     model: str | None = None, is_operator: bool = False, depth: int = 0,
                     tools: bool = True, meta: dict[str, Any] | None = None,
                     owner_only: bool = False, hops: tuple[str, ...] = (),
                     client_tools: Sequence[ToolSpec] = (), title: str | None = None) -> Turn:
        """Take a message: run its commands now, queue its plain text as a turn (see intake.py).

        The user message is committed before this returns, so acknowledging the returned turn to a
        client is safe. A message that holds only commands returns an already finished turn whose
        text is the commands' output. `meta` goes into a session this creates (its owner, say);
        an existing session's is left alone. With `owner_only` (a client token's message), nothing
        of the message acts on a session whose owner is not `meta`'s: one another caller started
        after the caller's surface found no session of that id. `depth` and `hops` are a call's
        from another aiops (a swarm session): its tools run at that depth, and a call they make
        carries the hop list on. `client_tools`: the chat client's
        own tools, offered to the model for this turn (see client_tools.py). `title`: what a new
        session is titled by when not the text (a chat UI's template around the user's question).
        """
        outcome: Outcome | None = self.intake.precheck(text, model)
        if outcome is None:
            with self.admission(), ExitStack() as pins:
                outcome = await self.intake.take(pins, client_id, text, kind=kind, model=model,
                                                 is_operator=is_operator, depth=depth, tools=tools, meta=meta,
                                                 owner_only=owner_only, hops=hops,
                                                 client_tools=offer(client_tools, self.tools.names()),
                                                 title=title)
        if isinstance(outcome, Refused):
            raise EngineError(outcome.reason)
        return outcome.turn

    async def resume(self, session_id: str, results: Sequence[tuple[str, str]], *, kind: str,
                     client_tools: Sequence[ToolSpec] = (), is_operator: bool = False) -> Turn:
        """Go on with a turn that handed client tool calls back to its client: `results` are the
        client's (call id, result text), recorded as the calls' results (a call left without
        one is recorded as unanswered), then the same turn is queued again, without a new user
        message, offering `client_tools` anew. EngineError when the session waits for no such
        call."""
        with self.admission(), ExitStack() as pins:
            live = await self.session(session_id)
            if live is None:
                raise EngineError(f"no session {session_id!r}")
            pins.enter_context(self.cache.pinned(live))
            waiting = open_client_calls(await live.history(self))
            if waiting is None or live.current is not None or live.queue:
                raise EngineError(f"session {session_id!r} is not waiting for client tool results")
            calls = {c.id: c for c in waiting.calls}
            if unknown := [cid for cid, _ in results if cid not in calls]:
                raise EngineError(f"session {session_id!r} is waiting for no tool call {unknown[0]!r}")
            if len({cid for cid, _ in results}) < len(results):
                raise EngineError("two results for one tool call")
            for call_id, text in results:
                call = calls.pop(call_id)
                # Cut as the agent's own results are.
                msg = Message("tool", clipped(text), tool_call_id=call_id, name=call.name, turn_id=waiting.turn_id,
                              meta={"client": True, "is_error": False})
                await self.record(live.id, msg)
                self.bus.publish(returned(live.id, msg))
            if calls:
                for result in unanswered(OpenClientCalls(waiting.turn_id, tuple(calls.values()),
                                                         waiting.client_names)):
                    await self.record(live.id, result)
                    self.bus.publish(returned(live.id, result))
            turn = Turn(waiting.turn_id, live.id, "", kind, is_operator=is_operator,
                        client_tools=offer(client_tools, self.tools.names()))
            self.turns.enqueue(live, turn)
            return turn

    async def run(self, client_id: str | None, text: str, *, timeout: float | None = None,
                  **kw: Any) -> TurnResult:
        turn = await self.submit(client_id, text, **kw)
        return await turn.wait(timeout)

    def drop_queued_turn(self, live: LiveSession, turn: Turn) -> bool:
        """Take a turn that has not started out of its session's queue, as cancelled (its `done`
        is published all the same)."""
        return self.turns.drop(live, turn)

    def stop_turn(self, ref: str, *, clear_queue: bool = False, by: str = "stop") -> bool:
        """Cancel the running turn of a session (its pending gates are cancelled too, `by` saying
        why in their record: "stop", "the client disconnected", …)."""
        live = self.cache.find(ref)
        return live is not None and self.turns.stop(live, clear_queue=clear_queue, by=by)

    async def stop_one_turn(self, ref: str, turn_id: str, *, by: str = "stop") -> bool:
        """Cancel the turn `turn_id` of a session, running (as stop_turn) or still queued (taken
        out of the queue, recorded as cancelled): a client that leaves before its own turn ends
        (`aiops chat` on Ctrl-C) must not end another client's turn that runs ahead of it, and
        must not leave its own to run later with nobody at its gates. False when that turn is
        neither running nor queued (it ended, or there is no such turn)."""
        live = self.cache.find(ref)
        if live is None:
            return False
        running = live.current or (live.queue[0] if live.queue else None)  # (as TurnQueue.stop sees it)
        if running is not None and running.id == turn_id:
            return self.turns.stop(live, by=by)
        queued = next((t for t in live.queue if t.id == turn_id), None)
        if queued is None or not self.turns.drop(live, queued):
            return False
        await self.record(live.id, Message("notice", "turn cancelled before it started: it was stopped",
                                           turn_id=queued.id, meta={"kind": "cancelled"}))
        return True

    # -- what a turn asks of the gatekeeper (see turn.TurnHost) --

    async def check_call(self, tool: Tool, args: dict[str, Any], cls: Classification,
                         ctx: ToolContext) -> GateOutcome:
        return await self.gatekeeper.check(tool, args, cls, ctx)

    def cancel_turn_gates(self, turn_id: str, *, by: str = "stop") -> int:
        return self.gatekeeper.broker.cancel_turn(turn_id, by=by)

    # -- the facade's gate and rate operations (see facade.py) --

    def resolve_gate(self, gate_id: str, decision: str, scope: str = "once", *, by: str) -> ev.GateInfo:
        """Answer a pending gate: the one path every view takes (the broker audits it). Raises
        GateError for an unknown gate, GateAlreadyResolved when someone answered first."""
        broker = self.gatekeeper.broker
        broker.resolve(gate_id, decision, scope, by=by)
        gate = broker.get(gate_id)
        assert gate is not None and gate.resolution is not None
        return ev.GateInfo.from_dict(gate.resolved_dict())

    def pending_gates(self, session_id: str | None = None) -> list[ev.GateInfo]:
        """Gates waiting for an answer, oldest first."""
        return [ev.GateInfo.from_dict(g.to_dict()) for g in self.gatekeeper.broker.pending(session_id)]

    def rate_usage(self, session_id: str | None = None) -> list[ev.RateInfo]:
        return self.gatekeeper.limiter.usage(session_id)

    def models(self) -> Mapping[str, ModelConfig]:
        return self.config.models.models

    def subscribe(self, session_id: str | None = None, names: Iterable[str] | None = None,
                  maxsize: int | None = None) -> Subscription:
        return self.bus.subscribe(session_id, names, maxsize)

    def status(self) -> dict[str, Any]:
        return {
            "sessions_live": len(self.cache),
            "running": sum(1 for s in self.cache if s.state == "running"),
            "pending_gates": len(self.gatekeeper.broker.pending()),
            "plugins": [p.to_dict() for p in self.plugin_host.status],
        }


if TYPE_CHECKING:
    def _implements(engine: Engine) -> None:
        """For the type checker: the engine is the views' facade and each collaborator's host."""
        _facade: EngineFacade = engine
        _turns: TurnHost = engine
        _gates: GateHost = engine
        _commands: CommandHost = engine
        _intake: IntakeHost = engine
        _plugins: PluginEngine = engine
