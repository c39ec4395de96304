"""Delegation to other models: `llm_clean_text(model, prompt)` and `llm_clean_tool(model, tool,
arguments)`, and the operator's `!llm_call`.

Both tools are of type `llm_call` (`[rate.llm_call]` in limits.toml), operation read: the
delegation itself changes nothing, and the one call a delegate may make passes its own tool's gate.

- `llm_clean_text`: the prompt alone (no system prompt, no history, no tools) to another registry
  model; its text comes back.
- `llm_clean_tool`: the other model sees exactly one tool's definition (and that tool's sections of
  its system-prompt tree as its system prompt, if any) and the arguments text. Only a call to that
  tool is run, and only one, under the *caller's* session: the caller's gates and rate limits
  apply, and a gate says which delegate wrote the call. A call to any other name is refused, never
  run. The delegate then answers with the result; the caller reads what happened to the call (ran,
  denied, failed) and that answer.

Only models marked `delegation = true` in models.toml (and enabled) are targets; `!llm_call` lists
them and switches them off and on for one session (operator-only; kept in the session's record, so
a restart does not undo it). Each delegate answer is bounded by its model's `delegation_timeout`.
The model never reaches anything that changes policy: its prompt goes to the other model as data,
never through `submit` (so a `!command` or `@model` in it is text), the delegation tools cannot be
delegated, and the depth of nested agent calls is bounded by `max_agent_call_depth`.
"""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import BaseModel, Field

from aiops.engine.backends import ModelError
from aiops.engine.commands import Command, CommandContext, CommandError
from aiops.engine.context import as_text_protocol
from aiops.engine.plugins import Plugin, PluginAPI, PluginSettings
from aiops.engine.textcalls import describe_tools_for_prompt, looks_like_tool_call, parse_text_tool_calls
from aiops.engine.tools import Classification, Tool, ToolContext, ToolHost, ToolOutput
from aiops.engine.types import Completion, Message, ToolCall, Usage, new_id
from aiops.integrations.web_text import FULL_TEXT_MAX_CHARS, output, register_fulltext, snippet

if TYPE_CHECKING:
    from aiops.config import ModelConfig

TOOL_TYPE = "llm_call"
TEXT_TOOL = "llm_clean_text"
TOOL_TOOL = "llm_clean_tool"
# The session record's key for the targets an operator switched off there (`!llm_call off`).
OFF_KEY = "llm_call_off"
MAX_PROMPT_CHARS = 100_000


class DelegationSettings(PluginSettings):
    # The caller's copy of a delegate's answer is cut (head and tail kept) beyond this; the whole
    # answer stays in the result's data (`!fulltext`).
    max_result_chars: int = Field(8_000, ge=500, le=20_000)


class LlmCleanTextArgs(BaseModel):
    model: str = Field(..., min_length=1, max_length=200, description="the key of a delegation model")
    prompt: str = Field(..., min_length=1, max_length=MAX_PROMPT_CHARS,
                        description="everything the model needs: it sees this text and nothing else")


class LlmCleanToolArgs(BaseModel):
    model: str = Field(..., min_length=1, max_length=200, description="the key of a delegation model")
    tool: str = Field(..., min_length=1, max_length=200,
                      description="the name of one of your tools: the only tool the model is given")
    arguments: str = Field(..., min_length=1, max_length=MAX_PROMPT_CHARS,
                           description="what the call should do (in words, or the tool's arguments): "
                                       "the model sees this text and the tool's definition, nothing else")


class DelegationFailed(Exception):
    """A delegate could not be asked or did not answer; the message is for the caller's model."""


class DelegationPlugin(Plugin):
    name = "delegation"
    description = ("llm_clean_text / llm_clean_tool: hand a prompt, or one tool's task, to another "
                   "model marked delegation = true in models.toml")
    settings_model: ClassVar[Any] = DelegationSettings

    async def setup(self, api: PluginAPI) -> None:
        api.register_command(Command(
            "llm_call", "!llm_call [on|off MODEL...]",
            "the delegation models (llm_clean_text, llm_clean_tool) and whether this session may use "
            "them; on/off switches them for this session", self._command, operator_only=True))
        targets = api.config.models.delegation_targets()
        if not targets:
            # Nothing is wrong (as shipped, no model is marked): no tools, so the model is not told
            # of any, and the prompt's delegation section stays out.
            self.status_note = "no tools: no enabled model in models.toml has delegation = true"
            return
        listing = "; ".join(f"{k}" + (f" ({m.description})" if m.description else "") for k, m in targets.items())
        api.register_tool(Tool(
            TEXT_TOOL,
            "Send a prompt to another model and get its answer. The model sees only the prompt: no "
            "system prompt, no conversation, no tools, so put everything it needs in the prompt. "
            f"Models: {listing}.",
            LlmCleanTextArgs, TOOL_TYPE, self._clean_text, classify=self._classify_text))
        api.register_tool(Tool(
            TOOL_TOOL,
            "Hand one of your tools to another model for one call: it sees only that tool's "
            "definition and your arguments text, makes the call (which runs with your permissions "
            "and approvals, like your own calls), and answers with the result. It can call no other "
            f"tool, and only once. Models: {listing}.",
            LlmCleanToolArgs, TOOL_TYPE, self._clean_tool, classify=self._classify_tool))
        register_fulltext(api)

    # ---- the targets --------------------------------------------------------------------------

    @property
    def _api(self) -> PluginAPI:
        assert self.api is not None
        return self.api

    def _targets(self) -> dict[str, ModelConfig]:
        return self._api.config.models.delegation_targets()

    @staticmethod
    async def _switched_off(engine: ToolHost, session_id: str) -> set[str]:
        row = await engine.store.get_session(session_id)
        off = row.meta.get(OFF_KEY) if row is not None else None
        return {str(k) for k in off} if isinstance(off, list) else set()

    async def _target(self, key: str, ctx: ToolContext) -> ModelConfig:
        """The target `key`, or DelegationFailed saying why it is not one for this session."""
        models = self._api.config.models.models
        targets = self._targets()
        off = await self._switched_off(ctx.engine, ctx.session_id)
        on = [k for k in targets if k not in off]
        choices = f"delegation models: {', '.join(on) or 'none (all switched off for this session)'}"
        if key not in models:
            raise DelegationFailed(f"unknown model {key!r}; {choices}")
        if not models[key].delegation:
            raise DelegationFailed(f"model {key!r} is not a delegation model (only models the operator "
                                   f"marked delegation = true in models.toml are); {choices}")
        if key not in targets:
            raise DelegationFailed(f"model {key!r} is disabled in models.toml; {choices}")
        if key in off:
            raise DelegationFailed(f"the operator switched model {key!r} off for this session "
                                   f"(!llm_call); {choices}")
        limit = self._api.config.limits.max_agent_call_depth
        if ctx.depth >= limit:
            raise DelegationFailed(f"delegation refused: this call is already {ctx.depth} agent call(s) "
                                   f"deep, and max_agent_call_depth in limits.toml is {limit}")
        return targets[key]

    async def _ask(self, key: str, model: ModelConfig, messages: list[Message], tools: list[Any],
                   system: str | None) -> Completion:
        """One answer of the delegate, within its delegation_timeout."""
        try:
            async with asyncio.timeout(model.delegation_timeout):
                return await self._api.complete(key, messages, tools, system)
        except TimeoutError:
            raise DelegationFailed(f"model {key!r} did not answer within {model.delegation_timeout:g} s "
                                   f"(its delegation_timeout in models.toml)") from None
        except ModelError as e:
            raise DelegationFailed(str(e)) from None

    # ---- llm_clean_text -----------------------------------------------------------------------

    @staticmethod
    def _classify_text(args: LlmCleanTextArgs) -> Classification:
        return Classification("read", summary=f"{TEXT_TOOL} to {args.model}: {snippet(args.prompt, 160)}")

    async def _clean_text(self, args: LlmCleanTextArgs, ctx: ToolContext) -> ToolOutput:
        try:
            model = await self._target(args.model, ctx)
            completion = await self._ask(args.model, model, [Message("user", args.prompt)], [], None)
        except DelegationFailed as e:
            return ToolOutput(f"error: {e}", is_error=True)
        text = completion.text.strip()
        usage = completion.usage.counts() if completion.usage else None
        if not text:
            return ToolOutput(f"model {args.model!r} returned an empty answer",
                              data={"model": args.model, "usage": usage})
        # (the whole answer stays in the data when the caller's copy is cut: `!fulltext`)
        return output(text, self.settings.max_result_chars, model=args.model, usage=usage)

    # ---- llm_clean_tool -----------------------------------------------------------------------

    @staticmethod
    def _classify_tool(args: LlmCleanToolArgs) -> Classification:
        return Classification("read", summary=f"{TOOL_TOOL} to {args.model} with {args.tool}: "
                                              f"{snippet(args.arguments, 140)}")

    def _delegable(self, name: str) -> Tool:
        tool = self._api.tool(name)
        others = [n for n in self._api.tool_names()
                  if (t := self._api.tool(n)) is not None and t.tool_type != TOOL_TYPE]
        if tool is None:
            raise DelegationFailed(f"unknown tool {name!r}; tools you can hand over: {', '.join(others) or 'none'}")
        if tool.tool_type == TOOL_TYPE:
            raise DelegationFailed(f"{name} cannot be handed to another model (delegations do not nest); "
                                   f"tools you can hand over: {', '.join(others) or 'none'}")
        return tool

    @staticmethod
    def _calls(completion: Completion, tool: str, text_mode: bool) -> tuple[list[ToolCall], str]:
        """The delegate's calls (whatever names they have: the caller decides what runs) and its
        text without call markup."""
        calls, text = list(completion.tool_calls), completion.text
        if not calls and (text_mode or looks_like_tool_call(text)):
            parsed = parse_text_tool_calls(text, {tool})
            if parsed.calls or parsed.unknown or parsed.errors:
                text = parsed.text
                calls = list(parsed.calls)
                calls += [ToolCall(new_id("txt_"), name, {}) for name in parsed.unknown]
                calls += [ToolCall(new_id("txt_"), tool, {}, parse_error=err) for err in parsed.errors]
        return calls, text.strip()

    async def _clean_tool(self, args: LlmCleanToolArgs, ctx: ToolContext) -> ToolOutput:
        key = args.model
        try:
            model = await self._target(key, ctx)
            tool = self._delegable(args.tool)
        except DelegationFailed as e:
            return ToolOutput(f"error: {e}", is_error=True)
        spec = tool.spec()
        text_mode = model.tool_calling == "text"
        system = "\n\n".join(p for p in (self._api.tool_guidance(key, tool.name),
                                         describe_tools_for_prompt([spec]) if text_mode else "") if p) or None
        offered = [] if text_mode else [spec]
        convo = [Message("user", args.arguments)]
        data: dict[str, Any] = {"model": key, "tool": tool.name}
        usage = Usage()
        try:
            first = await self._ask(key, model, convo, offered, system)
        except DelegationFailed as e:
            return ToolOutput(f"error: {e}", is_error=True, data=data)
        _add(usage, first)
        calls, said = self._calls(first, tool.name, text_mode)
        wanted = next((c for c in calls if c.name == tool.name), None)
        refused = [c for c in calls if c.name != tool.name]
        if refused:
            data["refused"] = [{"tool": c.name, "arguments": c.arguments} for c in refused]
        if wanted is None:
            data |= {"answer": said, "usage": usage.counts()}
            if refused:
                names = ", ".join(sorted({c.name for c in refused}))
                return ToolOutput(f"error: model {key!r} did not call {tool.name}: it asked for {names}, which "
                                  f"was not run (a delegate may call only the tool it is given)."
                                  + (f" Its text: {snippet(said, 600)}" if said else ""), is_error=True, data=data)
            return ToolOutput(f"error: model {key!r} made no call to {tool.name}. Its answer: "
                              f"{snippet(said, 1500) or '(empty)'}", is_error=True, data=data)
        inner = ToolContext(ctx.engine, ctx.session_id, ctx.client_kind, ctx.turn_id, ctx.model_key,
                            depth=ctx.depth + 1, is_operator=ctx.is_operator, via=f"delegate model {key}", hops=ctx.hops,
                            call_id=ctx.call_id)
        if wanted.parse_error:
            out, decision = ToolOutput(f"error: could not decode the arguments of {tool.name}: "
                                       f"{wanted.parse_error}", is_error=True), None
        else:
            out, decision = await self._api.run_tool(tool.name, wanted.arguments, inner)
        data["call"] = {"arguments": wanted.arguments, "gate": decision, "is_error": out.is_error,
                        "result": out.text[:FULL_TEXT_MAX_CHARS]}
        if out.data is not None:
            data["call"]["data"] = out.data
        head = _what_happened(key, tool.name, wanted, out, decision)
        # Every call the delegate made gets its result, as a model expects; only `wanted` ran.
        results = [Message("tool", out.text if c is wanted else _not_run(c, tool.name), tool_call_id=c.id,
                           name=c.name) for c in calls]
        convo += [Message("assistant", said, tool_calls=calls), *results]
        try:
            second = await self._ask(key, model, as_text_protocol(convo) if text_mode else convo, offered, system)
        except DelegationFailed as e:
            data["usage"] = usage.counts()
            return ToolOutput(f"{head}\nThen: {e}. The tool's result:\n{_cut(out.text, 4000)}",
                              is_error=True, data=data)
        _add(usage, second)
        more, answer = self._calls(second, tool.name, text_mode)
        if more:
            data["not_run_after"] = [{"tool": c.name, "arguments": c.arguments} for c in more]
            answer += (("\n" if answer else "") + f"(it asked for {len(more)} more call(s); not run: one call "
                       f"per delegation)")
        data |= {"answer": answer, "usage": usage.counts()}
        cap: int = self.settings.max_result_chars
        text = f"{head}\nIts answer:\n{answer or '(empty)'}"
        result = output(text, cap, **data)
        result.is_error = out.is_error
        return result

    # ---- !llm_call ----------------------------------------------------------------------------

    async def _command(self, ctx: CommandContext, argv: list[str], raw: str) -> str:
        targets = self._targets()
        models = self._api.config.models.models
        live = await ctx.session()
        off: set[str] = set()
        if live is not None:
            stored = live.row.meta.get(OFF_KEY)
            off = {str(k) for k in stored} if isinstance(stored, list) else set()
        if argv:
            action, keys = argv[0].lower(), argv[1:]
            if action not in ("on", "off") or not keys:
                raise CommandError("say on or off, then one or more model keys")
            for k in keys:
                if k not in models or not models[k].delegation:
                    raise CommandError(f"{k!r} is not a delegation model (delegation = true in models.toml); "
                                       f"delegation models: {', '.join(targets) or 'none'}")
            if live is None:
                raise CommandError("this session does not exist yet: send it a message first")
            changed = (off | set(keys)) if action == "off" else (off - set(keys))
            meta = {**live.row.meta, OFF_KEY: sorted(changed)}
            await ctx.engine.store.update_session(live.id, meta=meta)
            live.row.meta = meta
            await ctx.engine.store.add_audit("llm_call_switched", session_id=live.id, tool=TOOL_TYPE,
                                             decision=action, actor=ctx.client_kind, data={"models": keys})
            off = changed
        lines = ["Delegation models (llm_clean_text, llm_clean_tool) for this session:"]
        marked = {k: m for k, m in models.items() if m.delegation}
        for k, m in marked.items():
            state = "disabled in models.toml" if not m.enabled else ("off" if k in off else "on")
            lines.append(f"  {k:<14} {state:<24} timeout {m.delegation_timeout:g} s"
                         + (f"  {m.description}" if m.description else ""))
        if not marked:
            lines.append("  none: mark a model delegation = true in models.toml")
        return "\n".join(lines)


def _add(usage: Usage, completion: Completion) -> None:
    if completion.usage:
        usage.prompt_tokens += completion.usage.prompt_tokens
        usage.completion_tokens += completion.usage.completion_tokens


def _cut(text: str, n: int) -> str:
    return text if len(text) <= n else text[:n] + f"\n[… {len(text) - n} more characters]"


def _not_run(call: ToolCall, tool: str) -> str:
    if call.name != tool:
        return f"error: {call.name} was not run: you may call only {tool}"
    return f"error: not run: one call of {tool} per delegation"


def _what_happened(key: str, tool: str, call: ToolCall, out: ToolOutput, decision: str | None) -> str:
    """One line for the caller's model: which call the delegate made and what became of it."""
    shown = snippet(json.dumps(call.arguments, ensure_ascii=False), 300)
    made = f"model {key!r} called {tool}({shown})"
    if decision not in (None, "allow", "approved"):
        return f"{made}; it was not run ({decision}): {snippet(out.text, 600)}"
    if out.is_error:
        return f"{made}; it failed: {snippet(out.text, 600)}"
    return f"{made}; it ran" + (" (approved by the operator)" if decision == "approved" else "") + "."
