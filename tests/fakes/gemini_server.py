"""A fake Gemini API server (generativelanguage.googleapis.com) for the google-genai SDK.

Same scripting API as `tests.fakes.openai_server` (the `Reply`/`Call` builders are shared and
re-exported here); only the wire shapes differ:

    with FakeGemini() as fake:                       # or the `fake_gemini` fixture
        fake.script(Reply.reasoning("hmm", then_text="42"))
        client = genai.Client(api_key="x", http_options=types.HttpOptions(base_url=fake.url))

The SDK builds `<base_url>/<api version>/models/<model>:generateContent` (or
`:streamGenerateContent?alt=sse`); the fake answers on any version segment (the 3.x SDK uses
"v1", older ones "v1beta"). Streams are SSE `data: <GenerateContentResponse JSON>` events: text
parts, `thought: true` parts for thinking, `functionCall` parts (name, args, id) — all the calls
of one reply in one event, as Gemini sends parallel calls — with `finishReason` and the full
`usageMetadata` on the last event. Errors use Google's `{"error": {"code", "message", "status"}}`.

Like Gemini 3, the first function call of a reply carries a `thoughtSignature` (turn it off
with `thought_signatures=False`), so tests can check that a backend hands it back.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import threading
import uuid
from collections.abc import Iterable
from typing import Any

from aiohttp import web

from tests.fakes.openai_server import (
    Call,
    CallLike,
    FakeServer,
    RecordedRequest,
    Reply,
    Responder,
    estimate_tokens,
    split_text,
    sse_frame,
)

__all__ = ["Call", "FakeGemini", "RecordedRequest", "Reply", "call_tool_when", "function_responses",
           "last_user_text"]

_GOOGLE_STATUS: dict[int, str] = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    409: "ABORTED",
    429: "RESOURCE_EXHAUSTED",
    499: "CANCELLED",
    500: "INTERNAL",
    501: "NOT_IMPLEMENTED",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}


def _parts(content: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in content.get("parts") or [] if isinstance(p, dict)]


def last_user_text(body: dict[str, Any]) -> str:
    """The text of the last user content that has text (function responses are skipped)."""
    for c in reversed(body.get("contents") or []):
        if c.get("role", "user") != "user":
            continue
        texts = [p["text"] for p in _parts(c) if isinstance(p.get("text"), str) and not p.get("thought")]
        if texts:
            return "".join(texts)
    return ""


def function_responses(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The `functionResponse` objects of the last content, if it is one of tool results."""
    contents = body.get("contents") or []
    if not contents:
        return []
    return [p["functionResponse"] for p in _parts(contents[-1]) if "functionResponse" in p]


def _response_text(fr: dict[str, Any]) -> str:
    response = fr.get("response")
    if isinstance(response, dict) and len(response) == 1:
        return str(next(iter(response.values())))
    return str(response)


def call_tool_when(trigger: str, *calls: CallLike, then_text: str | None = None) -> Responder:
    """A responder for multi-step turns: a user text containing `trigger` gets the function calls;
    a conversation ending in function responses gets `then_text` (default "tool said: <results>");
    anything else falls through to the echo."""

    def respond(body: dict[str, Any]) -> Reply | None:
        results = function_responses(body)
        if results:
            return Reply.text(then_text if then_text is not None
                              else "tool said: " + " | ".join(_response_text(r) for r in results))
        contents = body.get("contents") or []
        if contents and contents[-1].get("role", "user") == "user" and trigger in "".join(
                str(p.get("text", "")) for p in _parts(contents[-1])):
            return Reply.tool_calls(*calls)
        return None

    return respond


def signature_for(call_id: str) -> str:
    """The base64 thoughtSignature the fake attaches to the call with this id."""
    return base64.b64encode(f"sig-{call_id}".encode()).decode()


class FakeGemini(FakeServer):
    """Speaks the Gemini API's generateContent / streamGenerateContent / models list."""

    path_prefix = ""

    def __init__(self, *, models: Iterable[str] = ("gemini-fake",), responder: Responder | None = None,
                 api_key: str | None = None, call_ids: bool = True, thought_signatures: bool = True,
                 host: str = "127.0.0.1", port: int = 0) -> None:
        super().__init__(responder=responder, api_key=api_key, host=host, port=port)
        self.models = list(models)
        self.call_ids = call_ids  # Gemini 3 sends ids with function calls; older models did not
        self.thought_signatures = thought_signatures

    def _add_routes(self, app: web.Application) -> None:
        # "models/gemini-x:streamGenerateContent" is one path segment to aiohttp.
        app.router.add_post("/{version}/models/{model_action}", self._generate)
        app.router.add_get("/{version}/models", self._list_models)

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        model, _, action = request.match_info["model_action"].rpartition(":")
        if action not in ("generateContent", "streamGenerateContent") or not model:
            return self._error_response(Reply.error(404, f"unknown method {action!r}"))
        return await self._serve(request, model=model, stream=action == "streamGenerateContent")

    async def _list_models(self, request: web.Request) -> web.Response:
        if err := self._auth_error(request):
            return self._error_response(err)
        return web.json_response({"models": [
            {"name": f"models/{m}", "displayName": m, "inputTokenLimit": 1_048_576,
             "outputTokenLimit": 65_536, "thinking": True,
             "supportedGenerationMethods": ["generateContent", "countTokens"]} for m in self.models]})

    def _auth_error(self, request: web.Request) -> Reply | None:
        if self.api_key is None:
            return None
        got = request.headers.get("x-goog-api-key") or request.query.get("key") or ""
        if got == self.api_key:
            return None
        return Reply.error(400, "API key not valid. Please pass a valid API key.",
                           error_type="INVALID_ARGUMENT")

    def _error_response(self, reply: Reply) -> web.Response:
        status = reply.error_type or _GOOGLE_STATUS.get(reply.status, "UNKNOWN")
        error: dict[str, Any] = {"code": reply.status, "message": reply.error_message, "status": status}
        if reply.error_message.startswith("API key not valid"):
            error["details"] = [{"@type": "type.googleapis.com/google.rpc.ErrorInfo",
                                 "reason": "API_KEY_INVALID", "domain": "googleapis.com"}]
        return web.json_response({"error": error}, status=reply.status)

    # -- rendering --

    def _usage(self, body: dict[str, Any], reply: Reply, text: str, calls: list[Call],
               final: bool) -> dict[str, Any]:
        texts = [str(p.get("text", "")) for c in body.get("contents") or [] for p in _parts(c)]
        system = body.get("systemInstruction") or {}
        texts += [str(p.get("text", "")) for p in _parts(system)]
        if reply.usage is not None:
            prompt, candidates = reply.usage
            thoughts = 0
        else:
            prompt = estimate_tokens(*texts)
            thoughts = estimate_tokens(reply.thinking)
            candidates = estimate_tokens(text, *(c.arguments_json() for c in calls)) or 1
        if not final:
            return {"promptTokenCount": prompt, "totalTokenCount": prompt}
        usage = {"promptTokenCount": prompt, "candidatesTokenCount": candidates,
                 "totalTokenCount": prompt + candidates + thoughts}
        if thoughts:
            usage["thoughtsTokenCount"] = thoughts
        return usage

    def _call_part(self, call: Call, first: bool) -> dict[str, Any]:
        fc: dict[str, Any] = {"name": call.name, "args": call.arguments_dict()}
        call_id = call.id or f"fc_{uuid.uuid4().hex[:16]}"
        if self.call_ids:
            fc["id"] = call_id
        part: dict[str, Any] = {"functionCall": fc}
        if first and self.thought_signatures:
            part["thoughtSignature"] = signature_for(call_id)
        return part

    async def _render(self, request: web.Request, body: dict[str, Any], reply: Reply, *,
                      model: str, stream: bool) -> web.StreamResponse:
        text = reply.content if reply.content is not None else f"echo: {last_user_text(body)}"
        calls = list(reply.calls)
        call_parts = [self._call_part(c, i == 0) for i, c in enumerate(calls)]
        finish = reply.finish_reason or "STOP"  # Gemini says STOP after function calls too
        response_id = uuid.uuid4().hex[:20]

        def event(parts: list[dict[str, Any]], final: bool) -> dict[str, Any]:
            candidate: dict[str, Any] = {"content": {"parts": parts, "role": "model"}, "index": 0}
            if final:
                candidate["finishReason"] = finish
            return {"candidates": [candidate],
                    "usageMetadata": self._usage(body, reply, text, calls, final),
                    "modelVersion": model, "responseId": response_id}

        if not stream:
            parts = ([{"text": reply.thinking, "thought": True}] if reply.thinking else [])
            parts += ([{"text": text}] if text else []) + call_parts
            return await self._send_json(request, reply, event(parts or [{"text": ""}], True))

        groups: list[list[dict[str, Any]]] = [[{"text": p, "thought": True}]
                                              for p in split_text(reply.thinking, reply.chunks)]
        groups += [[{"text": p}] for p in split_text(text, reply.chunks)]
        if call_parts:
            groups.append(call_parts)
        groups = groups or [[{"text": ""}]]
        frames = [sse_frame(event(g, i == len(groups) - 1)) for i, g in enumerate(groups)]
        return await self._send_sse(request, reply, frames)


def _main() -> None:
    parser = argparse.ArgumentParser(description="Run the fake Gemini server (echo replies) until ^C.")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--api-key")
    args = parser.parse_args()
    with FakeGemini(port=args.port, api_key=args.api_key) as fake:
        print(fake.url, flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            threading.Event().wait()


if __name__ == "__main__":
    _main()
