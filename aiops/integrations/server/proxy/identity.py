"""Which conversation a request continues: its root session id.

`X-Aiops-Session` when sent, else Open WebUI's `X-OpenWebUI-Chat-Id`, else the OpenAI `user`
field, else a fingerprint of the caller (token name or address) and the conversation's first user
message. The identity names a *root*; the sessions of a root are the root itself and its forks
`<root>+2`, `<root>+3`, ... A client token's names are namespaced by the token (`<token>:<name>`),
so another client token naming the same conversation gets its own.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass

from aiohttp import web

from aiops.integrations.server.errors import HttpError
from aiops.integrations.server.owners import caller, namespace, safe_name
from aiops.integrations.server.proxy.messages import ClientMessage
from aiops.integrations.server.proxy.openwebui import as_typed
from aiops.integrations.server.proxy.status import collapsed

SESSION_HEADER = "X-Aiops-Session"
OPENWEBUI_CHAT_HEADER = "X-OpenWebUI-Chat-Id"

# The API's client-id pattern: a fork's id (`<root>+2`) can be sent back as it was received.
_SESSION_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@+-]{0,127}$")


# A conversation's root id leaves room for a fork's "+N" (up to 7 digits) within the 128
# characters a session id may have: every id the server sends back can be sent again.
_ROOT_MAX = 120


def _fitted(root: str) -> str:
    """`root`, or when it is too long, its start and a hash of the whole: still one per name."""
    if len(root) <= _ROOT_MAX:
        return root
    return root[:_ROOT_MAX - 9] + "-" + hashlib.sha256(root.encode()).hexdigest()[:8]


@dataclass(frozen=True, slots=True)
class ConversationId:
    root: str  # session id of the conversation's first session; forks are root+N
    source: str  # header | openwebui | user | fingerprint

    @property
    def explicit(self) -> bool:
        return self.source == "header"


def conversation_id(request: web.Request, messages: Sequence[ClientMessage],
                    user: str | None = None) -> ConversationId:
    """The conversation's root session id. Names a client chose (header, chat id, `user`) are
    namespaced by a client token's name, so one client token cannot continue another's
    conversation by naming it; a name already carrying the caller's namespace (a session id the
    server sent back) is taken as it is."""
    ns = namespace(caller(request))
    header = request.headers.get(SESSION_HEADER, "").strip()
    if header:
        if not _SESSION_ID.match(header) or header.isdigit():
            raise HttpError(400, "invalid_session",
                            f"{SESSION_HEADER} must be 1-128 characters of A-Z a-z 0-9 . _ : @ + -, starting "
                            f"with a letter or digit, and not all digits")
        root = header if header.startswith(ns) else ns + header
        if len(first_root(root)) > _ROOT_MAX or len(root) > 128:
            # Longer, and the id the server sends back (namespaced, or a fork's) could not be
            # sent again.
            raise HttpError(400, "invalid_session",
                            f"{SESSION_HEADER} is too long: at most {_ROOT_MAX - len(ns)} characters"
                            + (f" with this token (its sessions are named {ns}<name>)" if ns else "")
                            + ", so that a fork's id (<name>+N) stays within 128")
        return ConversationId(root, "header")
    chat = request.headers.get(OPENWEBUI_CHAT_HEADER, "").strip()
    if chat:
        return ConversationId(_fitted(ns + "owui-" + safe_name(chat)), "openwebui")
    if user and user.strip():
        return ConversationId(_fitted(ns + "user-" + safe_name(user)), "user")
    h = hashlib.sha256(str(request.get("principal") or f"addr:{request.remote}").encode())
    first_user = next((m.text for m in messages if m.role == "user"), "")
    # Not the system message: chat UIs fill it from templates ({{CURRENT_DATETIME}}) that change
    # every turn, and each turn would start a new conversation. Two chats that begin alike fork
    # apart anyway. (Its slot stays, empty, so that chats without one keep their ids.)
    # As the chat shows it later: the first request's question may come inside Open WebUI's RAG
    # template (a file or web search attached), every later one without it.
    for part in ("", as_typed(collapsed(first_user))):
        h.update(b"\x00" + part.encode())
    # Namespaced as the names above: the id goes back in X-Aiops-Session, and a client token that
    # sends it again must find this session, not a new `<token>:proxy-…` one.
    return ConversationId(ns + "proxy-" + h.hexdigest()[:16], "fingerprint")


def root_of(session_id: str) -> str:
    base, sep, n = session_id.rpartition("+")
    return base if sep and n.isdigit() else session_id


def first_root(session_id: str) -> str:
    """The name a fork of a fork (`name+2+3`) started from."""
    while (root := root_of(session_id)) != session_id:
        session_id = root
    return session_id
