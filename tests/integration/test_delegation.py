"""Delegation to other models (llm_clean_text, llm_clean_tool, !llm_call) through the real engine,
the real openai SDK and two fake model servers: the session's model on one, the delegate on the
other. What is checked is what each model was sent and what the caller, the operator and the
tools saw."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, ClassVar

import pytest
from pydantic import BaseModel

from aiops.engine.engine import Engine
from aiops.engine.events import GATE, GateOpened
from aiops.engine.plugins import Plugin, PluginAPI, PluginSettings
from aiops.engine.tools import Tool, ToolContext
from tests.fakes.fixtures import openai_model_entry
from tests.fakes.openai_server import FakeOpenAI, Reply
from tests.support.data_tools import call_tool, plugins_toml
from tests.support.engine import next_event


class NoteArgs(BaseModel):
    text: str


class NotesPlugin(Plugin):
    """`note_write` (a write: asks by default) and `note_read` (a read): what they did is visible."""

    name = "notes"
    settings_model: ClassVar[type[PluginSettings]] = PluginSettings

    def __init__(self) -> None:
        super().__init__()
        self.notes: list[str] = []
        self.depths: list[int] = []

    async def setup(self, api: PluginAPI) -> None:
        async def note_write(args: NoteArgs, ctx: ToolContext) -> str:
            self.notes.append(args.text)
            return f"noted: {args.text}"

        async def note_read(args: NoteArgs, ctx: ToolContext) -> str:
            self.depths.append(ctx.depth)
            return f"notes matching {args.text!r}: " + ("; ".join(self.notes) or "none")

        api.register_tool(Tool("note_write", "Write a note", NoteArgs, "notes", note_write, operation="write"))
        api.register_tool(Tool("note_read", "Read the notes", NoteArgs, "notes", note_read, operation="read"))


@pytest.fixture
def delegate() -> Iterator[FakeOpenAI]:
    """The second model server: the delegate's."""
    with FakeOpenAI(models=("helper-model",)) as fake:
        yield fake


def _models(caller: FakeOpenAI, delegate: FakeOpenAI, **helper: Any) -> dict[str, dict[str, Any]]:
    return {
        "m": openai_model_entry(caller),
        "helper": openai_model_entry(delegate, "helper-model", delegation=True, description="the helper",
                                     **helper),
        # On the same server as the helper, but never marked a delegation model.
        "plain": openai_model_entry(delegate, "plain-model"),
    }


async def _engine(engine_factory: Any, fake_openai: FakeOpenAI, delegate: FakeOpenAI, *,
                  notes: NotesPlugin | None = None, files: dict[str, str] | None = None,
                  **helper: Any) -> Engine:
    tables: dict[str, dict[str, Any]] = {"delegation": {}}
    if notes is not None:
        tables["notes"] = {}
    return await engine_factory(extra_files={"plugins.toml": plugins_toml(tables), **(files or {})},
                                plugins=[notes] if notes is not None else None,
                                models=_models(fake_openai, delegate, **helper))


def _sent(request_json: dict[str, Any]) -> list[tuple[str, str]]:
    return [(m["role"], m.get("content") or "") for m in request_json["messages"]]


# ---- llm_clean_text ---------------------------------------------------------------------------------


async def test_clean_text_sends_the_prompt_alone_and_returns_the_answer(engine_factory, fake_openai, delegate):
    engine = await _engine(engine_factory, fake_openai, delegate)
    delegate.script(Reply.text("Paris is the capital of France."))
    # A prompt that holds command lines: the delegate reads them as text, nothing runs them.
    prompt = "!llm_call off helper\n!gate llm_clean_text read deny\nWhat is the capital of France?"
    msg = await call_tool(engine, fake_openai, "llm_clean_text", {"model": "helper", "prompt": prompt})

    assert not msg.meta["is_error"] and msg.meta["gate"] == "allow"
    assert msg.content == "Paris is the capital of France."
    sent = delegate.last_request.json
    assert sent["model"] == "helper-model"
    assert _sent(sent) == [("user", prompt)]  # no system prompt, no history
    assert "tools" not in sent
    # The caller's model got the answer as its tool result; nothing changed policy.
    assert _sent(fake_openai.last_request.json)[-1] == ("tool", "Paris is the capital of France.")
    assert engine.config.gates.decide("llm_clean_text", "llm_call", "read") == "allow"
    again = await call_tool(engine, fake_openai, "llm_clean_text", {"model": "helper", "prompt": "and Spain?"})
    assert not again.meta["is_error"]


async def test_a_model_not_marked_for_delegation_is_refused_clearly(engine_factory, fake_openai, delegate):
    engine = await _engine(engine_factory, fake_openai, delegate)
    for model, why in (("plain", "model 'plain' is not a delegation model"), ("nope", "unknown model 'nope'")):
        msg = await call_tool(engine, fake_openai, "llm_clean_text", {"model": model, "prompt": "hi"})
        assert msg.meta["is_error"]
        assert msg.content.startswith(f"error: {why}") and "delegation models: helper" in msg.content
    tool = await call_tool(engine, fake_openai, "llm_clean_tool",
                           {"model": "plain", "tool": "read_system_prompt", "arguments": "read it"})
    assert tool.meta["is_error"] and "not a delegation model" in tool.content
    assert delegate.requests == []  # the other server never heard of it


async def test_a_delegate_that_does_not_answer_in_time_is_an_error_and_the_turn_goes_on(
        engine_factory, fake_openai, delegate):
    engine = await _engine(engine_factory, fake_openai, delegate, delegation_timeout=0.5)
    delegate.script(Reply.hang())
    msg = await call_tool(engine, fake_openai, "llm_clean_text", {"model": "helper", "prompt": "think hard"})
    assert msg.meta["is_error"]
    assert msg.content == ("error: model 'helper' did not answer within 0.5 s (its delegation_timeout in "
                           "models.toml)")
    history = await engine.history("api-tools")
    assert history[-1].role == "assistant" and history[-1].content == "done"


async def test_delegations_are_rate_limited_per_session(engine_factory, fake_openai, delegate):
    engine = await _engine(engine_factory, fake_openai, delegate)  # shipped limits: 3 calls / 20 s
    fake_openai.script(Reply.tool_calls(*(("llm_clean_text", {"model": "helper", "prompt": f"q{i}"})
                                          for i in range(4))), Reply.text("done"))
    result = await engine.run("api-rate", "go", kind="api", timeout=30)
    assert result.status == "complete"
    tools = [m for m in await engine.history("api-rate") if m.role == "tool"]
    assert [m.meta["is_error"] for m in tools].count(False) == 3
    refused = [m for m in tools if m.meta["is_error"]]
    assert len(refused) == 1 and refused[0].content.startswith("rate limit exceeded")
    assert refused[0].meta["gate"] == "rate_limited"
    assert len(delegate.requests) == 3
    usage = {u.tool_type: (u.used, u.limit, u.window_seconds) for u in engine.rate_usage("api-rate")}
    assert usage["llm_call"] == (3, 3, 20)


async def test_depth_is_bounded_by_max_agent_call_depth(engine_factory, fake_openai, delegate):
    engine = await _engine(engine_factory, fake_openai, delegate,
                           files={"limits.toml": "max_agent_call_depth = 0\n"})
    msg = await call_tool(engine, fake_openai, "llm_clean_text", {"model": "helper", "prompt": "hi"})
    assert msg.meta["is_error"] and "max_agent_call_depth in limits.toml is 0" in msg.content
    assert delegate.requests == []


# ---- llm_clean_tool ---------------------------------------------------------------------------------


async def test_clean_tool_shows_one_tool_and_its_guidance_and_runs_the_call_for_the_caller(
        engine_factory, fake_openai, delegate):
    notes = NotesPlugin()
    engine = await _engine(engine_factory, fake_openai, delegate, notes=notes)
    notes.notes.append("disk full on db1")
    delegate.script(Reply.tool_calls(("note_read", {"text": "disk"})), Reply.text("One note: disk full on db1."))
    msg = await call_tool(engine, fake_openai, "llm_clean_tool",
                          {"model": "helper", "tool": "note_read", "arguments": "find the notes about disks"})

    first, second = (r.json for r in delegate.requests)
    assert [t["function"]["name"] for t in first["tools"]] == ["note_read"]
    assert _sent(first) == [("user", "find the notes about disks")]  # no guidance section for note_read
    # The call ran once, for the caller's session, one agent call deep; the delegate got its result.
    assert notes.depths == [1]
    assert _sent(second)[-1] == ("tool", "notes matching 'disk': disk full on db1")
    assert not msg.meta["is_error"] and msg.meta["gate"] == "allow"
    assert msg.content == ("model 'helper' called note_read({\"text\": \"disk\"}); it ran.\n"
                           "Its answer:\nOne note: disk full on db1.")
    assert msg.meta["data"]["call"]["result"] == "notes matching 'disk': disk full on db1"

    # A tool with a section in the prompt tree: that section is the delegate's whole system prompt.
    delegate.script(Reply.tool_calls(("read_system_prompt", {"section": "gates"})), Reply.text("read"))
    await call_tool(engine, fake_openai, "llm_clean_tool",
                    {"model": "helper", "tool": "read_system_prompt", "arguments": "show the gates section"})
    request = delegate.requests[2].json
    system = request["messages"][0]
    assert system["role"] == "system" and system["content"].startswith("### tools_prompt: ")
    assert "update_system_prompt edits one section" in system["content"]
    assert "operations assistant" not in system["content"]  # the rest of the prompt stays out
    assert [t["function"]["name"] for t in request["tools"]] == ["read_system_prompt"]
    assert _sent(delegate.requests[3].json)[-1][1].startswith("## gates: When a tool call waits")


async def test_a_delegated_call_meets_the_callers_gate_and_a_denial_stops_it(engine_factory, fake_openai, delegate):
    notes = NotesPlugin()
    engine = await _engine(engine_factory, fake_openai, delegate, notes=notes)
    delegate.script(Reply.tool_calls(("note_write", {"text": "reboot db1 tonight"})),
                    Reply.text("The note could not be written."))
    fake_openai.script(Reply.tool_calls(("llm_clean_tool", {"model": "helper", "tool": "note_write",
                                                             "arguments": "note: reboot db1 tonight"})),
                       Reply.text("done"))
    sub = engine.subscribe("api-gated")
    turn = await engine.submit("api-gated", "go", kind="api")
    opened = await next_event(sub, GATE)
    assert isinstance(opened, GateOpened)
    gate = opened.gate
    # In the caller's inbox, as the caller's call of that tool, saying who wrote it.
    assert (gate.session_id, gate.client_kind, gate.tool, gate.operation) == ("api-gated", "api", "note_write", "write")
    assert gate.summary.endswith("(via delegate model helper)")
    engine.resolve_gate(gate.id, "denied", by="operator")
    result = await turn.wait(30)
    assert result.status == "complete"

    assert notes.notes == []  # never ran
    tool = next(m for m in await engine.history("api-gated") if m.role == "tool")
    assert tool.meta["is_error"]
    assert tool.content.startswith("model 'helper' called note_write({\"text\": \"reboot db1 tonight\"}); "
                                   "it was not run (denied): The operator did not allow the note_write write call")
    assert tool.content.endswith("Its answer:\nThe note could not be written.")
    assert tool.meta["data"]["call"]["gate"] == "denied"
    # The delegate was told, too.
    assert _sent(delegate.last_request.json)[-1] == ("tool", "The operator did not allow the note_write write call; "
                                                     "it was not run. Do not retry it. Explain to the user that "
                                                     "this action was not approved.")
    gates = [m for m in await engine.history("api-gated") if m.role == "gate"]
    assert [m.meta["decision"] for m in gates] == ["denied"]


async def test_stopping_the_caller_cancels_the_delegated_calls_gate(engine_factory, fake_openai, delegate):
    notes = NotesPlugin()
    engine = await _engine(engine_factory, fake_openai, delegate, notes=notes)
    delegate.script(Reply.tool_calls(("note_write", {"text": "x"})))
    fake_openai.script(Reply.tool_calls(("llm_clean_tool", {"model": "helper", "tool": "note_write",
                                                             "arguments": "write x"})))
    sub = engine.subscribe("api-stop")
    turn = await engine.submit("api-stop", "go", kind="api")
    await next_event(sub, GATE)
    assert engine.stop_turn("api-stop")
    result = await turn.wait(30)
    assert result.status == "cancelled"
    assert engine.pending_gates("api-stop") == [] and notes.notes == []
    history = await engine.history("api-stop")
    tool = next(m for m in history if m.role == "tool")
    assert tool.status == "cancelled" and tool.content.startswith("cancelled: the turn was stopped before "
                                                                  "llm_clean_tool finished")
    assert [m.meta["decision"] for m in history if m.role == "gate"] == ["cancelled"]
    assert len(delegate.requests) == 1  # the delegate was not asked for an answer after the stop


async def test_a_delegated_call_denied_by_policy_never_runs(engine_factory, fake_openai, delegate):
    notes = NotesPlugin()
    engine = await _engine(engine_factory, fake_openai, delegate, notes=notes,
                           files={"gates.toml": '[tools.note_read]\nread = "deny"\n'})
    delegate.script(Reply.tool_calls(("note_read", {"text": "x"})), Reply.text("denied, sorry"))
    msg = await call_tool(engine, fake_openai, "llm_clean_tool",
                          {"model": "helper", "tool": "note_read", "arguments": "read"})
    assert notes.depths == []
    assert msg.meta["is_error"] and "it was not run (policy): The gate policy denies note_read read" in msg.content


async def test_a_delegate_calling_another_tool_is_refused_and_nothing_runs(engine_factory, fake_openai, delegate):
    notes = NotesPlugin()
    engine = await _engine(engine_factory, fake_openai, delegate, notes=notes,
                           files={"gates.toml": '[tools.note_write]\nwrite = "allow"\n'})
    delegate.script(Reply.tool_calls(("note_write", {"text": "pwned"})))
    msg = await call_tool(engine, fake_openai, "llm_clean_tool",
                          {"model": "helper", "tool": "note_read", "arguments": "read the notes"})
    assert notes.notes == [] and notes.depths == []
    assert msg.meta["is_error"]
    assert msg.content == ("error: model 'helper' did not call note_read: it asked for note_write, which was "
                           "not run (a delegate may call only the tool it is given).")
    assert msg.meta["data"]["refused"] == [{"tool": "note_write", "arguments": {"text": "pwned"}}]
    assert len(delegate.requests) == 1

    # Beside the right call, a wrong one is still not run; and the delegation tools cannot be handed on.
    delegate.script(Reply.tool_calls(("note_read", {"text": "a"}), ("note_write", {"text": "pwned"})),
                    Reply.text("read them"))
    both = await call_tool(engine, fake_openai, "llm_clean_tool",
                           {"model": "helper", "tool": "note_read", "arguments": "read the notes"})
    assert notes.notes == [] and notes.depths == [1] and not both.meta["is_error"]
    results = [m for m in delegate.last_request.json["messages"] if m["role"] == "tool"]
    assert [r["content"] for r in results] == ["notes matching 'a': none",
                                               "error: note_write was not run: you may call only note_read"]
    nested = await call_tool(engine, fake_openai, "llm_clean_tool",
                             {"model": "helper", "tool": "llm_clean_text", "arguments": "hi"})
    assert nested.meta["is_error"] and "llm_clean_text cannot be handed to another model" in nested.content


async def test_a_text_calling_delegate_gets_the_tool_in_its_prompt_and_its_call_is_parsed(
        engine_factory, fake_openai, delegate):
    notes = NotesPlugin()
    engine = await _engine(engine_factory, fake_openai, delegate, notes=notes, tool_calling="text")
    delegate.script(Reply.text('<tool_call>{"name": "note_read", "arguments": {"text": "t"}}</tool_call>'),
                    Reply.text("nothing there"))
    msg = await call_tool(engine, fake_openai, "llm_clean_tool",
                          {"model": "helper", "tool": "note_read", "arguments": "read"})
    assert notes.depths == [1] and not msg.meta["is_error"]
    first, second = (r.json for r in delegate.requests)
    assert "tools" not in first and "note_read" in first["messages"][0]["content"]
    assert "notes matching 't': none" in _sent(second)[-1][1]
    assert msg.content.endswith("Its answer:\nnothing there")


# ---- !llm_call ------------------------------------------------------------------------------------


async def test_the_operator_switches_delegation_models_per_session_and_it_lasts(
        engine_factory, fake_openai, delegate):
    engine = await _engine(engine_factory, fake_openai, delegate)
    await call_tool(engine, fake_openai, "llm_clean_text", {"model": "helper", "prompt": "hi"})

    refused = await engine.run("api-tools", "!llm_call off helper", kind="api")
    assert "not permitted" in refused.text
    listing = await engine.run("api-tools", "!llm_call", kind="console", is_operator=True)
    assert "helper" in listing.text and "on" in listing.text.split("helper", 1)[1].split()[0]
    assert "plain" not in listing.text
    off = await engine.run("api-tools", "!llm_call off helper", kind="console", is_operator=True)
    assert off.text.split("helper", 1)[1].split()[0] == "off"
    bad = await engine.run("api-tools", "!llm_call off plain", kind="console", is_operator=True)
    assert "'plain' is not a delegation model" in bad.text

    msg = await call_tool(engine, fake_openai, "llm_clean_text", {"model": "helper", "prompt": "hi"})
    assert msg.meta["is_error"] and "the operator switched model 'helper' off for this session" in msg.content
    assert len(delegate.requests) == 1
    other = await call_tool(engine, fake_openai, "llm_clean_text", {"model": "helper", "prompt": "hi"},
                            session="api-other")
    assert not other.meta["is_error"]  # another session keeps it

    # Kept in the session's record: a restarted engine still refuses it there.
    await engine.stop()
    engine = await _engine(engine_factory, fake_openai, delegate)
    msg = await call_tool(engine, fake_openai, "llm_clean_text", {"model": "helper", "prompt": "hi"})
    assert msg.meta["is_error"] and "switched model 'helper' off" in msg.content
    await engine.run("api-tools", "!llm_call on helper", kind="console", is_operator=True)
    msg = await call_tool(engine, fake_openai, "llm_clean_text", {"model": "helper", "prompt": "hi"})
    assert not msg.meta["is_error"]
    audit = [a for a in await engine.store.audit("api-tools") if a.event == "llm_call_switched"]
    assert [a.decision for a in audit] == ["off", "on"]


async def test_without_a_delegation_model_there_are_no_tools_and_the_status_says_why(
        engine_factory, fake_openai, delegate):
    engine = await engine_factory(extra_files={"plugins.toml": plugins_toml({"delegation": {}})},
                                  models={"m": openai_model_entry(fake_openai),
                                          "off": openai_model_entry(delegate, delegation=True, enabled=False)})
    status = next(s for s in engine.plugin_status if s.name == "delegation")
    assert (status.state, status.reason) == ("started", "no tools: no enabled model in models.toml has "
                                                        "delegation = true")
    assert "llm_clean_text" not in engine.tools and "llm_clean_tool" not in engine.tools
    assert "llm_clean_tool" not in (engine.system_prompt("m") or "")  # its prompt section stays out
    listing = await engine.run("console-1", "!llm_call", kind="console", is_operator=True)
    assert any(line.split()[0] == "off" and "disabled in models.toml" in line
               for line in listing.text.splitlines()[1:])


async def test_the_shipped_prompt_guides_the_delegation_tools_when_they_exist(engine_factory, fake_openai, delegate):
    engine = await _engine(engine_factory, fake_openai, delegate)
    prompt = engine.system_prompt("m") or ""
    assert "### tools_delegation: " in prompt and "llm_clean_tool(model, tool, arguments)" in prompt
    assert "[REQUIRES" not in prompt
    tools = {t.name: t for t in engine.tools.all()}
    assert tools["llm_clean_text"].tool_type == tools["llm_clean_tool"].tool_type == "llm_call"
    assert "helper (the helper)" in tools["llm_clean_text"].description
    assert "plain" not in tools["llm_clean_text"].description

