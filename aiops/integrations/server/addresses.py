"""Addresses of the servers behind aiops, hidden from what client tokens read.

A client token is a chat UI or a script acting for people who are not the operator: a failure's
message reaches them without the URLs, addresses and host names of the model servers and other
services behind aiops. The operator's console, the log and operator tokens keep the whole message.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

from aiops.engine import events as ev
from aiops.engine.engine import Engine
from aiops.integrations.server.owners import Caller

# Where the servers behind aiops live: URLs, host:port pairs (compose service names have no dot),
# IPv4, and IPv6 (bracketed or as aiohttp prints a peer: two colons at least, and "::" or a hex
# letter, so that a time of day is not taken for one).
_ADDRESS = re.compile(
    r"\b[a-z][a-z0-9+.-]*://[^\s'\"<>()]*[^\s'\"<>().,:;]"  # a URL, not the punctuation after it
    r"|\[(?=[0-9a-f:.]*:[0-9a-f.]*:)[0-9a-f:.]+\](?::\d+)?"  # [::1]:8080, not messages[2]
    r"|(?<![\w:.])(?=[0-9a-f:]*(?:::|[a-f]))(?:[0-9a-f]{0,4}:){2,7}[0-9a-f]{0,4}(?![\w:])"  # fd00::5
    r"|\b(?:\d{1,3}\.){3}\d{1,3}(?::\d+)?\b"  # 10.0.0.5:8080
    r"|\b(?:localhost|[a-z][a-z0-9-]*(?:\.[a-z0-9-]+)*):\d{2,5}\b",  # llm.internal:8080, ollama:11434
    re.IGNORECASE)
HIDDEN = "[address hidden]"


def configured_hosts(engine: Engine) -> list[str]:
    """The hosts of the configured model servers, longest first: named outright in a failure's
    message ("Cannot connect to host gpu-box"), they are hidden too, port or not."""
    hosts = {urlsplit(m.base_url).hostname or "" for m in engine.config.models.models.values() if m.base_url}
    return sorted((h for h in hosts if h), key=len, reverse=True)


def shown_to(who: Caller, message: str, hosts: Sequence[str] = ()) -> str:
    """A failure's message as `who` may read it: word for word for an operator; for a client
    token (a chat UI, whose end users read it) without the addresses of the model servers and
    other services behind aiops (`hosts`: those known by name), which the operator's console and
    log still show."""
    if who.operator:
        return message
    message = _ADDRESS.sub(HIDDEN, message)
    for host in hosts:
        message = re.sub(rf"(?<![\w.-]){re.escape(host)}(?![\w-])", HIDDEN, message, flags=re.IGNORECASE)
    return message


def event_seen_by(who: Caller, engine: Engine, event: ev.Event) -> ev.Event:
    """An event as `who` may read it: a client token reads a failure's message without the
    addresses of the servers behind aiops (as the chat proxies show it); operators read it whole."""
    if who.operator:
        return event
    match event:
        case ev.ErrorEvent(error=err):
            return dataclasses.replace(event, error=_error_seen_by(who, engine, err))
        case ev.Done(error=ev.ErrorInfo() as err):
            return dataclasses.replace(event, error=_error_seen_by(who, engine, err))
    return event


def _error_seen_by(who: Caller, engine: Engine, err: ev.ErrorInfo) -> ev.ErrorInfo:
    return dataclasses.replace(err, message=shown_to(who, err.message, configured_hosts(engine)))


def reply_seen_by(who: Caller, engine: Engine, reply: dict[str, Any]) -> dict[str, Any]:
    """A submit's answer (the turn's result as the API writes it) as `who` may read it."""
    err = reply.get("error")
    if who.operator or not isinstance(err, dict) or not isinstance(err.get("message"), str):
        return reply
    return {**reply, "error": {**err, "message": shown_to(who, err["message"], configured_hosts(engine))}}


def record_seen_by(who: Caller, engine: Engine, record: dict[str, Any]) -> dict[str, Any]:
    """A stored error record as `who` may read it: its text and its `meta` (the error object)."""
    if who.operator or record.get("role") != "error":
        return record
    hosts = configured_hosts(engine)
    meta = record.get("meta") or {}
    if isinstance(meta.get("message"), str):
        meta = {**meta, "message": shown_to(who, meta["message"], hosts)}
    return {**record, "content": shown_to(who, str(record.get("content", "")), hosts), "meta": meta}
