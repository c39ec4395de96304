"""The agent turn, end to end: the real engine and the real openai SDK against the fake server."""

from __future__ import annotations

import asyncio
import json
from typing import ClassVar

from pydantic import BaseModel

from aiops.engine.events import DONE, ERROR, GATE, NOTICE, TOK, Event
from aiops.engine.plugins import Plugin, PluginAPI, PluginSettings
from aiops.engine.tools import Tool, ToolContext
from tests.fakes.fixtures import gemini_model_entry, openai_model_entry
from tests.fakes.openai_server import FakeOpenAI, Reply
from tests.support.engine import next_event

PLUGINS_ON = "[testtools]\nenabled = true\n"


class EchoArgs(BaseModel):
    text: str


class WaitArgs(BaseModel):
    name: str


class ToolsPlugin(Plugin):
    """Tools whose behaviour a test can observe: echo, raise, and a pair that must run concurrently."""

    name = "testtools"
    settings_model: ClassVar[type[PluginSettings]] = PluginSettings

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []
        self.started: dict[str, asyncio.Event] = {}

    async def setup(self, api: PluginAPI) -> None:
        async def echo(args: EchoArgs, ctx: ToolContext) -> str:
            self.calls.append(args.text)
            return f"echoed {args.text}"

        async def boom(args: EchoArgs, ctx: ToolContext) -> str:
            raise RuntimeError("the disk is on fire")

        async def meet(args: WaitArgs, ctx: ToolContext) -> str:
            # Each call waits until the other has started: only concurrent execution finishes.
            self.started.setdefault(args.name, asyncio.Event()).set()
            other = "b" if args.name == "a" else "a"
            await asyncio.wait_for(self.started.setdefault(other, asyncio.Event()).wait(), 5)
            return f"{args.name} met {other}"

        api.register_tool(Tool("echo", "echo text back", EchoArgs, "test", echo))
        api.register_tool(Tool("boom", "always fails", EchoArgs, "test", boom))
        api.register_tool(Tool("meet", "waits for its twin", WaitArgs, "test", meet))


def sent_messages(fake: FakeOpenAI, i: int = -1) -> list[dict]:
    return fake.requests[i].json["messages"]


def tool_contents(fake: FakeOpenAI, i: int = -1) -> list[str]:
    return [m["content"] for m in sent_messages(fake, i) if m["role"] == "tool"]


async def test_streams_text_and_commits_history(engine_factory, fake_openai):
    engine = await engine_factory()
    # Held at the fake after the first piece (frame 0 is the role): that piece is published while
    # the rest is still to come, then the rest follows.
    fake_openai.script(Reply.text("hello operator", chunks=4, hold_after=2))
    published: list[str] = []
    first = asyncio.Event()

    def on_event(e: Event) -> None:
        if e.name == TOK:
            published.append(e.data["text"])
            first.set()

    engine.bus.add_listener(on_event)
    turn = await engine.submit("api-1", "hi", kind="api")
    async with asyncio.timeout(30):
        await first.wait()
    assert "".join(published) == "hell" and not turn.done
    fake_openai.release()
    result = await turn.wait(30)
    assert result.status == "complete" and result.text == "hello operator"
    assert len(published) > 1 and "".join(published) == "hello operator"
    history = await engine.history("api-1")
    assert [(m.role, m.content) for m in history] == [("user", "hi"), ("assistant", "hello operator")]


async def test_parallel_tool_calls_run_concurrently_and_results_go_back(engine_factory, fake_openai):
    plugin = ToolsPlugin()
    engine = await engine_factory(extra_files={"plugins.toml": PLUGINS_ON}, plugins=[plugin])
    fake_openai.script(Reply.tool_calls(("meet", {"name": "a"}), ("meet", {"name": "b"})),
                       Reply.text("both met"))
    result = await engine.run("api-p", "go", kind="api", timeout=15)
    assert result.text == "both met"
    assert sorted(tool_contents(fake_openai)) == ["a met b", "b met a"]
    calls = [m for m in sent_messages(fake_openai) if m["role"] == "assistant"][0]["tool_calls"]
    assert len(calls) == 2


async def test_tool_errors_reach_the_model_and_the_turn_goes_on(engine_factory, fake_openai):
    plugin = ToolsPlugin()
    engine = await engine_factory(extra_files={"plugins.toml": PLUGINS_ON}, plugins=[plugin])
    fake_openai.script(
        Reply.tool_calls(("boom", {"text": "x"}), ("echo", {"wrong": 1}), ("no_such_tool", {})),
        Reply.text("recovered"))
    result = await engine.run("api-e", "go", kind="api", timeout=15)
    assert result.status == "complete" and result.text == "recovered"
    boom, bad_args, unknown = tool_contents(fake_openai)
    assert "boom failed: the disk is on fire" in boom
    assert "invalid arguments for echo" in bad_args and "text" in bad_args
    assert "unknown tool 'no_such_tool'" in unknown and "echo" in unknown
    assert plugin.calls == []  # the invalid echo call never ran


async def test_text_tool_calls_for_text_mode_models(engine_factory, fake_openai):
    plugin = ToolsPlugin()
    engine = await engine_factory(
        extra_files={"plugins.toml": PLUGINS_ON}, plugins=[plugin],
        models={"m": openai_model_entry(fake_openai, tool_calling="text")})
    fake_openai.script(
        Reply.text('Let me check.\n<tool_call>{"name": "echo", "arguments": {"text": "ping"}}</tool_call>'),
        Reply.text("pong received"))
    sub = engine.bus.subscribe()
    result = await engine.run("api-t", "ping it", kind="api", timeout=15)
    assert plugin.calls == ["ping"]
    first = fake_openai.requests[0].json
    assert "tools" not in first  # tools are described in the prompt instead
    assert "<tool_call>" in first["messages"][0]["content"] and "echo" in first["messages"][0]["content"]
    last = sent_messages(fake_openai)
    assert last[-1]["role"] == "user" and "echoed ping" in last[-1]["content"]
    streamed = "".join(e.data["text"] for e in sub.pending() if e.name == TOK)
    assert "<tool_call>" not in streamed and "Let me check." in streamed
    assert result.text.endswith("pong received")


async def test_native_model_writing_a_text_call_still_works(engine_factory, fake_openai):
    plugin = ToolsPlugin()
    engine = await engine_factory(extra_files={"plugins.toml": PLUGINS_ON}, plugins=[plugin])
    fake_openai.script(Reply.text('<function=echo>{"text": "llama"}</function>'), Reply.text("ok"))
    await engine.run("api-n", "go", kind="api", timeout=15)
    assert plugin.calls == ["llama"]


async def test_sql_looking_text_is_never_executed(engine_factory, fake_openai):
    plugin = ToolsPlugin()
    engine = await engine_factory(extra_files={"plugins.toml": PLUGINS_ON}, plugins=[plugin])
    fake_openai.script(Reply.text("You could run:\nDELETE FROM users WHERE id = 3;"))
    result = await engine.run("api-q", "how do I delete", kind="api", timeout=10)
    assert "DELETE FROM users" in result.text and len(fake_openai.requests) == 1


async def test_the_same_call_a_third_time_ends_the_turn(engine_factory, fake_openai):
    plugin = ToolsPlugin()
    engine = await engine_factory(extra_files={"plugins.toml": PLUGINS_ON}, plugins=[plugin])
    same = Reply.tool_calls(("echo", {"text": "again"}))
    fake_openai.script(same, same, same, Reply.text("never reached"))
    sub = engine.bus.subscribe(names=[NOTICE])
    result = await engine.run("api-r", "loop", kind="api", timeout=15)
    assert plugin.calls == ["again", "again"]
    assert "third time" in (await next_event(sub, NOTICE)).data["text"]
    assert result.status == "complete" and len(fake_openai.requests) == 3
    # The result says the text is not a whole answer, and why.
    assert result.ended == "ended the turn: echo was called a third time with the same arguments"


async def test_max_tool_iterations_bounds_the_turn(engine_factory, fake_openai):
    plugin = ToolsPlugin()
    engine = await engine_factory(extra_files={"plugins.toml": PLUGINS_ON,
                                               "limits.toml": "max_tool_iterations = 2\n"},
                                  plugins=[plugin])
    fake_openai.script(*[Reply.tool_calls(("echo", {"text": str(i)})) for i in range(5)])
    sub = engine.bus.subscribe(names=[NOTICE, DONE])
    result = await engine.run("api-i", "go", kind="api", timeout=15)
    assert plugin.calls == ["0", "1"]
    assert "2 tool iterations" in (await next_event(sub, NOTICE)).data["text"]
    assert (await next_event(sub, DONE)).data["ended"] == result.ended == (
        "ended the turn after 2 tool iterations (max_tool_iterations in limits.toml)")


async def test_messages_queue_in_order_one_turn_at_a_time(engine_factory, fake_openai):
    engine = await engine_factory()
    fake_openai.script(Reply.slow(0.3, Reply.text("first answer")), Reply.text("second answer"))
    t1 = await engine.submit("api-o", "one", kind="api")
    t2 = await engine.submit("api-o", "two", kind="api")
    r1, r2 = await asyncio.gather(t1.wait(30), t2.wait(30))
    assert (r1.text, r2.text) == ("first answer", "second answer")
    # the second request already saw the first exchange
    assert [m["content"] for m in sent_messages(fake_openai) if m["role"] != "system"] == [
        "one", "first answer", "two"]



async def test_shutdown_ends_running_and_queued_turns_and_says_so_after_a_restart(
        engine_factory, fake_openai):
    engine = await engine_factory()
    fake_openai.script(Reply.hang())
    running = await engine.submit("api-q", "long one", kind="api")
    await fake_openai.wait_for_requests_async(1)
    queued = await engine.submit("api-q", "waiting behind it", kind="api")
    await engine.stop()
    assert (await running.wait(5)).status == "cancelled"
    assert (await queued.wait(5)).status == "cancelled"  # a wait=true submit is answered at once
    again = await engine_factory()
    history = await again.history("api-q")
    waiting = [m for m in history if m.turn_id == queued.id]
    assert [m.role for m in waiting] == ["user", "notice"]
    assert waiting[0].content == "waiting behind it" and "shutting down" in waiting[1].content

async def test_stop_cancels_cleanly_and_the_session_stays_usable(engine_factory, fake_openai):
    engine = await engine_factory()
    fake_openai.script(Reply.hang(after_chunks=2))
    sub = engine.bus.subscribe()
    turn = await engine.submit("api-s", "long one", kind="api")
    await next_event(sub, TOK)
    assert engine.stop_turn("api-s")
    result = await turn.wait(10)
    assert result.status == "cancelled"
    history = await engine.history("api-s")
    assert history[-2].role == "assistant" and history[-2].status == "cancelled" and history[-2].content
    assert history[-1].role == "notice" and "cancelled" in history[-1].content
    fake_openai.script(Reply.text("back again"))
    assert (await engine.run("api-s", "still there?", kind="api", timeout=10)).text == "back again"


async def test_failing_model_is_an_error_event_and_the_session_survives(engine_factory, fake_openai):
    engine = await engine_factory()
    fake_openai.script(Reply.error(500, "upstream exploded"))
    sub = engine.bus.subscribe()
    result = await engine.run("api-f", "hi", kind="api", timeout=10)
    assert result.status == "error"
    err = (await next_event(sub, ERROR)).data
    assert err["code"] == "model_error"
    assert "'m'" in err["message"] and fake_openai.url in err["message"] and "500" in err["message"]
    done = (await next_event(sub, DONE)).data
    assert done["status"] == "error"
    fake_openai.script(Reply.text("recovered"))
    assert (await engine.run("api-f", "again", kind="api", timeout=10)).text == "recovered"


async def test_unreachable_model_names_model_and_url(engine_factory, fake_openai):
    engine = await engine_factory(models={
        "m": openai_model_entry(fake_openai),
        "down": {"type": "openai", "model_id": "x", "base_url": "http://127.0.0.1:1/v1", "timeout": 5},
    })
    result = await engine.run("api-u", "@down hello", kind="api", timeout=20)
    assert result.status == "error"
    assert "'down'" in result.error["message"] and "127.0.0.1:1" in result.error["message"]
    fake_openai.script(Reply.text("the default model still works"))
    assert (await engine.run("api-u", "hi", kind="api", timeout=10)).status == "complete"


async def test_at_model_is_one_turn_then_back(engine_factory, fake_openai):
    engine = await engine_factory(models={
        "m": openai_model_entry(fake_openai, model_id="main-model"),
        "other": openai_model_entry(fake_openai, model_id="other-model"),
    })
    await engine.run("api-a", "@other who are you", kind="api", timeout=10)
    await engine.run("api-a", "and now?", kind="api", timeout=10)
    assert [r.json["model"] for r in fake_openai.requests] == ["other-model", "main-model"]
    assert sent_messages(fake_openai, 0)[-1]["content"] == "who are you"


async def test_commands_never_reach_the_model(engine_factory, fake_openai):
    engine = await engine_factory(models={
        "m": openai_model_entry(fake_openai, model_id="main-model"),
        "other": openai_model_entry(fake_openai, model_id="other-model"),
    })
    out = (await engine.run("console-c", "!frobnicate", kind="console", is_operator=True)).text
    assert out.startswith("unknown command !frobnicate") and "!help" in out
    out = (await engine.run("console-c", "!model", kind="console", is_operator=True)).text
    assert "* " in out and "other" in out
    assert not fake_openai.requests
    result = await engine.run("console-c", "!model other\nwhich model?\n!session", kind="console",
                              is_operator=True, timeout=10)
    assert "now uses other" in result.text and "console" in result.text
    assert fake_openai.requests[-1].json["model"] == "other-model"
    assert sent_messages(fake_openai)[-1]["content"] == "which model?"
    await engine.run("console-c", "!reset", kind="console", is_operator=True)
    await engine.run("console-c", "fresh start", kind="console", timeout=10)
    assert [m["content"] for m in sent_messages(fake_openai) if m["role"] == "user"] == ["fresh start"]


async def test_context_trimming_keeps_tool_pairs(engine_factory, fake_openai):
    plugin = ToolsPlugin()
    engine = await engine_factory(extra_files={"plugins.toml": PLUGINS_ON}, plugins=[plugin],
                                  models={"m": openai_model_entry(fake_openai, max_context=4)})
    for i in range(3):
        fake_openai.script(Reply.tool_calls(("echo", {"text": str(i)})), Reply.text(f"answer {i}"))
        await engine.run("api-x", f"question {i}", kind="api", timeout=10)
    for req in fake_openai.requests:
        msgs = [m for m in req.json["messages"] if m["role"] != "system"]
        ids = {c["id"] for m in msgs for c in m.get("tool_calls") or []}
        assert all(m["tool_call_id"] in ids for m in msgs if m["role"] == "tool")
        assert msgs[0]["role"] == "user"
    assert len([m for m in sent_messages(fake_openai) if m["role"] != "system"]) <= 4


async def test_assembled_system_prompt_is_sent_to_the_model(engine_factory, fake_openai):
    engine = await engine_factory()
    await engine.run("api-sp", "hi", kind="api", timeout=10)
    system = sent_messages(fake_openai, 0)[0]
    assert system["role"] == "system"
    tree = engine.prompts.get(engine.prompt_folder("m"))
    # Exactly the tree as assembled for the tools this engine has (sections needing others drop).
    assert system["content"] == tree.assemble(engine.tools.names())
    for s in tree.active(engine.tools.names()):
        assert f"{s.name}: {s.description}" in system["content"]


async def test_update_system_prompt_is_gated(engine_factory, fake_openai, tmp_path):
    import shutil

    from aiops.config import SHIPPED_PROMPT_DIR

    folder = tmp_path / "prompt"
    shutil.copytree(SHIPPED_PROMPT_DIR / "default", folder)
    engine = await engine_factory(models={"m": openai_model_entry(fake_openai,
                                                                  system_prompt_folder=str(folder))})
    role_file = folder / ".system_prompt_role"
    before = role_file.read_text()
    edit = ("update_system_prompt", {"section": "role", "operation": "append",
                                     "content": "Always answer in haiku."})
    sub = engine.bus.subscribe(names=[GATE])

    # denied: nothing changes
    fake_openai.script(Reply.tool_calls(edit), Reply.text("ok"))
    turn = await engine.submit("api-g", "write haiku from now on", kind="api")
    gate = (await next_event(sub, GATE)).data
    assert gate["tool"] == "update_system_prompt" and gate["operation"] == "write"
    engine.gatekeeper.broker.resolve(gate["id"], "deny", by="op")
    await turn.wait(10)
    assert role_file.read_text() == before

    # approved: the section changes, the next turn's system prompt has it, the audit has the diff
    fake_openai.script(Reply.tool_calls(edit), Reply.text("ok"))
    turn = await engine.submit("api-g", "please, really", kind="api")
    gate = (await next_event(sub, GATE)).data
    engine.gatekeeper.broker.resolve(gate["id"], "approve", by="op")
    await turn.wait(10)
    assert "Always answer in haiku." in role_file.read_text()
    await engine.run("api-g", "next", kind="api", timeout=10)
    assert "Always answer in haiku." in sent_messages(fake_openai)[0]["content"]
    edits = [a for a in await engine.store.audit("api-g") if a.event == "prompt_edit"]
    assert len(edits) == 1 and "+Always answer in haiku." in edits[0].data["diff"]


async def test_gemini_backend_runs_a_turn_with_a_tool(engine_factory, fake_openai, fake_gemini):
    from tests.fakes.gemini_server import Reply as GReply

    plugin = ToolsPlugin()
    engine = await engine_factory(extra_files={"plugins.toml": PLUGINS_ON}, plugins=[plugin],
                                  models={"g": gemini_model_entry(fake_gemini)}, default="g")
    fake_gemini.script(GReply.tool_calls(("echo", {"text": "gem"})), GReply.text("gemini done"))
    result = await engine.run("api-gem", "hi", kind="api", timeout=15)
    assert result.text == "gemini done" and plugin.calls == ["gem"]
    last = fake_gemini.requests[-1].json
    assert json.dumps(last).count("functionResponse") == 1


async def test_a_turn_dropped_before_its_task_began_never_reaches_the_model_and_the_next_one_runs(
        engine_factory, fake_openai):
    """A chat client that hangs up right after its message was taken in: the turn is still queued
    (its task has not begun), so it is dropped as cancelled, never started; the session goes on."""
    engine = await engine_factory()
    fake_openai.script(Reply.text("the second answer"))
    began: list[str | None] = []
    engine.bus.add_listener(lambda e: began.append(e.turn_id) if e.name == "turn" else None)
    first = await engine.submit("api-drop", "first", kind="api")
    live = await engine.session("api-drop")
    assert live is not None and engine.drop_queued_turn(live, first)
    second = await engine.submit("api-drop", "second", kind="api")
    assert (await first.wait(5)).status == "cancelled"
    assert (await second.wait(10)).text == "the second answer"
    assert began == [second.id] and len(fake_openai.requests) == 1
    assert [m.content for m in await engine.store.history("api-drop") if m.role == "user"] == ["first", "second"]
