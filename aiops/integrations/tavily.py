"""Tavily's REST API (search and extract) over aiohttp, for `tavily_search` and `url_extract`.

The key travels in the Authorization header; errors quote Tavily's own message with the key
redacted, never the request.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp

from aiops.integrations.web_text import redact


class TavilyError(Exception):
    """A call that did not give a usable answer; the message is for the model and the operator."""


class TavilyClient:
    def __init__(self, base_url: str, api_key: str, timeout: float) -> None:
        self.base_url = base_url.rstrip("/")
        self._key = api_key
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._session: aiohttp.ClientSession | None = None

    async def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=self._timeout)
        headers = {"Authorization": f"Bearer {self._key}", "Content-Type": "application/json"}
        try:
            async with self._session.post(self.base_url + path, json=body, headers=headers) as resp:
                try:
                    data = await resp.json(content_type=None)
                except ValueError:
                    data = None
                if resp.status != 200:
                    raise TavilyError(f"Tavily answered HTTP {resp.status}: {self._message(data)}")
        except TimeoutError:
            raise TavilyError(f"Tavily did not answer within {self._timeout.total:g} s") from None
        except aiohttp.ClientError as e:
            raise TavilyError(redact(f"could not reach Tavily: {e}", [self._key])) from None
        if not isinstance(data, dict):
            raise TavilyError("Tavily's answer was not a JSON object")
        return data

    def _message(self, data: Any) -> str:
        detail = data.get("detail", data) if isinstance(data, dict) else data
        if isinstance(detail, dict):
            detail = detail.get("error") or detail.get("message") or detail
        return redact(str(detail or "no details")[:300], [self._key])

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            # aiohttp's connector closes its transports on the next loop iteration.
            await asyncio.sleep(0)
