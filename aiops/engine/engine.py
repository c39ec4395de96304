"""The engine: sessions, turns, tools, commands and plugins, headless.

Every client (console, API, proxy, Slack, swarm, MCP) goes through this facade: `submit` a message,
watch the events on `bus`, `stop` a turn, read history. The engine never imports Textual or an
integration; integrations arrive as plugins.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections import OrderedDict, deque
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from aiops.config import Config, ModelConfig
from aiops.engine import events as ev
from aiops.engine.backends import Backend, make_backend
from aiops.engine.bus import EventBus
from aiops.engine.commands import CommandContext, CommandRegistry, ParsedInput, not_the_senders
from aiops.engine.gatekeeper import SESSION_DELETED, Gatekeeper
from aiops.engine.lock import DataDirLock
from aiops.engine.plugins import (
    Plugin,
    PluginAPI,
    PluginStatus,
    PluginUnavailable,
    check_requirements,
    discover,
    validate_settings,
)
from aiops.engine.store import OWNER_KEY, SessionRow, Store
from aiops.engine.tools import ToolRegistry
from aiops.engine.turn import Turn, TurnResult, TurnRunner
from aiops.engine.types import Completion, Message, ToolSpec, is_short_id, new_id

log = logging.getLogger(__name__)

MAX_COMMANDS = 20  # per message
SESSION_KINDS = ("console", "api", "proxy", "slack", "swarm", "mcp")
# History stamps kept before those of sessions not in memory are forgotten (see _history_changed).
_HISTORY_STAMPS_MAX = 10_000


def _warm_backend_imports(types: set[str]) -> None:
    import importlib

    for t in sorted(types):
        try:
            importlib.import_module(f"aiops.engine.backends.{t}_backend")
        except Exception:  # noqa: BLE001 - the turn that needs it reports the real error
            log.debug("could not pre-import the %s backend", t, exc_info=True)


class EngineError(Exception):
    """A request the engine refuses; the message is for the user."""


class EngineStopping(Exception):
    """The engine is stopping (or stopped): it takes no new message. Not an EngineError: the
    request was fine, and may be sent again once aiops is back (the server answers 503)."""


STOPPING = "aiops is shutting down"
# The admission the current task is inside: the work it brackets may take in its message to the
# end, even once a stop has begun (the stop waits for it), nested calls included. An object, not a
# flag: a task born inside one (a listener's, say) outlives it, and must not count as inside it.
_ADMITTED: ContextVar[_Admission | None] = ContextVar("aiops_admitted", default=None)


class _Admission:
    """One open admission of one engine; a context that outlives it (a task born inside) no
    longer counts as inside it."""
    __slots__ = ("engine", "open")

    def __init__(self, engine: Engine) -> None:
        self.engine, self.open = engine, True


ADMISSION_WAIT = 10.0  # seconds a stop waits for messages being taken in


@dataclass
class LiveSession:
    """A session in memory: its row, its (lazily loaded) history, its turn queue.

    The store is the truth; this is a cache the engine may drop while the session is idle (see
    Engine._evict_idle). Code that holds one across an await and then changes it pins it first
    (Engine._pinned), so a message is never queued on a copy the engine has already dropped."""

    row: SessionRow
    state: str = "idle"  # idle | running | waiting
    queue: deque[Turn] = field(default_factory=deque)
    current: Turn | None = None
    worker: asyncio.Task[None] | None = None
    pins: int = 0
    # Set while Engine.delete_session runs: done when the session is gone from memory and store.
    deleting: asyncio.Future[None] | None = None
    _history: list[Message] | None = None
    _history_lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    @property
    def id(self) -> str:
        return self.row.id

    @property
    def idle(self) -> bool:
        """Nothing running, queued or in hand: dropping it from memory loses nothing."""
        return (self.current is None and not self.queue and self.pins == 0 and self.state == "idle"
                and (self.worker is None or self.worker.done()) and not self._history_lock.locked()
                and self.deleting is None)

    def model_key(self, engine: Engine) -> str:
        key = self.row.model
        if key and key in engine.config.models.models:
            return key
        return engine.config.models.default_model

    async def history(self, engine: Engine) -> list[Message]:
        if self._history is None:
            async with self._history_lock:
                if self._history is None:
                    self._history = await engine.store.history(self.id)
        return self._history

    def to_dict(self, engine: Engine) -> dict[str, Any]:
        d = self.row.to_dict()
        d.update(model=self.model_key(engine), state=engine.session_state(self.id), queued=len(self.queue))
        return d


INTERRUPTED_NOTICE = ("interrupted: aiops stopped (killed or crashed) before this turn ended; "
                      "it was not resumed")


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
        self.plugin_status: list[PluginStatus] = []
        self._extra_plugins = plugins or []
        self._discover = discover_plugins
        self._plugins: list[Plugin] = []
        # Live sessions, least recently used first (see _admit).
        self._sessions: OrderedDict[str, LiveSession] = OrderedDict()
        self._cached_sessions = config.app.engine.cached_sessions
        self._backends: dict[str, Backend] = {}
        self._background: set[asyncio.Task[Any]] = set()
        # A stamp per session whose history this process changed, from one counter: a cache of
        # something derived from a history (the proxy's conversation views) is current while the
        # stamp it was made under still is. Kept through eviction and deletion, so a session
        # deleted and created again never matches a stamp of the old one.
        self._history_stamps: dict[str, int] = {}
        self._history_counter = 0
        self._history_floor = 0  # the stamp of every session not in _history_stamps
        self._commanding: dict[str, int] = {}  # sessions whose message's commands are running
        self._deletions: dict[str, dict[str, Any]] = {}  # deletions announced when they end
        self._prompts: Any = None
        self._stopping = False
        self._admitted = 0  # admissions open (see admission)
        self._admissions_over: asyncio.Event | None = None  # set by the last, while a stop waits
        self.started = False
        self.started_at = time.time()

    # ---- lifecycle ----

    async def start(self) -> None:
        await self.store.open()
        from aiops.engine.builtin_commands import register_builtin_commands
        from aiops.engine.gate_commands import register_gate_commands
        from aiops.engine.prompt_tools import register_prompt_tools

        register_builtin_commands(self)
        register_gate_commands(self)
        register_prompt_tools(self)
        await self._load_plugins()
        # Importing a provider SDK takes about a second; do it in a thread now rather than on the
        # loop during the first turn (the import lock makes a turn that comes earlier just wait).
        types = {m.type for m in self.config.models.enabled().values()}
        self._spawn(asyncio.to_thread(_warm_backend_imports, types))
        self.started = True

    async def close_left_open(self, lock: DataDirLock | None) -> tuple[int, int]:
        """When this data dir's last process died without stopping (SIGKILL, a crash: its `lock`
        says so, and when it ran): its turns that never ended get a notice saying so, its gates
        left open are recorded as cancelled, then the lock is told. A clean stop records both
        itself. Returns (turns, gates)."""
        span = lock.left_open() if lock is not None else None
        if lock is None or span is None:
            return 0, 0
        turns, gates = await self.store.left_open(*span)
        at = time.time()
        for gate in gates:
            data = {**gate.data, "resolution": {"decision": "cancelled", "scope": "once", "by": "restart", "at": at}}
            await self.store.add_audit("gate_resolved", session_id=gate.session_id, gate_id=gate.gate_id,
                                       tool=gate.tool, operation=gate.operation, decision="cancelled",
                                       scope="once", actor="restart", data=data)
        for session_id, turn_id in turns:
            await self.record(session_id, Message(
                "notice", INTERRUPTED_NOTICE, turn_id=turn_id, meta={"kind": "interrupted"}))
        if turns or gates:
            log.warning("aiops did not stop cleanly last time: %d turn(s) recorded as interrupted, "
                        "%d gate(s) left open recorded as cancelled", len(turns), len(gates))
        lock.recovered()
        return len(turns), len(gates)

    @contextmanager
    def admission(self) -> Iterator[None]:
        """Bracket the taking in of a new message (a session made, a history imported, the
        submit): refused with EngineStopping once a stop has begun, and waited for by the stop,
        so that a turn it queues is stopped and recorded like every other, never left half
        taken in, nor started on a closed store."""
        outer = _ADMITTED.get()
        nested = outer is not None and outer.open and outer.engine is self
        if self._stopping and not nested:
            raise EngineStopping(STOPPING)
        mine = _Admission(self)
        token = _ADMITTED.set(mine)
        self._admitted += 1  # nested ones too: one may outlive its outer admission
        try:
            yield
        finally:
            mine.open = False
            _ADMITTED.reset(token)
            self._admitted -= 1
            if not self._admitted and self._admissions_over is not None:
                self._admissions_over.set()

    @property
    def stopping(self) -> bool:
        return self._stopping

    async def stop(self) -> None:
        """Cancel running turns cleanly (recorded as cancelled), stop plugins, close the store."""
        self._stopping = True
        if self._admitted:
            self._admissions_over = asyncio.Event()
            try:
                async with asyncio.timeout(ADMISSION_WAIT):
                    await self._admissions_over.wait()
            except TimeoutError:
                log.warning("stopping with %d message(s) still being taken in", self._admitted)
        turns = [live.current.task for live in self._sessions.values()
                 if live.current is not None and live.current.task is not None]
        dropped: list[tuple[str, Turn]] = []
        for live in self._sessions.values():
            # Queued turns end too, as cancelled (their waiters and readers are answered); their
            # user messages are already stored, and a notice says why no answer follows.
            for t in list(live.queue):
                if self.drop_queued_turn(live, t):
                    dropped.append((live.id, t))
            if live.current and live.current.task:
                # Its gates say why they closed (not that a task was cancelled somewhere).
                self.gatekeeper.broker.cancel_turn(live.current.id, by="shutdown")
                live.current.stop_requested = True
                if live.current.started:  # else its runner ends it as it begins (see stop_turn)
                    live.current.task.cancel()
        if turns:
            await asyncio.wait(turns, timeout=10)
        for sid, t in dropped:
            try:
                await self.record(sid, Message("notice", "turn cancelled before it started: aiops was "
                                               "shutting down", turn_id=t.id, meta={"kind": "cancelled"}))
            except Exception:  # noqa: BLE001 - shutting down: the store may already be failing
                log.warning("could not record the cancelled turn %s of %s", t.id, sid, exc_info=True)
        for live in self._sessions.values():
            if live.worker:
                live.worker.cancel()
        for p in reversed(self._plugins):
            try:
                await p.stop()
            except Exception:  # noqa: BLE001
                log.exception("plugin %s failed to stop", p.name)
        for b in self._backends.values():
            try:
                await b.aclose()
            except Exception:  # noqa: BLE001
                pass
        if self._background:
            await asyncio.wait(self._background, timeout=5)
        await self.gatekeeper.broker.drain()
        await self.store.close()
        self.started = False

    async def _load_plugins(self) -> None:
        classes: dict[str, type[Plugin] | Exception] = discover() if self._discover else {}
        instances: list[tuple[Plugin, str]] = [(p, "programmatic") for p in self._extra_plugins]
        plugins_file = str(self.config.sources.get("plugins.toml", "plugins.toml"))
        for name, cls in sorted(classes.items()):
            if isinstance(cls, Exception):
                self.plugin_status.append(PluginStatus(name, "failed", f"cannot load: {cls}", "entry point"))
                continue
            if any(p.name == cls.name for p, _ in instances):
                continue
            instances.append((cls(), "entry point"))
        for plugin, source in instances:
            name = plugin.name
            table = self.config.plugin_settings(name)
            try:
                plugin.settings = validate_settings(type(plugin), table, plugins_file)
                if not plugin.settings.enabled:
                    self.plugin_status.append(PluginStatus(name, "disabled", f"enabled = false in {plugins_file}",
                                                           source))
                    continue
                missing = check_requirements(type(plugin))
                if missing:
                    raise PluginUnavailable(missing)
                plugin.api = PluginAPI(self, plugin)
                await plugin.setup(plugin.api)
                await plugin.start()
            except PluginUnavailable as e:
                self.plugin_status.append(PluginStatus(name, "skipped", str(e), source))
                log.warning("plugin %s skipped: %s", name, e)
                continue
            except Exception as e:  # noqa: BLE001 - the rest start
                log.exception("plugin %s failed", name)
                self.plugin_status.append(PluginStatus(name, "failed", f"{type(e).__name__}: {e}", source))
                continue
            self._plugins.append(plugin)
            # A plugin may start yet have something to say (e.g. its server was unreachable).
            note = str(getattr(plugin, "status_note", "") or "")
            self.plugin_status.append(PluginStatus(name, "started", note, source))

    async def plugins_ready(self) -> None:
        """Wait for the plugins' background start-up checks (each bounds its own)."""
        await asyncio.gather(*(p.ready() for p in self._plugins), return_exceptions=True)

    def plugin(self, name: str) -> Plugin | None:
        return next((p for p in self._plugins if p.name == name), None)

    # ---- models ----

    def model_config(self, key: str) -> ModelConfig:
        models = self.config.models.models
        if key not in models:
            raise EngineError(f"unknown model {key!r}; known: {', '.join(sorted(models))}")
        return models[key]

    def check_model(self, key: str) -> str | None:
        """Why `key` cannot be used, or None."""
        models = self.config.models.models
        if key not in models:
            return f"unknown model {key!r}; models: {', '.join(sorted(self.config.models.enabled()))}"
        if not models[key].enabled:
            return f"model {key!r} is disabled in models.toml"
        return None

    def backend(self, key: str) -> Backend:
        b = self._backends.get(key)
        if b is None:
            b = make_backend(key, self.model_config(key), dict(self.env))
            self._backends[key] = b
        return b

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
        live = self._sessions.get(ref)
        if live is not None:
            self._sessions.move_to_end(ref)
            return live
        if create and model is not None and (why := self.check_model(model)):
            raise EngineError(why)
        if create and not is_short_id(ref) and kind in SESSION_KINDS:
            # One store round trip instead of a lookup and a create; a new session's history is
            # known to be empty, so it is not loaded either.
            row, created = await self.store.get_or_create_session(ref, kind, model, meta)
            if not created:
                return self._admit(LiveSession(row))
            live = self._admit(LiveSession(row, _history=[]))
            self.bus.publish(ev.SESSION, row.id, {"change": "created", **live.to_dict(self)})
            return live
        row = await self.store.get_session(ref)
        if row is None:
            if not create:
                return None
            if kind not in SESSION_KINDS:
                raise EngineError(f"unknown session kind {kind!r}")
            if is_short_id(ref):
                raise EngineError(f"no session {ref}: all-digit ids are shorthand ids of existing sessions")
            row = await self.store.create_session(ref, kind, model, meta)
            live = self._admit(LiveSession(row))
            self.bus.publish(ev.SESSION, row.id, {"change": "created", **live.to_dict(self)})
            return live
        return self._admit(LiveSession(row))

    def _admit(self, live: LiveSession) -> LiveSession:
        """`live` as the session's one copy in memory (or the copy another caller admitted while
        the store was read), then drop idle sessions beyond the cache size."""
        known = self._sessions.setdefault(live.id, live)
        self._sessions.move_to_end(live.id)
        if len(self._sessions) > self._cached_sessions:
            self._evict_idle(keep=live.id)
        return known

    def _evict_idle(self, keep: str) -> None:
        """Drop the least recently used idle sessions until the cache is back to its size. A
        long-running server sees a new session per API script run or chat conversation: kept
        forever, they grow memory without bound and make every full garbage collection slower
        (docs/PERFORMANCE.md). Busy sessions stay, however many there are, and so does `keep`,
        the one being handed to a caller (it pins the session only once it has it)."""
        excess = len(self._sessions) - self._cached_sessions
        victims: list[str] = []
        for sid, live in self._sessions.items():
            if len(victims) >= excess:
                break
            if live.idle and sid != keep:
                victims.append(sid)
        for sid in victims:
            del self._sessions[sid]

    @contextmanager
    def _pinned(self, live: LiveSession | None) -> Iterator[None]:
        """Keep `live` in memory while a caller that awaits in between still has to change it."""
        if live is None:
            yield
            return
        live.pins += 1
        try:
            yield
        finally:
            live.pins -= 1

    async def open_session(self, client_id: str | None = None, *, kind: str = "console",
                           model: str | None = None) -> LiveSession:
        if model and (why := self.check_model(model)):
            raise EngineError(why)
        cid = client_id or f"{kind}-{new_id()[:8]}"
        live = await self.session(cid, kind=kind, create=True, model=model)
        assert live is not None
        return live

    async def list_sessions(self, kind: str | None = None, limit: int = 1000, offset: int = 0, *,
                            owner: str | None = None) -> list[dict[str, Any]]:
        """Sessions, most recently active first; only those of `kind` and of `owner` (the server
        caller that created them) when given."""
        rows = await self.store.list_sessions(kind, limit=limit, offset=offset, owner=owner)
        out = []
        for r in rows:
            live = self._sessions.get(r.id)
            d = r.to_dict()
            d["model"] = r.model if r.model in self.config.models.models else self.config.models.default_model
            d["state"] = self.session_state(r.id)
            if live:
                d["title"] = live.row.title or r.title
            out.append(d)
        return out

    def history_stamp(self, session_id: str) -> int:
        """Changes whenever the session's stored history does (a message added, a reset, a
        delete). Read it before reading the history: what was read is current while it holds."""
        return self._history_stamps.get(session_id, self._history_floor)

    def _history_changed(self, session_id: str) -> None:
        self._history_counter += 1
        self._history_stamps[session_id] = self._history_counter
        if len(self._history_stamps) > _HISTORY_STAMPS_MAX:
            # Forget the stamps of sessions not in memory: they all read as one new stamp, which
            # no cached view was made under, so each is read afresh once (the safe direction).
            self._history_counter += 1
            self._history_floor = self._history_counter
            self._history_stamps = {sid: n for sid, n in self._history_stamps.items() if sid in self._sessions}

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
                if self._sessions.get(live.id) is live:
                    del self._sessions[live.id]
                self._history_changed(live.id)
                await self.gatekeeper.forget_session(live.id)
        finally:
            pending, live.deleting = live.deleting, None
            if self._sessions.get(live.id) is not live:
                live.deleting = pending  # gone: anyone still holding this copy sees it deleted
            # else the delete was cancelled (or failed) before the row went: the session goes on.
            pending.set_result(None)
        deleted = {"change": "deleted", "client_id": live.id, "short_id": live.row.short_id}
        if self._commanding.get(live.id):
            self._deletions[live.id] = deleted  # announced when the commands' message is answered
        else:
            self.bus.publish(ev.SESSION, live.id, deleted)
        return ok

    def _commands_over(self, session_id: str) -> None:
        n = self._commanding.pop(session_id, 1) - 1
        if n > 0:
            self._commanding[session_id] = n
        elif (deleted := self._deletions.pop(session_id, None)) is not None:
            self.bus.publish(ev.SESSION, session_id, deleted)

    async def reset_session(self, ref: str) -> None:
        live = await self.session(ref)
        if live is None:
            raise EngineError(f"no session {ref!r}")
        with self._pinned(live):
            try:
                await self.store.reset_session(live.id)
            finally:
                live._history = None
                self._history_changed(live.id)
        live.row.title = ""
        self._session_changed(live)

    async def set_session_model(self, ref: str, model: str) -> None:
        live = await self.session(ref)
        if live is None:
            raise EngineError(f"no session {ref!r}")
        if why := self.check_model(model):
            raise EngineError(why)
        with self._pinned(live):
            await self.store.update_session(live.id, model=model)
        live.row.model = model
        self._session_changed(live)

    def _session_changed(self, live: LiveSession) -> None:
        self.bus.publish(ev.SESSION, live.id, {"change": "updated", **live.to_dict(self)})

    def live_state_changed(self, session_id: str | None) -> None:
        live = self._sessions.get(session_id or "")
        if live is not None:
            self._session_changed(live)

    def session_state(self, session_id: str) -> str:
        live = self._sessions.get(session_id)
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
            self._history_changed(session_id)
        live = self._sessions.get(session_id)
        if live is not None:
            if live._history is not None:
                live._history.append(msg)
            if msg.role == "user" and not live.row.title and not msg.meta.get("command"):
                live.row.title = " ".join(msg.content.split()[:8])[:60]
            live.row.updated_at = msg.created_at
        if publish:
            self.bus.publish(msg.role if msg.role in (ev.NOTICE, ev.USER) else ev.NOTICE, session_id,
                             {"text": msg.content}, msg.turn_id)
        return msg

    def notice(self, session_id: str | None, text: str, turn_id: str | None = None, *,
               persist: bool = True, extra: dict[str, Any] | None = None) -> None:
        self.bus.publish(ev.NOTICE, session_id, {"text": text, **(extra or {})}, turn_id)
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
        parsed = self.commands.parse(text, kind)
        if len(parsed.commands) > MAX_COMMANDS:
            # Each runs on the loop, answers and may be written down: thousands of `!help` lines in
            # one message stalled every client for seconds and answered with 100+ MB.
            raise EngineError(f"a message may hold at most {MAX_COMMANDS} !commands; "
                              f"this one holds {len(parsed.commands)}")
        return parsed

    async def submit(self, client_id: str | None, text: str, *, kind: str = "api",
                     model: str | None = None, is_operator: bool = False, depth: int = 0,
                     tools: bool = True, meta: dict[str, Any] | None = None,
                     owner_only: bool = False) -> Turn:
        """Take a message: run its commands now, queue its plain text as a turn.

        The user message is committed before this returns, so acknowledging the returned turn to a
        client is safe. A message that holds only commands returns an already finished turn whose
        text is the commands' output. `meta` goes into a session this creates (its owner, say);
        an existing session's is left alone. With `owner_only` (a client token's message), nothing
        of the message acts on a session whose owner is not `meta`'s: one another caller started
        after the caller's surface found no session of that id.
        """
        if not text or not text.strip():
            raise EngineError("empty message")
        if model is not None and (why := self.check_model(model)):
            # Before anything runs: a new session would store this model, an existing one run on it.
            raise EngineError(why)
        with self.admission(), ExitStack() as pins:
            return await self._submit(pins, client_id, text, kind=kind, model=model, is_operator=is_operator,
                                      depth=depth, tools=tools, meta=meta, owner_only=owner_only)

    async def _submit(self, pins: ExitStack, client_id: str | None, text: str, *, kind: str,
                      model: str | None, is_operator: bool, depth: int, tools: bool,
                      meta: dict[str, Any] | None, owner_only: bool) -> Turn:
        """submit's body. The session is pinned from the moment it is known until its turn is
        queued: the commands and the writes in between must not see it dropped from memory."""
        cid = client_id or f"{kind}-{new_id()[:8]}"
        parsed = self.parse(text, kind)
        owner = (meta or {}).get(OWNER_KEY) if owner_only else None
        live: LiveSession | None
        if parsed.text:
            # A refused `@model` is answered below; it must not leave a new, empty session behind.
            refused = parsed.model is not None and self.check_model(parsed.model) is not None
            live = await self.session(cid, kind=kind, create=not refused, model=model, meta=meta)
        else:
            # Only commands: they run without creating a session, so `!help` from a new client
            # leaves nothing behind (a command that needs a session says so, or creates it).
            live = await self.session(cid)
            if live is None and is_short_id(cid):
                raise EngineError(f"no session {cid}: all-digit ids are shorthand ids of existing sessions")
            if live is None and kind not in SESSION_KINDS:
                raise EngineError(f"unknown session kind {kind!r}")
        if live is not None and owner is not None and live.row.owner != owner:
            # The caller found no session of this id and another caller's appeared since (the
            # API checks access to one that exists): nothing of this message is for it.
            raise EngineError(not_the_senders(cid))
        pins.enter_context(self._pinned(live))
        sid = live.id if live is not None else cid
        turn_id = new_id("turn_")
        outputs: list[str] = []

        def gone() -> bool:
            """The session went away (or began to) while this message was being taken: deleted by
            one of its commands or by someone else. Nothing more may be written to it: a write
            behind the deletion's would fail, and a turn queued on it would never run."""
            return live is not None and (self._sessions.get(sid) is not live or live.deleting is not None)
        if parsed.commands:
            # A command may delete this very session: its deletion is announced after the `done`
            # of this message, so that a stream ending at the deletion still gets that `done`.
            self._commanding[sid] = self._commanding.get(sid, 0) + 1
            pins.callback(self._commands_over, sid)
            echo = "\n".join(parsed.commands)
            echoed = live is not None
            if echoed:
                await self.record(sid, Message("user", echo, turn_id=turn_id, meta={"command": True}))
            self.bus.publish(ev.USER, sid, {"text": echo, "command": True}, turn_id)
            ctx = CommandContext(self, sid, kind, is_operator, turn_id, owner=owner)
            for i, line in enumerate(parsed.commands):
                ctx.failed = False
                out = await self.commands.run(ctx, line)
                notice = {"text": out, "command": line, "ok": not ctx.failed}
                if live is None and (appeared := self._sessions.get(sid)) is not None and ctx.foreign(appeared):
                    # Not ours to write into, nor to publish to (its streams are its owner's).
                    outputs.append(out)
                    if i + 1 < len(parsed.commands):
                        outputs.append(f"(the rest of the message was not run: {not_the_senders(sid)})")
                    return self._finished_turn(turn_id, sid, kind, "\n\n".join(outputs), model=model,
                                               publish=False)
                if gone():
                    # A command deleted this very session (or a delete came meanwhile): answer, but
                    # write nothing more to it.
                    if i + 1 < len(parsed.commands) or parsed.text:
                        out += "\n(the rest of the message was not run: its session is deleted)"
                        notice["text"] = out
                    outputs.append(out)
                    self.bus.publish(ev.NOTICE, sid, notice, turn_id)
                    return self._finished_turn(turn_id, sid, kind, "\n\n".join(outputs), model=live.model_key(self))
                outputs.append(out)
                if live is None:
                    live = self._sessions.get(sid)  # a plugin's command may have created it
                    pins.enter_context(self._pinned(live))
                if live is not None:
                    if not echoed:
                        await self.record(sid, Message("user", echo, turn_id=turn_id, meta={"command": True}))
                        echoed = True
                    if not gone():
                        await self.record(sid, Message("notice", out, turn_id=turn_id,
                                                       meta={"kind": "command", "command": line}))
                self.bus.publish(ev.NOTICE, sid, notice, turn_id)
        if parsed.model is not None and not parsed.text:
            outputs.append(f"@{parsed.model} needs a prompt after it (or use !model {parsed.model} "
                           f"to switch this session)")
        turn_model = parsed.model or (model if live is not None and model != live.row.model else None)
        if turn_model and (why := self.check_model(turn_model)):
            outputs.append(why)
            return self._finished_turn(turn_id, sid, kind, "\n\n".join(outputs), status="error", model=model)
        if not parsed.text or live is None:
            return self._finished_turn(turn_id, sid, kind, "\n\n".join(outputs), model=model)
        if not gone():
            await self.record(live.id, Message("user", parsed.text, turn_id=turn_id,
                                               meta={"model": turn_model} if turn_model else {}))
        if gone():  # (a write ahead of the deletion's is deleted with the session)
            outputs.append("this message was not run: its session was deleted meanwhile")
            return self._finished_turn(turn_id, sid, kind, "\n\n".join(outputs), status="cancelled",
                                       model=live.model_key(self), command=bool(parsed.commands))
        self.bus.publish(ev.USER, live.id, {"text": parsed.text, "model": turn_model}, turn_id)
        turn = Turn(turn_id, live.id, parsed.text, kind, model=turn_model, is_operator=is_operator,
                    depth=depth, prefix="\n\n".join(outputs), tools_enabled=tools)
        live.queue.append(turn)
        if live.worker is None or live.worker.done():
            # (It inherits this admission, closed by the time its turns run: they are not part
            # of taking in this message.)
            live.worker = asyncio.get_running_loop().create_task(self._worker(live),
                                                                 name=f"aiops-session-{live.id}")
        elif live.current is not None:
            self.notice(live.id, f"queued behind the running turn ({len(live.queue)} waiting)",
                        turn_id, persist=False)
        return turn

    def _finished_turn(self, turn_id: str, session_id: str, kind: str, text: str,
                       status: str = "complete", model: str | None = None, command: bool = True,
                       publish: bool = True) -> Turn:
        """The turn of a message that ran no model: its commands' output (or why it was refused).
        Its `done` has the fields of any turn's (`model`: the session's, or a new one's), plus
        `command: true` unless the message was text that a delete kept from running. Without
        `publish`, the session there is not the sender's: nothing of it goes into its streams,
        and nothing of it (its model) comes back."""
        live = self._sessions.get(session_id) if publish else None
        model_key = live.model_key(self) if live is not None else (model or self.config.models.default_model)
        turn = Turn(turn_id, session_id, "", kind)
        error = {"code": "bad_request", "message": text} if status == "error" else None
        turn.future.set_result(TurnResult(turn_id, status, text, error))
        data: dict[str, Any] = {"text": text, "status": status, "model": model_key}
        if command:
            data["command"] = True
        if not publish:
            return turn
        if error is not None:
            data["error"] = error
            self.bus.publish(ev.ERROR, session_id, error, turn_id)
        self.bus.publish(ev.DONE, session_id, data, turn_id)
        return turn

    async def run(self, client_id: str | None, text: str, *, timeout: float | None = None,
                  **kw: Any) -> TurnResult:
        turn = await self.submit(client_id, text, **kw)
        return await turn.wait(timeout)

    async def _worker(self, live: LiveSession) -> None:
        while live.queue:
            if live.deleting is not None:
                # Queued by a submit that had the session in hand as the delete began.
                self.drop_queued_turn(live, live.queue[0])
                continue
            turn = live.queue.popleft()
            live.current = turn
            runner = TurnRunner(self, live, turn)
            turn.task = asyncio.get_running_loop().create_task(runner.run(), name=f"aiops-turn-{turn.id}")
            try:
                result = await asyncio.shield(turn.task)
            except asyncio.CancelledError:
                # The worker itself is being cancelled (shutdown): let the turn finish cancelling.
                turn.task.cancel()
                try:
                    result = await turn.task
                except Exception as e:  # noqa: BLE001 - its waiters must still hear that it ended
                    result = self._crashed(live, turn, e)
                if not turn.future.done():
                    turn.future.set_result(result)
                live.current = None
                raise
            except Exception as e:  # noqa: BLE001
                result = self._crashed(live, turn, e)
            if not turn.future.done():
                turn.future.set_result(result)
            live.current = None

    def _crashed(self, live: LiveSession, turn: Turn, e: Exception) -> TurnResult:
        """End a turn whose runner failed outside its own error handling (the store refusing its
        error record, say) as the runner ends any failed turn: an `error`, then the `done` every
        client waiting on it needs, and its session idle again rather than "running" for good."""
        log.error("turn %s crashed", turn.id, exc_info=e)
        error = {"code": "internal_error", "message": f"{type(e).__name__}: {e}"}
        result = TurnResult(turn.id, "error", turn.prefix, error)
        self.bus.publish(ev.ERROR, live.id, error, turn.id)
        self.bus.publish(ev.DONE, live.id, {"text": result.text, "status": "error", "error": error,
                                            "model": turn.model or live.model_key(self)}, turn.id)
        live.state = "idle"
        self._session_changed(live)
        return result

    def drop_queued_turn(self, live: LiveSession, turn: Turn) -> bool:
        """Take a turn that has not started out of its session's queue, as cancelled. Its `done`
        is published all the same: readers waiting for that turn (a proxy request, an SSE client)
        would otherwise wait for good."""
        if turn not in live.queue:
            return False
        live.queue.remove(turn)
        if not turn.future.done():
            turn.future.set_result(TurnResult(turn.id, "cancelled", ""))
        self.bus.publish(ev.DONE, live.id, {"text": "", "status": "cancelled",
                                            "model": turn.model or live.model_key(self)}, turn.id)
        return True

    def _in_memory(self, ref: str) -> LiveSession | None:
        """The session `ref` (full or shorthand id) if it is in memory; no store lookup."""
        live = self._sessions.get(ref)
        if live is None and is_short_id(ref):
            n = int(ref)
            live = next((s for s in self._sessions.values() if s.row.short_id == n), None)
        return live

    def stop_turn(self, ref: str, *, clear_queue: bool = False, by: str = "stop") -> bool:
        """Cancel the running turn of a session (its pending gates are cancelled too, `by` saying
        why in their record: "stop", "the client disconnected", …)."""
        live = self._in_memory(ref)
        if live is None:
            return False
        if clear_queue:
            for t in list(live.queue):
                self.drop_queued_turn(live, t)
        # The running turn; or, when none runs yet, the one its worker is about to start (just
        # submitted: a stop right after Enter must not let it run).
        turn = live.current or (live.queue[0] if live.queue else None)
        # A turn already being stopped is not stopped again: only the stop that ended it says so.
        if turn and not (turn.task and turn.task.done()) and not turn.stop_requested:
            turn.stop_requested = True
            # Gates first, as a stop (not as a side effect of the cancelled wait), so they are
            # attributed to the stop and the turn can say how many it cancelled.
            turn.cancelled_gates += self.gatekeeper.broker.cancel_turn(turn.id, by=by)
            if turn.started and turn.task:
                turn.task.cancel()
            # else its runner finds stop_requested as it begins: a task cancelled before its first
            # step would end without recording anything or publishing its `done`.
            return True
        return False

    async def complete_plain(self, model_key: str, messages: list[Message],
                             system: str | None = None) -> Completion:
        """One model call with no tools, no gates and no session: chat UIs' background tasks.

        The whole Completion, so callers can report the model's token usage with the text."""
        completion = Completion()
        async for item in self.backend(model_key).stream(messages, [], system=system):
            if isinstance(item, Completion):
                completion = item
        return completion

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
        return [ev.RateInfo(u.session_id, u.tool_type, u.used, u.limit, u.window_seconds, u.disabled)
                for u in self.gatekeeper.limiter.usage(session_id)]

    def models(self) -> Mapping[str, ModelConfig]:
        return self.config.models.models

    def subscribe(self, session_id: str | None = None, names: Any = None,
                  maxsize: int | None = None) -> Any:
        return self.bus.subscribe(session_id, names, maxsize)

    def status(self) -> dict[str, Any]:
        return {
            "sessions_live": len(self._sessions),
            "running": sum(1 for s in self._sessions.values() if s.state == "running"),
            "pending_gates": len(self.gatekeeper.broker.pending()),
            "plugins": [p.to_dict() for p in self.plugin_status],
        }
