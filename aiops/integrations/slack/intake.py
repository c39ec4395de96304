"""Which Slack events are a user's message to the agent, and each only once.

A mention in a channel arrives twice (as `message` and as `app_mention`), and Slack redelivers an
event whose envelope it thinks was not acknowledged in time: both carry the same channel and ts,
a redelivery also the same event id. The bot's own messages, other bots', edits, deletions and
other subtypes are not messages to answer.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from aiops.integrations.slack.markup import mentions, slack_to_text

# A user's message, with or without files, or one also sent to the channel from a thread.
_USER_SUBTYPES = frozenset({None, "", "thread_broadcast", "file_share"})


@dataclass(frozen=True, slots=True)
class UserMessage:
    channel: str
    ts: str
    thread_ts: str  # the thread it is in, or starts (its own ts)
    user: str
    text: str  # plain text, the bot's mention dropped
    mentioned: bool  # it addresses the bot
    direct: bool  # a direct message
    in_thread: bool  # a reply in an existing thread

    @property
    def session_id(self) -> str:
        return session_id(self.channel, self.thread_ts)


def session_id(channel: str, thread_ts: str) -> str:
    """One session per thread."""
    return f"slack-{channel}-{thread_ts}"


def read_message(event: Mapping[str, Any], bot_user_id: str) -> UserMessage | None:
    """The user message an Events API `event` carries, or None when it is none to answer."""
    kind = event.get("type")
    if kind not in ("message", "app_mention"):
        return None
    if event.get("subtype") not in _USER_SUBTYPES or event.get("hidden"):
        return None  # edits, deletions, joins, topic changes, bot_message, ...
    user = event.get("user")
    if not isinstance(user, str) or not user or user == bot_user_id or event.get("bot_id"):
        return None
    channel, ts = event.get("channel"), event.get("ts")
    if not isinstance(channel, str) or not isinstance(ts, str):
        return None
    raw = str(event.get("text") or "")
    thread_ts = event.get("thread_ts")
    return UserMessage(
        channel=channel, ts=ts, thread_ts=thread_ts if isinstance(thread_ts, str) else ts, user=user,
        text=slack_to_text(raw, bot_user_id),
        mentioned=kind == "app_mention" or mentions(raw, bot_user_id),
        direct=event.get("channel_type") == "im" or channel.startswith("D"),
        in_thread=isinstance(thread_ts, str) and thread_ts != ts,
    )


class Seen:
    """Keys seen lately (bounded: the oldest are forgotten first)."""

    def __init__(self, size: int = 10_000) -> None:
        self._keys: OrderedDict[str, None] = OrderedDict()
        self._size = size

    def add(self, key: str) -> bool:
        """Remember `key`; False when it was already remembered."""
        if key in self._keys:
            self._keys.move_to_end(key)
            return False
        self._keys[key] = None
        if len(self._keys) > self._size:
            self._keys.popitem(last=False)
        return True

    def __contains__(self, key: object) -> bool:
        return key in self._keys
