"""A fake OpenAI Chat Completions server, plus the machinery every fake model server shares.

The fake runs an aiohttp app on its own event loop in a background thread, bound to 127.0.0.1 on an
ephemeral port. That makes it usable from sync tests, from async tests on any loop, and from code
under test running in a subprocess: everything talks to it over a real socket.

    with FakeOpenAI() as fake:                      # or the `fake_openai` fixture
        fake.script(Reply.text("hello", chunks=3),  # one reply per request, FIFO
                    Reply.tool_calls(("db_query", {"sql": "select 1"})))
        client = openai.AsyncOpenAI(base_url=fake.url, api_key="x")
        ...
        fake.wait_for_requests(2)                   # blocks this thread (sync tests)
        await fake.wait_for_requests_async(2)       # from a coroutine: never blocks the loop
        body = fake.requests[0].json

With nothing scripted the reply is `Reply.echo()`: the text "echo: <last user message text>".
A `responder(body) -> Reply | None` gives rule-based replies once the script is used up (None falls
through to the echo); `call_tool_when(...)` builds the common "call a tool, then answer" rule.

`Reply`, `Call`, `RecordedRequest` and `FakeServer` are shared with `tests.fakes.gemini_server`,
which renders the same replies in Gemini's wire shapes.

Run one by hand (or from a benchmark) with `python -m tests.fakes.openai_server --port 8099`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import logging
import ssl
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Self

from aiohttp import web

log = logging.getLogger(__name__)

WAIT_S = 30.0  # how long the `wait_for_*` helpers wait by default

# ---- replies ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Call:
    """One tool call a scripted reply makes.

    `arguments` as a str is sent verbatim (OpenAI only), which is how a test sends broken JSON.
    """

    name: str
    arguments: dict[str, Any] | str = field(default_factory=dict)
    id: str | None = None

    def arguments_json(self) -> str:
        if isinstance(self.arguments, str):
            return self.arguments
        return json.dumps(self.arguments)

    def arguments_dict(self) -> dict[str, Any]:
        if isinstance(self.arguments, dict):
            return self.arguments
        try:
            value = json.loads(self.arguments)
        except ValueError:
            return {}
        return value if isinstance(value, dict) else {}


CallLike = Call | tuple[str, dict[str, Any] | str] | tuple[str, dict[str, Any] | str, str]


def _as_call(c: CallLike) -> Call:
    if isinstance(c, Call):
        return c
    return Call(*c)


@dataclass(frozen=True, slots=True)
class Reply:
    """What the fake answers to one request. Build with the classmethods, tweak with `with_()`.

    Timing and failure options work on every builder:
      delay        seconds before the first byte (headers included)
      chunk_delay  seconds between streamed chunks
      drop_after   close the connection after this many streamed chunks (0: before any byte)
      hang_after   stop after this many streamed chunks and never finish until the fake stops
                   (0: not even headers); the client sees silence, as a stuck server looks
      hold_after   pause after this many streamed chunks until the test calls `fake.release()`,
                   then go on (a model that writes in bursts, with the test choosing when the
                   next burst comes instead of a timer); `fake.wait_for_held()` waits until a
                   reply got there. With `long_line_bytes`: after this many writes of the line
    """

    content: str | None = ""  # None: echo the last user message
    thinking: str = ""
    calls: tuple[Call, ...] = ()
    chunks: int = 3  # text and thinking are each streamed in this many pieces
    arg_chunks: int = 3  # OpenAI: each call's argument JSON arrives in this many fragments
    delay: float = 0.0
    chunk_delay: float = 0.0
    drop_after: int | None = None
    hang_after: int | None = None
    hold_after: int | None = None
    status: int = 200  # anything else is an error reply in the provider's error shape
    error_message: str = ""
    error_type: str | None = None  # OpenAI `type`; Gemini `status` (e.g. "RESOURCE_EXHAUSTED")
    error_code: str | None = None  # OpenAI `code`
    finish_reason: str | None = None  # override the natural one ("stop"/"tool_calls", "STOP")
    usage: tuple[int, int] | None = None  # (prompt, completion) tokens; None: estimated
    reasoning_field: str = "reasoning_content"  # OpenAI delta field ("reasoning" for newer vLLM)
    line_end: str = "\n"  # SSE allows "\r\n" and "\r" too, and some servers use them
    write_bytes: int | None = None  # send each SSE frame in writes of this many bytes, as a slow
    # network splits it (a CRLF pair or a UTF-8 character can land in two reads)
    one_write: bool = False  # send the whole stream in one write, as a fast server's burst arrives
    write_pause: float = 0.002  # seconds between the writes of write_bytes (0: as fast as the socket)
    headers: tuple[tuple[str, str], ...] = ()  # extra response headers (an error's Retry-After)
    # OpenAI: stream the answer as one `data:` line of this many bytes of text, written in pieces of
    # write_bytes (default 8 KiB) made as they are sent, so the fake itself never holds the
    # interpreter for long (it shares the process with the server under test).
    long_line_bytes: int | None = None
    # A `data:` payload sent as is (`{"error": ...}`, status text) before the streamed frame of this
    # index, as servers that report a failure mid-stream, or chatter, do.
    inject: tuple[int, str] | None = None

    # -- builders --

    @classmethod
    def text(cls, text: str, *, chunks: int = 3, **opts: Any) -> Reply:
        return cls(content=text, chunks=chunks, **opts)

    @classmethod
    def echo(cls, **opts: Any) -> Reply:
        """"echo: <last user message text>" — the default when nothing is scripted."""
        return cls(content=None, **opts)

    @classmethod
    def tool_calls(cls, *calls: CallLike, text: str = "", **opts: Any) -> Reply:
        """One or more (parallel) calls: `Reply.tool_calls(("a", {...}), ("b", {...}, "call_id"))`."""
        if not calls:
            raise ValueError("Reply.tool_calls needs at least one call")
        return cls(content=text, calls=tuple(_as_call(c) for c in calls), **opts)

    @classmethod
    def reasoning(cls, thinking: str, then_text: str = "", *, calls: Iterable[CallLike] = (),
                  **opts: Any) -> Reply:
        return cls(content=then_text, thinking=thinking, calls=tuple(_as_call(c) for c in calls), **opts)

    @classmethod
    def error(cls, status: int = 500, message: str = "boom", *, error_type: str | None = None,
              error_code: str | None = None, **opts: Any) -> Reply:
        return cls(status=status, error_message=message, error_type=error_type, error_code=error_code,
                   **opts)

    @classmethod
    def slow(cls, delay_s: float, reply: Reply | None = None, *, chunk_delay: float | None = None) -> Reply:
        base = reply or cls.echo()
        return base.with_(delay=delay_s,
                          chunk_delay=base.chunk_delay if chunk_delay is None else chunk_delay)

    @classmethod
    def drop(cls, after_chunks: int = 2, reply: Reply | None = None) -> Reply:
        base = reply or cls.text("this reply is cut off before it ends", chunks=6)
        return base.with_(drop_after=after_chunks)

    @classmethod
    def hang(cls, after_chunks: int = 0, reply: Reply | None = None) -> Reply:
        base = reply or cls.text("this reply never finishes", chunks=6)
        return base.with_(hang_after=after_chunks)

    def with_(self, **changes: Any) -> Reply:
        return dataclasses.replace(self, **changes)

    @property
    def is_error(self) -> bool:
        return self.status != 200


Responder = Callable[[dict[str, Any]], "Reply | None"]
ScriptItem = Reply | Responder


def split_text(text: str, n: int) -> list[str]:
    """Split into `n` non-empty pieces of similar size (fewer when the text is shorter)."""
    if not text:
        return []
    n = max(1, min(n, len(text)))
    size, extra = divmod(len(text), n)
    pieces, pos = [], 0
    for i in range(n):
        end = pos + size + (1 if i < extra else 0)
        pieces.append(text[pos:end])
        pos = end
    return pieces


def estimate_tokens(*texts: str) -> int:
    """A deterministic stand-in for a tokenizer: words."""
    return sum(len(t.split()) for t in texts if t)


# ---- the request log ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RecordedRequest:
    """One generation request as the fake received it (model-list calls are not recorded)."""

    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]  # names lower-cased
    json: Any  # the parsed body; None when it was not JSON
    model: str | None
    stream: bool
    at: float


# ---- the threaded server --------------------------------------------------------------------------


class _Abort(Exception):
    """Unwinds a handler after the fake closed the connection on purpose."""

    def __init__(self, resp: web.StreamResponse | None) -> None:
        self.resp = resp


_ABORTED = web.RequestKey("fake_aborted", bool)


class FakeServer:
    """An aiohttp app on its own loop in a background thread; subclasses add the wire protocol."""

    path_prefix = ""

    def __init__(self, *, responder: Responder | None = None, api_key: str | None = None,
                 host: str = "127.0.0.1", port: int = 0, tls: ssl.SSLContext | None = None) -> None:
        self.responder = responder
        self.api_key = api_key  # when set, requests must carry it (else the provider's auth error)
        self.host = host
        self.port = port
        self.tls = tls  # served over https with this context (tests/fakes/tls_proxy.py: Authority)
        self._cond = threading.Condition()
        self._queue: deque[ScriptItem] = deque()
        self._requests: list[RecordedRequest] = []
        self._disconnects = 0
        self._held = 0  # replies that reached their `hold_after` point
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._stopping: asyncio.Event | None = None
        self._releases: asyncio.Semaphore | None = None  # one per `release()`, for `hold_after`
        self._stopped = False

    # -- lifecycle --

    def start(self) -> Self:
        if self._stopped:
            raise RuntimeError(f"{type(self).__name__} was stopped; start a new one")
        if self._thread is not None:
            return self
        ready = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            asyncio.set_event_loop(loop)
            try:
                loop.run_until_complete(self._startup())
            except BaseException as e:  # reported to start()'s caller
                failure.append(e)
                ready.set()
                loop.close()
                return
            ready.set()
            try:
                loop.run_forever()
            finally:
                pending = asyncio.all_tasks(loop)
                for task in pending:
                    task.cancel()
                loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
                loop.run_until_complete(loop.shutdown_asyncgens())
                loop.close()

        self._thread = threading.Thread(target=run, name=type(self).__name__, daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError(f"{type(self).__name__} did not start within 10s")
        if failure:
            self._thread = None
            raise failure[0]
        return self

    async def _startup(self) -> None:
        self._stopping = asyncio.Event()
        self._releases = asyncio.Semaphore(0)
        app = web.Application()
        self._add_routes(app)
        # handler_cancellation: a client hanging up cancels its handler, which is how
        # `disconnects` learns about it. shutdown_timeout bounds stop() even if a handler misbehaves.
        self._runner = web.AppRunner(app, access_log=None, handler_cancellation=True,
                                     shutdown_timeout=2.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port, ssl_context=self.tls)
        await site.start()
        self.port = self._runner.addresses[0][1]

    def stop(self) -> None:
        """Stop serving. Releases hanging and slow replies first, so it never waits on them."""
        if self._thread is None or self._stopped or self._loop is None:
            return
        self._stopped = True
        loop = self._loop
        try:
            asyncio.run_coroutine_threadsafe(self._shutdown(), loop).result(timeout=10)
        finally:
            loop.call_soon_threadsafe(loop.stop)
            self._thread.join(10)
            with self._cond:
                self._cond.notify_all()

    async def _shutdown(self) -> None:
        assert self._stopping is not None and self._runner is not None
        self._stopping.set()
        await self._runner.cleanup()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def base_url(self) -> str:
        """Scheme, host and port: "http://127.0.0.1:PORT" (https with `tls`)."""
        if self._thread is None:
            raise RuntimeError(f"{type(self).__name__} is not started")
        return f"{'https' if self.tls else 'http'}://{self.host}:{self.port}"

    @property
    def url(self) -> str:
        """What to give the SDK as its base URL."""
        return self.base_url + self.path_prefix

    # -- scripting --

    def script(self, *replies: ScriptItem) -> Self:
        """Queue replies (or one-shot responder callables), consumed one per request, in order."""
        with self._cond:
            self._queue.extend(replies)
        return self

    def release(self) -> None:
        """Let one reply held at its `hold_after` go on (the oldest held; or, if none is held yet,
        the next one to be). Callable from any thread."""
        if self._loop is None or self._releases is None:
            raise RuntimeError(f"{type(self).__name__} is not started")
        self._loop.call_soon_threadsafe(self._releases.release)

    @property
    def queued(self) -> int:
        """Scripted replies not yet consumed."""
        with self._cond:
            return len(self._queue)

    def reset(self) -> None:
        """Forget the script, the request log, the disconnect and held counts (the responder stays)."""
        with self._cond:
            self._queue.clear()
            self._requests.clear()
            self._disconnects = 0
            self._held = 0

    def _next_reply(self, body: dict[str, Any]) -> Reply:
        with self._cond:
            item: ScriptItem | None = self._queue.popleft() if self._queue else None
        try:
            if isinstance(item, Reply):
                return item
            if item is not None:
                return item(body) or Reply.echo()
            if self.responder is not None:
                return self.responder(body) or Reply.echo()
        except Exception as e:  # a broken responder is a test bug: say so in the reply
            log.exception("fake responder failed")
            return Reply.error(500, f"fake responder raised {type(e).__name__}: {e}")
        return Reply.echo()

    # -- observing --

    @property
    def requests(self) -> list[RecordedRequest]:
        with self._cond:
            return list(self._requests)

    @property
    def last_request(self) -> RecordedRequest:
        with self._cond:
            if not self._requests:
                raise AssertionError(f"{type(self).__name__} has received no request")
            return self._requests[-1]

    # The default deadlines are generous: a passing test never waits them out, and on a loaded CI
    # machine a request can take seconds to arrive.
    def wait_for_requests(self, n: int = 1, timeout: float = WAIT_S) -> list[RecordedRequest]:
        """Block this thread until `n` generation requests arrived. Not for use on a loop that
        runs the client: use `wait_for_requests_async` there."""
        with self._cond:
            self._cond.wait_for(lambda: len(self._requests) >= n or self._stopped, timeout)
            if len(self._requests) < n:
                raise TimeoutError(f"{type(self).__name__}: {len(self._requests)} of {n} requests "
                                   f"arrived within {timeout}s")
            return list(self._requests)

    # The timeout is the thread-side wait's own bound (mirroring the sync API), hence the noqa.
    async def wait_for_requests_async(self, n: int = 1, timeout: float = WAIT_S  # noqa: ASYNC109
                                      ) -> list[RecordedRequest]:
        return await asyncio.to_thread(self.wait_for_requests, n, timeout)

    @property
    def disconnects(self) -> int:
        """How many clients hung up before their reply was complete."""
        with self._cond:
            return self._disconnects

    def wait_for_disconnects(self, n: int = 1, timeout: float = WAIT_S) -> int:
        with self._cond:
            self._cond.wait_for(lambda: self._disconnects >= n or self._stopped, timeout)
            if self._disconnects < n:
                raise TimeoutError(f"{type(self).__name__}: {self._disconnects} of {n} client "
                                   f"disconnects within {timeout}s")
            return self._disconnects

    @property
    def held(self) -> int:
        """How many replies have reached their `hold_after` point (released or not)."""
        with self._cond:
            return self._held

    def wait_for_held(self, n: int = 1, timeout: float = WAIT_S) -> int:
        """Block until `n` replies reached their `hold_after` point: everything before it was
        written (for a large reply: taken by the client, since a write waits for the socket)."""
        with self._cond:
            self._cond.wait_for(lambda: self._held >= n or self._stopped, timeout)
            if self._held < n:
                raise TimeoutError(f"{type(self).__name__}: {self._held} of {n} replies reached "
                                   f"their hold_after within {timeout}s")
            return self._held

    async def wait_for_held_async(self, n: int = 1, timeout: float = WAIT_S  # noqa: ASYNC109
                                  ) -> int:
        return await asyncio.to_thread(self.wait_for_held, n, timeout)

    async def wait_for_disconnects_async(self, n: int = 1, timeout: float = WAIT_S  # noqa: ASYNC109
                                         ) -> int:
        return await asyncio.to_thread(self.wait_for_disconnects, n, timeout)

    # -- for subclasses --

    def _add_routes(self, app: web.Application) -> None:
        raise NotImplementedError

    async def _render(self, request: web.Request, body: dict[str, Any], reply: Reply, *,
                      model: str, stream: bool) -> web.StreamResponse:
        raise NotImplementedError

    def _error_response(self, reply: Reply) -> web.Response:
        raise NotImplementedError

    def _auth_error(self, request: web.Request) -> Reply | None:
        raise NotImplementedError

    async def _serve(self, request: web.Request, *, model: str | None, stream: bool | None) -> web.StreamResponse:
        """Record the request, pick the reply, apply its timing and failure options, render it."""
        raw = await request.read()
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        if model is None and isinstance(body, dict):
            model = str(body.get("model") or "")
        if stream is None:
            stream = bool(isinstance(body, dict) and body.get("stream"))
        rec = RecordedRequest(method=request.method, path=request.path, query=dict(request.query),
                              headers={k.lower(): v for k, v in request.headers.items()}, json=body,
                              model=model, stream=stream, at=time.time())
        with self._cond:
            self._requests.append(rec)
            self._cond.notify_all()
        if not isinstance(body, dict):
            return self._error_response(Reply.error(400, "the request body is not a JSON object",
                                                    error_type="invalid_request_error"))
        reply = self._auth_error(request) or self._next_reply(body)
        try:
            if reply.delay:
                await self._pause(request, reply.delay)
            if reply.hang_after == 0:
                await self._hold(request, None)
            if reply.drop_after == 0:
                self._abort(request, None)
            if reply.is_error:
                return self._error_response(reply)
            return await self._render(request, body, reply, model=model or "", stream=stream)
        except _Abort as a:
            return a.resp or web.Response()
        except asyncio.CancelledError:
            self._client_gone(request)
            raise
        except ConnectionError:
            self._client_gone(request)
            return web.Response()

    def _client_gone(self, request: web.Request) -> None:
        assert self._stopping is not None
        if request.get(_ABORTED, False) or self._stopping.is_set():
            return
        with self._cond:
            self._disconnects += 1
            self._cond.notify_all()

    def _abort(self, request: web.Request, resp: web.StreamResponse | None) -> None:
        request[_ABORTED] = True
        if request.transport is not None:
            request.transport.abort()
        raise _Abort(resp)

    async def _pause(self, request: web.Request, seconds: float,
                     resp: web.StreamResponse | None = None) -> None:
        """Sleep, unless the fake is stopping: then hang up at once."""
        assert self._stopping is not None
        if seconds <= 0:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), seconds)
            self._abort(request, resp)

    async def _hold(self, request: web.Request, resp: web.StreamResponse | None) -> None:
        """Never answer; released (by hanging up) when the fake stops."""
        assert self._stopping is not None
        await self._stopping.wait()
        self._abort(request, resp)

    async def _wait_release(self, request: web.Request, resp: web.StreamResponse) -> None:
        """Wait for a `release()`; if the fake stops first, hang up."""
        assert self._stopping is not None and self._releases is not None
        with self._cond:
            self._held += 1
            self._cond.notify_all()
        released = asyncio.ensure_future(self._releases.acquire())
        stopping = asyncio.ensure_future(self._stopping.wait())
        try:
            await asyncio.wait((released, stopping), return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopping.cancel()
            if not released.done():
                released.cancel()
        if not released.done() or released.cancelled():
            self._abort(request, resp)

    async def _send_json(self, request: web.Request, reply: Reply, payload: Any,
                         status: int = 200) -> web.StreamResponse:
        data = json.dumps(payload).encode()
        if reply.drop_after is None and reply.hang_after is None:
            return web.Response(body=data, status=status, content_type="application/json")
        # A truncated body: headers promise the full length, half of it arrives.
        resp = web.StreamResponse(status=status, headers={"Content-Type": "application/json"})
        resp.content_length = len(data)
        await resp.prepare(request)
        await resp.write(data[: len(data) // 2])
        if reply.hang_after is not None:
            await self._hold(request, resp)
        self._abort(request, resp)
        return resp  # not reached

    async def _send_sse(self, request: web.Request, reply: Reply, frames: list[bytes]) -> web.StreamResponse:
        resp = web.StreamResponse(status=200, headers={"Content-Type": "text/event-stream",
                                                       "Cache-Control": "no-cache"})
        await resp.prepare(request)
        if reply.inject is not None:
            at, payload = reply.inject
            frames = [*frames[:at], f"data: {payload}\n\n".encode(), *frames[at:]]
        if reply.one_write:
            frames = [b"".join(frames)]
        for i, frame in enumerate(frames):
            if reply.drop_after is not None and i >= reply.drop_after:
                self._abort(request, resp)
            if reply.hang_after is not None and i >= reply.hang_after:
                await self._hold(request, resp)
            if i == reply.hold_after:
                await self._wait_release(request, resp)
            if i and reply.chunk_delay:
                await self._pause(request, reply.chunk_delay, resp)
            if reply.line_end != "\n":
                frame = frame.replace(b"\n", reply.line_end.encode())
            if reply.write_bytes is None:
                await resp.write(frame)
                continue
            for start in range(0, len(frame), reply.write_bytes):
                await resp.write(frame[start:start + reply.write_bytes])
                await self._pause(request, reply.write_pause, resp)  # so the pieces arrive as separate reads
        await resp.write_eof()
        return resp


def sse_frame(data: Any) -> bytes:
    text = data if isinstance(data, str) else json.dumps(data)
    return f"data: {text}\n\n".encode()


# ---- OpenAI -------------------------------------------------------------------------------------

_OPENAI_ERRORS: dict[int, tuple[str, str | None]] = {
    400: ("invalid_request_error", None),
    401: ("invalid_request_error", "invalid_api_key"),
    403: ("permission_error", None),
    404: ("invalid_request_error", "model_not_found"),
    429: ("requests", "rate_limit_exceeded"),
}


def message_text(message: dict[str, Any]) -> str:
    """The text of an OpenAI message whose content is a string or a list of parts."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    return ""


def last_user_text(body: dict[str, Any]) -> str:
    for m in reversed(body.get("messages") or []):
        if m.get("role") == "user":
            return message_text(m)
    return ""


def tool_results(body: dict[str, Any]) -> list[str]:
    """The contents of the tool messages at the end of the conversation (empty if it ends otherwise)."""
    out: list[str] = []
    for m in reversed(body.get("messages") or []):
        if m.get("role") != "tool":
            break
        out.append(message_text(m))
    return out[::-1]


def call_tool_when(trigger: str, *calls: CallLike, then_text: str | None = None) -> Responder:
    """A responder for multi-step turns: a user message containing `trigger` gets the tool calls;
    a conversation ending in tool results gets `then_text` (default "tool said: <results>");
    anything else falls through to the echo."""

    def respond(body: dict[str, Any]) -> Reply | None:
        results = tool_results(body)
        if results:
            return Reply.text(then_text if then_text is not None else "tool said: " + " | ".join(results))
        msgs = body.get("messages") or []
        if msgs and msgs[-1].get("role") == "user" and trigger in message_text(msgs[-1]):
            return Reply.tool_calls(*calls)
        return None

    return respond


class FakeOpenAI(FakeServer):
    """Speaks `POST /v1/chat/completions` (streaming and not) and `GET /v1/models` like OpenAI."""

    path_prefix = "/v1"

    def __init__(self, *, models: Iterable[str] = ("fake-model",), responder: Responder | None = None,
                 api_key: str | None = None, host: str = "127.0.0.1", port: int = 0,
                 tls: ssl.SSLContext | None = None) -> None:
        super().__init__(responder=responder, api_key=api_key, host=host, port=port, tls=tls)
        self.models = list(models)

    def _add_routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/v1/models", self._list_models)
        app.router.add_get("/v1/models/{model}", self._get_model)

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, model=None, stream=None)

    def _model_obj(self, model_id: str) -> dict[str, Any]:
        return {"id": model_id, "object": "model", "created": 1_700_000_000, "owned_by": "fake"}

    async def _list_models(self, request: web.Request) -> web.Response:
        if err := self._auth_error(request):
            return self._error_response(err)
        return web.json_response({"object": "list", "data": [self._model_obj(m) for m in self.models]})

    async def _get_model(self, request: web.Request) -> web.Response:
        if err := self._auth_error(request):
            return self._error_response(err)
        model = request.match_info["model"]
        if model not in self.models:
            return self._error_response(Reply.error(404, f"The model '{model}' does not exist"))
        return web.json_response(self._model_obj(model))

    def _auth_error(self, request: web.Request) -> Reply | None:
        if self.api_key is None:
            return None
        got = request.headers.get("Authorization", "").removeprefix("Bearer ").strip()
        if got == self.api_key:
            return None
        # Unlike OpenAI (which masks it) this quotes the key verbatim, so tests can prove that
        # nothing of ours ever repeats a key to the user.
        return Reply.error(401, f"Incorrect API key provided: {got}. You can find your API key at "
                                "https://platform.openai.com/account/api-keys.",
                           error_type="invalid_request_error", error_code="invalid_api_key")

    def _error_response(self, reply: Reply) -> web.Response:
        etype, ecode = _OPENAI_ERRORS.get(reply.status, ("server_error", None))
        payload = {"error": {"message": reply.error_message, "type": reply.error_type or etype,
                             "param": None, "code": reply.error_code or ecode}}
        return web.json_response(payload, status=reply.status, headers=dict(reply.headers))

    # -- rendering --

    def _reply_text(self, body: dict[str, Any], reply: Reply) -> str:
        return reply.content if reply.content is not None else f"echo: {last_user_text(body)}"

    def _usage(self, body: dict[str, Any], reply: Reply, text: str, calls: list[Call]) -> dict[str, Any]:
        if reply.usage is not None:
            prompt, completion = reply.usage
            reasoning = 0
        else:
            prompt = estimate_tokens(*(message_text(m) for m in body.get("messages") or []))
            reasoning = estimate_tokens(reply.thinking)
            completion = (estimate_tokens(text, *(c.arguments_json() for c in calls)) + reasoning) or 1
        return {"prompt_tokens": prompt, "completion_tokens": completion,
                "total_tokens": prompt + completion,
                "completion_tokens_details": {"reasoning_tokens": reasoning}}

    async def _send_long_line(self, request: web.Request, reply: Reply, first: bytes, cid: str, created: int,
                              model: str) -> web.StreamResponse:
        return await _send_long_line_impl(self, request, reply, first, cid, created, model)

    @staticmethod
    def _calls_with_ids(reply: Reply) -> list[Call]:
        return [c if c.id else dataclasses.replace(c, id=f"call_{uuid.uuid4().hex[:24]}") for c in reply.calls]

    async def _render(self, request: web.Request, body: dict[str, Any], reply: Reply, *,
                      model: str, stream: bool) -> web.StreamResponse:
        text = self._reply_text(body, reply)
        calls = self._calls_with_ids(reply)
        finish = reply.finish_reason or ("tool_calls" if calls else "stop")
        usage = self._usage(body, reply, text, calls)
        cid = f"chatcmpl-{uuid.uuid4().hex[:24]}"
        created = int(time.time())
        if not stream:
            message: dict[str, Any] = {"role": "assistant", "content": text or (None if calls else ""),
                                       "refusal": None}
            if reply.thinking:
                message[reply.reasoning_field] = reply.thinking
            if calls:
                message["tool_calls"] = [
                    {"id": c.id, "type": "function",
                     "function": {"name": c.name, "arguments": c.arguments_json()}} for c in calls]
            payload = {"id": cid, "object": "chat.completion", "created": created, "model": model,
                       "system_fingerprint": "fp_fake",
                       "choices": [{"index": 0, "message": message, "logprobs": None,
                                    "finish_reason": finish}],
                       "usage": usage}
            return await self._send_json(request, reply, payload)

        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))

        def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> bytes:
            obj: dict[str, Any] = {
                "id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
                "system_fingerprint": "fp_fake",
                "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}],
            }
            if include_usage:
                obj["usage"] = None
            return sse_frame(obj)

        frames = [chunk({"role": "assistant", "content": "", "refusal": None})]
        if reply.long_line_bytes is not None:
            return await self._send_long_line(request, reply, frames[0], cid, created, model)
        frames += [chunk({reply.reasoning_field: p}) for p in split_text(reply.thinking, reply.chunks)]
        frames += [chunk({"content": p}) for p in split_text(text, reply.chunks)]
        for index, c in enumerate(calls):
            # id and name first, then the argument JSON in fragments, as OpenAI streams calls.
            frames.append(chunk({"tool_calls": [{"index": index, "id": c.id, "type": "function",
                                                 "function": {"name": c.name, "arguments": ""}}]}))
            frames += [chunk({"tool_calls": [{"index": index, "function": {"arguments": frag}}]})
                       for frag in split_text(c.arguments_json(), reply.arg_chunks)]
        frames.append(chunk({}, finish))
        if include_usage:
            frames.append(sse_frame({"id": cid, "object": "chat.completion.chunk", "created": created,
                                     "model": model, "system_fingerprint": "fp_fake", "choices": [],
                                     "usage": usage}))
        frames.append(sse_frame("[DONE]"))
        return await self._send_sse(request, reply, frames)


async def _send_long_line_impl(fake: FakeOpenAI, request: web.Request, reply: Reply, first: bytes, cid: str,
                               created: int, model: str) -> web.StreamResponse:
    resp = web.StreamResponse(status=200, headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    await resp.write(first)
    head = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
            "choices": [{"index": 0, "delta": {"content": ""}, "finish_reason": None}]}
    prefix, _, suffix = json.dumps(head).partition('"content": ""')
    await resp.write(f"data: {prefix}\"content\": \"".encode())
    piece = reply.write_bytes or 8192
    left = reply.long_line_bytes or 0
    writes = 0
    try:
        while left > 0:
            if writes == reply.hold_after:
                await fake._wait_release(request, resp)
            writes += 1
            await resp.write(b"z" * min(piece, left))
            left -= piece
            if reply.write_pause:
                await fake._pause(request, reply.write_pause, resp)
        await resp.write(f'"{suffix}\n\n'.encode())
        await resp.write(sse_frame("[DONE]"))
        await resp.write_eof()
    except ConnectionError:
        fake._client_gone(request)
    return resp


def _main() -> None:
    parser = argparse.ArgumentParser(description="Run the fake OpenAI server (echo replies) until ^C.")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--api-key")
    args = parser.parse_args()
    with FakeOpenAI(port=args.port, api_key=args.api_key) as fake:
        print(fake.url, flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            threading.Event().wait()


if __name__ == "__main__":
    _main()
