"""Fake web-search and extraction APIs: Tavily (search, extract), xAI (Responses API with web
search) and Gemini with Google Search grounding. Each speaks its service's wire shapes closely
enough for the real client code (aiohttp, the openai SDK, google-genai) and records what it got.

    with FakeTavily(api_key="tvly-test") as tavily:
        tavily.results = [{"title": "A", "url": "https://a.example", "content": "..."}]
        ... url_extract / tavily_search with base_url = tavily.base_url
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from tests.fakes.openai_server import FakeServer


@dataclass(frozen=True, slots=True)
class Hit:
    """One request as a fake received it."""

    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]  # names lower-cased
    json: Any


class _RecordingServer(FakeServer):
    def __init__(self, api_key: str) -> None:
        super().__init__(api_key=api_key)
        self.hits: list[Hit] = []
        self._lock = threading.Lock()
        # Seconds every answer waits first (for timeouts).
        self.delay = 0.0

    async def _record(self, request: web.Request) -> Any:
        try:
            body = await request.json()
        except ValueError:
            body = None
        with self._lock:
            self.hits.append(Hit(request.method, request.path, dict(request.query),
                                 {k.lower(): v for k, v in request.headers.items()}, body))
        if self.delay:
            import asyncio

            await asyncio.sleep(self.delay)
        return body


class FakeTavily(_RecordingServer):
    """POST /search and /extract, with Tavily's bearer-key auth and error shape."""

    def __init__(self, api_key: str = "tvly-test-key") -> None:
        super().__init__(api_key)
        self.answer = ""
        self.results: list[dict[str, Any]] = []
        # url -> the page's Markdown; a URL not here fails extraction; "" means fetched, no text.
        self.pages: dict[str, str] = {}

    def _add_routes(self, app: web.Application) -> None:
        app.router.add_post("/search", self._search)
        app.router.add_post("/extract", self._extract)

    def _unauthorized(self, request: web.Request) -> web.Response | None:
        if request.headers.get("Authorization") != f"Bearer {self.api_key}":
            return web.json_response({"detail": {"error": "Unauthorized: missing or invalid API key."}},
                                     status=401)
        return None

    async def _search(self, request: web.Request) -> web.Response:
        body = await self._record(request)
        if (denied := self._unauthorized(request)) is not None:
            return denied
        n = int(body.get("max_results", 5))
        return web.json_response({"query": body["query"], "answer": self.answer if body.get("include_answer") else None,
                                  "results": [{**r, "score": 0.9} for r in self.results[:n]],
                                  "response_time": 0.1})

    async def _extract(self, request: web.Request) -> web.Response:
        body = await self._record(request)
        if (denied := self._unauthorized(request)) is not None:
            return denied
        results, failed = [], []
        for url in body["urls"]:
            if url not in self.pages:
                failed.append({"url": url, "error": "Failed to fetch url"})
                continue
            content = self.pages[url]
            if body.get("query") and content:
                # Tavily's reranked chunks: here, the paragraphs naming a word of the query.
                words = body["query"].lower().split()
                chunks = [p for p in content.split("\n\n") if any(w in p.lower() for w in words)]
                content = " [...] ".join(chunks[:int(body.get("chunks_per_source", 3))])
            results.append({"url": url, "raw_content": content, "images": []})
        return web.json_response({"results": results, "failed_results": failed, "response_time": 0.2})


class FakeXai(_RecordingServer):
    """POST /v1/responses: xAI's Responses API with the web_search tool; answers with a message
    whose text carries url_citation annotations, plus xAI's top-level `citations` list."""

    path_prefix = "/v1"

    def __init__(self, api_key: str = "xai-test-key") -> None:
        super().__init__(api_key)
        self.answer = ""
        self.citations: list[tuple[str, str]] = []  # (url, title)

    def _add_routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/responses", self._responses)

    async def _responses(self, request: web.Request) -> web.Response:
        body = await self._record(request)
        if request.headers.get("Authorization") != f"Bearer {self.api_key}":
            return web.json_response({"code": "Client specified an invalid argument",
                                      "error": "Incorrect API key provided: xa***ey."}, status=400)
        annotations = [{"type": "url_citation", "url": u, "title": t, "start_index": 0,
                        "end_index": len(self.answer)} for u, t in self.citations]
        return web.json_response({
            "id": "resp_fake", "object": "response", "created_at": int(time.time()), "model": body["model"],
            "status": "completed", "parallel_tool_calls": True, "tool_choice": "auto", "tools": body.get("tools", []),
            "output": [
                {"type": "web_search_call", "id": "ws_1", "status": "completed",
                 "action": {"type": "search", "query": body["input"]}},
                {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
                 "content": [{"type": "output_text", "text": self.answer, "annotations": annotations}]},
            ],
            "citations": [u for u, _ in self.citations],
            "usage": {"input_tokens": 10, "output_tokens": 20, "total_tokens": 30,
                      "input_tokens_details": {"cached_tokens": 0}, "output_tokens_details": {"reasoning_tokens": 0}},
        })


class FakeGeminiSearch(_RecordingServer):
    """`models/{model}:generateContent` with a `googleSearch` tool: a grounded answer.

    Authentication as Google's: the key in the `x-goog-api-key` header; `fail` answers every call
    with that HTTP status and Google's error object instead."""

    def __init__(self, api_key: str = "gemini-test-key") -> None:
        super().__init__(api_key)
        self.answer = ""
        self.chunks: list[tuple[str, str]] = []  # (uri, title)
        self.fail: int | None = None

    def _add_routes(self, app: web.Application) -> None:
        app.router.add_post("/{version}/models/{model}:generateContent", self._generate)

    async def _generate(self, request: web.Request) -> web.Response:
        body = await self._record(request)
        if request.headers.get("x-goog-api-key") != self.api_key:
            return web.json_response({"error": {"code": 400, "message": "API key not valid. Please pass a valid "
                                                "API key.", "status": "INVALID_ARGUMENT"}}, status=400)
        if self.fail:
            return web.json_response({"error": {"code": self.fail, "message": "Resource has been exhausted",
                                                "status": "RESOURCE_EXHAUSTED"}}, status=self.fail)
        if not any("googleSearch" in t or "google_search" in t for t in body.get("tools") or []):
            return web.json_response({"candidates": [{"content": {"role": "model", "parts": [
                {"text": "(no search tool was given)"}]}, "finishReason": "STOP"}]})
        query = body["contents"][-1]["parts"][0]["text"]
        return web.json_response({
            "candidates": [{
                "content": {"role": "model", "parts": [{"text": self.answer}]},
                "finishReason": "STOP",
                "groundingMetadata": {
                    "webSearchQueries": [query],
                    "groundingChunks": [{"web": {"uri": u, "title": t}} for u, t in self.chunks],
                    "groundingSupports": [{"segment": {"startIndex": 0, "endIndex": len(self.answer),
                                                       "text": self.answer},
                                           "groundingChunkIndices": list(range(len(self.chunks)))}],
                },
            }],
            "usageMetadata": {"promptTokenCount": 5, "candidatesTokenCount": 10, "totalTokenCount": 15},
            "modelVersion": request.match_info["model"],
        })
