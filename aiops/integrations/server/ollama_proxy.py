"""The Ollama-compatible surface: `/api/chat`, `/api/generate`, `/api/tags`, `/api/show`, `/api/ps`,
`/api/version`, and `GET|HEAD /` ("Ollama is running"), shaped as Ollama's own API documents them.

Models are published with a tag (`aiops:latest`, `aiops/<key>:latest`) and accepted with or
without `:latest`. Streaming is on by default, as in Ollama: NDJSON lines, a final `done: true` line
with `done_reason`, durations (ns) and token counts. The model's reasoning is `message.thinking`
(chat) or `thinking` (generate) when the request asks with `think`, and left out otherwise, as
Ollama does. While the agent waits (a gate, a slow model) the stream carries empty `done: false`
lines (each stamped when it is sent); an error after the stream started is a final
`{"error": "..."}` line. Request fields are typed strictly, as Ollama's
own decoder does (`"stream": "yes"` is a 400). The legacy `/v1/api/*` paths map to the same
handlers.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from aiohttp import web
from pydantic import AfterValidator, BaseModel, ConfigDict
from pydantic_core import PydanticCustomError

from aiops import __version__ as aiops_version
from aiops.engine import events as ev
from aiops.engine.types import ToolSpec
from aiops.integrations.server.bodies import parse_body, read_json, validate
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
)
from aiops.integrations.server.proxy.models import PublishedModel, find_model, published_models
from aiops.integrations.server.proxy.openwebui import is_background_task
from aiops.integrations.server.proxy.output import TurnEnd
from aiops.integrations.server.proxy.state import proxy_state
from aiops.integrations.server.proxy.status import REFUSED, status_line

# The Ollama API version we speak; clients that gate features on the server version see a recent one.
OLLAMA_VERSION = "0.11.4"
NDJSON = "application/x-ndjson"


# ---- request models ---------------------------------------------------------------------------------


# Strict: Ollama's JSON decoder refuses a string where a boolean belongs, and so do we.
_STRICT = ConfigDict(extra="allow", strict=True)

# Go's time.ParseDuration grammar, which Ollama reads a keep_alive string with: "0" alone, or signed
# numbers each with a unit ("1h30m", ".5s", "0.s"). [0-9], not \d: Go takes ASCII digits only.
_GO_DURATION_PART = r"([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(ns|us|\u00b5s|\u03bcs|ms|s|m|h)"
_GO_DURATION = re.compile(rf"[-+]?(?:0|(?:{_GO_DURATION_PART})+)")
_GO_DURATION_UNIT_NS = {"ns": 1, "us": 10**3, "\u00b5s": 10**3, "\u03bcs": 10**3, "ms": 10**6, "s": 10**9,
                        "m": 60 * 10**9, "h": 3600 * 10**9}


def _go_duration_ns(text: str) -> int:
    """A Go duration string in ns; ValueError for one Go refuses, an overflow of its int64 included.
    Each part is truncated to whole ns, as Go does."""
    if not _GO_DURATION.fullmatch(text):
        raise ValueError(f"invalid duration {text!r}: a number of seconds, or a duration such as "
                         f"\"5m\" or \"1h30m\"")
    limit = 2**63 if text.startswith("-") else 2**63 - 1
    ns = 0
    for number, unit in re.findall(_GO_DURATION_PART, text):
        whole, _, fraction = number.partition(".")
        whole = whole.lstrip("0")
        # Before int(), which refuses (and is slow on) thousands of digits: more than 19 whole
        # digits overflow Go's int64 anyway, and a fraction's digits past the 20th are finer than
        # 1 ns in any unit.
        if len(whole) > 19:
            raise ValueError(f"duration {text!r} is out of range")
        fraction = fraction[:20]
        scale = _GO_DURATION_UNIT_NS[unit]
        ns += int(whole or "0") * scale + int(fraction or "0") * scale // 10 ** len(fraction)
        if ns > limit:
            raise ValueError(f"duration {text!r} is out of range")
    return -ns if text.startswith("-") else ns


def _keep_alive_ns(value: int | float | str) -> int:
    """How long Ollama would keep the model loaded, in ns (negative: for ever). A number counts
    whole seconds, truncated (Ollama reads 0.5 as 0); a string is a Go duration."""
    if isinstance(value, str):
        return _go_duration_ns(value)
    if not math.isfinite(value):
        raise ValueError(f"invalid duration {value}")
    return -1 if value < 0 else int(value) * 10**9


def _valid_keep_alive(value: int | float | str | None) -> int | float | str | None:
    # Refused on every request, as Ollama's decoder does, not only on the unload probe that reads it.
    if value is not None:
        try:
            _keep_alive_ns(value)
        except ValueError as e:
            raise PydanticCustomError("invalid_duration", "{reason}", {"reason": str(e)}) from None
    return value


KeepAlive = Annotated[int | float | str | None, AfterValidator(_valid_keep_alive)]


class _Function(BaseModel):
    model_config = _STRICT
    name: str
    arguments: dict[str, Any] | None = None


class _ToolCall(BaseModel):
    model_config = _STRICT
    id: str | None = None  # Ollama's own calls have none; Open WebUI adds one
    function: _Function


class _Message(BaseModel):
    model_config = _STRICT
    role: Literal["system", "user", "assistant", "tool"]
    content: str | None = ""
    images: list[Any] | None = None
    tool_calls: list[_ToolCall] | None = None
    tool_name: str | None = None  # a tool result's tool (newer ollama clients)
    tool_call_id: str | None = None  # a tool result's call (Open WebUI)


# Ollama's `think`: true, false, or a level ("low", "medium", "high", …). Whether the model
# reasons is models.toml's business; here it says whether the answer shows its reasoning.
Think = bool | str | None


class ChatRequest(BaseModel):
    model_config = _STRICT  # options and the like are accepted and ignored (models.toml rules)
    model: str
    messages: list[_Message] | None = None
    stream: bool | None = True
    tools: list[Any] | None = None
    keep_alive: KeepAlive = None
    format: Any = None  # JSON output: refused for agent turns (see _refuse_json_format)
    think: Think = None


class GenerateRequest(BaseModel):
    model_config = _STRICT
    model: str
    prompt: str | None = ""
    system: str | None = None
    stream: bool | None = True
    images: list[Any] | None = None
    keep_alive: KeepAlive = None
    format: Any = None
    think: Think = None
    # Completion-engine requests (an editor's fill-in-the-middle, a raw prompt, a prompt template)
    # have no meaning for an agent turn: refused (see _generate_messages). Older ollama clients send
    # them empty or false with every request, which counts as absent.
    suffix: str | None = None
    raw: bool | None = None
    template: str | None = None


class ShowRequest(BaseModel):
    model_config = _STRICT
    model: str | None = None
    name: str | None = None  # the older spelling


def _thinks(think: Think) -> bool:
    """Whether the answer shows the model's reasoning: only when the request asks (`think: true`
    or a level), as Ollama answers; absent or false, the reasoning is left out."""
    return think is True or (isinstance(think, str) and think != "")


def _refuse_json_format(fmt: Any) -> None:
    """An agent turn answers in prose: a client asking for JSON (`format: "json"` or a schema) is
    told so rather than handed prose its parser fails on. Background tasks ignore the field."""
    if fmt is not None and fmt != "":
        raise HttpError(400, "unsupported_value",
                        f"format {fmt if isinstance(fmt, str) else 'with a JSON schema'!r} is not supported: "
                        f"the agent answers in prose")


def _chat_messages(req: ChatRequest, tools_mode: str = "offer") -> list[ClientMessage]:
    """The request's messages; `tools_mode` is `[server] client_tools` (tool calls and results in
    the history are refused only when it is "refuse")."""
    out: list[ClientMessage] = []
    messages = req.messages or []
    for i, m in enumerate(messages):
        if tools_mode == "refuse" and (m.role == "tool" or m.tool_calls):
            raise HttpError(400, "tools_not_supported",
                            f"messages.{i}: tool calls and tool results are not supported (client_tools = "
                            f"\"refuse\"); the agent runs its tools server-side")
        text = m.content or ""
        if m.images and i == len(messages) - 1:
            raise HttpError(400, "unsupported_content", f"messages.{i}.images: images are not supported")
        if m.images:
            # Earlier in the chat (answered by a vision model, say): a placeholder, as on /v1.
            text = "\n".join([text, *(omitted("image") for _ in m.images)]).strip()
        calls = tuple(ClientToolCall(c.id, c.function.name, c.function.arguments or {}) for c in m.tool_calls or ())
        out.append(ClientMessage(m.role, text, tool_calls=calls,
                                 tool_call_id=m.tool_call_id if m.role == "tool" else None,
                                 tool_name=m.tool_name if m.role == "tool" else None))
    return out


def _generate_messages(req: GenerateRequest) -> list[ClientMessage]:
    if req.images:
        raise HttpError(400, "unsupported_content", "images are not supported")
    for name, value in (("suffix", req.suffix), ("raw", req.raw), ("template", req.template)):
        if value:
            raise HttpError(400, "unsupported_value",
                            f"{name} is not supported: aiops answers with an agent turn, not as a completion "
                            f"engine (fill-in-the-middle, raw prompts and templates have no meaning for it)")
    out = [ClientMessage("system", req.system)] if req.system else []
    return out + [ClientMessage("user", req.prompt or "")]


# ---- shapes ------------------------------------------------------------------------------------------


def _iso(ts: float) -> str:
    """RFC 3339 with fractional seconds, as Ollama writes times."""
    return datetime.fromtimestamp(ts, tz=UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def _tagged(m: PublishedModel) -> str:
    return f"{m.name}:latest"


def _digest(m: PublishedModel) -> str:
    return hashlib.sha256(f"{m.name}\x00{m.config.type}\x00{m.config.model_id}\x00"
                          f"{m.config.base_url or ''}".encode()).hexdigest()


def _details(m: PublishedModel) -> dict[str, Any]:
    return {"parent_model": "", "format": "api", "family": m.config.type, "families": [m.config.type],
            "parameter_size": "", "quantization_level": ""}


def _modified_at(request: web.Request) -> str:
    engine = get_engine(request)
    path = engine.config.sources.get("models.toml")
    try:
        ts = path.stat().st_mtime if path is not None else engine.started_at
    except OSError:
        ts = engine.started_at
    return _iso(ts)


def _tag_entry(m: PublishedModel, modified_at: str) -> dict[str, Any]:
    name = _tagged(m)
    return {"name": name, "model": name, "modified_at": modified_at, "size": 0, "digest": _digest(m),
            "details": _details(m)}


def _find(request: web.Request, name: str) -> PublishedModel:
    m = find_model(get_engine(request), name)
    if m is None:
        names = ", ".join(_tagged(p) for p in published_models(get_engine(request)))
        raise HttpError(404, "model_not_found", f'model "{name}" not found; this server has {names}')
    return m


# ---- model routes -------------------------------------------------------------------------------------


async def root(request: web.Request) -> web.Response:
    return web.Response(text="Ollama is running", content_type="text/plain")


async def version(request: web.Request) -> web.Response:
    return web.json_response({"version": OLLAMA_VERSION, "aiops": aiops_version})


async def tags(request: web.Request) -> web.Response:
    modified = _modified_at(request)
    return web.json_response({"models": [_tag_entry(m, modified) for m in published_models(get_engine(request))]})


async def ps(request: web.Request) -> web.Response:
    expires = _iso(time.time() + 300)
    models = []
    for m in published_models(get_engine(request)):
        name = _tagged(m)
        models.append({"name": name, "model": name, "size": 0, "digest": _digest(m), "details": _details(m),
                       "expires_at": expires, "size_vram": 0})
    return web.json_response({"models": models})


async def show(request: web.Request) -> web.Response:
    req = await parse_body(request, ShowRequest)
    name = req.model or req.name
    if not name:
        raise HttpError(400, "invalid_request", "model is required")
    m = _find(request, name)
    c = m.config
    what = "each session's own model (default: " + m.key + ")" if m.session_model else f"registry model {m.key}"
    # As Ollama names them: editors' Ollama providers choose tool mode by "tools", and chat UIs
    # offer `think` by "thinking". Whether the model behind it reasons is up to that model: one
    # that does not simply sends no thinking.
    settings = proxy_state(request).settings
    capabilities = ["completion"]
    if settings.client_tools != "refuse":
        capabilities.append("tools")
    if settings.reasoning:
        capabilities.append("thinking")
    return web.json_response({
        "license": "",
        "modelfile": f"# aiops agent: {what}\n# {c.type} model {c.model_id}\nFROM {m.key}\n",
        "parameters": "",
        "template": "{{ .Prompt }}",
        "details": _details(m),
        "model_info": {"general.architecture": c.type, "general.basename": m.key,
                       "aiops.model_id": c.model_id, "aiops.description": c.description},
        "capabilities": capabilities,
        "modified_at": _modified_at(request),
    })


# ---- chat and generate ----------------------------------------------------------------------------------


async def chat(request: web.Request) -> web.StreamResponse:
    body = await read_json(request)
    check_message_count(body, proxy_state(request).settings.max_messages)
    req = validate(ChatRequest, body)
    model = _find(request, req.model)  # first, as Ollama: an unknown model is a 404 whatever else is asked
    messages = _chat_messages(req, proxy_state(request).settings.client_tools)
    # Non-empty only: the ollama client sends `"tools": []` with every chat.
    offered = offered_tools(request, req.tools or None)
    framer = OllamaFramer("chat", req.model, thinks=_thinks(req.think),
                          status_lines=proxy_state(request).settings.status_lines)
    if not messages:
        return _load_reply(framer, req.keep_alive)
    return await _answer(request, framer, model, messages, req.stream is not False, req.format, offered)


async def generate(request: web.Request) -> web.StreamResponse:
    req = await parse_body(request, GenerateRequest)
    model = _find(request, req.model)  # first, as Ollama: an unknown model is a 404 whatever else is asked
    messages = _generate_messages(req)
    framer = OllamaFramer("generate", req.model, thinks=_thinks(req.think),
                          status_lines=proxy_state(request).settings.status_lines)
    # Ollama's own test for the load probe: nothing to say at all. A prompt of spaces, or a system
    # prompt alone, is a turn with no question, refused as on the other routes.
    if not req.prompt and not req.system:
        return _load_reply(framer, req.keep_alive)
    return await _answer(request, framer, model, messages, req.stream is not False, req.format)


def _load_reply(framer: OllamaFramer, keep_alive: int | float | str | None) -> web.Response:
    """Ollama's "load the model" (no messages / empty prompt) and "unload" (a keep_alive of zero,
    however written: 0, "0s", "0m0s", "-0s") replies."""
    obj = framer.body("", True)
    unload = keep_alive is not None and _keep_alive_ns(keep_alive) == 0
    obj["done_reason"] = "unload" if unload else "load"
    return web.json_response(obj)


async def _answer(request: web.Request, framer: OllamaFramer, model: PublishedModel,
                  messages: list[ClientMessage], stream: bool, fmt: Any,
                  client_tools: Sequence[ToolSpec] = ()) -> web.StreamResponse:
    if is_background_task(messages):
        return await answer_task(request, model, messages, framer, stream=stream)
    _refuse_json_format(fmt)
    return await answer_turn(request, conversation_id(request, messages), messages, model, framer, stream=stream,
                             client_tools=client_tools)


class OllamaFramer:
    """One answer in Ollama's shapes, `/api/chat` (message.content) or `/api/generate` (response):
    NDJSON lines ending in a `done: true` line with durations and counts, or that line alone as
    the body (see proxy.driver.Framer)."""

    failed_status = 500
    times_text = True  # eval_duration: the time from the first text (or reasoning) to the end
    stream_headers = {"Content-Type": NDJSON}

    def __init__(self, kind: Literal["chat", "generate"], model: str, *, thinks: bool = False,
                 status_lines: bool = True) -> None:
        self.kind = kind
        self.status_lines = status_lines  # `proxy_status_lines`: a failure said in the text too
        self.model = model
        self.wants_reasoning = thinks  # the request asked with `think`
        self.t0 = time.monotonic_ns()
        self.first: int | None = None

    def body(self, text: str, done: bool, thinking: str = "") -> dict[str, Any]:
        """One line: `message.content` (chat) or `response` (generate), and the reasoning beside
        it as Ollama puts it, `message.thinking` or `thinking`, only when there is some."""
        obj: dict[str, Any] = {"model": self.model, "created_at": _iso(time.time())}
        if self.kind == "chat":
            obj["message"] = {"role": "assistant", "content": text}
            if thinking:
                obj["message"]["thinking"] = thinking
        else:
            obj["response"] = text
            if thinking:
                obj["thinking"] = thinking
        obj["done"] = done
        return obj

    def final(self, text: str, usage: dict[str, int] | None, reason: str = "stop",
              thinking: str = "") -> dict[str, Any]:
        end = time.monotonic_ns()
        # Unknown when the text began (a plain model call): all of it counts as generating, so
        # that eval_count / eval_duration, a client's tokens per second, is never a division by 0.
        first = self.first or self.t0
        obj = self.body(text, True, thinking)
        obj["done_reason"] = reason
        obj["total_duration"] = end - self.t0
        obj["load_duration"] = 0
        if usage:
            obj["prompt_eval_count"] = int(usage.get("prompt_tokens", 0))
        obj["prompt_eval_duration"] = first - self.t0
        if usage:
            obj["eval_count"] = int(usage.get("completion_tokens", 0))
        obj["eval_duration"] = end - first
        return obj

    def begin(self, turn_id: str | None) -> None:
        pass

    def head(self) -> bytes:
        return b""

    def text(self, text: str) -> bytes:
        self.text_began()
        return _ndjson(self.body(text, False))

    def reasoning(self, text: str) -> bytes:
        self.text_began()  # the model is generating: its reasoning counts as eval, as Ollama's does
        return _ndjson(self.body("", False, text))

    def text_began(self) -> None:
        if self.first is None:
            self.first = time.monotonic_ns()

    def end(self, end: TurnEnd) -> bytes:
        calls = b""
        if end.client_calls:
            # As Ollama streams a call: a `done: false` line whose message holds the calls.
            line = self.body("", False)
            line["message"]["tool_calls"] = _tool_calls(end.client_calls)
            calls = _ndjson(line)
        return calls + _ndjson(self.final("", end.usage, _reason(end)))

    def error(self, code: str, message: str) -> bytes:
        # Said in the answer's text as well: Open WebUI (0.12) reads only the message of each line
        # of an Ollama stream and drops `error` lines, so a failed model call showed as an empty
        # answer, and one cut mid-stream as a finished one. The status line is left out when the
        # client sends the answer back (proxy.status), so the chat goes on in the same session.
        if not self.status_lines:
            return _ndjson({"error": message})
        said = status_line(REFUSED, f"the answer failed: {message}")
        lead = "\n\n" if self.first is not None else ""
        return _ndjson(self.body(lead + said, False)) + _ndjson({"error": message})

    def keepalive(self) -> bytes:
        # The ollama client parses every line as JSON: a keep-alive is an empty `done: false`
        # line, made afresh each time so its created_at is the time it is sent.
        return _ndjson(self.body("", False))

    def whole(self, end: TurnEnd) -> bytes:
        # body(), not text(): the text exists only now the call is over, and marking it begun here
        # would count the whole call as waiting (eval_duration ~0); unmarked, final() counts it as
        # generating, as the non-streamed answer does.
        return (_ndjson(self.body(end.text, False)) if end.text else b"") + self.end(end)

    def answer(self, text: str, end: TurnEnd) -> dict[str, Any]:
        obj = self.final(text, end.usage, _reason(end), end.reasoning)
        if end.client_calls and self.kind == "chat":
            obj["message"]["tool_calls"] = _tool_calls(end.client_calls)
        return obj


def _reason(end: TurnEnd) -> str:
    # Ollama ends an answer that calls tools with "stop", as any other.
    return "stop" if end.finish_reason == "tool_calls" else end.finish_reason


def _tool_calls(calls: Sequence[ev.ClientCall]) -> list[dict[str, Any]]:
    """Client tool calls in Ollama's shape (`arguments` an object), with our call id, which the
    result may name as `tool_call_id` (it is matched by place and name otherwise)."""
    return [{"id": c.id, "function": {"index": k, "name": c.name, "arguments": dict(c.arguments)}}
            for k, c in enumerate(calls)]


def _ndjson(obj: Any) -> bytes:
    # ASCII only: the ollama client splits the stream as str.splitlines does, so a raw U+2028,
    # U+2029 or U+0085 in an answer would cut its line in two (Ollama's own encoder escapes them).
    return json.dumps(obj).encode() + b"\n"


_NOT_SERVED = {
    "embed": "embeddings", "embeddings": "embeddings", "pull": "model downloads",
    "push": "model uploads", "create": "model creation", "copy": "model copies", "delete": "model deletion",
}


async def not_served(request: web.Request) -> web.Response:
    """Ollama routes of model management and embeddings: aiops is an agent, not a model server.
    Said in Ollama's shape, so a client shows the reason rather than 'no route'."""
    what = _NOT_SERVED[request.path.rsplit("/", 1)[-1]]
    raise HttpError(501, "not_implemented",
                    f"aiops does not serve {what} ({request.path}): it is an agent behind an Ollama-compatible "
                    f"chat API (/api/chat, /api/generate); use a model server for {what}")


def setup(app: web.Application) -> None:
    """Mount the Ollama routes, under `/api` and the legacy `/v1/api` alias, and `GET|HEAD /`."""
    app.router.add_get("/", root)  # HEAD comes with GET
    for prefix in ("/api", "/v1/api"):
        app.router.add_get(f"{prefix}/version", version)
        app.router.add_get(f"{prefix}/tags", tags)
        app.router.add_get(f"{prefix}/ps", ps)
        app.router.add_post(f"{prefix}/show", show)
        app.router.add_post(f"{prefix}/chat", chat)
        app.router.add_post(f"{prefix}/generate", generate)
        for route in ("embed", "embeddings", "pull", "push", "create", "copy", "delete"):
            app.router.add_route("*", f"{prefix}/{route}", not_served)
