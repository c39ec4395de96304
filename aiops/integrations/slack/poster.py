"""Replies out through the Web API, retried: an answer is in the session's history whatever Slack
does, but the thread should get it too.

HTTP 429 is the SDK's to retry: its rate-limit handler (installed on the client, see `web_client`)
waits as long as `Retry-After` says. Connection errors and Slack's own transient errors are retried
here with backoff; a call that still fails is reported (`on_failure`), never raised into a turn.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import aiohttp
from slack_sdk.errors import SlackApiError
from slack_sdk.http_retry.builtin_async_handlers import (
    AsyncConnectionErrorRetryHandler,
    AsyncRateLimitErrorRetryHandler,
)
from slack_sdk.web.async_client import AsyncWebClient

log = logging.getLogger(__name__)

# Seconds between attempts after a transient failure (then the call is given up).
BACKOFF = (1.0, 2.0, 4.0, 8.0, 16.0)
# Slack's errors that a later attempt may not get (others, like channel_not_found, it would).
_TRANSIENT = frozenset({"ratelimited", "internal_error", "fatal_error", "service_unavailable",
                        "request_timeout"})


def web_client(token: str, base_url: str, logger: logging.Logger) -> AsyncWebClient:
    """The Web API client: 429s waited out per `Retry-After` (up to 5 times in a row)."""
    return AsyncWebClient(token=token, base_url=base_url, logger=logger, retry_handlers=[
        AsyncConnectionErrorRetryHandler(max_retry_count=1),
        AsyncRateLimitErrorRetryHandler(max_retry_count=5),
    ])


def transient(e: Exception) -> bool:
    """A failure a later attempt may not meet (connection, HTTP 5xx or 429, Slack's transient errors)."""
    if isinstance(e, SlackApiError):
        status = getattr(e.response, "status_code", 200)
        error = e.response.get("error") if isinstance(e.response.data, dict) else None
        return status >= 500 or status == 429 or error in _TRANSIENT
    return isinstance(e, aiohttp.ClientError | TimeoutError | ConnectionError)


def describe(e: Exception) -> str:
    if isinstance(e, SlackApiError):
        data = e.response.data
        error = data.get("error") if isinstance(data, dict) else None
        return f"{error or 'error'} (HTTP {e.response.status_code})"
    return f"{type(e).__name__}: {e}" if str(e) else type(e).__name__


class Poster:
    def __init__(self, web: AsyncWebClient, on_failure: Callable[[str], None],
                 backoff: Sequence[float] = BACKOFF) -> None:
        self.web = web
        self.on_failure = on_failure
        self.backoff = tuple(backoff)

    async def _call(self, what: str, call: Callable[[], Awaitable[Any]]) -> Any:
        for attempt in range(len(self.backoff) + 1):
            try:
                return await call()
            except Exception as e:  # noqa: BLE001 - every failure is reported, none raised into a turn
                if attempt < len(self.backoff) and transient(e):
                    log.info("slack: %s failed (%s); retrying in %gs", what, describe(e), self.backoff[attempt])
                    await asyncio.sleep(self.backoff[attempt])
                    continue
                note = f"could not {what}: {describe(e)}"
                log.warning("slack: %s", note)
                self.on_failure(note)
                return None
        return None

    async def post(self, channel: str, thread_ts: str, text: str,
                   blocks: list[dict[str, Any]] | None = None) -> str | None:
        """Post in a thread; the new message's ts (None when it could not be posted)."""
        resp = await self._call("post a reply", lambda: self.web.chat_postMessage(
            channel=channel, thread_ts=thread_ts, text=text, blocks=blocks, unfurl_links=False))
        return str(resp["ts"]) if resp is not None else None

    async def update(self, channel: str, ts: str, text: str,
                     blocks: list[dict[str, Any]] | None = None) -> bool:
        # An empty list (not None) replaces the message's blocks: buttons go when a gate is decided.
        resp = await self._call("update a reply", lambda: self.web.chat_update(
            channel=channel, ts=ts, text=text, blocks=blocks if blocks is not None else []))
        return resp is not None

    async def ephemeral(self, channel: str, user: str, text: str, thread_ts: str | None) -> None:
        """A message only `user` sees (a refused button press)."""
        await self._call("answer a button", lambda: self.web.chat_postEphemeral(
            channel=channel, user=user, text=text, thread_ts=thread_ts))
