"""The one boundary between the engine and the console's widgets.

Each typed engine event (`aiops.engine.events`) becomes one Textual message class here, carrying
the event; every request the console makes of the engine (submit, stop, history, gates, rate
limits, the prompt tree, the server) goes through `EngineAdapter`, which asks the engine's facade
(`resolve_gate`, `pending_gates`, `rate_usage`, …). Widgets and screens never touch the engine:
they receive these messages, typed values (GateInfo, RateInfo) and session records, so a remote
engine (the HTTP API and its SSE stream, read back with `events.from_wire`) can later stand behind
the same widgets.

Ordering: events are posted to the App synchronously when the engine publishes them (a bus
listener) — text deltas excepted, which wait up to a short tick to reach the App as one batch
(`outbox.EventOutbox`; any other event sends them first, so none is overtaken) — and results of
history reads are posted after the read completes. The store runs on one thread in FIFO order and
every record is published right after it is committed, so every event describing a message
contained in a history read is already in the App's queue ahead of the `HistoryLoaded` message.
(Deltas waiting for their tick may follow the page: they belong to a running turn, which the chat
leaves out of the page and draws from the App's live buffer and the events after it.) The App can
therefore rebuild a chat from history plus the events of the live turn without duplicates or gaps.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from textual.message import Message

from aiops.engine import events as ev
from aiops.gates.broker import GateError
from aiops.tui.outbox import EventOutbox

if TYPE_CHECKING:
    from textual.message_pump import MessagePump

    from aiops.config import Config
    from aiops.engine.engine import Engine
    from aiops.engine.events import Event
    from aiops.engine.lock import DataDirLock
    from aiops.engine.types import Message as HistoryMessage
    from aiops.engine.types import SessionKey
    from aiops.prompts.tree import PromptTree

log = logging.getLogger(__name__)

PROBE_TIMEOUT = 5.0

# The console's answer keys say approve / deny; the facade takes the decision's past tense.
_ANSWERS: dict[str, Literal["approved", "denied"]] = {
    "approve": "approved", "approved": "approved", "deny": "denied", "denied": "denied"}


# ---- messages: engine events ------------------------------------------------------------------------
#
# One Textual message class per typed engine event, each carrying its event (harlequin's
# messages.py style): the App has one `@on` handler per class and reads the event's typed fields.


class EngineMessage(Message):
    """One engine event, as a Textual message (a subclass per event type)."""

    event: Event

    def __init__(self, event: Event) -> None:
        super().__init__()
        self.event = event


class DeltasArrived(Message):
    """`tok` and `thinking`: deltas of answers and reasoning, of one or many sessions, in the order
    they came (adjacent ones of a turn merged). Gathered for a short tick (`outbox.EventOutbox`):
    fifty streaming sessions make one message per tick, not one per token."""

    def __init__(self, events: list[Event]) -> None:
        super().__init__()
        self.events = events


class ToolCallStarted(EngineMessage):
    """`tool_call`: the model called a tool."""

    event: ev.ToolCalled


class ToolCallFinished(EngineMessage):
    """`tool_result`: a tool call's result (or why its stopped or failed turn left it without one)."""

    event: ev.ToolReturned


class GateOpened(EngineMessage):
    """`gate`: a tool call waits for an operator's answer."""

    event: ev.GateOpened


class GateResolved(EngineMessage):
    """`gate_resolved`: a gate was answered, timed out or was cancelled."""

    event: ev.GateResolved


class NoticePosted(EngineMessage):
    """`notice`: status text, or a command's output."""

    event: ev.Notice


class ErrorRaised(EngineMessage):
    """`error`: a failure of the model, a backend or the turn."""

    event: ev.ErrorEvent


class TurnDone(EngineMessage):
    """`done`: the end of a turn, always."""

    event: ev.Done


class UserPosted(EngineMessage):
    """`user`: a user message was committed."""

    event: ev.UserPosted


class TurnStarted(EngineMessage):
    """`turn`: a queued turn started running."""

    event: ev.TurnStarted


class SessionChanged(EngineMessage):
    """`session`: a session was created, updated or deleted."""

    event: ev.SessionChanged


class RateChanged(EngineMessage):
    """`rate`: rate-limit usage of one session changed."""

    event: ev.RateChanged


# Every event but the text deltas (`DeltasArrived` carries those, in batches).
EVENT_MESSAGES: dict[type[Event], type[EngineMessage]] = {
    ev.ToolCalled: ToolCallStarted,
    ev.ToolReturned: ToolCallFinished,
    ev.GateOpened: GateOpened,
    ev.GateResolved: GateResolved,
    ev.Notice: NoticePosted,
    ev.ErrorEvent: ErrorRaised,
    ev.Done: TurnDone,
    ev.UserPosted: UserPosted,
    ev.TurnStarted: TurnStarted,
    ev.SessionChanged: SessionChanged,
    ev.RateChanged: RateChanged,
}


def to_message(event: Event) -> EngineMessage:
    return EVENT_MESSAGES[type(event)](event)


# ---- messages: services and reads ---------------------------------------------------------------------


class ServicesStarted(Message):
    """The engine is running (and the server, when asked for)."""

    def __init__(self, server_urls: list[str], server_error: str | None) -> None:
        super().__init__()
        self.server_urls = server_urls
        self.server_error = server_error


class ServicesFailed(Message):
    """The engine could not start; the console stays up to say why."""

    def __init__(self, error: str) -> None:
        super().__init__()
        self.error = error


class HistoryLoaded(Message):
    """A page of one session's history. `before_id` None: the latest page (a fresh view)."""

    def __init__(self, session_id: str, messages: list[HistoryMessage], limit: int,
                 before_id: int | None) -> None:
        super().__init__()
        self.session_id = session_id
        self.messages = messages
        self.limit = limit
        self.before_id = before_id

    @property
    def has_more(self) -> bool:
        return len(self.messages) >= self.limit


@dataclass
class ModelProbe:
    key: str
    ok: bool
    reason: str = ""  # why it is unreachable
    description: str = ""  # "openai gpt-4o-mini at https://…"
    cause: str = ""  # with `reason`: "key" or "connection" (engine/backends/base.py FailureCause)


class ModelsChecked(Message):
    """Reachability of the enabled models (first-run guidance, header warning)."""

    def __init__(self, probes: dict[str, ModelProbe]) -> None:
        super().__init__()
        self.probes = probes


# ---- start-up imports, in a thread ---------------------------------------------------------------------


def _import_for_start(engine: bool, plugins: bool, server: bool) -> None:
    """Import what starting the engine (and its server) imports, so that the start itself, on
    the loop, finds it all loaded. An import that fails is left for the start to report."""
    import importlib

    names = (["aiops.engine.engine"] if engine else []) + (
        ["aiops.integrations.server.run", "aiops.integrations.server.app", "aiops.integrations.mcp.endpoint"]
        if server else [])
    for name in names:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - the start reports it where the operator looks
            log.debug("could not pre-import %s", name, exc_info=True)
    if plugins:
        from aiops.engine.plugins import discover

        discover()  # loads every plugin's module; a broken one is reported by the start


# ---- the adapter --------------------------------------------------------------------------------------


# The sessions the console lists at start-up; the rest follow in pages of this size once it is
# interactive (services.py).
SESSIONS_PAGE = 1000


class EngineAdapter:
    """The console's only door to the engine (and to the HTTP server it runs)."""

    def __init__(self, engine: Engine | None, target: MessagePump, *,
                 make_engine: Callable[[], Engine] | None = None, preload_plugins: bool = False) -> None:
        """`engine`, or None and `make_engine`, which makes it when it is first needed: `start`
        imports the engine's modules in a thread first, so the console draws while they load.
        `preload_plugins`: the engine's start will load the plugins' entry points (imported in
        that thread too)."""
        if engine is None and make_engine is None:
            raise ValueError("an engine, or a function that makes it")
        self._engine = engine
        self._make_engine = make_engine
        self._preload_plugins = preload_plugins
        self.target = target
        self.server: Any = None
        self._unlisten: Any = None
        self.outbox = self._make_outbox()

    @property
    def engine(self) -> Engine:
        if self._engine is None:
            assert self._make_engine is not None
            self._engine = self._make_engine()
        return self._engine

    @property
    def owner(self) -> str | None:
        """Whose console sessions this console opens: the in-process console's have no owner."""
        return None

    # -- events --

    def connect(self) -> None:
        """Start turning engine events into messages for `target`."""
        if self._unlisten is None:
            self._unlisten = self.engine.bus.add_listener(self._on_event)

    def disconnect(self) -> None:
        if self._unlisten is not None:
            self._unlisten()
            self._unlisten = None
        self.outbox.flush()

    def _make_outbox(self) -> EventOutbox:
        return EventOutbox(self._post_event, self._post_deltas)

    def _on_event(self, event: Event) -> None:
        # Called synchronously by the bus: cheap, never raises.
        try:
            self.outbox.put(event)
        except Exception:  # noqa: BLE001
            log.exception("posting %s to the console failed", event.name)

    def _post_event(self, event: Event) -> None:
        if isinstance(event, ev.ModelsChanged):  # the server probed (for an attached console)
            self.target.post_message(self.models_checked(event.models))
            return
        self.target.post_message(to_message(event))

    def _post_deltas(self, events: list[Event]) -> None:
        try:
            self.target.post_message(DeltasArrived(events))
        except Exception:  # noqa: BLE001 - (from the outbox's timer: nothing above would log it)
            log.exception("posting %d deltas to the console failed", len(events))

    # -- lifecycle --

    async def start(self, *, server: bool, host: str | None, port: int | None,
                    lock: DataDirLock | None = None) -> ServicesStarted:
        """Start the engine, then the server; a server failure leaves the engine running.
        `lock`: this data dir's, which says whether the last aiops on it died without stopping.

        What takes long here is importing (the engine, the plugins, the server: ~0.4 s of CPU): done
        in a thread first, so the console's loop keeps drawing and taking keys meanwhile. The
        model SDKs (another ~0.4 s) are left to `warm_backends`, once the console session is shown:
        imported in a thread during start-up, they took the loop's time all the same (the GIL)."""
        await asyncio.to_thread(_import_for_start, self._engine is None, self._preload_plugins, server)
        await self.engine.start(warm=())
        await self.engine.close_left_open(lock)
        self.connect()
        urls: list[str] = []
        error: str | None = None
        if server:
            try:
                from aiops.integrations.server.run import BindRefused, ServerStartError, start_server
            except ImportError as e:
                error = f"the HTTP server is not available in this build ({e})"
            else:
                cfg = self.engine.config.app.server
                try:
                    self.server = await start_server(self.engine, self.engine.config,
                                                     host or cfg.host, cfg.port if port is None else port)
                    urls = list(getattr(self.server, "urls", []) or [])
                except (ServerStartError, BindRefused) as e:  # a port in use, a refused bind: said, not a bug
                    log.error("the server did not start: %s", e)
                    error = str(e)
                except Exception as e:  # noqa: BLE001 - the console stays useful without a server
                    log.exception("the server did not start")
                    error = f"{type(e).__name__}: {e}"
        return ServicesStarted(urls, error)

    async def stop(self) -> None:
        """Stop listening, stop the engine (running turns are cancelled and recorded, so every open
        stream sees its `done`), then close the server's open streams and connections."""
        server, self.server = self.server, None
        if server is not None and hasattr(server, "close_listeners"):
            try:
                await server.close_listeners()
            except Exception:  # noqa: BLE001
                log.exception("closing the server's listeners failed")
        try:
            if self._engine is not None and self._engine.started:
                await self._engine.stop()
        finally:
            self.disconnect()
            if server is not None:
                try:
                    await server.stop()
                except Exception:  # noqa: BLE001
                    log.exception("stopping the server failed")

    @property
    def started(self) -> bool:
        return self._engine is not None and bool(self._engine.started)

    async def warm_backends(self) -> None:
        """Import the enabled models' provider SDKs in a thread (a turn would otherwise import its
        model's on the loop)."""
        await self.engine.warm_backends()

    def connected_clients(self) -> int | None:
        """Clients streaming from the server right now (API streams, proxy and MCP requests in
        flight); None without a server."""
        server = self.server
        if server is None:
            return None
        value = getattr(server, "connected_clients", None)
        if callable(value):
            value = value()
        if isinstance(value, int):
            return value
        # Every remote reader of events holds one bus subscription; the console itself listens.
        return self.engine.bus.subscriber_count

    # -- models and commands --

    @property
    def config(self) -> Config:
        return self.engine.config

    def default_model(self) -> str:
        return self.engine.config.models.default_model

    def model_keys(self) -> list[str]:
        return sorted(self.engine.config.models.enabled())

    def command_names(self) -> list[str]:
        return self.engine.commands.names()

    def describe_model(self, key: str) -> str:
        m = self.engine.config.models.models.get(key)
        if m is None:
            return key
        return f"{m.type} {m.model_id} at {m.display_url()}"

    def key_env(self, key: str) -> str | None:
        """The variable that holds the model's API key ("" for a keyless model, None: not known)."""
        m = self.engine.config.models.models.get(key)
        return (m.api_key_env or "") if m is not None else ""

    async def probe_models(self) -> ModelsChecked:
        keys = self.model_keys()
        results = await asyncio.gather(*(self.probe_model(k) for k in keys))
        return ModelsChecked({p.key: p for p in results})

    def models_checked(self, states: Iterable[ev.ModelState]) -> ModelsChecked:
        """What the server knows of the models (`models` event), as the console's probe result."""
        keys = set(self.model_keys())
        return ModelsChecked({s.key: ModelProbe(s.key, s.ok, s.reason, self.describe_model(s.key), s.cause)
                              for s in states if s.key in keys})

    async def probe_model(self, key: str) -> ModelProbe:
        """A cheap request (list models) to tell whether `key` can answer at all."""
        from aiops.integrations.model_probe import probe_model

        why = await probe_model(self.engine.config.models.models[key], self.engine.env, PROBE_TIMEOUT)
        if why is None:
            return ModelProbe(key, True, "", self.describe_model(key))
        return ModelProbe(key, False, why.reason, self.describe_model(key), why.cause)

    # -- sessions and turns --

    async def sessions(self, limit: int = SESSIONS_PAGE, *, before: SessionKey | None = None) -> list[dict[str, Any]]:
        """Sessions, most recently active first: a page of them (`limit`, the first ones or those
        after `before`, the last session of the page before)."""
        return await self.engine.list_sessions(limit=limit, before=before)

    async def open_session(self, kind: str = "console") -> dict[str, Any]:
        live = await self.engine.open_session(kind=kind)
        return live.to_dict(self.engine)

    async def submit(self, session_id: str, text: str) -> str:
        """Send operator input; returns the turn id. Engine refusals raise with a readable message."""
        turn = await self.engine.submit(session_id, text, kind="console", is_operator=True)
        return turn.id

    def stop_turn(self, session_id: str) -> bool:
        return self.engine.stop_turn(session_id)

    async def load_history(self, session_id: str, limit: int, before_id: int | None = None) -> HistoryLoaded:
        messages = await self.engine.history(session_id, limit=limit, before_id=before_id)
        return HistoryLoaded(session_id, messages, limit, before_id)

    # -- gates --

    def pending_gates(self) -> list[ev.GateInfo]:
        return self.engine.pending_gates()

    def answered_elsewhere(self, gate: ev.GateInfo) -> bool:
        """Whether another operator answered `gate` (said when it leaves the inbox). In-process the
        inbox has always cleared silently; an attached console says it (remote_adapter.py)."""
        return False

    def resolve_gate(self, gate_id: str, decision: str, scope: str = "once") -> str | None:
        """Answer a gate as the console (`decision`: approve or deny; `scope`: once or session);
        the reason it could not be answered, or None."""
        answer = _ANSWERS[decision]  # a KeyError is a bug of ours, not the operator's
        try:
            self.engine.resolve_gate(gate_id, answer, "session" if scope == "session" else "once", by="console")
        except GateError as e:
            return str(e)
        return None

    # -- rate limits --

    def rate_usage(self, session_id: str | None = None) -> list[ev.RateInfo]:
        """Usage of every session that used a limited tool type, plus every limited type of
        `session_id` (the one the operator is looking at), sorted."""
        rows = {(u.session_id, u.tool_type): u for u in self.engine.rate_usage()}
        if session_id is not None:
            rows.update({(u.session_id, u.tool_type): u for u in self.engine.rate_usage(session_id)})
        return [rows[k] for k in sorted(rows)]

    def enable_rate(self, session_id: str, tool_type: str) -> bool:
        return self.engine.gatekeeper.limiter.enable(session_id, tool_type)

    # -- the prompt tree --

    def prompt_folder(self, model_key: str | None) -> Path | None:
        try:
            return self.engine.prompt_folder(model_key)
        except Exception:  # noqa: BLE001 - an unknown model: no folder
            return None

    def prompt_tree(self, model_key: str | None) -> tuple[Path | None, PromptTree | None]:
        folder = self.prompt_folder(model_key)
        if folder is None or not folder.exists():
            return folder, None
        return folder, self.engine.prompts.get(folder)

    def tool_names(self) -> list[str]:
        """The registered tools: a prompt section that requires another is left out of the prompt."""
        return self.engine.tools.names()

    def reload_prompt(self, folder: Path) -> None:
        self.engine.prompts.reload(folder)

    async def save_prompt_section(self, folder: Path, session_id: str | None, section: str, body: str) -> str:
        """Overwrite one leaf through the prompt-tree engine (atomic, audited); returns its summary."""
        from aiops.engine.prompt_tools import apply_edit

        result = await apply_edit(self.engine, folder, session_id, "operator", section, "overwrite", body,
                                  confirm=True)
        return result.summary

