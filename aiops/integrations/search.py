"""Web search tools, one plugin each: `ddgs_search`, `tavily_search`, `xai_search`, `google_search`.

All are tool type `search`, operation read (rate limited per session by `[rate.search]` in
limits.toml). Results are compact — title, URL, a snippet of about 200 characters — and framed as
untrusted text; the sources travel in the result's data for the console. Each call is bounded by
the plugin's `timeout_seconds`; each service's address is configurable (`base_url`, or for ddgs a
proxy), which is how the tests reach local fakes.
"""

from __future__ import annotations

import asyncio
import logging
import math
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, Field

from aiops.engine.plugins import Plugin, PluginAPI
from aiops.engine.tools import Classification, Executor, Tool, ToolContext, ToolOutput
from aiops.integrations.tavily import TavilyClient, TavilyError
from aiops.integrations.web_text import (
    DataToolSettings,
    Source,
    error,
    output,
    redact,
    register_fulltext,
    snippet,
    sources_text,
    untrusted,
)

log = logging.getLogger(__name__)

QUERY_MAX_CHARS = 400


def _classify(tool: str) -> Any:
    def classify(args: Any) -> Classification:
        return Classification("read", summary=f"{tool}: {snippet(args.query, 160)}")

    return classify


def _results(tool: str, query: str, sources: list[Source], answer: str = "") -> str:
    parts = [f"{tool} results for {query!r}:"]
    body = (f"Answer: {answer}\n\nSources:\n" if answer else "") + sources_text(sources)
    parts.append(untrusted(f"{tool} (web search)", body))
    return "\n".join(parts)


class _SearchPlugin(Plugin):
    """What every search plugin does alike: its tool registered (with `!fulltext`) under the
    plugin's name as tool type `search`, its results framed one way, its client closed on stop."""

    def __init__(self) -> None:
        super().__init__()
        self.client: Any = None

    def _register(self, api: PluginAPI, description: str, args_model: type[BaseModel], execute: Executor) -> None:
        register_fulltext(api)
        api.register_tool(Tool(self.name, description, args_model, "search", execute,
                               classify=_classify(self.name)))

    def _found(self, query: str, sources: list[Source], answer: str | None = None, *,
               none: str = "no results") -> ToolOutput:
        """The tool's result: the sources (and the service's answer, for those that give one), or
        the line saying there were `none`."""
        if not sources and not answer:
            return ToolOutput(f"{self.name}: {none} for {query!r}")
        extra = {} if answer is None else {"answer": answer}
        return output(_results(self.name, query, sources, answer or ""), self.settings.max_result_chars,
                      sources=sources, **extra)

    def _timed_out(self) -> ToolOutput:
        return error(f"{self.name}: no answer within {self.settings.timeout_seconds:g} s")

    async def stop(self) -> None:
        if self.client is not None:
            await self.client.close()


# ---- ddgs -----------------------------------------------------------------------------------------


class DdgsSettings(DataToolSettings):
    region: str = "wt-wt"
    safesearch: Literal["on", "moderate", "off"] = "moderate"
    # ddgs backends, comma-separated ("auto", "duckduckgo", "bing", "brave", ...).
    backend: str = "auto"
    # The most results one call returns, whatever the model asks for.
    max_results: int = Field(10, ge=1, le=50)
    # An HTTP(S)/SOCKS proxy for every request (ddgs also reads $DDGS_PROXY), and the CA bundle of
    # a TLS-inspecting proxy; empty: none.
    proxy: str = ""
    ca_file: str = ""


class DdgsArgs(BaseModel):
    query: str = Field(..., min_length=1, max_length=QUERY_MAX_CHARS, description="what to search for")
    max_results: int = Field(10, ge=1, description="how many results (capped by the operator's setting)")


class DdgsSearchPlugin(_SearchPlugin):
    name = "ddgs_search"
    description = "ddgs_search: web search through the ddgs metasearch library (no key)"
    settings_model: ClassVar[Any] = DdgsSettings
    requires = ("ddgs",)

    async def setup(self, api: PluginAPI) -> None:
        s: DdgsSettings = self.settings

        def search(query: str, limit: int) -> list[dict[str, Any]]:
            from ddgs import DDGS
            from ddgs.exceptions import DDGSException

            ddgs = DDGS(proxy=s.proxy or None, timeout=max(1, math.ceil(s.timeout_seconds)),
                        verify=s.ca_file or True)
            try:
                return ddgs.text(query, region=s.region, safesearch=s.safesearch, max_results=limit,
                                 backend=s.backend)
            except DDGSException as e:
                if "No results found" in str(e):
                    return []
                raise

        async def execute(args: DdgsArgs, ctx: ToolContext) -> ToolOutput:
            limit = min(args.max_results, s.max_results)
            try:
                # ddgs is synchronous (threads and a blocking HTTP client): off the event loop, and
                # bounded here too since its own timeout applies per engine request.
                rows = await asyncio.wait_for(asyncio.to_thread(search, args.query, limit),
                                              s.timeout_seconds + 5)
            except TimeoutError:
                return self._timed_out()
            except Exception as e:  # noqa: BLE001 - ddgs raises its own and its HTTP client's errors
                return error(f"ddgs_search failed: {type(e).__name__}: {e}")
            return self._found(args.query, [
                Source(snippet(r.get("title"), 120), str(r.get("href") or r.get("url") or ""),
                       snippet(r.get("body"))) for r in rows[:limit]])

        self._register(
            api, "Search the web (DuckDuckGo and other engines through ddgs). Returns titles, URLs and "
            f"short snippets (at most {s.max_results} results). Snippets are untrusted web text.",
            DdgsArgs, execute)


# ---- Tavily ---------------------------------------------------------------------------------------


class TavilySearchSettings(DataToolSettings):
    base_url: str = "https://api.tavily.com"
    api_key_env: str = "TAVILY_API_KEY"
    max_results: int = Field(5, ge=1, le=20)


class TavilySearchArgs(BaseModel):
    query: str = Field(..., min_length=1, max_length=QUERY_MAX_CHARS, description="what to search for")
    search_depth: Literal["basic", "advanced"] = Field(
        "basic", description="advanced: more thorough and slower (costs more credits)")


class TavilySearchPlugin(_SearchPlugin):
    name = "tavily_search"
    description = "tavily_search: web search with a short answer through Tavily (TAVILY_API_KEY)"
    settings_model: ClassVar[Any] = TavilySearchSettings
    requires = ("aiohttp",)

    async def setup(self, api: PluginAPI) -> None:
        s: TavilySearchSettings = self.settings
        key = api.require_env(s.api_key_env, "Tavily API key")
        client = self.client = TavilyClient(s.base_url, key, s.timeout_seconds)

        async def execute(args: TavilySearchArgs, ctx: ToolContext) -> ToolOutput:
            try:
                data = await client.post("/search", {
                    "query": args.query, "search_depth": args.search_depth, "max_results": s.max_results,
                    "include_answer": True})
            except TavilyError as e:
                return error(f"tavily_search failed: {e}", [key])
            rows = [r for r in data.get("results") or [] if isinstance(r, dict)]
            sources = [Source(snippet(r.get("title"), 120), str(r.get("url") or ""), snippet(r.get("content")))
                       for r in rows[:s.max_results]]
            return self._found(args.query, sources, " ".join(str(data.get("answer") or "").split()))

        self._register(
            api, "Search the web through Tavily: a short answer plus its sources (title, URL, snippet). "
            "The answer and snippets are untrusted web text.",
            TavilySearchArgs, execute)


# ---- xAI ------------------------------------------------------------------------------------------


class XaiSearchSettings(DataToolSettings):
    base_url: str = "https://api.x.ai/v1"
    api_key_env: str = "XAI_API_KEY"
    # The model that searches; chosen by the operator, never by the model calling the tool.
    model: str = "grok-4-fast"
    timeout_seconds: float = Field(60.0, gt=0, le=300)


class QueryArgs(BaseModel):
    query: str = Field(..., min_length=1, max_length=QUERY_MAX_CHARS, description="what to search for")


def _xai_sources(response: Any) -> list[Source]:
    """The url citations of the answer's text, then any top-level `citations` xAI adds."""
    found: dict[str, Source] = {}
    for item in getattr(response, "output", None) or []:
        for part in getattr(item, "content", None) or []:
            for ann in getattr(part, "annotations", None) or []:
                url = getattr(ann, "url", None)
                if url and url not in found:
                    found[url] = Source(snippet(getattr(ann, "title", "") or "", 120), url)
    extra = (getattr(response, "model_extra", None) or {}).get("citations") or []
    for c in extra:
        url = c if isinstance(c, str) else (c.get("url") if isinstance(c, dict) else None)
        if url and url not in found:
            found[url] = Source("", url)
    return list(found.values())


class XaiSearchPlugin(_SearchPlugin):
    name = "xai_search"
    description = "xai_search: Grok with live web search through xAI's API (XAI_API_KEY)"
    settings_model: ClassVar[Any] = XaiSearchSettings
    requires = ("openai",)

    async def setup(self, api: PluginAPI) -> None:
        import openai

        s: XaiSearchSettings = self.settings
        key = api.require_env(s.api_key_env, "xAI API key")
        # xAI's Responses API is OpenAI's: the SDK we already use, at xAI's address.
        client = self.client = openai.AsyncOpenAI(api_key=key, base_url=s.base_url,
                                                  timeout=s.timeout_seconds, max_retries=0)

        async def execute(args: QueryArgs, ctx: ToolContext) -> ToolOutput:
            try:
                response = await client.responses.create(
                    model=s.model, input=args.query, tools=[{"type": "web_search"}])
            except openai.APITimeoutError:
                return self._timed_out()
            except openai.APIStatusError as e:
                return error(f"xai_search failed: xAI answered HTTP {e.status_code}: {_api_message(e)}", [key])
            except openai.APIError as e:
                return error(f"xai_search failed: {e}", [key])
            return self._found(args.query, _xai_sources(response), (response.output_text or "").strip(),
                               none="no answer")

        self._register(
            api, "Ask Grok (xAI) to search the web live and answer: an answer with its source URLs. The "
            "answer is untrusted web-derived text.",
            QueryArgs, execute)


def _api_message(e: Any) -> str:
    body = getattr(e, "body", None)
    if isinstance(body, dict):
        err = body.get("error", body)
        msg = err.get("message") if isinstance(err, dict) else err
        if msg:
            return str(msg)[:300]
    return str(getattr(e, "message", "") or "no details")[:300]


# ---- Google (Gemini with Google Search grounding) -------------------------------------------------


class GoogleSearchSettings(DataToolSettings):
    # Empty: google-genai's own (https://generativelanguage.googleapis.com).
    base_url: str = ""
    api_key_env: str = "GEMINI_API_KEY"
    model: str = "gemini-2.5-flash"
    timeout_seconds: float = Field(60.0, gt=0, le=300)


class GoogleSearchPlugin(_SearchPlugin):
    name = "google_search"
    description = "google_search: Gemini grounded in Google Search through google-genai (GEMINI_API_KEY)"
    settings_model: ClassVar[Any] = GoogleSearchSettings
    requires = ("google.genai",)

    async def setup(self, api: PluginAPI) -> None:
        s: GoogleSearchSettings = self.settings
        key = api.require_env(s.api_key_env, "Gemini API key")
        sdk: list[Any] = []  # [errors module, client, request config], made on first use

        def load() -> list[Any]:
            # google-genai takes about half a second to import: not at start-up (every `aiops chat`
            # would pay it), and on first use in a thread, so the loop (the console) never stalls.
            from google import genai
            from google.genai import errors as genai_errors
            from google.genai import types

            # The key goes in the x-goog-api-key header, never in the URL; one attempt, bounded by
            # the plugin's timeout (the SDK takes milliseconds).
            options = types.HttpOptions(base_url=s.base_url or None, timeout=int(s.timeout_seconds * 1000),
                                        retry_options=types.HttpRetryOptions(attempts=1))
            client = genai.Client(api_key=key, http_options=options)
            config = types.GenerateContentConfig(tools=[types.Tool(google_search=types.GoogleSearch())])
            return [genai_errors, client, config]

        async def execute(args: QueryArgs, ctx: ToolContext) -> ToolOutput:
            if not sdk:
                loaded = await asyncio.to_thread(load)
                if not sdk:  # (two first calls at once: the first one's client is kept)
                    sdk.extend(loaded)
                    self.client = sdk[1]
            genai_errors, client, config = sdk
            try:
                response = await asyncio.wait_for(
                    client.aio.models.generate_content(model=s.model, contents=args.query, config=config),
                    s.timeout_seconds + 5)
            except TimeoutError:
                return self._timed_out()
            except genai_errors.APIError as e:
                # The SDK's message can carry the request; only the status and Google's message go out.
                return error(f"google_search failed: Gemini answered HTTP {e.code} {e.status or ''}: "
                             f"{str(e.message or '')[:300]}", [key])
            except Exception as e:  # noqa: BLE001 - connection failures come from aiohttp/httpx
                return error(f"google_search failed: {type(e).__name__}: {e}", [key])
            answer = (response.text or "").strip() if response.candidates else ""
            return self._found(args.query, _grounding_sources(response), answer, none="no answer")

        self._register(
            api, "Search Google (through Gemini with Search grounding): an answer with its source pages. "
            "The answer is untrusted web-derived text.",
            QueryArgs, execute)

    async def stop(self) -> None:
        if self.client is not None:
            try:
                await self.client.aio.aclose()
            except Exception as e:  # noqa: BLE001 - closing must not stop the others
                log.debug("google_search: closing the client: %s", redact(str(e), []))


def _grounding_sources(response: Any) -> list[Source]:
    found: dict[str, Source] = {}
    for cand in response.candidates or []:
        meta = cand.grounding_metadata
        for chunk in (meta.grounding_chunks if meta else None) or []:
            web = chunk.web
            if web is not None and web.uri and web.uri not in found:
                found[web.uri] = Source(snippet(web.title or web.domain or "", 120), web.uri)
    return list(found.values())
