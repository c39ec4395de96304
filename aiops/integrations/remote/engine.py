"""`RemoteEngine`: a running aiops reached over `/api/v1`, with what a view needs of an engine.

It follows the operator event stream (`GET /api/v1/events`) in a task of its own and hands every
event, typed again with `events.from_wire`, to `on_event`; it keeps the pending gates and the rate
usage the events describe, so views can ask for them without waiting; it keeps what the server knows of its models' reachability (`models`, from `/api/v1/console` and
the `models` events) and of the configured rate limits (`limits`); its other operations are the
API's calls. A dropped stream is said (`on_state("disconnected", reason)`), retried with backoff
(0.5 s doubling to 10 s), and resumed with `Last-Event-ID`: the server replays what was missed, so
nothing is lost or doubled. When the server cannot (it restarted, or the reader was away longer than
its ring reaches back), the first frame says `reset` and `on_reset` is called after the gates and
rates are read again: the view reloads its sessions and history.

A history read is complete up to the event position its answer carries (`X-Aiops-Event-Id`);
`history` returns only once the stream has delivered that far, so a view that draws the page and
then the events after it draws nothing twice.

No model SDK, no Textual, no aiohttp server: `aiops chat` uses this on its fast path.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable
from typing import Any, Literal
from urllib.parse import quote

import aiohttp

from aiops.engine import events as ev
from aiops.engine.types import Message, SessionKey, ToolCall
from aiops.sse import SseParser

log = logging.getLogger(__name__)

EVENT_ID_HEADER = "X-Aiops-Event-Id"
BACKOFF_FIRST = 0.5
BACKOFF_MAX = 10.0
CATCH_UP_TIMEOUT = 5.0  # seconds a history read waits for the stream to reach its position


class RemoteError(Exception):
    """The server refused (status, code, message) or could not be reached (status 0)."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


def _seq(event_id: str | None) -> tuple[str, int] | None:
    if not event_id:
        return None
    epoch, _, seq = event_id.rpartition("-")
    return (epoch, int(seq)) if seq.isdigit() else None


def message_from_wire(d: dict[str, Any]) -> Message:
    """A history record of `GET /api/v1/sessions/{id}` as the engine's `Message`."""
    return Message(role=d["role"], content=d.get("content") or "",
                   tool_calls=[ToolCall.from_dict(tc) for tc in d.get("tool_calls") or ()],
                   tool_call_id=d.get("tool_call_id"), name=d.get("name"), thinking=d.get("thinking") or "",
                   meta=dict(d.get("meta") or {}), created_at=float(d.get("created_at") or 0), id=d.get("id"),
                   turn_id=d.get("turn_id"), status=d.get("status") or "complete")


class RemoteEngine:
    """One aiops server, as a view sees an engine."""

    def __init__(self, url: str, token: str | None = None, *,
                 on_event: Callable[[ev.Event], None] | None = None,
                 on_state: Callable[[str, str], None] | None = None,
                 on_reset: Callable[[], Any] | None = None, timeout: float = 30.0) -> None:
        self.url = url.rstrip("/")
        self.token = token
        self.on_event = on_event or (lambda e: None)
        self.on_state = on_state or (lambda state, reason: None)
        self.on_reset = on_reset
        self.timeout = timeout
        self.info: dict[str, Any] = {}
        self.gates: dict[str, ev.GateInfo] = {}
        self.rates: dict[tuple[str, str], ev.RateInfo] = {}
        self.limits: dict[str, tuple[int, float]] = {}  # tool type -> (calls, window seconds)
        self.models: dict[str, ev.ModelState] = {}
        self.connected = False
        self.epoch: str | None = None
        self.last_seq = 0
        self._http: aiohttp.ClientSession | None = None
        self._stream_task: asyncio.Task[None] | None = None
        self._seq_changed = asyncio.Event()
        self._closed = False
        # Against an aiops without keyset paging: the last session listed, and the offset its
        # listing ended at (`list_sessions`).
        self._listed_to: tuple[SessionKey, int] | None = None

    # -- lifecycle --

    async def start(self, *, follow: bool = True) -> None:
        """Connect: who we are, the pending gates, rate usage; then follow the event stream.
        Raises RemoteError when the server cannot be reached or refuses the token."""
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        self._http = aiohttp.ClientSession(headers=headers)
        try:
            self.info = await self._call("GET", "/api/v1/console")
            await self._read_state()
        except BaseException:
            await self.close()
            raise
        if follow:
            self._stream_task = asyncio.create_task(self._follow(), name="aiops-remote-events")

    async def close(self) -> None:
        self._closed = True
        task, self._stream_task = self._stream_task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
        http, self._http = self._http, None
        if http is not None:
            await http.close()

    @property
    def operator(self) -> bool:
        return self.info.get("role") == "operator"

    @property
    def principal(self) -> str:
        return str(self.info.get("principal") or "")

    async def _read_state(self) -> None:
        data = await self._call("GET", "/api/v1/gates")
        self.gates = {g["id"]: ev.GateInfo.from_dict(g) for g in data.get("gates") or ()}
        self.models = {m["key"]: ev.ModelState.from_dict(m) for m in self.info.get("model_status") or ()}
        if self.operator:
            await self.read_rates()

    async def read_rates(self) -> None:
        """Read the rate usage and the configured limits again (`!limits set` changes the limits
        without a `rate` event)."""
        rates = await self._call("GET", "/api/v1/rates")
        self.rates = {(u["session_id"], u["tool_type"]): ev.RateInfo(**u) for u in rates.get("usage") or ()}
        self.limits = {str(r["tool_type"]): (int(r["limit"]), float(r["window_seconds"]))
                       for r in rates.get("limits") or ()}

    # -- HTTP --

    def _require(self) -> aiohttp.ClientSession:
        if self._http is None:
            raise RemoteError(0, "not_connected", f"not connected to {self.url}")
        return self._http

    async def _request(self, method: str, path: str, *, body: dict[str, Any] | None = None,
                       params: dict[str, Any] | None = None) -> tuple[dict[str, Any], str | None]:
        http = self._require()
        query = {k: str(v) for k, v in (params or {}).items() if v is not None}
        try:
            async with http.request(method, self.url + path, json=body, params=query or None,
                                    timeout=aiohttp.ClientTimeout(total=self.timeout)) as resp:
                raw = await resp.read()
                try:
                    data = json.loads(raw) if raw else {}
                except ValueError:
                    data = {}
                if resp.status >= 400:
                    err = data.get("error") if isinstance(data, dict) else None
                    if isinstance(err, dict):
                        raise RemoteError(resp.status, str(err.get("code", "error")), str(err.get("message", "")))
                    raise RemoteError(resp.status, "http_error",
                                      f"{self.url} answered HTTP {resp.status} (is it an aiops server?)")
                if not isinstance(data, dict):
                    raise RemoteError(resp.status, "invalid_response", f"{self.url}: not a JSON object")
                return data, resp.headers.get(EVENT_ID_HEADER)
        except aiohttp.ClientError as e:
            raise RemoteError(0, "connection_error", f"cannot reach {self.url} ({type(e).__name__}: {e})") from None
        except TimeoutError:
            raise RemoteError(0, "timeout", f"{self.url}: no answer to {method} {path} within "
                                            f"{self.timeout:g} s") from None

    async def _call(self, method: str, path: str, **kw: Any) -> dict[str, Any]:
        return (await self._request(method, path, **kw))[0]

    # -- the event stream --

    async def _follow(self) -> None:
        delay = BACKOFF_FIRST
        while not self._closed:
            reason = "the stream ended"
            try:
                await self._read_stream()
                delay = BACKOFF_FIRST
            except asyncio.CancelledError:
                raise
            except RemoteError as e:
                reason = e.message
            except (aiohttp.ClientError, OSError, TimeoutError) as e:
                reason = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
            except Exception as e:  # noqa: BLE001 - a bad frame: reconnect rather than die
                log.exception("reading the event stream failed")
                reason = f"{type(e).__name__}: {e}"
            if self._closed:
                return
            if self.connected:
                self.connected = False
                delay = BACKOFF_FIRST
            self.on_state("disconnected", f"{reason}; retrying in {delay:g} s")
            await asyncio.sleep(delay)
            delay = min(BACKOFF_MAX, delay * 2)

    async def _read_stream(self) -> None:
        http = self._require()
        headers = {"Accept": "text/event-stream"}
        if self.epoch is not None:
            headers["Last-Event-ID"] = f"{self.epoch}-{self.last_seq}"
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=None)
        async with http.get(self.url + "/api/v1/events", headers=headers, timeout=timeout) as resp:
            if resp.status >= 400:
                raw = await resp.read()
                try:
                    err = json.loads(raw).get("error") or {}
                except (ValueError, AttributeError):
                    err = {}
                raise RemoteError(resp.status, str(err.get("code", "http_error")),
                                  str(err.get("message") or f"HTTP {resp.status}"))
            parser = SseParser()
            while chunk := await resp.content.readany():
                for event in parser.feed(chunk):
                    await self._frame(event.event, json.loads(event.data), event.id)
            # (the server ended the stream: shutting down)

    async def _frame(self, name: str, payload: dict[str, Any], event_id: str | None) -> None:
        if name == "hello":
            epoch = str(payload.get("epoch"))
            pos = _seq(payload.get("last_event_id"))
            reset = bool(payload.get("reset")) or (self.epoch is not None and epoch != self.epoch)
            first = self.epoch is None
            self.epoch = epoch
            self._advance(pos[1] if pos else 0, force=True)
            if reset and not first:
                self.info = await self._call("GET", "/api/v1/console")  # (a restarted server knows anew)
                await self._read_state()
                if self.on_reset is not None:
                    result = self.on_reset()
                    if asyncio.iscoroutine(result):
                        await result
            self.connected = True
            self.on_state("connected", "")
            return
        try:
            event = ev.from_wire(name, payload)
        except (ValueError, TypeError, KeyError):
            log.debug("unknown event %r on the stream", name)
            return
        match event:
            case ev.GateOpened(gate=gate):
                self.gates[gate.id] = gate
            case ev.GateResolved(gate=gate):
                self.gates.pop(gate.id, None)
            case ev.RateChanged(usage=usage) if event.session_id is not None:
                for key in [k for k in self.rates if k[0] == event.session_id]:
                    del self.rates[key]
                self.rates.update({(u.session_id, u.tool_type): u for u in usage})
            case ev.SessionChanged(change="deleted") if event.session_id is not None:
                for key in [k for k in self.rates if k[0] == event.session_id]:
                    del self.rates[key]
            case ev.ModelsChanged(models=models):
                self.models = {m.key: m for m in models}
        self.on_event(event)
        pos = _seq(event_id)
        if pos is not None:
            self._advance(pos[1])

    def _advance(self, seq: int, *, force: bool = False) -> None:
        if force or seq > self.last_seq:
            self.last_seq = seq
            self._seq_changed.set()
            self._seq_changed = asyncio.Event()

    async def caught_up(self, position: str | None, timeout: float = CATCH_UP_TIMEOUT) -> None:
        """Wait until the stream delivered every event up to `position` (a header's event id)."""
        pos = _seq(position)
        if pos is None or self._stream_task is None:
            return
        epoch, seq = pos
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self.epoch == epoch and self.last_seq < seq and self.connected:
            left = deadline - loop.time()
            if left <= 0:
                return
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(left):
                    await self._seq_changed.wait()

    # -- the facade's operations --

    async def list_sessions(self, kind: str | None = None, limit: int = 1000, offset: int = 0, *,
                            before: SessionKey | None = None) -> list[dict[str, Any]]:
        """Most recently active first; only those after `before` when given (keyset paging, see
        `SessionKey`). The server answers 1,000 at most: more are read a page at a time, each after
        the last session of the one before.

        An aiops from before keyset paging (its `/api/v1/console` does not say `sessions_before`)
        is paged by offset: a page `before` the last session this listed starts where that listing
        ended; before any other session, at the top. A deletion meanwhile shifts the offset, so one
        older session can be missed until the next full listing (nothing here counts deletions)."""
        keyset = bool(self.info.get("sessions_before"))
        if before is not None and not keyset:
            if self._listed_to is not None and self._listed_to[0] == before:
                offset += self._listed_to[1]
            before = None
        out: list[dict[str, Any]] = []
        while True:
            page = await self._call("GET", "/api/v1/sessions", params={
                "kind": kind, "limit": min(1000, limit - len(out)), "offset": offset or None,
                "before": before.to_wire() if before is not None else None})
            rows = page.get("sessions") or []
            out.extend(rows)
            if keyset and rows:
                before, offset = SessionKey.of(rows[-1]), 0
            else:
                offset += len(rows)
            if len(rows) < 1000 or len(out) >= limit:
                if not keyset and out:
                    self._listed_to = (SessionKey.of(out[-1]), offset)
                return out

    async def session(self, ref: str, limit: int = 1) -> dict[str, Any] | None:
        try:
            return await self._call("GET", f"/api/v1/sessions/{quote(ref, safe='')}", params={"limit": limit})
        except RemoteError as e:
            if e.status == 404:
                return None
            raise

    async def history(self, ref: str, *, limit: int | None = None, before_id: int | None = None) -> list[Message]:
        try:
            data, position = await self._request("GET", f"/api/v1/sessions/{quote(ref, safe='')}",
                                                 params={"limit": limit or 50, "before": before_id})
        except RemoteError as e:
            if e.status == 404:
                return []  # a console session made but not yet used: no history
            raise
        await self.caught_up(position)
        return [message_from_wire(m) for m in data.get("messages") or ()]

    async def submit(self, client_id: str | None, text: str, *, model: str | None = None,
                     kind: str | None = None) -> dict[str, Any]:
        """`kind`: the kind of a session this message creates (`console`: an operator's console, where
        `/api/v1/console` says `console_sessions`)."""
        body: dict[str, Any] = {"text": text}
        if client_id is not None:
            body["client_id"] = client_id
        if model is not None:
            body["model"] = model
        if kind is not None:
            body["kind"] = kind
        return await self._call("POST", "/api/v1/submit", body=body)

    async def stop_turn(self, ref: str) -> bool:
        data = await self._call("POST", f"/api/v1/sessions/{quote(ref, safe='')}/stop")
        return bool(data.get("stopped"))

    async def delete_session(self, ref: str) -> bool:
        data = await self._call("DELETE", f"/api/v1/sessions/{quote(ref, safe='')}")
        return bool(data.get("deleted"))

    async def resolve_gate(self, gate_id: str, decision: Literal["approved", "denied"],
                           scope: Literal["once", "session"] = "once") -> ev.GateInfo:
        data = await self._call("POST", f"/api/v1/gates/{quote(gate_id, safe='')}",
                                body={"decision": "approve" if decision == "approved" else "deny", "scope": scope})
        return ev.GateInfo.from_dict(data["gate"])

    def pending_gates(self, session_id: str | None = None) -> list[ev.GateInfo]:
        gates = sorted(self.gates.values(), key=lambda g: g.created_at)
        return [g for g in gates if session_id is None or g.session_id == session_id]

    def rate_usage(self, session_id: str | None = None) -> list[ev.RateInfo]:
        return [u for k, u in sorted(self.rates.items()) if session_id is None or k[0] == session_id]

    async def rate_usage_of(self, session_id: str) -> list[ev.RateInfo]:
        """Every limited tool type of one session, used or not (the server's limiter knows them)."""
        data = await self._call("GET", "/api/v1/rates", params={"session": session_id})
        return [ev.RateInfo(**u) for u in data.get("usage") or ()]

    async def check_models(self) -> list[ev.ModelState]:
        """Have the server probe every enabled model now; the picture it answers (and publishes)."""
        data = await self._call("POST", "/api/v1/models/check")
        self.models = {m["key"]: ev.ModelState.from_dict(m) for m in data.get("models") or ()}
        return list(self.models.values())

    async def enable_rate(self, session_id: str, tool_type: str) -> bool:
        data = await self._call("POST", "/api/v1/rates/enable", body={"session_id": session_id, "tool_type": tool_type})
        return bool(data.get("enabled"))

    async def prompt(self, model: str | None, *, reload: bool = False) -> dict[str, Any]:
        if reload:
            return await self._call("POST", "/api/v1/prompt/reload", body={"model": model})
        return await self._call("GET", "/api/v1/prompt", params={"model": model})

    async def save_prompt_section(self, model: str | None, session_id: str | None, section: str, body: str) -> str:
        data = await self._call("POST", "/api/v1/prompt/sections",
                                body={"model": model, "section": section, "body": body, "session_id": session_id})
        return str(data.get("summary", ""))
