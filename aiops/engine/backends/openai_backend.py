"""The `openai` model type: any OpenAI-compatible Chat Completions server, through `openai.AsyncOpenAI`.

Covers OpenAI itself and, through `base_url`, xAI, llama.cpp, Ollama, vLLM and LM Studio. The
adapter always streams, converts the engine's neutral messages to Chat Completions messages and
back, assembles tool calls that arrive in fragments, and reports every failure as a ModelError
phrased for the operator (model key, URL, what failed) — never with the API key in it.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import email.utils
import json
import logging
import socket
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import openai
from openai import AsyncAPIResponse
from openai._vendor.httpx_aiohttp import AiohttpTransport  # the SDK imports it; see _PlainHttpTransport

from aiops.config import ModelConfig
from aiops.engine.backends.base import FailureCause, ModelError
from aiops.engine.backends.base import exception_chain as _causes
from aiops.engine.types import (
    Completion,
    Message,
    StreamItem,
    TextDelta,
    ThinkingDelta,
    ToolCall,
    ToolSpec,
    Usage,
    new_id,
)

# The header the SDK's `with_streaming_response` sets to get the undecoded streamed response.
_RAW_STREAM = ("X-Stainless-Raw-Response", "stream")

# Keyless local servers (llama.cpp, Ollama, vLLM) ignore the key, but the SDK insists on one.
KEYLESS_PLACEHOLDER = "not-needed"

# Where OpenAI-compatible servers put reasoning text in a delta: llama.cpp, vLLM (older) and
# DeepSeek use `reasoning_content`; newer vLLM, OpenRouter and Ollama use `reasoning`.
REASONING_FIELDS = ("reasoning_content", "reasoning")


# ---- neutral -> Chat Completions --------------------------------------------------------------------


def to_openai_messages(messages: list[Message], system: str | None = None) -> list[dict[str, Any]]:
    """Chat Completions messages for a conversation; the system prompt goes first."""
    out: list[dict[str, Any]] = []
    if system:
        out.append({"role": "system", "content": system})
    for m in messages:
        if m.role == "system":
            out.append({"role": "system", "content": m.content})
        elif m.role == "user":
            out.append({"role": "user", "content": m.content})
        elif m.role == "assistant":
            msg: dict[str, Any] = {"role": "assistant", "content": m.content}
            if m.tool_calls:
                # null, not "", is the spec's "no text" next to tool calls.
                msg["content"] = m.content or None
                msg["tool_calls"] = [
                    {"id": tc.id, "type": "function",
                     "function": {"name": tc.name, "arguments": json.dumps(tc.arguments, ensure_ascii=False)}}
                    for tc in m.tool_calls
                ]
            # Earlier reasoning is not sent back: DeepSeek rejects it and the others ignore it.
            out.append(msg)
        elif m.role == "tool":
            out.append({"role": "tool", "tool_call_id": m.tool_call_id or "", "content": m.content})
        # notice / gate / error records are history, never conversation.
    return out


def to_openai_tools(tools: list[ToolSpec]) -> list[dict[str, Any]]:
    return [
        {"type": "function",
         "function": {"name": t.name, "description": t.description,
                      "parameters": t.parameters or {"type": "object", "properties": {}}}}
        for t in tools
    ]


# ---- Chat Completions -> neutral --------------------------------------------------------------------


def decode_arguments(raw: str) -> tuple[dict[str, Any], str | None]:
    """A tool call's argument JSON as a dict, or ({}, why not)."""
    if not raw.strip():
        return {}, None  # a call without arguments
    try:
        value = json.loads(raw)
    except ValueError as e:
        return {}, f"the arguments are not valid JSON ({e}): {raw[:200]}"
    if not isinstance(value, dict):
        return {}, f"the arguments are not a JSON object: {raw[:200]}"
    return value, None


@dataclass
class _PartialCall:
    id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)

    def finish(self) -> ToolCall:
        args, error = decode_arguments("".join(self.arguments))
        if not self.name:
            error = error or "the model sent a tool call without a name"
        return ToolCall(id=self.id or new_id("call_"), name=self.name, arguments=args, parse_error=error)


def reasoning_text(delta: Any) -> str:
    """Reasoning carried by a delta (a JSON object, or an SDK model keeping it in model_extra)."""
    if isinstance(delta, dict):
        for name in REASONING_FIELDS:
            value = delta.get(name)
            if isinstance(value, str) and value:
                return value
        return ""
    extra = getattr(delta, "model_extra", None) or {}
    for name in REASONING_FIELDS:
        value = extra.get(name, getattr(delta, name, None))
        if isinstance(value, str) and value:
            return value
    return ""


# ---- errors -------------------------------------------------------------------------------------


def known_connection_failure(exc: BaseException, url: str) -> str | None:
    """Plain words for a recognised cause of a failed connection in the exception chain, or None."""
    for e in _causes(exc):
        text = str(e).lower()
        if isinstance(e, ConnectionRefusedError) or "connection refused" in text:
            return "connection refused"
        if isinstance(e, socket.gaierror) or "name or service not known" in text:
            return f"cannot resolve host {urlsplit(url).hostname or url}"
        if isinstance(e, ssl.SSLError):
            # aiohttp's certificate error is an SSLError that never set `reason`.
            return f"TLS handshake failed ({getattr(e, 'reason', None) or e})"
        if isinstance(e, ConnectionResetError):
            return "connection reset by the server"
        if type(e).__name__ == "RemoteProtocolError":
            if "without sending a response" in text:
                return "the server closed the connection without answering"
            if "incomplete" in text or "peer closed" in text:
                return "the server closed the connection mid-response"
            return f"HTTP protocol error ({e})"
    return None


def describe_connection_failure(exc: BaseException, url: str) -> str:
    """Plain words for why a connection failed, from the exception chain."""
    if (what := known_connection_failure(exc, url)) is not None:
        return what
    cause = exc.__cause__ or exc
    return f"connection failed ({type(cause).__name__}: {cause})"


def status_message(body: Any, reason: str = "") -> str:
    """What an error response says: OpenAI's `error.message` (or `detail`, or a bare `error`)."""
    if isinstance(body, dict):
        for key in ("message", "detail", "error"):
            value = body.get(key)
            if isinstance(value, str) and value:
                return value
    if isinstance(body, str) and body.strip():
        return body.strip()[:300]
    return reason


def _hung_up(exc: BaseException) -> str | None:
    """aiohttp's words for a server that hung up (under the SDK's aiohttp transport, whose mapping
    calls a disconnect a connect timeout), as the operator should read them."""
    for e in _causes(exc):
        if isinstance(e, aiohttp.ServerDisconnectedError):
            return "the server closed the connection without answering"
        if isinstance(e, aiohttp.ClientPayloadError):
            return "the server closed the connection mid-response"
    return None


def _timed_out(exc: BaseException) -> bool:
    for e in _causes(exc):
        if isinstance(e, openai.APITimeoutError | TimeoutError):
            return True
        # The SDK's HTTP library (httpx2): ReadTimeout, ConnectTimeout, ... all derive from it.
        if any(c.__name__ == "TimeoutException" for c in type(e).__mro__):
            return True
    return False


class StreamErrorEvent(Exception):
    """The server sent `data: {"error": ...}` in the middle of a stream."""


class _ReadFailed(Exception):
    """Reading the streamed body failed; the HTTP library's error is the __cause__."""


class _LineTooLong(Exception):
    """The server sent more than `max_line_bytes` without a line break."""


def retry_after_seconds(headers: Any) -> float | None:
    """The wait a 429 asks for: `retry-after-ms` (OpenAI's), `Retry-After` in seconds or as an
    HTTP date; None when it names none."""
    if headers is None:
        return None
    if (ms := headers.get("retry-after-ms")) is not None:
        with contextlib.suppress(ValueError):
            return max(0.0, float(ms) / 1000)
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.UTC)
    return max(0.0, (when - datetime.datetime.now(datetime.UTC)).total_seconds())


def quiet_sdk_logs() -> None:
    """The SDK's HTTP client logs every request at INFO ("HTTP Request: POST ..."), a line and a
    formatted record per model call. Turned down unless someone already chose a level for it."""
    for name in ("openai", "httpx2"):
        logger = logging.getLogger(name)
        if logger.level == logging.NOTSET:
            logger.setLevel(logging.WARNING)


log = logging.getLogger(__name__)


def http_client(base_url: str | None) -> openai.DefaultAioHttpClient:
    """The SDK's aiohttp client (the `openai[aiohttp]` extra) for `base_url`.

    For a plain-http server (llama.cpp, Ollama, vLLM, a fake in the tests) its transport is made
    without the SSL context the SDK builds for it first thing: the SDK makes that context through
    httpcore2, whose import (with h11 and anyio, none of which the aiohttp transport uses) was ~90 ms
    of a 0.9 s `aiops chat` on a 2-core machine (docs/PERFORMANCE.md). A redirect to https still
    verifies, with aiohttp's default context. https, and any proxy from the environment, keep the
    SDK's own path."""
    if base_url is None or urlsplit(base_url).scheme != "http":
        return openai.DefaultAioHttpClient()
    return _PlainHttpClient()


class _PlainHttpTransport(AiohttpTransport):
    """The SDK's aiohttp transport without an SSL context of its own. Its `__init__` (the vendored
    httpx_aiohttp of openai 3.x, the range pyproject.toml allows) stores these attributes and
    nothing else, after making the context. Every test of the backend streams through this one (the
    fake models are plain http), so a release that gives it another attribute fails them."""

    def __init__(self, limits: Any) -> None:  # noqa: D107 - not calling super(): that makes the context
        self.ssl_context = True  # type: ignore[assignment]  # aiohttp's default, verifying context
        self.proxy = None
        self.limits = limits
        self.retries = 0
        self.socket_options = []
        self.uds = None
        self.local_address = None
        self.client = None


class _PlainHttpClient(openai.DefaultAioHttpClient):  # type: ignore[misc, valid-type]
    def _init_transport(self, **kwargs: Any) -> Any:  # type: ignore[override]  # httpx2 passes keywords
        if kwargs.get("transport") is not None:
            return super()._init_transport(**kwargs)
        return _PlainHttpTransport(kwargs["limits"])


# ---- the backend --------------------------------------------------------------------------------


class OpenAIBackend:
    """Streams Chat Completions from one configured model through `openai.AsyncOpenAI`.

    The SDK builds and sends the request (auth header, base_url, timeouts) over its aiohttp
    transport and maps failed calls to its exceptions. The answer is read as the raw SSE lines of
    its streaming response and each chunk decoded as plain JSON: the SDK's typed stream builds a
    pydantic object per chunk (about a third of a short call's CPU here; docs/PERFORMANCE.md).
    """

    def __init__(self, key: str, config: ModelConfig, env: dict[str, str] | None = None) -> None:
        self.key = key
        self.config = config
        self._env = env
        self._client: openai.AsyncOpenAI | None = None
        self._api_key: str | None = None
        # Some OpenAI-compatible servers reject `stream_options`; after one such 400 we stop sending it.
        self._send_stream_options = True

    @property
    def url(self) -> str:
        return self.config.display_url()

    def _error(self, reason: str, *, status: int | None = None, retryable: bool = False,
               discard_partial: bool = False, cause: FailureCause | None = None) -> ModelError:
        if self._api_key and self._api_key != KEYLESS_PLACEHOLDER:
            reason = reason.replace(self._api_key, "[redacted]")
        return ModelError(self.key, self.url, reason, status=status, retryable=retryable,
                          discard_partial=discard_partial, cause=cause)

    def _get_client(self) -> openai.AsyncOpenAI:
        if self._client is not None:
            return self._client
        if self.config.api_key_env:
            api_key = self.config.api_key(self._env)
            if not api_key:
                raise self._error(f"no API key: the environment variable {self.config.api_key_env} is not set",
                                  cause="key")
        else:
            api_key = KEYLESS_PLACEHOLDER  # keyless local servers ignore it; the SDK insists on one
        self._api_key = api_key
        quiet_sdk_logs()
        # No SDK retries: the engine decides (ModelError.retryable), and a retried stream would
        # double the wait the operator sees. The SDK's timeout is per read (and per connect), so it
        # bounds silence, not the length of a long answer. The SDK's aiohttp transport (the
        # `openai[aiohttp]` extra) costs about 1 ms less per call here than its default httpx one.
        self._client = openai.AsyncOpenAI(base_url=self.config.base_url, api_key=api_key,
                                          timeout=self.config.timeout, max_retries=0,
                                          http_client=http_client(self.config.base_url))
        return self._client

    def _request(self, messages: list[Message], tools: list[ToolSpec], system: str | None) -> dict[str, Any]:
        req: dict[str, Any] = {"model": self.config.model_id,
                               "messages": to_openai_messages(messages, system), "stream": True}
        if self._send_stream_options:
            req["stream_options"] = {"include_usage": True}
        if tools:
            req["tools"] = to_openai_tools(tools)
        for name in ("temperature", "top_p", "max_tokens"):
            value = getattr(self.config, name)
            if value is not None:
                req[name] = value
        return req

    def _failure(self, exc: BaseException, *, streaming: bool) -> ModelError:
        """A ModelError for whatever interrupted a call: status, timeout, connection, stream error."""
        if isinstance(exc, openai.APIStatusError):
            status = exc.status_code
            message = status_message(exc.body, exc.response.reason_phrase or "")
            return self._error(f"HTTP {status}: {message}" if message else f"HTTP {status}", status=status,
                               retryable=status in (408, 409, 429) or status >= 500)
        if isinstance(exc, StreamErrorEvent):
            return self._error(f"the server reported an error: {exc}", retryable=True)
        if isinstance(exc, openai.APIError) and not isinstance(exc, openai.APIConnectionError):
            return self._error(f"the server reported an error: {exc.message}", retryable=True)
        # The cause chain before the exception's type: the aiohttp transport reports a refused
        # connection or a server hanging up as a connect timeout.
        what = known_connection_failure(exc, self.url) or _hung_up(exc)
        if what is None and _timed_out(exc):
            return self._error(f"timed out after {self.config.timeout:g}s with no data from the server",
                               retryable=True, cause="connection")
        if what is None:
            what = describe_connection_failure(exc, self.url)
        return self._error(f"stream ended unexpectedly: {what}" if streaming else what, retryable=True,
                           cause="connection")

    async def _open(self, messages: list[Message], tools: list[ToolSpec],
                    system: str | None) -> AsyncAPIResponse[Any]:
        """The streaming response, once its status says it is one."""
        client = self._get_client()
        waited = 0.0
        attempt = 0
        while True:
            attempt += 1
            try:
                # The client's own POST (auth, base_url, timeouts, errors mapped to the SDK's
                # exceptions), asked for the raw streamed response as `with_streaming_response`
                # does. Not `chat.completions.create()`: that walks every message and tool against
                # the typed params first, on the loop — 17 ms per call at 50 messages, against
                # 1 ms here — and its body is already a plain JSON dict.
                return await client.post(
                    "/chat/completions", cast_to=AsyncAPIResponse[bytes],
                    body=self._request(messages, tools, system), stream=True,
                    stream_cls=openai.AsyncStream[Any], options={"headers": {_RAW_STREAM[0]: _RAW_STREAM[1]}})
            except (openai.BadRequestError, openai.UnprocessableEntityError) as e:
                if (attempt == 1 and self._send_stream_options
                        and "stream_options" in str(e.body or e.message)):
                    self._send_stream_options = False
                    continue
                raise self._failure(e, streaming=False) from e
            except openai.RateLimitError as e:
                # Waited for within the model's budget: a provider's short "slow down" should not
                # fail the turn, a long one should fail it at once rather than hold it for minutes.
                budget = self.config.rate_limit_retry_seconds
                wait = retry_after_seconds(e.response.headers)
                if wait is not None and waited + wait <= budget:
                    log.info("model %r at %s answered 429; retrying in %.3g s as it asked", self.key,
                             self.url, wait)
                    waited += wait
                    await asyncio.sleep(wait)
                    continue
                failure = self._failure(e, streaming=False)
                if wait is None:
                    why = "it named no Retry-After"
                else:
                    why = (f"it asked to wait {wait:g} s, beyond the retry budget of {budget:g} s "
                           f"(rate_limit_retry_seconds in models.toml)")
                spent = f" after waiting {waited:g} s" if waited else ""
                raise self._error(f"{failure.reason} — not retried{spent}: {why}", status=429,
                                  retryable=True) from e
            except openai.OpenAIError as e:
                raise self._failure(e, streaming=False) from e

    @staticmethod
    def _decode(data: str) -> dict[str, Any] | None:
        try:
            chunk = json.loads(data)
        except ValueError:
            return None  # not a chunk; some servers send status text
        if not isinstance(chunk, dict):
            return None
        if err := chunk.get("error"):
            message = err.get("message") if isinstance(err, dict) else err
            raise StreamErrorEvent(message if isinstance(message, str) and message
                                   else "An error occurred during streaming")
        return chunk

    @staticmethod
    async def _reads(response: AsyncAPIResponse[Any], max_line: int) -> AsyncIterator[list[str]]:
        """The body's complete lines, as each network read completes them. Only the HTTP library
        runs while one is read, so whatever it raises is a failed read: httpx2's errors, the
        aiohttp transport's mapped to them (the original stays the cause, which is what _failure
        reads).

        Linear in the body: each read is searched once, and the unfinished line is kept as a list
        of reads joined once it ends (a buffer searched whole at every read made one 50 MB line
        cost a minute of the event loop). A line longer than `max_line` bytes raises _LineTooLong.
        """
        # Bytes, split here: the SDK's iter_lines() runs every network read through two more
        # decoder layers (text, then lines) of its HTTP library, a measurable share of a short
        # call's CPU. iter_bytes() still undoes any Content-Encoding.
        chunks = response.iter_bytes()
        parts: list[bytes] = []  # the unfinished line, read by read
        size = 0
        while True:
            try:
                chunk = await anext(chunks)
            except StopAsyncIteration:
                break
            except Exception as e:  # noqa: BLE001 - see above
                raise _ReadFailed(str(e)) from e
            # SSE ends lines with CRLF, LF or CR; a CR at the very end may be half of a CRLF, so
            # it is held back and looked at again with the next read.
            held_cr = bool(parts) and parts[-1].endswith(b"\r")
            search = b"\r" + chunk if held_cr else chunk
            cut = max(search.rfind(b"\n"), search.rfind(b"\r", 0, len(search) - 1)) - held_cr
            if cut < -1 or (cut == -1 and not held_cr):
                parts.append(chunk)
                size += len(chunk)
                if size > max_line:
                    raise _LineTooLong
                continue
            complete = b"".join(parts) + chunk[:cut + 1] if parts else chunk[:cut + 1]
            rest = chunk[cut + 1:]
            parts, size = ([rest], len(rest)) if rest else ([], 0)
            lines = complete.splitlines()
            if any(len(line) > max_line for line in lines) or size > max_line:
                raise _LineTooLong
            yield [line.decode("utf-8", "replace") for line in lines]
        if parts:
            yield [line.decode("utf-8", "replace") for line in b"".join(parts).splitlines()]

    @classmethod
    def _decode_all(cls, payloads: list[str]) -> list[dict[str, Any]]:
        """The chunks of one read's payloads, decoded as one JSON array when they allow it (one
        json.loads per read rather than per chunk: a fast server's whole answer is often one
        read); else one by one, as _decode does, up to a stream error (raised after the chunks
        before it, which are passed on)."""
        if len(payloads) > 1:
            try:
                values = json.loads("[" + ",".join(payloads) + "]")
            except ValueError:
                values = None  # one of them is not JSON (status text): each on its own
            if isinstance(values, list) and len(values) == len(payloads):
                if all(isinstance(v, dict) and not v.get("error") for v in values):
                    return values
        out: list[dict[str, Any]] = []
        for payload in payloads:
            try:
                chunk = cls._decode(payload)
            except StreamErrorEvent as e:
                e.before = out  # type: ignore[attr-defined]
                raise
            if chunk is not None:
                out.append(chunk)
        return out

    async def _batches(self, response: AsyncAPIResponse[Any]) -> AsyncIterator[list[dict[str, Any]]]:
        """The JSON chunks of an SSE stream, grouped by the network read that completed them,
        until `data: [DONE]` or the end of the body."""
        data: list[str] = []
        reads = self._reads(response, self.config.max_line_bytes)
        async for lines in reads:
            payloads: list[str] = []
            done = False
            for line in lines:
                if line:
                    if line.startswith("data:"):
                        data.append(line[6:] if line[5:6] == " " else line[5:])
                    continue  # event:, id:, retry: and ":" comments carry nothing we need
                if not data:
                    continue
                payload = data[0] if len(data) == 1 else "\n".join(data)
                data = []
                if payload.startswith("[DONE]"):
                    done = True
                    break
                payloads.append(payload)
            try:
                batch = self._decode_all(payloads)
            except StreamErrorEvent as e:
                if before := getattr(e, "before", None):
                    yield before  # what arrived before the error is still passed on
                raise
            if batch:
                yield batch
            if done:
                # Read on to the end (the server ends the body right after), so that the
                # connection goes back to the pool rather than being hung up on.
                async for _ in reads:
                    pass
                return
        if data and not (payload := "\n".join(data)).startswith("[DONE]"):
            if (chunk := self._decode(payload)) is not None:
                yield [chunk]

    async def stream(self, messages: list[Message], tools: list[ToolSpec], *,
                     system: str | None = None) -> AsyncIterator[StreamItem]:
        """Text and thinking deltas as the network delivers them, then the Completion.

        Deltas of one kind that arrive in the same network read are passed on as one: a fast
        server's chunks often land together, and each delta costs a trip through the turn loop,
        the event bus and every client's stream (docs/PERFORMANCE.md)."""
        response = await self._open(messages, tools, system)
        text: list[str] = []
        thinking: list[str] = []
        calls: dict[int, _PartialCall] = {}
        usage: Usage | None = None
        finish: str | None = None
        cap = self.config.max_answer_chars
        size = 0  # characters of text, thinking and call arguments so far
        try:
            async for batch in self._batches(response):
                run: list[str] = []  # consecutive deltas of one kind in this read
                run_is_text = False
                for chunk in batch:
                    u = chunk.get("usage")
                    if isinstance(u, dict):
                        usage = Usage(prompt_tokens=u.get("prompt_tokens") or 0,
                                      completion_tokens=u.get("completion_tokens") or 0)
                    choices = chunk.get("choices")
                    if not choices:
                        continue
                    choice = choices[0]
                    delta = choice.get("delta")
                    if isinstance(delta, dict):
                        if reasoning := reasoning_text(delta):
                            size += len(reasoning)
                            thinking.append(reasoning)
                            if run and run_is_text:
                                yield TextDelta("".join(run))
                                run = []
                            run_is_text = False
                            run.append(reasoning)
                        if content := delta.get("content"):
                            size += len(content)
                            text.append(content)
                            if run and not run_is_text:
                                yield ThinkingDelta("".join(run))
                                run = []
                            run_is_text = True
                            run.append(content)
                        for tc in delta.get("tool_calls") or ():
                            size += self._add_fragment(calls, tc)
                    if choice.get("finish_reason"):
                        finish = choice["finish_reason"]
                if run:
                    piece = "".join(run)
                    yield TextDelta(piece) if run_is_text else ThinkingDelta(piece)
                if size > cap:  # text, thinking and call arguments, counted above
                    raise self._error(
                        f"the answer grew beyond {cap} characters (max_answer_chars in models.toml); it "
                        f"was cut off and is not kept", discard_partial=True)
        except StreamErrorEvent as e:
            raise self._failure(e, streaming=True) from None
        except _ReadFailed as e:
            raise self._failure(e, streaming=True) from e.__cause__
        except _LineTooLong:
            raise self._error(
                f"the server sent a line longer than {self.config.max_line_bytes} bytes "
                f"(max_line_bytes in models.toml); the answer was cut off and is not kept",
                discard_partial=True) from None
        finally:
            # A body read to its end is closed already (the connection went back to the pool);
            # otherwise closing hangs up on the server, which is how a cancelled turn stops generation.
            with contextlib.suppress(Exception):
                await response.close()
        if finish is None:
            raise self._error("stream ended unexpectedly: the server closed it without a finish_reason",
                              retryable=True)
        tool_calls = [calls[i].finish() for i in sorted(calls)]
        if tool_calls and finish == "stop":
            finish = "tool_calls"  # some local servers say "stop" after calls
        yield Completion(text="".join(text), thinking="".join(thinking), tool_calls=tool_calls,
                         usage=usage, finish_reason=finish)

    @staticmethod
    def _add_fragment(calls: dict[int, _PartialCall], tc: Any) -> int:
        """Merge one streamed tool-call fragment: id and name come first, arguments in pieces.
        Returns the characters of arguments it carried."""
        if not isinstance(tc, dict):
            return 0
        index = tc.get("index")
        tc_id = tc.get("id")
        if not isinstance(index, int):
            # Servers that omit `index` send one call at a time: a new id starts the next call.
            known = [i for i, c in calls.items() if tc_id and c.id == tc_id]
            if known:
                index = known[0]
            elif not calls:
                index = 0
            else:
                index = max(calls) + 1 if tc_id else max(calls)
        call = calls.setdefault(index, _PartialCall())
        if tc_id and not call.id:
            call.id = tc_id
        fn = tc.get("function")
        if isinstance(fn, dict):
            if fn.get("name") and not call.name:
                call.name = fn["name"]
            if fn.get("arguments"):
                call.arguments.append(fn["arguments"])
                if isinstance(fn["arguments"], str):
                    return len(fn["arguments"])
        return 0

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None
