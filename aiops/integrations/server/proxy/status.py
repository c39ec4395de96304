"""The status lines aiops writes into a chat answer (`*⏳ waiting for operator approval: …*` and
friends), and text as compared across requests, with them left out: a client sends the answer back
as history, status lines and all."""

from __future__ import annotations

import re

from aiops.engine import events as ev
from aiops.gates.broker import waiting_notice

WAITING, APPROVED, REFUSED, TOOL = "⏳", "✅", "⛔", "🔧"
STOPPED = "the answer was stopped"
_STATUS_RE = re.compile(r"^\*(?:⏳|✅|⛔|🔧) [^\n]*\*[ \t]*$", re.MULTILINE)


def status_line(marker: str, text: str) -> str:
    return f"*{marker} {' '.join(text.replace('*', '').split())}*"


def collapsed(text: str) -> str:
    """A user's text as compared across requests: whitespace collapsed. Status lines are aiops's,
    written into answers only: one a user typed is the user's words, and an edit of it a fork."""
    return " ".join(text.split())


def normalize(text: str) -> str:
    """An answer as compared across requests: status lines dropped, whitespace collapsed."""
    if "*" in text:
        text = _STATUS_RE.sub("", text)
    return " ".join(text.split())


def gate_status(gate: ev.GateInfo) -> str:
    """The chat user's line for a waiting gate, in the same words as every other waiting notice:
    `*⏳ waiting for operator approval: db_query write on users*`."""
    return status_line(WAITING, waiting_notice(gate))


def resolution_status(gate: ev.GateInfo) -> str:
    match gate.decision:
        case "approved":
            return status_line(APPROVED, "approved by the operator")
        case "denied":
            return status_line(REFUSED, "denied by the operator")
        case "timeout":
            return status_line(REFUSED, "no operator answered in time")
    return status_line(REFUSED, "approval request cancelled")


def without_status_lines(text: str) -> str:
    """An answer as the client stored it, minus the status lines aiops wrote into it."""
    if "*" not in text:
        return text
    return re.sub(r"\n{3,}", "\n\n", _STATUS_RE.sub("", text)).strip()
