"""One tool call, from its arguments to its output, through the gate: the path every call takes.

A turn runs its model's calls through here, and so does a delegation (`llm_clean_tool`), whose
delegate's call runs under the caller's session, gates and rate limits: validation (errors go back
to the model), classification (a classifier that fails closes the call), the gatekeeper (rate
limit, rule, operator), then the tool. A raising tool becomes an error output.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from aiops.engine.tools import ToolContext, ToolOutput, format_validation_error

if TYPE_CHECKING:
    from aiops.engine.gatekeeper import GateOutcome
    from aiops.engine.tools import Classification, Tool

log = logging.getLogger(__name__)

CheckCall = Callable[["Tool", dict[str, Any], "Classification", ToolContext], Awaitable["GateOutcome"]]


async def run_checked(check: CheckCall, tool: Tool, arguments: dict[str, Any], ctx: ToolContext, *,
                      at_gate: Callable[[bool], None] | None = None,
                      executing: Callable[[], None] | None = None) -> tuple[ToolOutput, str | None]:
    """Run one call of `tool` with the model's `arguments` for `ctx`'s session: the output and the
    gate's decision (None when the call never reached the gate).

    `at_gate(True)` / `at_gate(False)` bracket the gate check and `executing()` marks the start of
    the tool's run, so a turn can say where a call was when it is stopped. A stop landing at the
    gate leaves `at_gate(True)` standing: the call was stopped there.
    """
    try:
        args = tool.validate(arguments)
    except ValidationError as e:
        return ToolOutput("error: " + format_validation_error(tool.name, e), is_error=True), None
    try:
        cls = tool.classification(args)
    except Exception as e:  # noqa: BLE001 - a classifier failure must fail closed
        return ToolOutput(f"error: {tool.name} could not be checked: {e}", is_error=True), None
    # A refusal the tool can tell before any gate (a swarm call too deep): no operator is asked.
    if tool.precheck is not None and (why := tool.precheck(args, ctx)):
        return ToolOutput(f"error: {why}", is_error=True), None
    if at_gate is not None:
        at_gate(True)
    # The arguments as the tool will read them: a key the tool ignores (a long decoy "summary",
    # say) must not fill what the operator reads before approving.
    outcome = await check(tool, args.model_dump(exclude_defaults=True), cls, ctx)
    if at_gate is not None:
        at_gate(False)
    if not outcome.allowed:
        return ToolOutput(outcome.message, is_error=True), outcome.decision
    if executing is not None:
        executing()
    try:
        raw = await tool.execute(args, ctx)
        out = raw if isinstance(raw, ToolOutput) else ToolOutput(str(raw))
    except asyncio.CancelledError:
        raise
    except Exception as e:  # noqa: BLE001 - the model sees the failure and the turn goes on
        log.info("tool %s raised: %s", tool.name, e)
        return ToolOutput(f"error: {tool.name} failed: {e}", is_error=True), outcome.decision
    return out, outcome.decision
