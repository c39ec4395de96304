"""Who may use a session over HTTP: the caller that created it, and every operator.

A session created through the server (an API submit, a proxy conversation) records its creator's
principal — the token's name, or `loopback:<addr>` when no token is configured — under `owner` in
the session's metadata, which the store keeps with the session, so ownership survives a restart.
Operators see and manage every session. A client token may read, stream, stop, delete and submit
to only the sessions it created; sessions with no recorded owner (the console's, Slack's, ones made
before ownership was recorded) are operator-only.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

from aiohttp import web

from aiops.engine.engine import Engine, LiveSession
from aiops.engine.store import OWNER_KEY  # where the owner is kept: the store filters on it
from aiops.integrations.server.context import is_operator
from aiops.integrations.server.errors import HttpError


@dataclass(frozen=True, slots=True)
class Caller:
    principal: str
    operator: bool

    def may_use(self, owner: str | None) -> bool:
        return self.operator or (owner is not None and owner == self.principal)


def caller(request: web.Request) -> Caller:
    return Caller(str(request.get("principal") or f"addr:{request.remote}"), is_operator(request))


def owner_of(live: LiveSession) -> str | None:
    return live.row.owner


_UNSAFE = re.compile(r"[^A-Za-z0-9._:@-]")


def safe_name(value: str, limit: int = 80) -> str:
    """`value` as a piece of a session id; a changed or shortened one gets a hash of the original,
    so two values never share a name."""
    clean = _UNSAFE.sub("_", value.strip())[:limit]
    if clean != value.strip():
        # surrogatepass: a header's non-UTF-8 bytes reach us as lone surrogates (aiohttp decodes
        # with surrogateescape); they are "_" in the name and still tell two values apart here.
        clean += "-" + hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()[:8]
    return clean


def namespace(who: Caller) -> str:
    """The prefix of the session names a client token chooses (`<token>:`, e.g. its proxy
    conversations); operators, who may use every session anyway, name sessions directly."""
    return "" if who.operator else safe_name(who.principal, 40) + ":"


def check_name_free(who: Caller, ref: str) -> None:
    """403 when a client token would create a session in another token's namespace: `webui:user-bob`
    made through /api/v1 by another client token would lock webui's proxy conversation out."""
    own = namespace(who)
    if own and ":" in ref and not ref.startswith(own):
        raise HttpError(403, "reserved_id",
                        f"session id {ref[:40]!r} is reserved: an id with ':' names another client's "
                        f"conversations; a new session of this token may use ':' only after {own!r}")


def forbidden(ref: str) -> HttpError:
    """403 naming the session as the caller named it: a shorthand id must not reveal the full id
    (and so the owner's name or conversation) of a session the caller may not use."""
    return HttpError(403, "forbidden", f"session {ref!r} belongs to another caller: a client token may "
                                       f"use only the sessions it created")


def check_access(who: Caller, live: LiveSession, ref: str) -> None:
    """403 unless `who` may use the session (`ref`: the id the caller gave)."""
    if not who.may_use(owner_of(live)):
        raise forbidden(ref)


def owner_meta(who: Caller) -> dict[str, str]:
    """The metadata that makes a session `who`'s own when it is created with it."""
    return {OWNER_KEY: who.principal}


async def claim(engine: Engine, ref: str, who: Caller, *, kind: str, model: str | None) -> LiveSession:
    """The session `ref`, created and owned by `who` when it does not exist yet; 403 when it exists
    and `who` may not use it.

    The owner goes into the creating INSERT itself: no second write on the proxy's hot path, and
    of two callers racing to create one id the store's transaction lets exactly one be the owner."""
    live = await engine.session(ref, kind=kind, create=True, model=model, meta=owner_meta(who))
    assert live is not None
    check_access(who, live, ref)
    return live
