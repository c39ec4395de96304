"""`AgentClient`: an async Python client for the aiops API (`/api/v1`).

    async with AgentClient("http://127.0.0.1:8765", token="...") as agent:
        reply = await agent.send("how many users signed up today?")
        print(reply["status"], reply["text"])

        async with agent.stream("api-build-bot") as events:        # subscribed once this returns
            await agent.submit("run the nightly check", client_id="api-build-bot")
            async for e in events:
                print(e["event"], e["data"])
                if e["event"] == "done":
                    break

With an operator token, a gate policy answers the gates of the client's own turns:

    def policy(gate: dict) -> str | None:
        return "approve" if gate["operation"] == "read" else None   # None: leave it to a human

    async with AgentClient(url, token=ops_token, gate_policy=policy) as agent:
        reply = await agent.send("archive last year's orders", auto_resolve=True)

Beside aiohttp it needs only two standard-library modules of aiops (api_errors, sse), so scripts
may copy the three files. The token defaults to the `AIOPS_TOKEN` environment variable.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import secrets
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from types import TracebackType
from typing import Any, Self

import aiohttp
from yarl import URL

from aiops.api_errors import AgentError, error_from, segment
from aiops.sse import EventTooLarge, ServerEvent, SseParser

Decision = str | tuple[str, str] | None
GatePolicy = Callable[[dict[str, Any]], "Decision | Awaitable[Decision]"]

DEFAULT_URL = "http://127.0.0.1:8765"
MAX_WAIT = 3600.0  # the server's limit on a waited submit's `timeout`


def _unreachable(base_url: str, e: Exception) -> AgentError:
    return AgentError(0, "connection_error", f"{base_url}: {type(e).__name__}: {e}")


class EventStream:
    """The server-sent events of one session: `{"event": name, "data": {...}}` items.

    Use as an async context manager (or `await stream.open()`, then `aclose()`) to be sure the
    server has subscribed before you submit, and to read it in several loops; or iterate it
    directly (it connects on the first item, and leaving that loop, by `break` or an exception,
    closes it: a later read raises AgentError `stream_closed`). It ends when the server ends the stream
    (shutdown; the session deleted, after an `error` event with code `session_deleted`; or an
    `error` event with code `slow_consumer` for a reader that fell behind). A connection lost
    midway (the server killed, the network gone) raises AgentError `stream_cut` instead: events
    may have been missed, and a script must not take it for a clean end.
    """

    def __init__(self, client: AgentClient, client_id: str) -> None:
        self._client = client
        self.client_id = client_id
        self._resp: aiohttp.ClientResponse | None = None
        self._parser = SseParser()
        self._ready: deque[ServerEvent] = deque()  # parsed from a read, not handed out yet
        self._eof = False
        self._managed = False  # opened by the caller (`async with`, open()): the caller closes it
        self._reads = 0  # __anext__ calls: a loop left early closes the stream only if none followed
        self._left = False  # closed because the one loop over it was left

    async def open(self) -> Self:
        """Connect (the server has subscribed when this returns); close with `aclose()`."""
        self._managed = True
        return await self._open()

    async def _open(self) -> Self:
        if self._resp is not None:
            return self
        http = self._client._require_session()
        try:
            resp = await http.get(self._client._url("/api/v1/stream/" + segment(self.client_id)),
                                  headers={"Accept": "text/event-stream"},
                                  timeout=aiohttp.ClientTimeout(total=None, sock_connect=self._client.timeout))
        except aiohttp.ClientError as e:
            raise _unreachable(self._client.base_url, e) from e
        if resp.status != 200:
            body = await resp.text()
            resp.release()
            raise error_from(resp.status, body)
        if resp.content_type != "text/event-stream":
            resp.release()
            raise AgentError(resp.status, "not_an_event_stream",
                             f"{resp.url} answered {resp.content_type or 'no content type'}, not an event stream "
                             f"(is {self._client.base_url} an aiops server?)")
        self._resp = resp
        return self

    async def aclose(self) -> None:
        if self._resp is not None:
            self._resp.close()
        self._eof = True

    async def __aenter__(self) -> Self:
        return await self.open()

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __aiter__(self) -> AsyncIterator[dict[str, Any]]:
        return self._items()

    async def _items(self) -> AsyncIterator[dict[str, Any]]:
        # A generator, so that a loop left early is noticed (asyncio closes a dropped generator, a
        # little later, in a task of its own): a stream iterated without being opened must not
        # keep its connection, and the server its subscription, until the client closes. Not if a
        # read came meanwhile (anext(), another loop): that caller is still reading.
        mark = self._reads
        try:
            while True:
                try:
                    item = await self.__anext__()
                except StopAsyncIteration:
                    return
                mark = self._reads
                yield item
        finally:
            if not self._managed and self._reads == mark and not self._eof:
                self._left = True
                await self.aclose()

    async def __anext__(self) -> dict[str, Any]:
        self._reads += 1
        if self._left:
            raise AgentError(0, "stream_closed", f"the event stream of {self.client_id} was closed when the loop "
                                                 f"over it was left; to read it in several loops, use `async with "
                                                 f"agent.stream(...)` or `await stream.open()`")
        if self._resp is None:
            if self._eof:
                raise StopAsyncIteration
            await self._open()
        assert self._resp is not None
        while not self._ready:
            try:
                chunk = await self._resp.content.readany() if not self._eof else b""
            except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError) as e:
                # Not the server's end of the stream (that is a clean end of the body): the
                # connection was lost, and with it whatever was sent meanwhile.
                await self.aclose()
                raise AgentError(0, "stream_cut", f"the event stream of {self.client_id} was cut "
                                                  f"({type(e).__name__}: {e}); events may have been missed: "
                                                  f"read the history, then open a new stream") from e
            if not chunk:
                await self.aclose()  # the server ended the stream; an event it left unfinished is dropped
                raise StopAsyncIteration
            try:
                self._ready.extend(self._parser.feed(chunk))
            except EventTooLarge as e:
                await self.aclose()
                raise AgentError(0, "invalid_response", f"the event stream of {self.client_id}: {e}") from None
        event = self._ready.popleft()
        return {"event": event.event, "data": json.loads(event.data)}


class AgentClient:
    """An async client for `/api/v1`. Use it as an async context manager."""

    def __init__(self, base_url: str = DEFAULT_URL, token: str | None = None, *,
                 gate_policy: GatePolicy | None = None, timeout: float = 30.0,
                 headers: Mapping[str, str] | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.token = token if token is not None else (os.environ.get("AIOPS_TOKEN") or None)
        self.gate_policy = gate_policy
        self.timeout = timeout
        # Sent with every request besides the token (an aiops peer's X-Aiops-Agent-Hops).
        self.headers = dict(headers or {})
        self._http: aiohttp.ClientSession | None = None

    # -- lifecycle --

    async def __aenter__(self) -> Self:
        headers = {**self.headers, **({"Authorization": f"Bearer {self.token}"} if self.token else {})}
        self._http = aiohttp.ClientSession(headers=headers)
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._http is not None:
            await self._http.close()
            self._http = None

    def _require_session(self) -> aiohttp.ClientSession:
        if self._http is None:
            raise RuntimeError("use AgentClient as `async with AgentClient(...) as client:`")
        return self._http

    def _url(self, path: str) -> URL:
        # The path is already encoded (ids by _segment) and taken as it is, so `%2E%2E` stays a
        # name, not `..`; the base URL is parsed as usual (a non-ASCII host, a path prefix).
        base = URL(self.base_url)
        return base.with_path(base.raw_path.rstrip("/") + path, encoded=True)

    async def _call(self, method: str, path: str, *, body: dict[str, Any] | None = None,
                    params: dict[str, Any] | None = None, timeout: float | None = None,
                    expect: tuple[str, ...] = ()) -> dict[str, Any]:
        """The JSON object the server answered; `expect` names keys an aiops answer always has."""
        http = self._require_session()
        query = {k: str(v) for k, v in (params or {}).items() if v is not None}
        limit = timeout or self.timeout
        try:
            async with http.request(method, self._url(path), json=body, params=query or None,
                                    timeout=aiohttp.ClientTimeout(total=limit)) as resp:
                raw = await resp.read()
                text = raw.decode("utf-8", "replace")
                if resp.status >= 400:
                    raise error_from(resp.status, text)
                try:
                    data = json.loads(raw) if raw else {}
                except ValueError:  # (UnicodeDecodeError included)
                    data = None
                if not isinstance(data, dict):
                    raise AgentError(resp.status, "invalid_response",
                                     f"{resp.url} answered {resp.content_type or 'no content type'}, not a JSON "
                                     f"object (is {self.base_url} an aiops server?): {text.strip()[:200]}")
                if missing := [k for k in expect if k not in data]:
                    raise AgentError(resp.status, "invalid_response",
                                     f"{resp.url} answered without {', '.join(missing)} (is {self.base_url} an "
                                     f"aiops server of this version?): {text.strip()[:200]}")
                return data
        except aiohttp.ClientError as e:
            raise _unreachable(self.base_url, e) from e
        except TimeoutError:
            raise AgentError(0, "timeout", f"{self.base_url}: no answer to {method} {path} within {limit:g} s "
                                           f"(AgentClient(timeout=…) sets the limit)") from None

    # -- turns --

    async def submit(self, text: str, client_id: str | None = None, model: str | None = None) -> dict[str, Any]:
        """Queue a message; returns `{client_id, status: "accepted", turn_id}` at once. A message
        that runs no model (only `!commands`) is answered at once instead: the result, as `send`
        gives it (`status` "complete" or "error")."""
        body: dict[str, Any] = {"text": text}
        if client_id is not None:
            body["client_id"] = client_id
        if model is not None:
            body["model"] = model
        return await self._call("POST", "/api/v1/submit", body=body, expect=("client_id", "status"))

    async def send(self, text: str, client_id: str | None = None, model: str | None = None,
                   timeout: float | None = 120.0, *, auto_resolve: bool = False,
                   policy: GatePolicy | None = None) -> dict[str, Any]:
        """Submit and wait for the end of the turn: `{client_id, status, text, turn_id, …}`.

        status is "complete", "cancelled", "error" or "timeout" (the turn goes on after a timeout).
        `timeout` is in seconds, at most 3600 (the server's limit); None waits that long.
        With `auto_resolve`, gates of this turn are answered by `policy` (default: `gate_policy`).
        """
        timeout = MAX_WAIT if timeout is None else timeout
        if auto_resolve or policy is not None:
            return await self.run_with_policy(text, policy, client_id=client_id, model=model, timeout=timeout)
        body: dict[str, Any] = {"text": text, "wait": True, "timeout": timeout}
        if client_id is not None:
            body["client_id"] = client_id
        if model is not None:
            body["model"] = model
        return await self._call("POST", "/api/v1/submit", body=body, timeout=timeout + self.timeout,
                                expect=("client_id", "status"))

    async def run_with_policy(self, text: str, policy: GatePolicy | None = None, *,
                              client_id: str | None = None, model: str | None = None,
                              timeout: float = 120.0) -> dict[str, Any]:
        """Submit, answer this turn's gates with `policy`, and return when the turn ends.

        `policy(gate)` returns "approve", "deny", ("approve", "session") or None (leave the gate to
        a human operator). Resolving gates needs an operator token: without one this raises
        AgentError (403) before submitting anything.
        """
        policy = policy or self.gate_policy
        if policy is None:
            raise ValueError("run_with_policy needs a policy (pass one, or gate_policy= to AgentClient)")
        role = (await self.health()).get("role")
        if role is None:  # /health is public: it answers a missing or wrong token without a role
            raise AgentError(401, "unauthorized", "auto-resolving gates needs an operator token; this client "
                                                  + ("sent no valid token" if self.token else "sent none"))
        if role != "operator":
            raise AgentError(403, "forbidden", f"auto-resolving gates needs an operator token; this client has "
                                               f"the {role} role")
        cid = client_id or f"api-{secrets.token_hex(4)}"
        async with self.stream(cid) as events:
            accepted = await self.submit(text, cid, model)
            if accepted.get("status") != "accepted":
                return accepted  # answered at once: it ran no model, so it has no gates
            turn_id = accepted["turn_id"]
            try:
                async with asyncio.timeout(timeout):
                    async for e in events:
                        data = e["data"]
                        if data.get("turn_id") != turn_id:
                            continue
                        if e["event"] == "gate":
                            await self._apply_policy(policy, data)
                        elif e["event"] == "done":
                            out = {"client_id": accepted["client_id"], "status": data.get("status", "complete"),
                                   "text": data.get("text", ""), "turn_id": turn_id}
                            for key in ("error", "usage", "finish_reason", "ended"):
                                if key in data:
                                    out[key] = data[key]
                            return out
            except TimeoutError:
                return {"client_id": accepted["client_id"], "status": "timeout", "text": "", "turn_id": turn_id}
        raise AgentError(0, "stream_ended", f"the event stream of {cid} ended before the turn did")

    async def _apply_policy(self, policy: GatePolicy, gate: dict[str, Any]) -> None:
        answer = policy(gate)
        if inspect.isawaitable(answer):
            answer = await answer
        if answer is None:
            return
        decision, scope = answer if isinstance(answer, tuple) and len(answer) == 2 else (answer, "once")
        if decision not in ("approve", "deny") or scope not in ("once", "session"):
            raise ValueError(f"gate policy returned {answer!r}; expected 'approve', 'deny', "
                             f"('approve' or 'deny', 'once' or 'session'), or None")
        try:
            await self.resolve_gate(gate["id"], decision, scope)
        except AgentError as e:
            if e.status not in (404, 409):  # someone else answered first, or it expired: fine
                raise

    def stream(self, client_id: str) -> EventStream:
        """The session's events (`async with` to subscribe before submitting, or `async for`)."""
        return EventStream(self, client_id)

    # -- sessions --

    async def sessions(self, kind: str | None = None, limit: int | None = None,
                       offset: int | None = None, before: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
        """Sessions, most recently updated first (a client token sees only those it created).
        The next page: `before=` the last session of this one (keyset paging: sessions deleted or
        updated meanwhile shift no other, as they shift an `offset`)."""
        key = f"{float(before['updated_at'])!r},{before['client_id']}" if before is not None else None
        return (await self._call("GET", "/api/v1/sessions", expect=("sessions",),
                                 params={"kind": kind, "limit": limit, "offset": offset, "before": key}))["sessions"]

    async def session(self, client_id: str, limit: int | None = None,
                      before: int | None = None) -> dict[str, Any]:
        """`{session, messages, has_more, next_before}`: the latest `limit` messages (before `before`)."""
        return await self._call("GET", "/api/v1/sessions/" + segment(client_id),
                                params={"limit": limit, "before": before},
                                expect=("session", "messages", "has_more", "next_before"))

    async def history(self, client_id: str, page: int = 200) -> list[dict[str, Any]]:
        """Every message of a session as a transcript: turns in the order they began, each turn's
        messages together (read page by page; see `GET /api/v1/sessions/{id}`)."""
        messages: list[dict[str, Any]] = []
        before: int | None = None
        while True:
            got = await self.session(client_id, limit=page, before=before)
            messages[:0] = got["messages"]
            if not got["has_more"]:
                return messages
            before = got["next_before"]

    async def delete_session(self, client_id: str) -> dict[str, Any]:
        return await self._call("DELETE", "/api/v1/sessions/" + segment(client_id))

    async def stop(self, client_id: str) -> dict[str, Any]:
        """Cancel the session's running turn: `{client_id, stopped}`."""
        return await self._call("POST", f"/api/v1/sessions/{segment(client_id)}/stop")

    # -- gates --

    async def gates(self) -> list[dict[str, Any]]:
        """Pending gates: of every session with an operator token, of the client's own sessions
        with a client token."""
        return (await self._call("GET", "/api/v1/gates", expect=("gates",)))["gates"]

    async def resolve_gate(self, gate_id: str, decision: str, scope: str = "once") -> dict[str, Any]:
        """Approve or deny a gate (operator token); returns the resolved gate."""
        return (await self._call("POST", "/api/v1/gates/" + segment(gate_id),
                                 body={"decision": decision, "scope": scope}, expect=("gate",)))["gate"]

    # -- server --

    async def health(self) -> dict[str, Any]:
        return await self._call("GET", "/api/v1/health", expect=("status",))

    async def openapi(self) -> dict[str, Any]:
        return await self._call("GET", "/api/v1/openapi.json")
