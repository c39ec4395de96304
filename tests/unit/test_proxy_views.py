"""How the proxy compares a chat UI's history with a session's (proxy_sessions.session_view and
the compact signatures kept between requests): what counts as the same conversation."""

from __future__ import annotations

import pytest

from aiops.engine.types import Message
from aiops.integrations.server.proxy_sessions import (
    ClientMessage,
    client_view,
    is_prefix,
    is_prefix_sig,
    session_view,
    signatures,
)

LONG = "The disk on web-1 is 91% full: /var/log holds 40 GB of rotated logs. " * 5


def _history(answer_status: str, *, cancelled_notice: bool) -> list[Message]:
    out = [Message("user", "why is web-1 slow?", turn_id="t1"),
           Message("assistant", LONG, turn_id="t1", status=answer_status)]
    if cancelled_notice:
        out.append(Message("notice", "turn cancelled", turn_id="t1", meta={"kind": "cancelled"}))
    return out


@pytest.mark.parametrize(("status", "notice"), [("cancelled", True), ("complete", True), ("error", False)])
def test_an_answer_that_was_cut_matches_any_start_of_it_the_client_kept(status: str, notice: bool) -> None:
    """Stopped (its record cancelled, or complete with the stop recorded just after) or failed:
    the client may hold any start of it, and that is still this conversation."""
    view = session_view(_history(status, cancelled_notice=notice))
    for kept in (LONG[:37], LONG[:100] + "  \n", LONG):
        client = client_view([ClientMessage("user", "why is web-1 slow?"), ClientMessage("assistant", kept)])
        assert is_prefix(view, client) and is_prefix_sig(signatures(view), client), kept
    other = client_view([ClientMessage("user", "why is web-1 slow?"), ClientMessage("assistant", "Another answer")])
    assert not is_prefix(view, other) and not is_prefix_sig(signatures(view), other)


def test_a_whole_answer_must_match_whole() -> None:
    """Only a cut answer may be held in part: a shorter copy of a whole one is an edit."""
    view = session_view(_history("complete", cancelled_notice=False))
    client = client_view([ClientMessage("user", "why is web-1 slow?"), ClientMessage("assistant", LONG[:100])])
    assert not is_prefix(view, client) and not is_prefix_sig(signatures(view), client)
    whole = client_view([ClientMessage("user", "why is web-1 slow?"), ClientMessage("assistant", LONG)])
    assert is_prefix(view, whole) and is_prefix_sig(signatures(view), whole)
