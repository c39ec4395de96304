"""What an attached console needs of `/api/v1` beyond the per-session API: one resumable event
stream of every session and gate, and the side panes' state (rate limits, plugins, the prompt tree,
which models answer: model_health.py).

`EventFeed` is a bus listener that numbers every event (`<epoch>-<seq>`: the epoch changes with every
start of the server, the seq is the engine's publication order) and keeps the latest `RING_SIZE` in
a ring. `GET /api/v1/events` replays what a reader missed after its `Last-Event-ID` from the ring,
then follows live; a reader whose id the ring no longer covers (it was away too long, or the server
restarted) is told so in the first frame (`hello` with `reset: true`) and reloads its state through
the API. Every `/api/v1` answer carries `X-Aiops-Event-Id`, the feed's position when it was made: a
history read is complete up to that event, so a reader that waits until its stream got there draws
nothing twice (see aiops/integrations/remote/).

Operators read every event; a client token reads only its own sessions' events (as `GET
/api/v1/stream` allows it). The side-pane routes are operator-only.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
from collections import deque
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field

from aiops.engine import events as ev
from aiops.integrations.server.addresses import event_seen_by
from aiops.integrations.server.bodies import parse_body, validate
from aiops.integrations.server.context import CONFIG_KEY, get_engine, prepare_stream, server_state
from aiops.integrations.server.errors import HttpError
from aiops.integrations.server.model_health import ModelHealth
from aiops.integrations.server.openapi import ApiRoute
from aiops.integrations.server.owners import caller, owner_of

if TYPE_CHECKING:
    from aiops.engine.engine import Engine

log = logging.getLogger(__name__)

PREFIX = "/api/v1"
RING_SIZE = 20_000  # events kept for readers that come back (a few minutes of a busy server)
RING_BYTES = 64 * 1024 * 1024  # and at most about this much of their text
EVENT_ID_HEADER = "X-Aiops-Event-Id"


def _weight(event: ev.Event) -> int:
    """Roughly what an event holds in memory (the text it carries), cheaply."""
    match event:
        case ev.ToolReturned(content=content):
            return 200 + len(content) * 2  # (its `data` may hold as much again)
        case ev.Tok(text=text) | ev.Thinking(text=text) | ev.Notice(text=text) | ev.Done(text=text):
            return 200 + len(text)
    return 400


class EventFeed:
    """Every engine event, numbered and kept in a bounded ring, with wake-ups for readers."""

    def __init__(self, size: int = RING_SIZE, max_bytes: int = RING_BYTES) -> None:
        self.epoch = secrets.token_hex(6)
        self.ring: deque[ev.Event] = deque(maxlen=size)
        self._sizes: deque[int] = deque()
        self.bytes = 0
        self.max_bytes = max_bytes
        self.last_seq = 0
        self.dropped_upto = 0  # the seq of the newest event the ring no longer holds
        self.closed = False
        self._waiters: set[asyncio.Event] = set()

    @property
    def readers(self) -> int:
        """Operator streams open right now (attached consoles)."""
        return len(self._waiters)

    def event_id(self, seq: int) -> str:
        return f"{self.epoch}-{seq}"

    @property
    def position(self) -> str:
        return self.event_id(self.last_seq)

    def publish(self, event: ev.Event) -> None:
        # A bus listener: synchronous, cheap, never raises.
        if len(self.ring) == self.ring.maxlen:
            self._evict()
        size = _weight(event)
        self.ring.append(event)
        self._sizes.append(size)
        self.bytes += size
        while self.bytes > self.max_bytes and len(self.ring) > 1:
            self._evict()  # a few huge tool results must not keep the ring's memory up
        self.last_seq = event.seq
        for w in self._waiters:
            w.set()

    def _evict(self) -> None:
        self.dropped_upto = self.ring.popleft().seq
        self.bytes -= self._sizes.popleft()

    def close(self) -> None:
        self.closed = True
        for w in self._waiters:
            w.set()

    def resume_point(self, last_event_id: str | None) -> tuple[int, bool]:
        """(the seq to stream after, whether the reader lost events and must reload)."""
        if not last_event_id:
            return self.last_seq, False
        epoch, _, seq = last_event_id.rpartition("-")
        if epoch != self.epoch or not seq.isdigit():
            return self.last_seq, True  # another run of the server (or no id of ours)
        n = int(seq)
        if n < self.dropped_upto:
            return self.last_seq, True  # away longer than the ring reaches back
        return n, False

    def after(self, seq: int) -> list[ev.Event]:
        if not self.ring or self.ring[-1].seq <= seq:
            return []
        # Usually the reader is at the end: walk back from there.
        out: list[ev.Event] = []
        for e in reversed(self.ring):
            if e.seq <= seq:
                break
            out.append(e)
        out.reverse()
        return out

    @contextlib.asynccontextmanager
    async def waiter(self) -> AsyncIterator[asyncio.Event]:
        w = asyncio.Event()
        self._waiters.add(w)
        try:
            yield w
        finally:
            self._waiters.discard(w)


FEED_KEY = web.AppKey("aiops_event_feed", EventFeed)
HEALTH_KEY = web.AppKey("aiops_model_health", ModelHealth)


def setup_feed(app: web.Application, engine: Engine) -> EventFeed:
    """Number every event from the start of the app; stamp every API answer with the position."""
    feed = EventFeed()
    app[FEED_KEY] = feed
    unlisten = engine.bus.add_listener(feed.publish)
    # Before any event: a turn's model error is known to the picture an attached console reads.
    health = app[HEALTH_KEY] = ModelHealth(engine)
    unlisten_health = engine.bus.add_listener(health.on_event)

    async def on_prepare(request: web.Request, response: web.StreamResponse) -> None:
        if request.path.startswith(PREFIX):
            response.headers[EVENT_ID_HEADER] = feed.position

    async def on_shutdown(_app: web.Application) -> None:
        feed.close()  # open event streams end now, not at shutdown_timeout

    async def on_cleanup(_app: web.Application) -> None:
        unlisten()
        unlisten_health()
        health.close()

    app.on_response_prepare.append(on_prepare)
    app.on_shutdown.append(on_shutdown)
    app.on_cleanup.append(on_cleanup)
    return feed


# ---- models ----------------------------------------------------------------------------------------


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class _Query(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RateOut(BaseModel):
    session_id: str
    tool_type: str
    used: int
    limit: int
    window_seconds: float
    disabled: bool


class RatesQuery(_Query):
    session: str | None = Field(None, max_length=128, description="Also every limited tool type of this "
                                "session (used or not), as the console shows the selected session.")


class RateEnableRequest(_Body):
    session_id: str = Field(min_length=1, max_length=128)
    tool_type: str = Field(min_length=1, max_length=64)


class RateEnabled(BaseModel):
    enabled: bool = Field(description="The tool type was disabled for the session and is enabled again.")


class LimitOut(BaseModel):
    tool_type: str
    limit: int = Field(description="Calls allowed in the window.")
    window_seconds: float
    auto_disable: bool = Field(description="A session that exceeds it has the tool type disabled.")


class RateList(BaseModel):
    usage: list[RateOut]
    limits: list[LimitOut] = Field(description="Every configured limit (limits.toml), used or not: a session "
                                               "that has not used a type is at 0 of its limit.")


class ModelStateOut(BaseModel):
    key: str
    ok: bool = Field(description="The model answered its last probe, or its last turn.")
    reason: str = Field(description="Why it is unreachable (empty when it answers).")
    checked_at: float = Field(description="When this was last seen (Unix time).")
    cause: str = Field("", description="With a reason: `key` (no API key, or the key refused) or "
                                       "`connection` (nothing answers there).")


class ModelStates(BaseModel):
    models: list[ModelStateOut]


class ConsoleInfo(BaseModel):
    """Who the caller is and what an attached console offers (completions, model descriptions)."""

    principal: str
    role: str
    epoch: str = Field(description="This run of the server: event ids of another run are not resumable.")
    last_event_id: str
    default_model: str
    models: dict[str, str] = Field(description="Enabled model key → what it is (type, model id, address).")
    commands: list[str]
    tools: list[str]
    plugins: list[dict[str, str]] | None = None
    console_sessions: bool = Field(False, description="An operator's `POST /api/v1/submit` may say `kind: "
                                   "\"console\"`: the session it creates is a console session, as the "
                                   "in-process console's are (an attached console does so).")
    sessions_before: bool = Field(False, description="`GET /api/v1/sessions` takes `before` (keyset paging; "
                                  "an attached console pages the older sessions with it).")
    model_status: list[ModelStateOut] | None = Field(
        None, description="Operators: what the server knows of each enabled model's reachability (its last "
                          "probe, then its turns); empty until something asked it to probe "
                          "(`POST /api/v1/models/check`). Changes come as `models` events.")


class PromptQuery(_Query):
    model: str | None = Field(None, max_length=200, description="Model key (default: the default model).")


class PromptOut(BaseModel):
    model: str
    folder: str | None = Field(description="The prompt folder; null: the model has no system prompt.")
    tree: dict[str, Any] | None = Field(description="The section tree (aiops/prompts/wire.py); null: the "
                                                    "folder does not exist.")


class PromptReloadRequest(_Body):
    model: str | None = Field(None, max_length=200)


class PromptSectionRequest(_Body):
    model: str | None = Field(None, max_length=200)
    section: str = Field(min_length=1, max_length=200)
    body: str = Field(max_length=1_000_000)
    session_id: str | None = Field(None, max_length=128, description="The session the edit is recorded for.")


class PromptSaved(BaseModel):
    summary: str


class FeedEvent(BaseModel):
    """The data of one event of `/api/v1/events`: the wire body of the event named by `event:`
    (every engine event: the stream's names plus `user`, `turn`, `session`, `rate`, and `models`, the
    server's picture of its models' reachability)."""

    model_config = ConfigDict(extra="allow")
    session_id: str | None = None


# ---- handlers --------------------------------------------------------------------------------------


def _json(model: BaseModel) -> web.Response:
    return web.json_response(model.model_dump(mode="json"), dumps=lambda o: json.dumps(o, default=str))


def _frame(name: str, data: dict[str, Any], event_id: str | None = None) -> bytes:
    head = f"id: {event_id}\n" if event_id else ""
    return f"{head}event: {name}\ndata: {json.dumps(data, ensure_ascii=False, default=str)}\n\n".encode()


async def events(request: web.Request) -> web.StreamResponse:
    engine = get_engine(request)
    feed = request.app[FEED_KEY]
    who = caller(request)
    cursor, reset = feed.resume_point(request.headers.get("Last-Event-ID")
                                      or request.query.get("last_event_id"))
    keepalive = request.app[CONFIG_KEY].app.server.keepalive_seconds
    owners: dict[str, bool] = {}  # session id -> the caller may read it (client tokens)

    async def visible(event: ev.Event) -> bool:
        if who.operator:
            return True
        sid = event.session_id
        if sid is None:
            return False
        if sid not in owners:
            live = await engine.session(sid)
            if live is None:
                return False  # not (yet) a session: decided when it is one
            owners[sid] = who.may_use(owner_of(live))
        return owners[sid]

    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8",
                                       "Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    await prepare_stream(request, resp)
    state = server_state(request)
    try:
        async with feed.waiter() as wake:
            await resp.write(_frame("hello", {"epoch": feed.epoch, "last_event_id": feed.event_id(cursor),
                                              "reset": reset, "principal": who.principal,
                                              "role": "operator" if who.operator else "client"}))
            while not feed.closed and not state.closing:
                batch = feed.after(cursor)
                if batch and batch[0].seq <= feed.dropped_upto:
                    # Fell behind by a whole ring while writing: what is gone must be reloaded.
                    cursor = feed.last_seq
                    await resp.write(_frame("hello", {"epoch": feed.epoch, "reset": True,
                                                      "last_event_id": feed.event_id(cursor)}))
                    continue
                if not batch:
                    wake.clear()
                    try:
                        async with asyncio.timeout(keepalive):
                            await wake.wait()
                    except TimeoutError:
                        await resp.write(b": keep-alive\n\n")
                    continue
                for event in batch:
                    cursor = event.seq
                    if not await visible(event):
                        continue
                    event = event_seen_by(who, engine, event)
                    await resp.write(_frame(event.name, event.payload(), feed.event_id(event.seq)))
    except (ConnectionResetError, ConnectionError):
        log.debug("an event-stream reader went away")
        return resp
    with contextlib.suppress(ConnectionResetError, ConnectionError):
        await resp.write_eof()
    return resp


async def console_info(request: web.Request) -> web.Response:
    engine = get_engine(request)
    who = caller(request)
    cfg = engine.config
    models = {}
    for key in sorted(cfg.models.enabled()):
        m = cfg.models.models[key]
        models[key] = f"{m.type} {m.model_id} at {m.display_url()}" if who.operator else key
    feed = request.app[FEED_KEY]
    info = ConsoleInfo(principal=who.principal, role="operator" if who.operator else "client",
                       epoch=feed.epoch, last_event_id=feed.position, default_model=cfg.models.default_model,
                       models=models, commands=engine.commands.names(), tools=engine.tools.names(),
                       plugins=[p.to_dict() for p in engine.plugin_status] if who.operator else None,
                       console_sessions=True, sessions_before=True,
                       model_status=_model_states(request.app[HEALTH_KEY].snapshot()) if who.operator else None)
    return _json(info)


def _model_states(states: list[ev.ModelState]) -> list[ModelStateOut]:
    return [ModelStateOut.model_validate(s.to_dict()) for s in states]


async def check_models(request: web.Request) -> web.Response:
    states = await request.app[HEALTH_KEY].check()
    return _json(ModelStates(models=_model_states(states)))


async def rates(request: web.Request) -> web.Response:
    q = validate(RatesQuery, dict(request.query), "query string")
    engine = get_engine(request)
    rows = {(u.session_id, u.tool_type): u for u in engine.rate_usage()}
    if q.session:
        live = await engine.session(q.session)
        if live is not None:
            rows.update({(u.session_id, u.tool_type): u for u in engine.rate_usage(live.id)})
    limits = [LimitOut(tool_type=t, limit=r.calls, window_seconds=r.window_seconds, auto_disable=r.auto_disable)
              for t, r in sorted(engine.gatekeeper.limiter.config.rate.items())]
    return _json(RateList(usage=[RateOut.model_validate(rows[k].to_dict()) for k in sorted(rows)], limits=limits))


async def enable_rate(request: web.Request) -> web.Response:
    body = await parse_body(request, RateEnableRequest)
    return _json(RateEnabled(enabled=get_engine(request).gatekeeper.limiter.enable(body.session_id, body.tool_type)))


def _prompt_folder(engine: Engine, model: str | None) -> tuple[str, Any]:
    key = model or engine.config.models.default_model
    if model is not None and engine.check_model(model):
        raise HttpError(400, "invalid_request", f"unknown model {model[:60]!r}", param="model")
    try:
        return key, engine.prompt_folder(key)
    except Exception:  # noqa: BLE001 - a model without a prompt folder
        return key, None


async def prompt(request: web.Request) -> web.Response:
    from aiops.prompts.wire import tree_to_wire

    q = validate(PromptQuery, dict(request.query), "query string")
    engine = get_engine(request)
    key, folder = _prompt_folder(engine, q.model)
    tree = None
    if folder is not None and folder.exists():
        tree = tree_to_wire(await asyncio.to_thread(engine.prompts.get, folder))
    return _json(PromptOut(model=key, folder=str(folder) if folder is not None else None, tree=tree))


async def prompt_reload(request: web.Request) -> web.Response:
    body = await parse_body(request, PromptReloadRequest)
    engine = get_engine(request)
    key, folder = _prompt_folder(engine, body.model)
    tree = None
    if folder is not None:
        await asyncio.to_thread(engine.prompts.reload, folder)
        if folder.exists():
            from aiops.prompts.wire import tree_to_wire

            tree = tree_to_wire(await asyncio.to_thread(engine.prompts.get, folder))
    return _json(PromptOut(model=key, folder=str(folder) if folder is not None else None, tree=tree))


async def prompt_section(request: web.Request) -> web.Response:
    from aiops.engine.prompt_tools import apply_edit
    from aiops.prompts.tree import PromptEditError

    body = await parse_body(request, PromptSectionRequest)
    engine = get_engine(request)
    key, folder = _prompt_folder(engine, body.model)
    if folder is None:
        raise HttpError(400, "invalid_request", f"model {key!r} has no system prompt")
    try:
        result = await apply_edit(engine, folder, body.session_id, str(request.get("principal") or "operator"),
                                  body.section, "overwrite", body.body, confirm=True)
    except PromptEditError as e:
        raise HttpError(400, "invalid_request", str(e)) from None
    return _json(PromptSaved(summary=result.summary))


ROUTES: tuple[ApiRoute, ...] = (
    ApiRoute("GET", f"{PREFIX}/events", events, "events", "Every session's events (operator stream)", "turns",
             description="Server-sent events of every session and gate, each with an `id:` "
                         "(`<epoch>-<seq>`). The first frame is `hello` `{epoch, last_event_id, reset, "
                         "principal, role}`. Reconnect with `Last-Event-ID` (or `?last_event_id=`) to get "
                         "what was missed from a bounded ring; `reset: true` says the ring no longer covers "
                         "it (or the server restarted): reload sessions, gates and history. Operators read "
                         "every session; a client token only the sessions it created.",
             event_model=FeedEvent, content_description="text/event-stream"),
    ApiRoute("GET", f"{PREFIX}/console", console_info, "consoleInfo", "What an attached console needs", "server",
             description="The caller's name and role, the event stream's position, models, !commands, tools; "
                         "operators also get every plugin's state.",
             response=ConsoleInfo),
    ApiRoute("POST", f"{PREFIX}/models/check", check_models, "checkModels", "Probe every enabled model", "server",
             description="One cheap request (list models) per enabled model, as the console's `check models`; "
                         "answers every model's state and publishes it as a `models` event.",
             response=ModelStates, operator_only=True),
    ApiRoute("GET", f"{PREFIX}/rates", rates, "rateUsage", "Rate-limit usage", "server",
             query=RatesQuery, response=RateList, operator_only=True),
    ApiRoute("POST", f"{PREFIX}/rates/enable", enable_rate, "enableRate",
             "Re-enable a tool type a rate limit disabled", "server",
             body=RateEnableRequest, response=RateEnabled, operator_only=True),
    ApiRoute("GET", f"{PREFIX}/prompt", prompt, "promptTree", "The system-prompt tree of a model", "server",
             query=PromptQuery, response=PromptOut, operator_only=True),
    ApiRoute("POST", f"{PREFIX}/prompt/reload", prompt_reload, "promptReload", "Re-read a prompt tree", "server",
             body=PromptReloadRequest, response=PromptOut, operator_only=True),
    ApiRoute("POST", f"{PREFIX}/prompt/sections", prompt_section, "promptSection",
             "Overwrite one prompt section (audited)", "server",
             body=PromptSectionRequest, response=PromptSaved, operator_only=True),
)
