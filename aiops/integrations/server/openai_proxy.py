"""The OpenAI-compatible surface: `POST /v1/chat/completions`, `GET /v1/models[/{id}]`.

Responses are shaped as OpenAI's own (`chat.completion`, `chat.completion.chunk` with the role in
the first delta, one `finish_reason`, `data: [DONE]`, `usage` when the model reported counts, and a
usage chunk when `stream_options.include_usage` asks and the model reported counts). The agent's
tools stay server-side: a request carrying `tools`, `tool_choice`, `functions` or `function_call`
is refused. Input is validated as strictly as OpenAI does (`"stream": "yes"` is a 400, not a
stream). Sessions, forks, gates and keep-alives: see proxy_sessions.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable
from typing import Any, Literal

from aiohttp import web
from pydantic import BaseModel, ConfigDict

from aiops.engine import events as ev
from aiops.integrations.server.bodies import parse_body
from aiops.integrations.server.context import get_engine, prepare_stream, server_state
from aiops.integrations.server.errors import HttpError
from aiops.integrations.server.owners import caller
from aiops.integrations.server.proxy_sessions import (
    SESSION_HEADER,
    TURN_OUTPUT_EVENTS,
    BufferedStreamResponse,
    Channel,
    ClientMessage,
    PublishedModel,
    StartedTurn,
    TaskAnswer,
    TurnEnd,
    answer_background_task,
    answer_text,
    cancel_turn,
    conversation_id,
    find_model,
    install,
    is_background_task,
    model_not_found,
    omitted,
    proxy_state,
    published_models,
    tools_refused,
    turn_error,
    turn_output,
    wait_done,
)

FINGERPRINT = "fp_aiops"
KEEPALIVE = b": keep-alive\n\n"
DONE_FRAME = b"data: [DONE]\n\n"


# ---- request model -------------------------------------------------------------------------------


# Strict, as OpenAI's own validation: "true" is not a boolean and 5 is not a string.
_STRICT = ConfigDict(extra="allow", strict=True)


class _Part(BaseModel):
    model_config = _STRICT
    type: str
    text: str | None = None


class _Message(BaseModel):
    model_config = _STRICT
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[_Part] | None = None
    tool_calls: list[Any] | None = None
    function_call: Any = None


class _StreamOptions(BaseModel):
    model_config = _STRICT
    include_usage: bool | None = None


class ChatRequest(BaseModel):
    model_config = _STRICT  # sampling options and the like are accepted: they are the agent's business
    model: str
    messages: list[_Message]
    stream: bool | None = False
    stream_options: _StreamOptions | None = None
    user: str | None = None
    n: int | None = None  # one answer per request: anything but 1 is refused, not silently cut
    response_format: Any = None  # JSON modes are refused for agent turns (see refuse_json_modes)
    # Any type: whatever their value, these are refused as unsupported (see client_messages).
    tools: Any = None
    tool_choice: Any = None
    functions: Any = None
    function_call: Any = None


def _text(i: int, m: _Message, new: bool) -> str:
    """A message's text. A part that is not text is refused in the new message (its question
    would be answered without it); earlier in the history it is a placeholder, or one image
    a vision model once answered would make every later message of the chat a 400."""
    if m.content is None or isinstance(m.content, str):
        return m.content or ""
    parts: list[str] = []
    for p in m.content:
        if p.type == "text":
            parts.append(p.text or "")
        elif not new:
            parts.append(omitted(p.type))
        else:
            raise HttpError(400, "unsupported_content",
                            f"messages.{i}.content: {p.type!r} parts are not supported; aiops accepts text",
                            param=f"messages.{i}.content")
    # Separate parts are separate blocks (a prompt and a pasted file, say): joined without a break,
    # their words would run together.
    return "\n".join(parts)


def refuse_json_modes(req: ChatRequest) -> None:
    """An agent turn answers in prose, whatever it is asked: a client asking for JSON (LangChain's
    structured output, the SDK's `parse`) is told so, not handed prose its parser fails on.
    Background tasks are plain model calls whose prompts ask for their own JSON: there the field
    is ignored, as other sampling options are."""
    rf = req.response_format
    if rf is None:
        return
    kind = rf.get("type") if isinstance(rf, dict) else None
    if kind == "text":
        return
    raise HttpError(400, "unsupported_value",
                    f"response_format {kind or rf!r} is not supported: the agent answers in prose "
                    f"(only {{\"type\": \"text\"}} is accepted)", param="response_format")


def client_messages(req: ChatRequest) -> list[ClientMessage]:
    # Any value, even `[]` or "none", is refused: the client would otherwise believe its tools
    # were offered. Only null counts as absent (OpenAI's own reading of null).
    for name in ("tools", "functions", "tool_choice", "function_call"):
        if getattr(req, name) is not None:
            raise tools_refused(name)
    if req.n is not None and req.n != 1:
        raise HttpError(400, "invalid_value", f"n: aiops gives one answer per request (n must be 1, got {req.n})",
                        param="n")
    if req.stream_options is not None and not req.stream:
        raise HttpError(400, "invalid_value", "stream_options is only allowed when stream is true",
                        param="stream_options")
    out: list[ClientMessage] = []
    for i, m in enumerate(req.messages):
        if m.role in ("tool", "function") or m.tool_calls or m.function_call:
            raise HttpError(400, "tools_not_supported",
                            f"messages.{i}: tool calls and tool results are not supported; the agent runs "
                            f"its tools server-side", param=f"messages.{i}")
        role = "system" if m.role == "developer" else m.role
        out.append(ClientMessage(role, _text(i, m, new=i == len(req.messages) - 1)))
    return out


# ---- shapes ----------------------------------------------------------------------------------------------


def model_object(m: PublishedModel, created: int) -> dict[str, Any]:
    return {"id": m.name, "object": "model", "created": created, "owned_by": "aiops"}


def _usage(counts: dict[str, int] | None) -> dict[str, int] | None:
    """OpenAI's usage object from the engine's counts (None when nothing was counted: see
    `Usage.counts`), which then has no usage rather than zeros."""
    if counts is None:
        return None
    return {**counts, "total_tokens": counts["prompt_tokens"] + counts["completion_tokens"]}


def completion_object(cid: str, created: int, model: str, text: str,
                      usage: dict[str, int] | None, finish_reason: str = "stop") -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": cid, "object": "chat.completion", "created": created, "model": model,
        "system_fingerprint": FINGERPRINT,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text, "refusal": None},
                     "logprobs": None, "finish_reason": finish_reason}],
    }
    if (u := _usage(usage)) is not None:
        body["usage"] = u
    return body


class _Chunks:
    """Frames of one stream; `id`, `created` and `model` are the same on every chunk, so the JSON
    around each delta is encoded once."""

    def __init__(self, cid: str, created: int, model: str, include_usage: bool) -> None:
        self.head = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
                     "system_fingerprint": FINGERPRINT}
        self.include_usage = include_usage
        envelope = json.dumps({**self.head, "choices": [{"index": 0, "delta": None}]}, ensure_ascii=False)
        self._open = b"data: " + envelope[: envelope.rindex("null")].encode()  # ...,"delta":
        self._close = (',"logprobs":null,"finish_reason":null}]' + (',"usage":null' if include_usage else "")
                       + "}\n\n").encode()

    def delta(self, delta: dict[str, Any], finish: str | None = None) -> bytes:
        if finish is None:
            return self._open + json.dumps(delta, ensure_ascii=False).encode() + self._close
        obj = {**self.head, "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}
        if self.include_usage:
            obj["usage"] = None
        return b"data: " + json.dumps(obj, ensure_ascii=False).encode() + b"\n\n"

    def usage(self, usage: dict[str, int] | None) -> bytes:
        """The usage chunk `include_usage` asks for; nothing when the model reported no counts
        (a turn stopped before the model answered): zeros would be a false report."""
        counts = _usage(usage)
        if counts is None:
            return b""
        obj = {**self.head, "choices": [], "usage": counts}
        return b"data: " + json.dumps(obj).encode() + b"\n\n"


def error_frame(code: str, message: str) -> bytes:
    err = {"error": {"message": message, "type": "server_error", "param": None, "code": code}}
    return b"data: " + json.dumps(err, ensure_ascii=False).encode() + b"\n\n"


# ---- handlers --------------------------------------------------------------------------------------------


async def list_models(request: web.Request) -> web.Response:
    engine = get_engine(request)
    created = int(engine.started_at)
    return web.json_response({"object": "list",
                              "data": [model_object(m, created) for m in published_models(engine)]})


async def get_model(request: web.Request) -> web.Response:
    engine = get_engine(request)
    name = request.match_info["model"]
    m = find_model(engine, name)
    if m is None:
        raise model_not_found(name)
    return web.json_response(model_object(m, int(engine.started_at)))


async def chat_completions(request: web.Request) -> web.StreamResponse:
    state = proxy_state(request)
    engine = get_engine(request)
    req = await parse_body(request, ChatRequest)
    messages = client_messages(req)
    model = find_model(engine, req.model)
    if model is None:
        raise model_not_found(req.model)
    created = int(time.time())
    if is_background_task(messages):
        task = await answer_background_task(engine, model, messages, caller(request), failed_status=502)
        cid = "chatcmpl-task-" + format(time.monotonic_ns(), "x")
        if req.stream:
            return await _stream_text(request, cid, created, req, task)
        return web.json_response(completion_object(cid, created, req.model, task.text, task.usage,
                                                   task.finish_reason))
    refuse_json_modes(req)
    started = await state.sessions.start(conversation_id(request, messages, req.user), messages, model,
                                         caller(request), events=TURN_OUTPUT_EVENTS if req.stream else (ev.DONE,))
    cid = "chatcmpl-" + started.turn.id.removeprefix("turn_")
    if req.stream:
        return await _stream(request, started, cid, created, req)
    return await _complete(request, started, cid, created, req)


async def _stream_text(request: web.Request, cid: str, created: int, req: ChatRequest,
                       task: TaskAnswer) -> web.StreamResponse:
    chunks = _Chunks(cid, created, req.model, bool(req.stream_options and req.stream_options.include_usage))
    resp = _sse_response()
    await prepare_stream(request, resp)
    await resp.write(chunks.delta({"role": "assistant", "content": ""}))
    if task.text:
        await resp.write(chunks.delta({"content": task.text}))
    await resp.write(chunks.delta({}, task.finish_reason))
    if chunks.include_usage and (frame := chunks.usage(task.usage)):
        await resp.write(frame)
    await resp.write(DONE_FRAME)
    await resp.write_eof()
    return resp


def _sse_response(session_id: str | None = None) -> web.StreamResponse:
    headers = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    if session_id:
        headers[SESSION_HEADER] = session_id
    return BufferedStreamResponse(headers=headers)


def _on_disconnect(request: web.Request, started: StartedTurn) -> Callable[[], Awaitable[None]]:
    async def gone() -> None:
        if started.sub is not None:
            started.sub.close()
        await cancel_turn(get_engine(request), started.session_id, started.turn, "the client disconnected")

    return gone


async def _stream(request: web.Request, started: StartedTurn, cid: str, created: int,
                  req: ChatRequest) -> web.StreamResponse:
    state = proxy_state(request)
    chunks = _Chunks(cid, created, req.model, bool(req.stream_options and req.stream_options.include_usage))
    resp = _sse_response(started.session_id)
    channel = Channel(request, resp, _on_disconnect(request, started), keepalive=KEEPALIVE,
                      keepalive_seconds=state.settings.keepalive_seconds,
                      head=chunks.delta({"role": "assistant", "content": ""}))
    done: TurnEnd | None = None
    assert started.sub is not None
    with server_state(request).track(started.sub):
        try:
            await prepare_stream(request, resp)
            channel.start()
            async for text, done in turn_output(started, state.settings):
                frames = chunks.delta({"content": text}) if text else b""
                if done is None:
                    if frames:
                        await channel.write(frames)
                    continue
                if done.status == "error":
                    frames += error_frame(*turn_error(request, done.error, "error"))
                else:
                    frames += chunks.delta({}, done.finish_reason)
                    if chunks.include_usage:
                        frames += chunks.usage(done.usage)
                await channel.finish(frames + DONE_FRAME)
            if channel.gone:
                return resp
            if done is None:
                await channel.finish(error_frame("stream_closed", "the stream ended before the answer: the "
                                                                  "server is shutting down") + DONE_FRAME)
        except ConnectionError:
            await channel.disconnected()  # a write to a client that hung up
        except BaseException:
            await channel.disconnected()  # the handler was cancelled (the client hung up) or failed
            raise
        finally:
            await channel.close()
    return resp


async def _complete(request: web.Request, started: StartedTurn, cid: str, created: int,
                    req: ChatRequest) -> web.Response:
    channel = Channel(request, None, _on_disconnect(request, started)).start()
    try:
        result = await wait_done(started)
    except BaseException:
        await channel.disconnected()
        raise
    finally:
        if started.sub is not None:
            started.sub.close()
        await channel.close()
    if result.status == "error":
        code, message = turn_error(request, result.error, "model_error")
        raise HttpError(502, code, message, headers={SESSION_HEADER: started.session_id})
    text = answer_text(request, result, started.session_id)
    resp = web.json_response(completion_object(cid, created, req.model, text,
                                               result.usage,
                                               result.finish_reason))
    resp.headers[SESSION_HEADER] = started.session_id
    return resp


def setup(app: web.Application) -> None:
    """Mount `/v1/chat/completions` and `/v1/models`."""
    install(app)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_get("/v1/models", list_models)
    app.router.add_get("/v1/models/{model:.+}", get_model)
