"""The aiops API, `/api/v1`: submit, stream, sessions, gates, health, and its OpenAPI document.

Handlers are thin: validate at the edge (pydantic), call the engine, shape the answer with the
response models the OpenAPI document is built from. `ROUTES` at the bottom is the one table both
the router and the document read.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import re
from pathlib import Path
from typing import Any, Literal

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic_core import PydanticCustomError

import aiops
from aiops.engine import events as ev
from aiops.engine.engine import Engine, EngineError, LiveSession
from aiops.engine.store import SQLITE_MAX_INT
from aiops.engine.turn import Turn
from aiops.engine.types import SessionKey, is_short_id, new_id
from aiops.gates.broker import GateAlreadyResolved, GateNotFound, waiting_notice
from aiops.integrations.server import operator_api
from aiops.integrations.server.addresses import event_seen_by, record_seen_by, reply_seen_by
from aiops.integrations.server.bodies import parse_body, validate
from aiops.integrations.server.context import (
    AUTHENTICATED_KEY,
    CONFIG_KEY,
    check_model,
    get_config,
    get_engine,
    mark_public,
    prepare_stream,
    require_operator,
    server_state,
)
from aiops.integrations.server.errors import HttpError
from aiops.integrations.server.openapi import ApiRoute, build_openapi
from aiops.integrations.server.owners import (
    Caller,
    caller,
    check_access,
    check_name_free,
    claim,
    forbidden,
    owner_meta,
    owner_of,
)
from aiops.integrations.swarm.hops import HOPS_HEADER, Hops, HopsError, instance_id, parse_hops, refusal

log = logging.getLogger(__name__)

PREFIX = "/api/v1"
CLIENT_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:@+-]*$"
_CLIENT_ID = re.compile(CLIENT_ID_PATTERN)

# ---- request models --------------------------------------------------------------------------------


class _Body(BaseModel):
    # Strict: "true" is not a boolean and 5 is not a string; unknown fields are typos, refused.
    model_config = ConfigDict(extra="forbid", strict=True)


class _Query(BaseModel):
    # Query strings are text: numbers are parsed from them, unknown parameters refused.
    model_config = ConfigDict(extra="forbid")


class SubmitRequest(_Body):
    text: str = Field(min_length=1, max_length=1_000_000,
                      description="The message. Lines starting with `!` are commands and `@model …` "
                                  "runs one turn on another model, as in the console.")
    client_id: str | None = Field(None, min_length=1, max_length=128, pattern=CLIENT_ID_PATTERN,
                                  description="Session id (full, or the shorthand number of an existing "
                                              "session). Omitted: a new session `api-<8 hex>`.")
    model: str | None = Field(None, min_length=1, max_length=200,
                              description="Model key from models.toml: the model of a new session, or a "
                                          "one-turn override for an existing one.")
    wait: bool = Field(False, description="Answer when the turn ends (or `timeout` passes) instead of at once.")
    timeout: float = Field(120, gt=0, le=3600, description="Seconds to wait with `wait`; the turn goes on "
                                                           "after a timeout.")
    # Only kinds a client may say it is: `cli` (`aiops chat` through a running aiops) changes how
    # long its gates wait (gates.toml [wait]) and how the console groups it, nothing it may do;
    # `console` is an attached console's own session, for an operator's token only. The proxies,
    # Slack, swarm and MCP are kinds the server itself assigns.
    kind: Literal["api", "cli", "console"] = Field(
        "api", description="The client's kind, for a session this message creates and for its turn: `cli` is "
                           "`aiops chat` (as its in-process sessions are), `console` an attached console's "
                           "(operator tokens only; 403 `forbidden` otherwise). A call from another aiops "
                           "(X-Aiops-Agent-Hops) is `swarm` whatever this says.")


class GateDecisionRequest(_Body):
    decision: Literal["approve", "deny"]
    scope: Literal["once", "session"] = Field(
        "once", description="`session` also approves the same tool, operation and tables for the rest "
                            "of the session (denials are always `once`).")


class StopQuery(_Query):
    turn_id: str | None = Field(
        None, min_length=1, max_length=128,
        description="Stop this turn only (a submit's `turn_id`): running, or still queued behind another "
                    "(taken out of the queue, recorded as cancelled); the session's other turns are left "
                    "alone. `stopped` is false when it already ended. Without it: the running turn.")


# Store ids and offsets are SQLite integers: a larger number is a 400, not an overflow (a 500).
class SessionsQuery(_Query):
    kind: Literal["console", "cli", "api", "proxy", "slack", "swarm", "mcp"] | None = Field(
        None, description="Only sessions of this kind.")
    limit: int = Field(200, ge=1, le=1000, description="At most this many, most recently updated first.")
    offset: int = Field(0, ge=0, le=SQLITE_MAX_INT, description="Skip this many first (the next page starts at "
                        "`offset + limit`; sessions deleted or updated meanwhile shift it: page with `before`).")
    before: str | None = Field(
        None, max_length=200, description="`<updated_at>,<client_id>` of the last session of the previous page: "
        "only the sessions after it in the listing's order (keyset paging; ties in `updated_at` are ordered by "
        "`client_id`, descending). Deletions and activity meanwhile move no other session past it, so none is "
        "skipped (a session active meanwhile moves above it: to the top of a new listing).")

    @field_validator("before")
    @classmethod
    def _a_session_key(cls, v: str | None) -> str | None:
        if v is not None:
            try:
                SessionKey.from_wire(v)
            except ValueError as e:
                raise PydanticCustomError("session_key", str(e)) from None
        return v

    @property
    def after(self) -> SessionKey | None:
        return SessionKey.from_wire(self.before) if self.before is not None else None


class HistoryQuery(_Query):
    limit: int = Field(50, ge=1, le=1000, description="The latest turns that hold at least this many messages "
                       "together: a page never splits a turn, so it is longer by up to its oldest turn's size.")
    before: int | None = Field(None, ge=1, le=SQLITE_MAX_INT, description="Only turns that began below this "
                               "message id (the `next_before` of the previous page).")


# ---- response models -------------------------------------------------------------------------------


class ErrorObject(BaseModel):
    code: str
    message: str


class ErrorBody(BaseModel):
    error: ErrorObject


class UsageOut(BaseModel):
    prompt_tokens: int
    completion_tokens: int


class SubmitAccepted(BaseModel):
    client_id: str
    status: Literal["accepted"]
    turn_id: str


class SubmitResult(BaseModel):
    """The turn ended, or the wait timed out (with `wait`)."""

    client_id: str | None = Field(description=(
        "The session the message went to; null when there is none: a message of only !commands "
        "to a session that does not exist creates none (`!help` from a new client), and no id is "
        "given out that would answer 404."))
    status: Literal["complete", "timeout", "error", "cancelled"]
    text: str
    turn_id: str
    error: ErrorObject | None = None
    usage: UsageOut | None = None
    finish_reason: Literal["length"] | None = Field(
        None, description="`length` when the answer was cut at the model's output limit; absent otherwise.")
    ended: str | None = Field(
        None, description="Why aiops ended the turn before the model had answered (a tool-iteration "
                          "limit, a call repeated a third time): the text is then not a whole answer. "
                          "Absent otherwise.")


class SessionInfo(BaseModel):
    client_id: str
    short_id: int
    kind: str
    model: str
    title: str
    created_at: float
    updated_at: float
    message_count: int
    state: Literal["idle", "running", "waiting"]
    owner: str | None = Field(description="Who created it through the server: a token's name, or "
                                          "`loopback:<address>` without tokens; null for sessions made "
                                          "elsewhere (the console, Slack), which only operators may use.")


class SessionList(BaseModel):
    sessions: list[SessionInfo]


class ToolCallOut(BaseModel):
    id: str
    name: str
    arguments: dict[str, Any]
    parse_error: str | None = None


class MessageOut(BaseModel):
    id: int | None
    role: Literal["system", "user", "assistant", "tool", "notice", "gate", "error"]
    content: str
    tool_calls: list[ToolCallOut]
    tool_call_id: str | None
    name: str | None
    thinking: str
    meta: dict[str, Any]
    created_at: float
    turn_id: str | None
    status: str


class SessionDetail(BaseModel):
    session: SessionInfo
    messages: list[MessageOut] = Field(description="Oldest first, each turn's messages together: a message "
                                                   "sent while a turn ran follows that turn's answer.")
    has_more: bool = Field(description="Older messages exist: ask again with `before=next_before`.")
    next_before: int | None


class SessionDeleted(BaseModel):
    client_id: str
    deleted: bool


class SessionStopped(BaseModel):
    client_id: str
    stopped: bool = Field(description="A turn was cancelled (false: nothing was running, or the `turn_id` "
                                      "named had ended).")


class GateOut(BaseModel):
    """The gate object (docs/API.md, "Gates"; the same shape in events, the console and MCP); resolved
    gates add decision, scope, by and at."""

    id: str
    session_id: str
    client_id: str
    client_kind: str
    tool: str
    rule_target: str | None = Field(None, description=(
        "The tool as gates.toml rules name it: `mcp:SERVER:TOOL` for an MCP server's tool (which the "
        "model calls `SERVER__TOOL`, the `tool` above), the tool's own name otherwise."))
    tool_type: str
    args: dict[str, Any]
    operation: Literal["read", "write"]
    tables: list[str]
    summary: str
    created_at: float
    expires_at: float | None
    session_grant: str | None = Field(None, description=(
        "What approving with scope 'session' lets through from then on (the same tool, operation, "
        "tables and statement kinds), in words; null: a 'session' answer approves this call only."))
    call_id: str | None = Field(None, description=(
        "The model's call the gate holds: the `id` of its `tool_call` event (of the delegating call, "
        "for a delegate's); null for a gate of no call (an MCP server's question)."))
    decision: Literal["approved", "denied", "timeout", "cancelled"] | None = None
    scope: Literal["once", "session"] | None = None
    by: str | None = None
    at: float | None = None


class GateList(BaseModel):
    gates: list[GateOut]


class GateResolved(BaseModel):
    gate: GateOut


class PluginOut(BaseModel):
    name: str
    state: Literal["started", "disabled", "skipped", "failed"]
    reason: str
    source: str


class Health(BaseModel):
    status: Literal["ok"]
    version: str
    models: list[str] = Field(description="Enabled model keys.")
    default_model: str
    sessions: int
    pending_gates: int
    role: Literal["operator", "client"] | None = Field(
        description="The caller's role, or null when no valid token was sent.")
    mcp: dict[str, Any] | None = Field(None, description="Where /mcp is (endpoint.url); for operators also "
                                       "the external MCP servers' state (docs/MCP.md).")
    plugins: list[PluginOut] | None = Field(None, description=(
        "Operators only: every plugin's state (started, disabled, skipped, failed) and why, as "
        "`aiops plugins` shows it (a Slack bot that cannot connect, a data tool without its key)."))


class StreamEvent(BaseModel):
    """The data of one server-sent event. The event name is one of tok, thinking, tool_call,
    tool_result, gate, gate_resolved, notice, error, done (see docs/API.md); every data object
    carries `session_id` and, for events of a turn, `turn_id`. tok/thinking/notice: `{text}`;
    tool_call: `{id, name, arguments}`; tool_result: `{id, name, content, truncated, is_error,
    duration_ms, gate?, data?, status?}`; gate/gate_resolved: the gate object; error: `{code,
    message}`; done: `{text, status, model, error?, usage?, finish_reason?, ended?}` (`finish_reason`
    "length": the answer was cut at the model's output limit; `ended`: why aiops ended the turn
    early), plus `command: true` for a message that ran only commands."""

    model_config = ConfigDict(extra="allow")
    session_id: str | None
    turn_id: str | None = None


# ---- helpers ---------------------------------------------------------------------------------------


def _json(model: BaseModel, status: int = 200, *, exclude_none: bool = False,
          exclude_unset: bool = False) -> web.Response:
    return web.json_response(model.model_dump(mode="json", exclude_none=exclude_none, exclude_unset=exclude_unset),
                             status=status, dumps=_dumps)


def _dumps(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False, default=str)


async def _live(engine: Engine, ref: str, who: Caller) -> LiveSession:
    """The session `ref` (404 when there is none, 403 when the caller may not use it)."""
    live = await engine.session(ref)
    if live is None:
        raise HttpError(404, "not_found", f"no session {ref!r}")
    check_access(who, live, ref)
    return live


async def _session_info(engine: Engine, live: LiveSession) -> SessionInfo:
    row = await engine.store.get_session(live.id)
    d = (row or live.row).to_dict()
    d.update(model=live.model_key(engine), state=engine.session_state(live.id), owner=live.row.owner)
    if live.row.title:
        d["title"] = live.row.title
    return SessionInfo.model_validate(d)


# ---- handlers --------------------------------------------------------------------------------------


async def submit(request: web.Request) -> web.Response:
    body = await parse_body(request, SubmitRequest)
    engine = get_engine(request)
    if body.model is not None:
        check_model(engine, body.model, "model")
    who = caller(request)
    hops = await _swarm_hops(request)
    if body.client_id is not None and is_short_id(body.client_id):
        client_id = (await _live(engine, body.client_id, who)).id  # a shorthand id names an existing session
    else:
        client_id = body.client_id or f"api-{new_id()[:8]}"
    try:
        # Shielded: a client hanging up must not interrupt the engine halfway through accepting.
        turn = await asyncio.shield(_submit(engine, client_id, body, who, hops))
    except EngineError as e:
        raise HttpError(400, "bad_request", str(e)) from None
    if not body.wait and not turn.done:
        return _json(SubmitAccepted(client_id=turn.session_id, status="accepted", turn_id=turn.id), 202)
    # With `wait`, or a message of only commands: answered by now, so answered here, wait or not
    # (without a session, no stream could have had it).
    try:
        result = await turn.wait(body.timeout)
    except TimeoutError:
        return _json(SubmitResult(client_id=turn.session_id, status="timeout", text="", turn_id=turn.id),
                     exclude_none=True)
    # The result as the engine reports it: usage only when the model counted something. A message
    # of only commands that left no session names none (its id would be a 404 from then on).
    session_id = turn.session_id if await engine.session(turn.session_id) is not None else None
    reply = {"client_id": session_id, **result.to_dict(), "turn_id": turn.id}
    out = SubmitResult.model_validate(reply_seen_by(who, engine, reply))
    shown = {"client_id": session_id, **out.model_dump(mode="json", exclude_none=True)}  # null stays
    return web.json_response(shown, dumps=_dumps)


async def _swarm_hops(request: web.Request) -> Hops | None:
    """The hops of a call from another aiops (`X-Aiops-Agent-Hops`), None for any other caller;
    400 for a header this server cannot read, 403 for a call too deep or looping back here."""
    value = request.headers.get(HOPS_HEADER)
    if value is None:
        return None
    try:
        hops = parse_hops(value)
    except HopsError as e:
        raise HttpError(400, "invalid_request", str(e), param=HOPS_HEADER) from None
    cfg = get_config(request)
    own = await asyncio.to_thread(_instance_id, cfg.paths.data_dir)
    if why := refusal(hops, own, cfg.limits.max_agent_call_depth):
        raise HttpError(403, "agent_call_refused", why)
    return hops


@functools.cache
def _instance_id(data_dir: Path) -> str:
    return instance_id(data_dir)


async def _submit(engine: Engine, client_id: str, body: SubmitRequest, who: Caller,
                  hops: Hops | None = None) -> Turn:
    """Submit to a session the caller may use; a session it creates is recorded as its own."""
    with engine.admission():  # (a shutdown waits for the message to be taken in, or refuses it)
        return await _submit_admitted(engine, client_id, body, who, hops)


async def _submit_admitted(engine: Engine, client_id: str, body: SubmitRequest, who: Caller,
                           hops: Hops | None) -> Turn:
    # A call from another aiops's agent is a `swarm` session here, its turn at the call's depth.
    kind = body.kind if hops is None else "swarm"
    if kind == "console" and not who.operator:
        # A console session is the operator's own: its commands and gates are the operator's.
        raise HttpError(403, "forbidden", "only an operator's token may start a console session")
    live = await engine.session(client_id)
    if live is not None:
        check_access(who, live, client_id)
    else:
        # A message of only commands to another client's conversation name is refused too: its
        # commands would act on that conversation the moment its owner started it.
        check_name_free(who, client_id)
        if (parsed := engine.parse(body.text, kind)).text and not (
                parsed.model and engine.check_model(parsed.model)):
            # A message that starts a turn: its new session is created owned before anything runs,
            # so even the first event on a stream that subscribed early is known to be its own. (A
            # message of only `!commands`, or one asking for a refused model, creates none.)
            await claim(engine, client_id, who, kind=kind, model=body.model)
    return await engine.submit(client_id, body.text, kind=kind, model=body.model, is_operator=who.operator,
                               meta=owner_meta(who), owner_only=not who.operator,
                               depth=hops.depth if hops else 0, hops=hops.via if hops else ())


def _sse(name: str, data: dict[str, Any]) -> bytes:
    return f"event: {name}\ndata: {_dumps(data)}\n\n".encode()


def _gate_frames(event: ev.GateOpened) -> bytes:
    """A `gate` event, then the "waiting for approval" `notice` that readers of this stream have
    always had right after it (named by its gate, not stored), derived here from the gate itself."""
    notice: dict[str, Any] = {"text": waiting_notice(event.gate), "gate_id": event.gate.id,
                              "session_id": event.session_id}
    if event.turn_id is not None:
        notice["turn_id"] = event.turn_id
    return _sse(event.name, event.payload()) + _sse(ev.NOTICE, notice)


_STREAMED = ev.CONTRACT_EVENTS | {ev.SESSION}


async def stream(request: web.Request) -> web.StreamResponse:
    engine = get_engine(request)
    who = caller(request)
    ref = request.match_info["client_id"]
    live = await engine.session(ref)
    if live is None and is_short_id(ref):
        raise HttpError(404, "not_found", f"no session {ref!r} (all-digit ids are shorthand ids of "
                                          f"existing sessions)")
    if live is None and (len(ref) > 128 or not _CLIENT_ID.match(ref)):
        # Waiting for a session submit would never create.
        raise HttpError(400, "invalid_request", f"client_id {ref[:40]!r}: not a valid session id (letters, "
                                                f"digits and ._:@+-, starting with a letter or digit; at "
                                                f"most 128 characters)", param="client_id")
    if live is not None:
        check_access(who, live, ref)
    session_id = live.id if live is not None else ref  # a session that does not exist yet: its id
    # A session that does not exist yet is checked when its first event comes: by then whoever
    # created it is recorded as its owner. Operators may read every session.
    allowed = live is not None or who.operator
    keepalive = request.app[CONFIG_KEY].app.server.keepalive_seconds
    # SESSION too, only to see the session deleted: the stream ends there, so that a later
    # session of the same name (another caller's, perhaps) never reaches this reader.
    sub = engine.subscribe(session_id, names=_STREAMED)
    with server_state(request).track(sub):
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8",
                                           "Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        await prepare_stream(request, resp)
        try:
            # The subscription exists once these headers arrive: a client may submit then.
            await resp.write(b": connected\n\n")
            while True:
                # asyncio.timeout, not wait_for: on Python 3.11 wait_for swallows a cancellation
                # that lands as the event arrives, and a reader that hung up then kept its
                # handler and subscription until the next keep-alive write failed.
                try:
                    async with asyncio.timeout(keepalive):
                        event = await sub.get()
                except TimeoutError:
                    await resp.write(b": keep-alive\n\n")
                    continue
                if event is None:  # the server is shutting down
                    break
                match event:
                    case ev.SessionChanged(change="deleted"):
                        await resp.write(_sse(ev.ERROR, {"code": "session_deleted", "session_id": session_id,
                                                         "message": f"session {session_id!r} was deleted"}))
                        break
                    case ev.SessionChanged():
                        continue
                if not allowed:
                    created = await engine.session(session_id)
                    if created is None:
                        # Output of another caller's `!command` that created no session: not
                        # the reader's (a client's own new session exists before its first event).
                        continue
                    if not who.may_use(owner_of(created)):
                        err = forbidden(session_id)
                        await resp.write(_sse(ev.ERROR, {"code": err.code, "message": err.message,
                                                         "session_id": session_id}))
                        break
                    allowed = True
                if isinstance(event, ev.GateOpened):
                    await resp.write(_gate_frames(event))
                    continue
                event = event_seen_by(who, engine, event)
                await resp.write(_sse(event.name, event.payload()))
                if ev.is_slow_consumer(event):
                    break
        except (ConnectionResetError, ConnectionError):
            log.debug("stream reader of %s went away", session_id)
            return resp
    try:
        await resp.write_eof()
    except (ConnectionResetError, ConnectionError):
        pass
    return resp


async def list_sessions(request: web.Request) -> web.Response:
    q = validate(SessionsQuery, dict(request.query), "query string")
    engine = get_engine(request)
    who = caller(request)
    # An operator sees every session; a client only those it created (the store finds them by owner).
    rows = await engine.list_sessions(q.kind, limit=q.limit, offset=q.offset, before=q.after,
                                      owner=None if who.operator else who.principal)
    return _json(SessionList(sessions=[SessionInfo.model_validate(r) for r in rows]))


async def get_session(request: web.Request) -> web.Response:
    q = validate(HistoryQuery, dict(request.query), "query string")
    engine = get_engine(request)
    who = caller(request)
    live = await _live(engine, request.match_info["id"], who)
    messages, has_more = await engine.history_page(live.id, limit=q.limit, before_id=q.before)
    return _json(SessionDetail(
        session=await _session_info(engine, live),
        messages=[MessageOut.model_validate(record_seen_by(who, engine, m.to_dict())) for m in messages],
        has_more=has_more,
        next_before=messages[0].id if has_more and messages else None,  # where the page's first turn began
    ))


async def delete_session(request: web.Request) -> web.Response:
    engine = get_engine(request)
    ref, who = request.match_info["id"], caller(request)
    live = await engine.session(ref, wait_for_delete=False)
    if live is None:
        raise HttpError(404, "not_found", f"no session {ref!r}")
    check_access(who, live, ref)
    if live.deleting is not None:
        # Another delete is under way: this one lost the race. Answered when the session is gone,
        # as the winner is, rather than a 404 for a session that was there when it was asked for.
        await asyncio.shield(live.deleting)
        return _json(SessionDeleted(client_id=live.id, deleted=False))
    deleted = await asyncio.shield(engine.delete_session(live.id))
    return _json(SessionDeleted(client_id=live.id, deleted=deleted))


async def stop_session(request: web.Request) -> web.Response:
    q = validate(StopQuery, dict(request.query), "query string")
    engine = get_engine(request)
    live = await _live(engine, request.match_info["id"], caller(request))
    if q.turn_id is not None:
        return _json(SessionStopped(client_id=live.id, stopped=await engine.stop_one_turn(live.id, q.turn_id)))
    return _json(SessionStopped(client_id=live.id, stopped=engine.stop_turn(live.id)))


async def list_gates(request: web.Request) -> web.Response:
    engine = get_engine(request)
    who = caller(request)
    gates = []
    for g in engine.pending_gates():
        if not who.operator:
            live = await engine.session(g.session_id)
            if live is None or not who.may_use(owner_of(live)):
                continue  # a client sees only the gates of its own sessions
        gates.append(GateOut.model_validate(g.to_dict()))
    # Only the fields the gate has: a pending one has no decision, scope, by or at (not nulls),
    # the same object as in its `gate` event.
    return _json(GateList(gates=gates), exclude_unset=True)


async def resolve_gate(request: web.Request) -> web.Response:
    body = await parse_body(request, GateDecisionRequest)
    gate_id = request.match_info["id"]
    decision: Literal["approved", "denied"] = "approved" if body.decision == "approve" else "denied"
    try:
        gate = get_engine(request).resolve_gate(gate_id, decision, body.scope, by=request["principal"])
    except GateNotFound:
        raise HttpError(404, "not_found", f"no gate {gate_id[:40]!r}") from None
    except GateAlreadyResolved as e:
        raise HttpError(409, "already_resolved", str(e)) from None
    return _json(GateResolved(gate=GateOut.model_validate(gate.to_dict())))


async def health(request: web.Request) -> web.Response:
    from aiops.integrations.mcp.endpoint import mcp_health

    engine = get_engine(request)
    cfg = get_config(request)
    operator = bool(request.get(AUTHENTICATED_KEY)) and request["role"] == "operator"
    health = Health(
        status="ok", version=aiops.__version__, models=sorted(cfg.models.enabled()),
        default_model=cfg.models.default_model, sessions=await engine.store.count_sessions(),
        pending_gates=len(engine.pending_gates()),
        role=request["role"] if request.get(AUTHENTICATED_KEY) else None,
        mcp=mcp_health(engine, operator=operator),
    )
    if operator:  # a plugin's reason may name a host or a variable: not for anonymous callers
        health.plugins = [PluginOut.model_validate(p.to_dict()) for p in engine.plugin_status]
    return _json(health, exclude_unset=True)


async def openapi_document(request: web.Request) -> web.Response:
    return web.json_response(openapi_spec())


@functools.cache
def openapi_spec() -> dict[str, Any]:
    return build_openapi(ROUTES, ErrorBody)


# ---- the route table -------------------------------------------------------------------------------

_SESSION_ID = "Full session id (client_id) or its shorthand number."
_OWN = (" A client token may use only the sessions it created (403 for another's); operators may use "
        "every session.")

ROUTES: tuple[ApiRoute, ...] = (
    ApiRoute("POST", f"{PREFIX}/submit", submit, "submit", "Submit a message", "turns",
             description="Without `wait`, answers 202 as soon as the message is committed; follow the "
                         "turn on the stream. With `wait`, answers when the turn ends or `timeout` passes. "
                         "A message of only `!commands` is answered at once, 200, with or without `wait` "
                         "(`status` `error`, code `command_failed`, when one of them failed). "
                         "A new session is owned by the caller. With the header `X-Aiops-Agent-Hops: "
                         "depth=N; via=ID,…` it is a call from another aiops (docs/SWARM.md): a session of "
                         "kind `swarm`, its message text only; 403 `agent_call_refused` when too deep or "
                         "looping back here." + _OWN,
             body=SubmitRequest, response=SubmitAccepted, status=202, also={200: SubmitResult},
             errors=(403, 404), content_description="Accepted: the turn is queued (without `wait`)"),
    ApiRoute("GET", f"{PREFIX}/stream/{{client_id}}", stream, "stream", "Stream a session's events", "turns",
             description="Server-sent events: `event:` is the event name, `data:` its JSON. A comment "
                         "`: keep-alive` is sent every 15 s of silence (keepalive_seconds). Every reader "
                         "gets every event; a reader that falls too far behind gets an `error` event with "
                         "code `slow_consumer` and the stream ends. The id may name a session that does "
                         "not exist yet (subscribe, then submit); if another caller creates it, a client "
                         "token's stream ends with an `error` event of code `forbidden`. When the session "
                         "is deleted, the stream ends with an `error` event of code `session_deleted`." + _OWN,
             event_model=StreamEvent, errors=(400, 403, 404), path_params={"client_id": _SESSION_ID},
             path_schemas={"client_id": {"pattern": CLIENT_ID_PATTERN, "maxLength": 128}},
             content_description="text/event-stream"),
    ApiRoute("GET", f"{PREFIX}/sessions", list_sessions, "listSessions", "List sessions", "sessions",
             description="Most recently updated first (then by `client_id`, descending). The next page: "
                         "`before=<updated_at>,<client_id>` of the last session listed (or `offset`, which "
                         "deletions and activity meanwhile shift). A client token sees only the sessions it "
                         "created; operators see every session.",
             query=SessionsQuery, response=SessionList),
    ApiRoute("GET", f"{PREFIX}/sessions/{{id}}", get_session, "getSession", "A session with its history",
             "sessions", description="History is paginated from the end: the latest `limit` messages, "
                                     "then older pages with `before=next_before`." + _OWN,
             query=HistoryQuery, response=SessionDetail, errors=(403, 404), path_params={"id": _SESSION_ID}),
    ApiRoute("DELETE", f"{PREFIX}/sessions/{{id}}", delete_session, "deleteSession", "Delete a session",
             "sessions", description="Cancels its running turn and pending gates, then deletes its history."
                                     + _OWN,
             response=SessionDeleted, errors=(403, 404), path_params={"id": _SESSION_ID}),
    ApiRoute("POST", f"{PREFIX}/sessions/{{id}}/stop", stop_session, "stopSession",
             "Stop the running turn", "sessions",
             description="Cancels the running turn cleanly: its partial answer is recorded as cancelled, its "
                         "pending gates are cancelled, and `done` comes with status `cancelled`. With "
                         "`turn_id`, that turn only, queued or running." + _OWN,
             query=StopQuery, response=SessionStopped, errors=(403, 404), path_params={"id": _SESSION_ID}),
    ApiRoute("GET", f"{PREFIX}/gates", list_gates, "listGates", "Pending gates", "gates",
             description="Oldest first. Operators see the pending gates of every session; a client token "
                         "sees only those of the sessions it created.",
             response=GateList),
    ApiRoute("POST", f"{PREFIX}/gates/{{id}}", resolve_gate, "resolveGate", "Approve or deny a gate", "gates",
             body=GateDecisionRequest, response=GateResolved, errors=(404, 409), operator_only=True,
             path_params={"id": "Gate id."}),
    ApiRoute("GET", f"{PREFIX}/health", health, "health", "Health", "server", response=Health, public=True),
    ApiRoute("GET", f"{PREFIX}/openapi.json", openapi_document, "openapi", "This OpenAPI document",
             "server", content_description="An OpenAPI 3.1 document"),
)


# The operator stream and the side panes' state (operator_api.py), documented and routed alike.
ROUTES = (*ROUTES, *operator_api.ROUTES)


def _guarded(route: ApiRoute) -> Any:
    if not route.operator_only:
        return route.handler

    async def handler(request: web.Request) -> web.StreamResponse:
        require_operator(request)
        return await route.handler(request)

    return handler


def setup(app: web.Application) -> None:
    for route in ROUTES:
        app.router.add_route(route.method, route.path, _guarded(route), name=route.operation_id)
        methods = [route.method]
        if route.answers_head:
            # aiohttp answers HEAD with the GET handler's headers and drops the body.
            app.router.add_route("HEAD", route.path, _guarded(route), name=route.operation_id + "Head")
            methods.append("HEAD")
        if route.public:
            for method in methods:
                mark_public(app, method, route.path)


__all__ = ["ROUTES", "openapi_spec", "setup"]
