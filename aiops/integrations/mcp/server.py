"""aiops as an MCP server: its tools, resources and change notifications, per caller.

Tools: send_message(text, session=""), list_sessions, approve_gate(id, scope="once"),
deny_gate(id). Resources: aiops://sessions, aiops://sessions/{id}, aiops://gates/pending,
aiops://gates/history, aiops://policy.

Who calls is decided by the endpoint (aiops.integrations.mcp.endpoint) with the JSON API's own
token check and handed in through the HTTP request; a request-level middleware puts it in a
context variable for the handlers. An operator may use everything; a client token may send to and
read its own sessions (and their pending gates) only. Everything goes through the engine facade.

Refusals are JSON-RPC errors with code -32950 and `data.decision = "deny_abort"` (the seeds'
convention, docs/MCP.md): the caller must not retry the same call.

Change notifications (`subscriptions/listen`) carry resource URIs; each listen stream is filtered
by the listener's identity, so a client hears about its own sessions only and never about gates,
their history or the policy (the seed broadcast every change to everyone, approval URIs included).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

import mcp_types as mt
from mcp.server.mcpserver import MCPServer
from mcp.server.subscriptions import InMemorySubscriptionBus, ResourceUpdated, ServerEvent
from mcp.shared.exceptions import MCPError

from aiops.engine.events import Done, GateOpened, GateResolved, SessionChanged, UserPosted
from aiops.engine.store import OWNER_KEY
from aiops.gates.broker import GateAlreadyResolved, GateError
from aiops.integrations.mcp.identity import CALLER, SCOPE_KEY, Identity

if TYPE_CHECKING:
    from aiops.engine.engine import Engine

log = logging.getLogger(__name__)

DENY_CODE = -32950  # seed 001: a refused call; data.decision says "deny_abort"
INVALID_PARAMS = -32602
SESSIONS = "aiops://sessions"
PENDING = "aiops://gates/pending"
HISTORY = "aiops://gates/history"
POLICY = "aiops://policy"
SEND_TIMEOUT = 3600.0

# What each tool does, as MCP tool annotations (hints a client may use to decide what to ask about).
# list_sessions reads and nothing more. send_message runs a turn of the agent, whose tools may write
# anywhere the agent reaches (behind this instance's own gates). approve_gate lets a held-back call
# run, a write as likely as not; a second answer to the same gate changes nothing. deny_gate only
# keeps a call from running.
READ_ONLY = mt.ToolAnnotations(read_only_hint=True, open_world_hint=False)
SEND_MESSAGE = mt.ToolAnnotations(read_only_hint=False, destructive_hint=True, idempotent_hint=False,
                                  open_world_hint=True)
APPROVE_GATE = mt.ToolAnnotations(read_only_hint=False, destructive_hint=True, idempotent_hint=True,
                                  open_world_hint=True)
DENY_GATE = mt.ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=True,
                               open_world_hint=False)


def refused(message: str) -> MCPError:
    return MCPError(DENY_CODE, message, {"decision": "deny_abort"})


def caller() -> Identity:
    who = CALLER.get()
    if who is None:  # only an unauthenticated path could get here; the endpoint has none
        raise refused("not authenticated")
    return who


def session_uri(session_id: str) -> str:
    return f"{SESSIONS}/{session_id}"


class AuthorizedBus(InMemorySubscriptionBus):
    """The SDK's in-process bus, with each listener filtered by the identity that subscribed."""

    def __init__(self, may_hear: Callable[[Identity, str], bool]) -> None:
        super().__init__()
        self._may_hear = may_hear

    def subscribe(self, listener: Callable[[ServerEvent], None]) -> Callable[[], None]:
        who = CALLER.get()

        def filtered(event: ServerEvent) -> None:
            uri = getattr(event, "uri", None)
            if who is None:
                return
            if uri is None and not who.operator:
                return  # list changes say nothing a client needs and could hint at others' work
            if uri is not None and not self._may_hear(who, str(uri)):
                return
            listener(event)

        return super().subscribe(filtered)


class AiopsMcp:
    """The MCPServer for one engine, and the task that turns engine events into notifications."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        # Session owners as last seen, for filtering notifications without a lookup per listener.
        self._owners: dict[str, str | None] = {}
        self.bus = AuthorizedBus(self._may_hear)
        # MCPServer calls logging.basicConfig with a rich handler on stderr: harmless where aiops
        # has set up logging (root has a handler, so basicConfig does nothing), and kept that way
        # where it has not (a library use), since stderr may be the console's screen.
        root = logging.getLogger()
        guard = logging.NullHandler() if not root.handlers else None
        if guard is not None:
            root.addHandler(guard)
        try:
            self.mcp: MCPServer = MCPServer("aiops", instructions="The aiops operator console: send "
                                            "messages to its agent, list sessions, answer gates (operators).",
                                            subscriptions=self.bus, middleware=[self._identify])
        finally:
            if guard is not None:
                root.removeHandler(guard)
        self._forwarder: asyncio.Task[None] | None = None
        # Legacy `resources/subscribe` clients (handshake-era protocol): their session, who they
        # are and the URIs they asked for. Notified by the same rule as listen streams.
        self._legacy: dict[Any, tuple[Identity, set[str]]] = {}
        self._register()
        self._register_legacy_subscriptions()

    # ---- identity ---------------------------------------------------------------------------------

    async def _identify(self, ctx: Any, call_next: Any) -> Any:
        request = getattr(ctx, "request", None)
        scope = getattr(request, "scope", None) or {}
        token = CALLER.set(scope.get(SCOPE_KEY))
        try:
            return await call_next(ctx)
        finally:
            CALLER.reset(token)

    def _may_hear(self, who: Identity, uri: str) -> bool:
        if who.operator:
            return True
        if uri.startswith(SESSIONS + "/"):
            owner = self._owners.get(uri.removeprefix(SESSIONS + "/"))
            return owner is not None and owner == who.principal
        return False

    async def _owned(self, session_id: str, who: Identity) -> Any:
        """The live session, checked: unknown → invalid params, another's → refused."""
        live = await self.engine.session(session_id)
        if live is None:
            raise MCPError(INVALID_PARAMS, f"no session {session_id!r}")
        self._owners[live.id] = live.row.owner
        if not who.operator and live.row.owner != who.principal:
            raise refused(f"session {session_id!r} belongs to another caller: a client token may use only "
                          f"the sessions it created")
        return live

    # ---- tools and resources ----------------------------------------------------------------------

    def _register(self) -> None:
        mcp = self.mcp

        # Annotations say what each tool does to aiops, so that a client honouring them (another
        # aiops among them: `readOnlyHint` makes a call a read for its gates) asks before a call
        # that changes something and need not before one that only reads.
        @mcp.tool(description="Send a message to the aiops agent and wait for its answer. `session`: an "
                              "existing session id of yours, or empty for a new session.",
                  annotations=SEND_MESSAGE)
        async def send_message(text: str, session: str = "") -> str:
            who = caller()
            if session:
                live = await self.engine.session(session)
                if live is not None:
                    await self._owned(session, who)
            sid = session or None
            turn = await self.engine.submit(sid, text, kind="mcp", is_operator=who.operator,
                                            meta={OWNER_KEY: who.principal}, owner_only=not who.operator)
            # A message of only commands to a new session creates none (its turn has ended by
            # now): no id is given out for it, as the API's submit gives none.
            exists = await self.engine.session(turn.session_id) is not None
            if exists:
                self._owners[turn.session_id] = who.principal
            result = await turn.wait(SEND_TIMEOUT)
            return json.dumps({"session": turn.session_id if exists else None, "status": result.status,
                               "text": result.text})

        @mcp.tool(description="The sessions you may use, most recently active first.", annotations=READ_ONLY)
        async def list_sessions() -> str:
            return json.dumps(await self._sessions(caller()))

        @mcp.tool(description="Approve a pending gate (operators only). scope: once | session.",
                  annotations=APPROVE_GATE)
        async def approve_gate(id: str, scope: Literal["once", "session"] = "once") -> str:
            return self._resolve(id, "approved", scope)

        @mcp.tool(description="Deny a pending gate (operators only).", annotations=DENY_GATE)
        async def deny_gate(id: str) -> str:
            return self._resolve(id, "denied", "once")

        @mcp.resource(SESSIONS, mime_type="application/json", description="Your sessions")
        async def sessions() -> str:
            return json.dumps(await self._sessions(caller()))

        @mcp.resource(SESSIONS + "/{session_id}", mime_type="application/json",
                      description="One session's history")
        async def session_history(session_id: str) -> str:
            who = caller()
            live = await self._owned(session_id, who)
            messages = await self.engine.history(live.id)
            return json.dumps({"session": live.id, "messages": [
                {"role": m.role, "content": m.content, "turn_id": m.turn_id, "name": m.name}
                for m in messages]}, default=str)

        @mcp.resource(PENDING, mime_type="application/json",
                      description="Gates waiting for an operator (a client token: its own sessions')")
        async def pending() -> str:
            who = caller()
            gates = self.engine.pending_gates()
            if not who.operator:
                mine = {s["client_id"] for s in await self._sessions(who)}
                gates = [g for g in gates if g.session_id in mine]
            return json.dumps([g.to_dict() for g in gates], default=str)

        @mcp.resource(HISTORY, mime_type="application/json", description="Answered gates (operators only)")
        async def gate_history() -> str:
            self._operator("read the gate history")
            rows = await self.engine.store.audit(limit=500)
            return json.dumps([r.to_dict() for r in rows if r.event.startswith("gate_")], default=str)

        @mcp.resource(POLICY, mime_type="application/json",
                      description="The effective gate rules and rate limits (operators only)")
        async def policy() -> str:
            self._operator("read the policy")
            gk = self.engine.gatekeeper
            return json.dumps({"gates": gk.rules.to_toml_dict(), "limits": gk.limits.model_dump(mode="json")},
                              default=str)

    def _register_legacy_subscriptions(self) -> None:
        async def subscribe(ctx: Any, params: mt.SubscribeRequestParams) -> mt.EmptyResult:
            who = caller()
            uri = str(params.uri)
            if not self._may_read(who, uri):
                raise refused(f"{uri} is not yours to read, so not to subscribe to")
            self._legacy.setdefault(ctx.session, (who, set()))[1].add(uri)
            return mt.EmptyResult()

        async def unsubscribe(ctx: Any, params: mt.UnsubscribeRequestParams) -> mt.EmptyResult:
            entry = self._legacy.get(ctx.session)
            if entry is not None:
                entry[1].discard(str(params.uri))
            return mt.EmptyResult()

        # MCPServer has no public way to serve these two; its lowlevel server's public API does.
        low = self.mcp._lowlevel_server  # noqa: SLF001
        low.add_request_handler("resources/subscribe", mt.SubscribeRequestParams, subscribe)
        low.add_request_handler("resources/unsubscribe", mt.UnsubscribeRequestParams, unsubscribe)

    def _may_read(self, who: Identity, uri: str) -> bool:
        """Whether `who` may subscribe to `uri` (reading checks each resource itself)."""
        if who.operator:
            return True
        if uri in (SESSIONS, PENDING):
            return True  # filtered to the caller's own when read
        return self._may_hear(who, uri) or (uri.startswith(SESSIONS + "/")
                                            and uri.removeprefix(SESSIONS + "/") not in self._owners)

    async def _notify_legacy(self, uri: str) -> None:
        for session, (who, uris) in list(self._legacy.items()):
            if uri not in uris or not self._may_hear(who, uri):
                continue
            try:
                await session.send_resource_updated(uri)
            except Exception:  # noqa: BLE001 - a session that went away is forgotten
                self._legacy.pop(session, None)

    def _operator(self, what: str) -> Identity:
        who = caller()
        if not who.operator:
            raise refused(f"only an operator token may {what}")
        return who

    def _resolve(self, gate_id: str, decision: Literal["approved", "denied"],
                 scope: Literal["once", "session"]) -> str:
        who = self._operator("answer gates")
        try:
            gate = self.engine.resolve_gate(gate_id, decision, scope, by=f"mcp:{who.principal}")
        except GateAlreadyResolved as e:
            raise MCPError(INVALID_PARAMS, str(e)) from None
        except GateError as e:
            raise MCPError(INVALID_PARAMS, str(e)) from None
        return json.dumps({"id": gate.id, "decision": gate.decision, "scope": gate.scope, "by": gate.by})

    async def _sessions(self, who: Identity) -> list[dict[str, Any]]:
        rows = await self.engine.list_sessions(owner=None if who.operator else who.principal)
        for r in rows:
            if "client_id" in r:
                self._owners.setdefault(str(r["client_id"]), r.get("owner") if who.operator else who.principal)
        return rows

    # ---- notifications ----------------------------------------------------------------------------

    def start(self) -> None:
        self._forwarder = asyncio.get_running_loop().create_task(self._forward(), name="mcp-notify")

    async def stop(self) -> None:
        if self._forwarder is not None:
            self._forwarder.cancel()
            await asyncio.gather(self._forwarder, return_exceptions=True)

    async def _owner(self, session_id: str) -> str | None:
        if session_id not in self._owners:
            live = await self.engine.session(session_id)
            self._owners[session_id] = live.row.owner if live is not None else None
        return self._owners[session_id]

    async def _forward(self) -> None:
        sub = self.engine.subscribe()
        async for event in sub:
            uris: list[str] = []
            match event:
                case GateOpened(gate=g) | GateResolved(gate=g):
                    await self._owner(g.session_id)
                    uris = [PENDING, session_uri(g.session_id)]
                    if isinstance(event, GateResolved):
                        uris.append(HISTORY)
                case Done(session_id=sid) | UserPosted(session_id=sid) if sid:
                    await self._owner(sid)
                    uris = [session_uri(sid)]
                case SessionChanged(session_id=sid, change=change):
                    if sid and change == "created":
                        self._owners.pop(sid, None)
                        await self._owner(sid)
                    uris = [SESSIONS]
                case _:
                    continue
            for uri in uris:
                try:
                    await self.bus.publish(ResourceUpdated(uri=uri))
                    await self._notify_legacy(uri)
                except Exception:  # noqa: BLE001 - one listener's failure must not end the others'
                    log.exception("mcp: notifying %s failed", uri)
