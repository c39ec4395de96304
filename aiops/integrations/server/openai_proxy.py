"""The OpenAI-compatible surface: `POST /v1/chat/completions`, `GET /v1/models[/{id}]`.

Responses are shaped as OpenAI's own (`chat.completion`, `chat.completion.chunk` with the role in
the first delta, one `finish_reason`, `data: [DONE]`, `usage` when the model reported counts, and a
usage chunk when `stream_options.include_usage` asks and the model reported counts), and the model's
reasoning as `reasoning_content` (streamed deltas or the message's field), as DeepSeek, vLLM and
llama.cpp send it, unless `[server] proxy_reasoning` withholds it. The agent's
tools stay server-side; a client's own `tools` are offered to the model beside them (by `[server]
client_tools`), a call of one answered as OpenAI answers it (`message.tool_calls`,
`finish_reason: "tool_calls"`), and its `role: "tool"` result continues the turn (see
proxy/client_tools.py). Input is validated as strictly as OpenAI does (`"stream": "yes"` is a 400, not a
stream). Sessions, forks, gates and keep-alives: see the proxy core (`proxy/`), which drives the
turn; `OpenAIFramer` writes its frames.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any, Literal

from aiohttp import web
from pydantic import BaseModel, ConfigDict

from aiops.engine import events as ev
from aiops.integrations.server.bodies import read_json, validate
from aiops.integrations.server.context import get_engine
from aiops.integrations.server.errors import HttpError
from aiops.integrations.server.proxy.client_tools import offered_tools
from aiops.integrations.server.proxy.driver import answer_task, answer_turn
from aiops.integrations.server.proxy.identity import conversation_id
from aiops.integrations.server.proxy.messages import (
    ClientMessage,
    ClientToolCall,
    check_message_count,
    omitted,
    tools_refused,
)
from aiops.integrations.server.proxy.models import (
    PublishedModel,
    find_model,
    model_not_found,
    published_models,
)
from aiops.integrations.server.proxy.openwebui import is_background_task
from aiops.integrations.server.proxy.output import TurnEnd
from aiops.integrations.server.proxy.state import proxy_state

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


class _Function(BaseModel):
    model_config = _STRICT
    name: str
    arguments: str | dict[str, Any] | None = None  # JSON, as a string (an object from lax clients)


class _ToolCall(BaseModel):
    model_config = _STRICT
    id: str | None = None
    type: str | None = "function"
    function: _Function


class _Message(BaseModel):
    model_config = _STRICT
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[_Part] | None = None
    tool_calls: list[_ToolCall] | None = None
    function_call: Any = None
    tool_call_id: str | None = None


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
    # The client's tools (checked in proxy/client_tools.py; the legacy `functions` refused).
    tools: Any = None
    tool_choice: Any = None
    parallel_tool_calls: Any = None
    functions: Any = None
    function_call: Any = None
    # Asked-for outputs aiops cannot give: refused (see refuse_unservable), not silently ignored.
    logprobs: Any = None
    top_logprobs: Any = None
    modalities: Any = None
    audio: Any = None


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


def refuse_unservable(req: ChatRequest) -> None:
    """Outputs a client asks for that no agent turn produces: a 400 naming the field, as `n > 1`
    gets, rather than an answer without what the client will look for in it."""
    if req.logprobs not in (None, False):
        raise HttpError(400, "unsupported_value", "logprobs: aiops does not return log probabilities "
                        "(send false or leave it out)", param="logprobs")
    if req.top_logprobs is not None:
        raise HttpError(400, "unsupported_value", "top_logprobs: aiops does not return log probabilities",
                        param="top_logprobs")
    if req.modalities not in (None, ["text"]):
        raise HttpError(400, "unsupported_value", f"modalities: aiops answers in text only (got "
                        f"{req.modalities!r}; send [\"text\"] or leave it out)", param="modalities")
    if req.audio is not None:
        raise HttpError(400, "unsupported_value", "audio: aiops answers in text only", param="audio")


def _arguments(raw: str | dict[str, Any] | None) -> dict[str, Any]:
    if isinstance(raw, dict):
        return raw
    try:
        value = json.loads(raw) if raw else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def client_messages(req: ChatRequest, tools_mode: str = "offer") -> list[ClientMessage]:
    """The request's messages; `tools_mode` is `[server] client_tools`. Refusing, any value of the
    tool fields, even `[]` or "none", is refused: the client would otherwise believe its tools
    were offered. Only null counts as absent (OpenAI's own reading of null). The deprecated
    `functions` / `function_call` are refused unless ignored: `tools` replaced them."""
    names = ("tools", "tool_choice", "parallel_tool_calls") if tools_mode == "refuse" else ()
    for name in (*names, "functions", "function_call"):
        if getattr(req, name) is not None and tools_mode != "ignore":
            raise tools_refused(name)
    refuse_unservable(req)
    if req.n is not None and req.n != 1:
        raise HttpError(400, "invalid_value", f"n: aiops gives one answer per request (n must be 1, got {req.n})",
                        param="n")
    if req.stream_options is not None and not req.stream:
        raise HttpError(400, "invalid_value", "stream_options is only allowed when stream is true",
                        param="stream_options")
    out: list[ClientMessage] = []
    for i, m in enumerate(req.messages):
        if (m.role == "function" or m.function_call
                or (tools_mode == "refuse" and (m.role == "tool" or m.tool_calls))):
            raise HttpError(400, "tools_not_supported",
                            f"messages.{i}: tool calls and tool results are not supported here"
                            + ("" if tools_mode != "refuse" else " (client_tools = \"refuse\")")
                            + "; the agent runs its tools server-side", param=f"messages.{i}")
        if m.role == "tool" and not m.tool_call_id:
            raise HttpError(400, "invalid_request", f"messages.{i}: a tool message needs its tool_call_id",
                            param=f"messages.{i}.tool_call_id")
        role = "system" if m.role == "developer" else m.role
        calls = tuple(ClientToolCall(c.id, c.function.name, _arguments(c.function.arguments))
                      for c in m.tool_calls or ())
        out.append(ClientMessage(role, _text(i, m, new=i == len(req.messages) - 1),
                                 sent_as=m.role if m.role != role else None, tool_calls=calls,
                                 tool_call_id=m.tool_call_id if m.role == "tool" else None))
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


def tool_calls(calls: Sequence[ev.ClientCall]) -> list[dict[str, Any]]:
    """Client tool calls in OpenAI's shape (`arguments` a JSON string; `index` for stream deltas)."""
    return [{"index": k, "id": c.id, "type": "function",
             "function": {"name": c.name, "arguments": json.dumps(dict(c.arguments), ensure_ascii=False)}}
            for k, c in enumerate(calls)]


def completion_object(cid: str, created: int, model: str, text: str,
                      usage: dict[str, int] | None, finish_reason: str = "stop",
                      calls: Sequence[ev.ClientCall] = (), reasoning: str = "") -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": text, "refusal": None}
    if reasoning:
        # Where DeepSeek, vLLM and llama.cpp put it, and Open WebUI and LiteLLM read it; a client
        # that does not know the field ignores it (the SDK keeps it as an extra attribute).
        message["reasoning_content"] = reasoning
    if calls:
        # As OpenAI answers a call: no `index` in a whole message, content null when it has none.
        message["tool_calls"] = [{k: v for k, v in c.items() if k != "index"} for c in tool_calls(calls)]
        message["content"] = text or None
    body: dict[str, Any] = {
        "id": cid, "object": "chat.completion", "created": created, "model": model,
        "system_fingerprint": FINGERPRINT,
        "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish_reason}],
    }
    if (u := _usage(usage)) is not None:
        body["usage"] = u
    return body


# json.dumps(s, ensure_ascii=False) for a str, without the encoder object around it.
_json_str = json.encoder.encode_basestring  # type: ignore[attr-defined]


class _Chunks:
    """Frames of one stream; `id`, `created` and `model` are the same on every chunk, so the JSON
    around each delta is encoded once, and a text delta costs one string encoding (issue 27: the
    frames were ~4 % of the loop thread's time when each was a json.dumps of a dict)."""

    def __init__(self, cid: str, created: int, model: str, include_usage: bool) -> None:
        self.head = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
                     "system_fingerprint": FINGERPRINT}
        self.include_usage = include_usage
        # {"id":...,"choices":[{"index":0,"delta": <delta> ,"logprobs":null,"finish_reason": <reason> }](,"usage":null)}
        self._open = (f'data: {{"id":{_json_str(cid)},"object":"chat.completion.chunk","created":{int(created)},'
                      f'"model":{_json_str(model)},"system_fingerprint":"{FINGERPRINT}",'
                      f'"choices":[{{"index":0,"delta":').encode()
        self._finish = b',"logprobs":null,"finish_reason":'
        self._end = b"}]" + (b',"usage":null' if include_usage else b"") + b"}\n\n"
        self._text_open = self._open + b'{"content":'
        self._text_close = b"}" + self._finish + b"null" + self._end
        self._reasoning_open = self._open + b'{"reasoning_content":'

    def text(self, text: str) -> bytes:
        return self._text_open + _json_str(text).encode() + self._text_close

    def reasoning(self, text: str) -> bytes:
        """A reasoning delta, as DeepSeek, vLLM and llama.cpp stream it: `delta.reasoning_content`."""
        return self._reasoning_open + _json_str(text).encode() + self._text_close

    def role(self) -> bytes:
        """The first chunk: the role, and empty content (as OpenAI opens a stream)."""
        return self._open + b'{"role":"assistant","content":""}' + self._finish + b"null" + self._end

    def finish(self, reason: str) -> bytes:
        """The chunk with the finish reason and an empty delta."""
        return self._open + b"{}" + self._finish + _json_str(reason).encode() + self._end

    def delta(self, delta: dict[str, Any], finish: str | None = None) -> bytes:
        return (self._open + json.dumps(delta, ensure_ascii=False, separators=(",", ":")).encode() + self._finish
                + (b"null" if finish is None else _json_str(finish).encode()) + self._end)

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
    body = await read_json(request)
    settings = proxy_state(request).settings
    check_message_count(body, settings.max_messages)
    req = validate(ChatRequest, body)
    messages = client_messages(req, settings.client_tools)
    offered = offered_tools(request, req.tools, tool_choice=req.tool_choice,
                            parallel_tool_calls=req.parallel_tool_calls)
    model = find_model(get_engine(request), req.model)
    if model is None:
        raise model_not_found(req.model)
    framer = OpenAIFramer(req)
    if is_background_task(messages):
        return await answer_task(request, model, messages, framer, stream=bool(req.stream))
    refuse_json_modes(req)
    return await answer_turn(request, conversation_id(request, messages, req.user), messages, model, framer,
                             stream=bool(req.stream), client_tools=offered)


class OpenAIFramer:
    """One answer in OpenAI's shapes: `chat.completion.chunk` events ending in `data: [DONE]`, or a
    `chat.completion` body (see proxy.driver.Framer)."""

    failed_status = 502
    times_text = False
    stream_headers = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    # As OpenAI-compatible servers send it, unasked: clients that do not know the field skip it.
    wants_reasoning = True

    def __init__(self, req: ChatRequest) -> None:
        self.model = req.model
        self.created = int(time.time())
        self.include_usage = bool(req.stream_options and req.stream_options.include_usage)
        self.cid = ""
        self._chunks: _Chunks | None = None

    def begin(self, turn_id: str | None) -> None:
        self.cid = ("chatcmpl-" + turn_id.removeprefix("turn_") if turn_id is not None
                    else "chatcmpl-task-" + format(time.monotonic_ns(), "x"))

    @property
    def chunks(self) -> _Chunks:
        if self._chunks is None:  # made for streams only: a whole answer needs none of it
            self._chunks = _Chunks(self.cid, self.created, self.model, self.include_usage)
        return self._chunks

    def head(self) -> bytes:
        return self.chunks.role()

    def text(self, text: str) -> bytes:
        return self.chunks.text(text)

    def reasoning(self, text: str) -> bytes:
        return self.chunks.reasoning(text)

    def end(self, end: TurnEnd) -> bytes:
        frames = self.chunks.delta({"tool_calls": tool_calls(end.client_calls)}) if end.client_calls else b""
        frames += self.chunks.finish(end.finish_reason)
        if self.include_usage:
            frames += self.chunks.usage(end.usage)
        return frames + DONE_FRAME

    def error(self, code: str, message: str) -> bytes:
        return error_frame(code, message) + DONE_FRAME

    def keepalive(self) -> bytes:
        return KEEPALIVE

    def text_began(self) -> None:
        pass

    def whole(self, end: TurnEnd) -> bytes:
        return self.head() + (self.text(end.text) if end.text else b"") + self.end(end)

    def answer(self, text: str, end: TurnEnd) -> dict[str, Any]:
        return completion_object(self.cid, self.created, self.model, text, end.usage, end.finish_reason,
                                 end.client_calls, end.reasoning)


# OpenAI APIs a client may try first (the Responses API is the default of newer SDKs' agents) that
# an agent behind Chat Completions does not serve: named, so the client's user reads what to set.
_NOT_SERVED = {
    "responses": "the Responses API", "completions": "legacy text completions", "embeddings": "embeddings",
    "moderations": "moderations", "audio": "audio", "images": "images",
}


async def not_served(request: web.Request) -> web.Response:
    what = _NOT_SERVED[request.match_info["api"]]
    raise HttpError(501, "not_implemented",
                    f"aiops does not serve {what} ({request.path}): it is an agent behind the Chat "
                    f"Completions API; set the client to use /v1/chat/completions")


def setup(app: web.Application) -> None:
    """Mount `/v1/chat/completions` and `/v1/models`, and a 501 for the OpenAI APIs not served."""
    # Also without the /v1 prefix: clients configured with the bare server URL call these.
    apis = "|".join(_NOT_SERVED)
    for prefix in ("/v1", ""):
        app.router.add_post(f"{prefix}/chat/completions", chat_completions)
        app.router.add_get(f"{prefix}/models", list_models)
        app.router.add_get(f"{prefix}/models/{{model:.+}}", get_model)
        app.router.add_route("*", f"{prefix}/{{api:{apis}}}", not_served)
        app.router.add_route("*", f"{prefix}/{{api:{apis}}}/{{rest:.*}}", not_served)
