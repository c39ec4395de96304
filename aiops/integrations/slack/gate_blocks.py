"""What a thread shows of a gate: what waits for approval, then the outcome and who decided; while
it waits, Approve and Deny buttons when the plugin has approvers."""

from __future__ import annotations

from typing import Any, Literal

from aiops.engine.events import GateInfo
from aiops.integrations.slack.markup import escape

APPROVE = "aiops_gate_approve"
DENY = "aiops_gate_deny"
ACTIONS: dict[str, Literal["approved", "denied"]] = {APPROVE: "approved", DENY: "denied"}


def who(by: str | None) -> str:
    """A resolver as the thread names it: Slack users by mention, others as the engine says."""
    if not by:
        return "no one"
    if by.startswith("slack:"):
        return f"<@{escape(by.removeprefix('slack:'))}>"
    return escape(by)


# A summary longer than this is cut (the console shows the whole gate).
SUMMARY_CHARS = 300


def summary(gate: GateInfo) -> str:
    """The gate's summary as inline code: escaped, its backticks (which would end the code) made
    quotes, cut to SUMMARY_CHARS."""
    text = " ".join(gate.summary.split()).replace("`", "'")
    if len(text) > SUMMARY_CHARS:
        text = text[:SUMMARY_CHARS - 1] + "…"
    return f"`{escape(text)}`"


def waiting_text(gate: GateInfo) -> str:
    return f":hourglass_flowing_sand: waiting for operator approval: {summary(gate)}"


def outcome_text(gate: GateInfo) -> str:
    what = summary(gate)
    match gate.decision:
        case "approved":
            scope = " for the session" if gate.scope == "session" else ""
            return f":white_check_mark: approved{scope} by {who(gate.by)}: {what}"
        case "denied":
            return f":no_entry: denied by {who(gate.by)}: {what}"
        case "timeout":
            return f":alarm_clock: no operator answered in time: {what} (not run)"
    return f":heavy_multiplication_x: cancelled ({escape(gate.by or 'stopped')}): {what} (not run)"


def waiting_blocks(gate: GateInfo, buttons: bool) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = [
        {"type": "section", "text": {"type": "mrkdwn", "text": waiting_text(gate)}},
    ]
    if buttons:
        blocks.append({"type": "actions", "block_id": f"gate-{gate.id}", "elements": [
            {"type": "button", "action_id": APPROVE, "value": gate.id, "style": "primary",
             "text": {"type": "plain_text", "text": "Approve"}},
            {"type": "button", "action_id": DENY, "value": gate.id, "style": "danger",
             "text": {"type": "plain_text", "text": "Deny"}},
        ]})
    else:
        blocks.append({"type": "context", "elements": [
            {"type": "mrkdwn", "text": "An operator answers it in the aiops console."}]})
    return blocks


def outcome_blocks(gate: GateInfo) -> list[dict[str, Any]]:
    return [{"type": "section", "text": {"type": "mrkdwn", "text": outcome_text(gate)}}]
