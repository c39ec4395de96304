"""The `gemini` model type: Google's Gemini API through the google-genai SDK.

Streams `generate_content_stream`, converts the engine's neutral messages to Gemini contents and
back (thought parts become thinking, functionCall parts become tool calls), sanitises the tools'
JSON schemas into the subset Gemini accepts, and reports every failure as a ModelError phrased for
the operator — never with the API key in it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import ssl
from collections import OrderedDict
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit

import aiohttp
from google import genai
from google.genai import errors as genai_errors
from google.genai import types

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

# Ids we make up for calls Gemini sent without one; they are never sent back to Gemini.
LOCAL_CALL_PREFIX = "gemini_call_"

# Gemini 3 refuses a history whose function calls lack the thought signature it issued. We keep the
# signatures we saw (in memory); for calls we have none for (after a restart, or made by another
# model) Google documents this value as the way to skip the check.
SKIP_SIGNATURE = b"skip_thought_signature_validator"
_MAX_SIGNATURES = 2048

# A key placeholder for a base_url that needs none (a local proxy); the SDK insists on one.
KEYLESS_PLACEHOLDER = "not-needed"

# Model families that reject a thinking_config; anything else gets include_thoughts=True (and loses
# it after the first 400 that complains about thinking).
_NO_THINKING_PREFIXES = ("gemini-1.", "gemini-2.0", "gemma", "learnlm")


def _supports_thinking(model_id: str) -> bool:
    name = model_id.removeprefix("models/").lower()
    return not name.startswith(_NO_THINKING_PREFIXES) or "thinking" in name


# ---- JSON schema -> Gemini schema ----------------------------------------------------------------

_SCALAR_KEYS = ("description", "nullable", "minimum", "maximum", "minItems", "maxItems", "minLength",
                "maxLength", "pattern", "minProperties", "maxProperties")
# Gemini answers 400 for any other `format`.
_FORMATS = {"STRING": {"enum", "date-time"}, "INTEGER": {"int32", "int64"}, "NUMBER": {"float", "double"}}
_JSON_TYPES = {"string": "STRING", "integer": "INTEGER", "number": "NUMBER", "boolean": "BOOLEAN",
               "array": "ARRAY", "object": "OBJECT"}


def gemini_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """The part of a JSON schema (as pydantic writes them) that Gemini's OpenAPI subset accepts.

    Inlines `$ref`s from `$defs`, turns `anyOf [X, null]` into `X` + `nullable`, merges `allOf`,
    upper-cases types, and drops what Gemini rejects (`title`, `default`, `additionalProperties`,
    `$schema`, unknown formats, non-string enums — those are described in words instead).
    """
    defs = {**(schema.get("definitions") or {}), **(schema.get("$defs") or {})}
    return _clean(schema, defs, frozenset())


def _deref(node: dict[str, Any], defs: dict[str, Any], seen: frozenset[str]) -> tuple[dict[str, Any], frozenset[str]]:
    while isinstance(node.get("$ref"), str):
        name = node["$ref"].rsplit("/", 1)[-1]
        rest = {k: v for k, v in node.items() if k != "$ref"}
        if name in seen or not isinstance(defs.get(name), dict):
            # A recursive or unknown reference cannot be inlined: accept any object there.
            return {"type": "object", **rest}, seen
        seen = seen | {name}
        node = {**defs[name], **rest}  # siblings of $ref (a field's description) win
    return node, seen


def _merge_all_of(node: dict[str, Any], defs: dict[str, Any], seen: frozenset[str]) -> dict[str, Any]:
    merged: dict[str, Any] = {}
    for sub in node.get("allOf") or []:
        if not isinstance(sub, dict):
            continue
        sub, _ = _deref(sub, defs, seen)
        props = {**merged.get("properties", {}), **(sub.get("properties") or {})}
        required = [*merged.get("required", []), *(sub.get("required") or [])]
        merged.update(sub)
        if props:
            merged["properties"] = props
        if required:
            merged["required"] = list(dict.fromkeys(required))
    return {**merged, **{k: v for k, v in node.items() if k != "allOf"}}


def _clean(node: Any, defs: dict[str, Any], seen: frozenset[str]) -> dict[str, Any]:
    if not isinstance(node, dict):
        return {}
    node, seen = _deref(node, defs, seen)
    if "allOf" in node:
        node, seen = _deref(_merge_all_of(node, defs, seen), defs, seen)

    out: dict[str, Any] = {}
    nullable = False
    variants = node.get("anyOf") or node.get("oneOf")
    if isinstance(variants, list):
        real = [v for v in variants if not (isinstance(v, dict) and v.get("type") == "null")]
        nullable = len(real) < len(variants)
        if len(real) == 1:
            out.update(_clean(real[0], defs, seen))  # Optional[X] is just X, nullable
        elif real:
            out["anyOf"] = [_clean(v, defs, seen) for v in real]

    json_type = node.get("type")
    if isinstance(json_type, list):
        nullable = nullable or "null" in json_type
        kinds = [t for t in json_type if t != "null"]
        if len(kinds) == 1:
            json_type = kinds[0]
        else:
            json_type = None
            if kinds:
                out["anyOf"] = [{"type": _JSON_TYPES.get(t, "STRING")} for t in kinds]
    gemini_type = _JSON_TYPES.get(json_type) if isinstance(json_type, str) else None

    for key in _SCALAR_KEYS:
        if key in node and node[key] is not None:
            out[key] = node[key]

    enum = node.get("enum")
    if "const" in node:
        enum = [node["const"]]
    if isinstance(enum, list) and enum:
        if all(isinstance(v, str) for v in enum):
            out["enum"] = enum
            gemini_type = gemini_type or "STRING"
        else:
            # Gemini only takes string enums; say the allowed values instead of losing them.
            allowed = "Allowed values: " + ", ".join(str(v) for v in enum) + "."
            out["description"] = f"{out['description']} {allowed}" if out.get("description") else allowed
            if gemini_type is None and all(isinstance(v, bool) for v in enum):
                gemini_type = "BOOLEAN"
            elif gemini_type is None and all(isinstance(v, int) for v in enum):
                gemini_type = "INTEGER"

    if isinstance(node.get("properties"), dict):
        props = {name: _clean(sub, defs, seen) for name, sub in node["properties"].items()}
        if props:
            out["properties"] = props
            required = [r for r in node.get("required") or [] if r in props]
            if required:
                out["required"] = required
        gemini_type = gemini_type or "OBJECT"
    items = node.get("items")
    if isinstance(items, list):  # tuple-style items: the first shape stands for all
        items = items[0] if items else None
    if isinstance(items, dict):
        out["items"] = _clean(items, defs, seen)
        gemini_type = gemini_type or "ARRAY"

    if gemini_type is not None and "anyOf" not in out:
        out["type"] = gemini_type
    fmt = node.get("format")
    if isinstance(fmt, str) and fmt in _FORMATS.get(out.get("type", ""), ()):
        out["format"] = fmt
    if nullable:
        out["nullable"] = True
    return out


def to_gemini_tools(tools: list[ToolSpec]) -> list[types.Tool] | None:
    if not tools:
        return None
    declarations = []
    for t in tools:
        schema = gemini_schema(t.parameters or {})
        # Gemini rejects an OBJECT with no properties: a tool without arguments sends no schema.
        parameters = types.Schema.model_validate(schema) if schema.get("properties") else None
        declarations.append(types.FunctionDeclaration(name=t.name, description=t.description,
                                                      parameters=parameters))
    return [types.Tool(function_declarations=declarations)]


# ---- neutral -> Gemini contents ------------------------------------------------------------------


def to_gemini_contents(messages: list[Message], signatures: dict[str, bytes] | None = None
                       ) -> tuple[list[types.Content], list[str]]:
    """Gemini contents for a conversation, and the text of any system messages in it.

    Assistant turns become role "model" with text and functionCall parts; tool results become
    role "user" functionResponse parts, consecutive results grouped in one content.
    """
    signatures = signatures or {}
    contents: list[types.Content] = []
    system: list[str] = []
    names: dict[str, str] = {}
    results: list[types.Part] = []

    def flush_results() -> None:
        if results:
            contents.append(types.Content(role="user", parts=list(results)))
            results.clear()

    for m in messages:
        if m.role == "tool":
            call_id = m.tool_call_id or ""
            results.append(types.Part(function_response=types.FunctionResponse(
                name=m.name or names.get(call_id, ""), response={"result": m.content},
                id=_wire_id(call_id))))
            continue
        flush_results()
        if m.role == "system":
            system.append(m.content)
        elif m.role == "user":
            contents.append(types.Content(role="user", parts=[types.Part(text=m.content)]))
        elif m.role == "assistant":
            parts = [types.Part(text=m.content)] if m.content else []
            for n, tc in enumerate(m.tool_calls):
                names[tc.id] = tc.name
                signature = signatures.get(tc.id) or (SKIP_SIGNATURE if n == 0 else None)
                parts.append(types.Part(
                    function_call=types.FunctionCall(name=tc.name, args=tc.arguments, id=_wire_id(tc.id)),
                    thought_signature=signature))
            # Earlier thinking is not sent back; Gemini keeps its own context in the signatures.
            if parts:
                contents.append(types.Content(role="model", parts=parts))
    flush_results()
    return contents, system


def _wire_id(call_id: str) -> str | None:
    return None if not call_id or call_id.startswith(LOCAL_CALL_PREFIX) else call_id


# ---- errors -------------------------------------------------------------------------------------


def describe_connection_failure(exc: BaseException, url: str) -> str:
    """Plain words for why talking to the server failed, from the exception chain."""
    for e in _causes(exc):
        if isinstance(e, ConnectionRefusedError) or "connection refused" in str(e).lower():
            return "connection refused"
        if isinstance(e, (socket.gaierror, aiohttp.ClientConnectorDNSError)):
            return f"cannot resolve host {urlsplit(url).hostname or url}"
        if isinstance(e, (ssl.SSLError, aiohttp.ClientSSLError)):
            return f"TLS handshake failed ({e})"
        if isinstance(e, aiohttp.ServerDisconnectedError):
            return "the server closed the connection without answering"
        if isinstance(e, aiohttp.ClientPayloadError):
            return "the server closed the connection mid-response"
        if isinstance(e, ConnectionResetError):
            return "connection reset by the server"
    cause = exc.__cause__ or exc
    return f"connection failed ({type(cause).__name__}: {cause})"


# ---- the backend --------------------------------------------------------------------------------


def _key_invalid(details: Any) -> bool:
    """A Google error whose details give the reason API_KEY_INVALID (google.rpc.ErrorInfo)."""
    error = details.get("error", details) if isinstance(details, dict) else None
    items = error.get("details") if isinstance(error, dict) else None
    return isinstance(items, list) and any(isinstance(d, dict) and d.get("reason") == "API_KEY_INVALID"
                                           for d in items)


class GeminiBackend:
    """Streams generate_content from one configured Gemini model."""

    def __init__(self, key: str, config: ModelConfig, env: dict[str, str] | None = None) -> None:
        self.key = key
        self.config = config
        self._env = env
        self._client: genai.Client | None = None
        self._api_key: str | None = None
        self._thinking = _supports_thinking(config.model_id)
        self._signatures: OrderedDict[str, bytes] = OrderedDict()

    @property
    def url(self) -> str:
        return self.config.display_url()

    def _error(self, reason: str, *, status: int | None = None, retryable: bool = False,
               cause: FailureCause | None = None) -> ModelError:
        if self._api_key and self._api_key != KEYLESS_PLACEHOLDER:
            reason = reason.replace(self._api_key, "[redacted]")
        return ModelError(self.key, self.url, reason, status=status, retryable=retryable, cause=cause)

    def _resolve_api_key(self) -> str:
        if self.config.api_key_env:
            key = self.config.api_key(self._env)
            if not key:
                raise self._error(f"no API key: the environment variable {self.config.api_key_env} is not set",
                                  cause="key")
            return key
        if self.config.base_url:
            return KEYLESS_PLACEHOLDER
        env = os.environ if self._env is None else self._env
        key = env.get("GEMINI_API_KEY") or env.get("GOOGLE_API_KEY")
        if not key:
            raise self._error("no API key: set api_key_env for this model in models.toml", cause="key")
        return key

    def _get_client(self) -> genai.Client:
        if self._client is not None:
            return self._client
        self._api_key = self._resolve_api_key()
        # One attempt: otherwise the SDK sleeps 1-10s and retries a refused connection by itself;
        # retrying is the engine's call (ModelError.retryable). No SDK timeout either: with aiohttp
        # it bounds the whole streamed answer, so stream() bounds silence itself instead.
        options = types.HttpOptions(base_url=self.config.base_url,
                                    retry_options=types.HttpRetryOptions(attempts=1))
        self._client = genai.Client(api_key=self._api_key, http_options=options)
        return self._client

    def _generation_config(self, tools: list[ToolSpec], system: str | None,
                           extra_system: list[str]) -> types.GenerateContentConfig:
        system_text = "\n\n".join(s for s in [system or "", *extra_system] if s)
        return types.GenerateContentConfig(
            system_instruction=system_text or None,
            tools=to_gemini_tools(tools),
            temperature=self.config.temperature,
            top_p=self.config.top_p,
            top_k=self.config.top_k,
            max_output_tokens=self.config.max_tokens,
            thinking_config=types.ThinkingConfig(include_thoughts=True) if self._thinking else None,
            # Tools run in the engine, behind gates: the SDK must never call anything itself.
            automatic_function_calling=types.AutomaticFunctionCallingConfig(disable=True),
        )

    def _translate(self, exc: BaseException, *, started: bool) -> ModelError:
        if isinstance(exc, genai_errors.APIError):
            code = exc.code
            message = exc.message or exc.status or ""
            # Gemini refuses a wrong key with a 400, and says so in the error's details.
            return self._error(f"HTTP {code}: {message}" if message else f"HTTP {code}", status=code,
                               retryable=code in (408, 409, 429) or code >= 500,
                               cause="key" if _key_invalid(exc.details) else None)
        if isinstance(exc, TimeoutError):
            return self._error(f"timed out after {self.config.timeout:g}s with no data from the server",
                               retryable=True, cause="connection")
        if isinstance(exc, genai_errors.UnknownApiResponseError):
            return self._error(f"the server sent something that is not a Gemini response ({exc})")
        what = describe_connection_failure(exc, self.url)
        if started:
            return self._error(f"stream ended unexpectedly: {what}", retryable=True, cause="connection")
        return self._error(what, retryable=True, cause="connection")

    def _remember_signature(self, call_id: str, signature: bytes) -> None:
        self._signatures[call_id] = signature
        while len(self._signatures) > _MAX_SIGNATURES:
            self._signatures.popitem(last=False)

    async def _next(self, chunks: AsyncIterator[types.GenerateContentResponse]
                    ) -> types.GenerateContentResponse | None:
        """The next chunk, or None at the end; silence longer than the timeout raises."""
        async with asyncio.timeout(self.config.timeout):
            try:
                return await anext(chunks)
            except StopAsyncIteration:
                return None

    async def _open(self, messages: list[Message], tools: list[ToolSpec], system: str | None
                    ) -> tuple[AsyncIterator[types.GenerateContentResponse], types.GenerateContentResponse | None]:
        """Start the stream and wait for its first chunk (that is when HTTP errors show)."""
        client = self._get_client()
        contents, extra_system = to_gemini_contents(messages, self._signatures)
        for attempt in range(2):
            config = self._generation_config(tools, system, extra_system)
            chunks: AsyncIterator[types.GenerateContentResponse] | None = None
            try:
                async with asyncio.timeout(self.config.timeout):
                    chunks = await client.aio.models.generate_content_stream(
                        model=self.config.model_id, contents=contents, config=config)
                return chunks, await self._next(chunks)
            except genai_errors.APIError as e:
                await _close(chunks)
                thinking_refused = (e.code == 400 and self._thinking
                                    and "thinking" in (e.message or "").lower())
                if thinking_refused and attempt == 0:
                    self._thinking = False  # this model has no thinking: ask again without
                    continue
                raise self._translate(e, started=False) from e
            except (TimeoutError, aiohttp.ClientError, OSError, genai_errors.UnknownApiResponseError) as e:
                await _close(chunks)
                raise self._translate(e, started=False) from e
        raise AssertionError("unreachable")

    async def stream(self, messages: list[Message], tools: list[ToolSpec], *,
                     system: str | None = None) -> AsyncIterator[StreamItem]:
        chunks, chunk = await self._open(messages, tools, system)
        text: list[str] = []
        thinking: list[str] = []
        calls: list[ToolCall] = []
        usage: Usage | None = None
        finish: str | None = None
        try:
            while chunk is not None:
                if chunk.usage_metadata is not None:
                    meta = chunk.usage_metadata
                    usage = Usage(prompt_tokens=meta.prompt_token_count or 0,
                                  completion_tokens=(meta.candidates_token_count or 0)
                                  + (meta.thoughts_token_count or 0))
                candidate = chunk.candidates[0] if chunk.candidates else None
                if candidate is None and chunk.prompt_feedback and chunk.prompt_feedback.block_reason:
                    reason = _enum_name(chunk.prompt_feedback.block_reason)
                    raise self._error(f"the prompt was blocked ({reason})")
                if candidate is not None:
                    for part in (candidate.content.parts if candidate.content else None) or []:
                        if part.function_call is not None:
                            calls.append(self._tool_call(part))
                        elif part.text:
                            if part.thought:
                                thinking.append(part.text)
                                yield ThinkingDelta(part.text)
                            else:
                                text.append(part.text)
                                yield TextDelta(part.text)
                    if candidate.finish_reason is not None:
                        finish = _enum_name(candidate.finish_reason)
                try:
                    chunk = await self._next(chunks)
                except (TimeoutError, aiohttp.ClientError, OSError, genai_errors.APIError,
                        genai_errors.UnknownApiResponseError) as e:
                    raise self._translate(e, started=True) from e
        finally:
            await _close(chunks)
        if finish is None:
            raise self._error("stream ended unexpectedly: the server closed it without a finishReason",
                              retryable=True)
        yield Completion(text="".join(text), thinking="".join(thinking), tool_calls=calls, usage=usage,
                         finish_reason=_finish_reason(finish, bool(calls)))

    def _tool_call(self, part: types.Part) -> ToolCall:
        fc = part.function_call
        assert fc is not None
        call_id = fc.id or new_id(LOCAL_CALL_PREFIX)
        if part.thought_signature:
            self._remember_signature(call_id, part.thought_signature)
        name = fc.name or ""
        return ToolCall(id=call_id, name=name, arguments=dict(fc.args or {}),
                        parse_error=None if name else "the model sent a function call without a name")

    async def aclose(self) -> None:
        if self._client is not None:
            client, self._client = self._client, None
            with contextlib.suppress(Exception):
                await client.aio.aclose()
            with contextlib.suppress(Exception):
                client.close()


async def _close(chunks: Any) -> None:
    """Close the SDK's stream generator, which releases (or drops) the HTTP connection."""
    aclose = getattr(chunks, "aclose", None)
    if aclose is not None:
        with contextlib.suppress(Exception):
            await aclose()


def _enum_name(value: Any) -> str:
    return str(getattr(value, "value", value))


_FILTERED = {"SAFETY", "RECITATION", "BLOCKLIST", "PROHIBITED_CONTENT", "SPII", "IMAGE_SAFETY",
             "IMAGE_PROHIBITED_CONTENT", "IMAGE_RECITATION"}


def _finish_reason(gemini_reason: str, has_calls: bool) -> str:
    """Gemini's finishReason in the engine's (OpenAI-style) words."""
    if gemini_reason == "STOP":
        return "tool_calls" if has_calls else "stop"
    if gemini_reason == "MAX_TOKENS":
        return "length"
    if gemini_reason in _FILTERED:
        return "content_filter"
    return gemini_reason.lower()
