"""A turn cut short, by a stop or by a failing stream, leaves a history that says what happened.

The real engine and the real openai SDK against the fake server: nothing of ours is patched.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
from pathlib import Path
from typing import ClassVar

from pydantic import BaseModel

from aiops.engine.context import CANCELLED_RESULT, INCOMPLETE_REPLY
from aiops.engine.engine import Engine
from aiops.engine.events import DONE, ERROR, GATE, GATE_RESOLVED, NOTICE, TOK, TOOL_CALL, TOOL_RESULT, Event
from aiops.engine.plugins import Plugin, PluginAPI, PluginSettings
from aiops.engine.tools import Tool, ToolContext, ToolOutput
from tests.fakes.fixtures import openai_model_entry
from tests.fakes.openai_server import FakeOpenAI, Reply, split_text
from tests.support.engine import next_event

PLUGINS_ON = "[slowtools]\nenabled = true\n"


class TextArgs(BaseModel):
    text: str


class SlowPlugin(Plugin):
    """`slow` starts and never finishes (as a long query would); `echo` answers at once."""

    name = "slowtools"
    settings_model: ClassVar[type[PluginSettings]] = PluginSettings

    def __init__(self) -> None:
        super().__init__()
        self.slow_started = asyncio.Event()
        self.slow_finished = False

    async def setup(self, api: PluginAPI) -> None:
        async def slow(args: TextArgs, ctx: ToolContext) -> str:
            self.slow_started.set()
            await asyncio.Event().wait()
            self.slow_finished = True
            return "never"

        async def echo(args: TextArgs, ctx: ToolContext) -> str:
            return f"echoed {args.text}"

        api.register_tool(Tool("slow", "takes forever", TextArgs, "test", slow))
        api.register_tool(Tool("echo", "echo text back", TextArgs, "test", echo))


class RollbackPlugin(Plugin):
    """`slow` runs until cancelled, then rolls back before it ends (a transaction would), and says
    so; `bad` returns data the store cannot keep, so recording its result fails the turn."""

    name = "rollbacktools"
    settings_model: ClassVar[type[PluginSettings]] = PluginSettings

    def __init__(self) -> None:
        super().__init__()
        self.slow_started = asyncio.Event()
        self.turn_done = asyncio.Event()  # set by the test when the turn publishes `done`
        self.rolled_back = asyncio.Event()

    async def setup(self, api: PluginAPI) -> None:
        async def slow(args: TextArgs, ctx: ToolContext) -> str:
            self.slow_started.set()
            try:
                await asyncio.Event().wait()
            finally:
                # The rollback lasts until the turn reports done, or half a second: a turn that
                # does not wait for its cancelled calls reports done first, and this notice follows.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.turn_done.wait(), 0.5)
                ctx.notice("slow: rolled back")
                self.rolled_back.set()
            return "never"

        async def bad(args: TextArgs, ctx: ToolContext) -> ToolOutput:
            await self.slow_started.wait()
            return ToolOutput("done", data=object())  # not JSON: the store refuses the result

        api.register_tool(Tool("slow", "takes forever", TextArgs, "test", slow))
        api.register_tool(Tool("bad", "returns what cannot be stored", TextArgs, "test", bad))


def rows(history: list) -> list[tuple[str, str, str]]:
    return [(m.role, m.status, m.content) for m in history]


async def collect_until(sub, name: str, timeout: float = 10.0) -> list[Event]:  # noqa: ASYNC109
    """Every event up to and including the first one called `name`."""
    seen: list[Event] = []

    async def run() -> list[Event]:
        async for e in sub:
            seen.append(e)
            if e.name == name:
                return seen
        raise AssertionError(f"the subscription ended before {name!r}")

    return await asyncio.wait_for(run(), timeout)


async def test_stop_during_a_tool_call_records_the_call_as_cancelled(engine_factory, fake_openai):
    plugin = SlowPlugin()
    engine: Engine = await engine_factory(extra_files={"plugins.toml": PLUGINS_ON}, plugins=[plugin])
    fake_openai.script(Reply.tool_calls(("echo", {"text": "hi"}), ("slow", {"text": "x"})))
    sub = engine.bus.subscribe(session_id=None)
    turn = await engine.submit("api-stop-tool", "run both", kind="api")
    await asyncio.wait_for(plugin.slow_started.wait(), 10)
    assert engine.stop_turn("api-stop-tool")
    result = await turn.wait(10)
    assert result.status == "cancelled" and not plugin.slow_finished

    events = await collect_until(sub, DONE)
    calls = {e.data["name"]: e.data["id"] for e in events if e.name == TOOL_CALL}
    results = {e.data["id"]: e.data for e in events if e.name == TOOL_RESULT}
    # Every call a UI drew as running gets its result: none is left spinning.
    assert set(results) == set(calls.values())
    slow = results[calls["slow"]]
    assert slow["is_error"] and slow["status"] == "cancelled"
    assert slow["content"].startswith("cancelled: the turn was stopped before slow finished")
    assert results[calls["echo"]]["content"] == "echoed hi" and "status" not in results[calls["echo"]]
    notice = [e.data["text"] for e in events if e.name == NOTICE][-1]
    assert notice == "turn cancelled: stopped slow"

    history = await engine.history("api-stop-tool")
    assert [(m.role, m.status) for m in history] == [
        ("user", "complete"), ("assistant", "complete"), ("tool", "complete"), ("tool", "cancelled"),
        ("notice", "complete")]
    assert {c.name for c in history[1].tool_calls} == {"echo", "slow"}
    cancelled = history[3]
    assert (cancelled.name, cancelled.tool_call_id) == ("slow", calls["slow"])
    assert cancelled.content == slow["content"] and cancelled.meta["is_error"]
    assert history[4].content == "turn cancelled: stopped slow"

    # The model is told what happened to the call, and the session goes on.
    fake_openai.script(Reply.text("sorry it took so long"))
    again = await engine.run("api-stop-tool", "what happened?", kind="api", timeout=10)
    assert again.text == "sorry it took so long"
    tool_msgs = [m for m in fake_openai.last_request.json["messages"] if m["role"] == "tool"]
    assert [m["content"] for m in tool_msgs] == ["echoed hi", slow["content"]]
    assert CANCELLED_RESULT not in str(fake_openai.last_request.json)


async def test_stop_while_a_gate_waits_cancels_the_gate_and_the_call(engine_factory, fake_openai,
                                                                     tmp_path: Path):
    from aiops.config import SHIPPED_PROMPT_DIR

    folder = tmp_path / "prompt"
    shutil.copytree(SHIPPED_PROMPT_DIR / "default", folder)
    role_file = folder / ".system_prompt_role"
    before = role_file.read_text()
    engine: Engine = await engine_factory(models={
        "m": openai_model_entry(fake_openai, system_prompt_folder=str(folder))})
    fake_openai.script(Reply.tool_calls(("update_system_prompt", {
        "section": "role", "operation": "append", "content": "Always answer in haiku."})))
    sub = engine.bus.subscribe(session_id=None)
    turn = await engine.submit("api-stop-gate", "write haiku from now on", kind="api")
    gate = (await next_event(sub, GATE)).data
    assert engine.stop_turn("api-stop-gate")
    assert (await turn.wait(10)).status == "cancelled"

    events = await collect_until(sub, DONE)
    resolved = [e.data for e in events if e.name == GATE_RESOLVED]
    assert [(g["id"], g["decision"], g["by"]) for g in resolved] == [(gate["id"], "cancelled", "stop")]
    (result,) = [e.data for e in events if e.name == TOOL_RESULT]
    assert result["name"] == "update_system_prompt" and result["gate"] == "cancelled"
    assert result["status"] == "cancelled" and result["is_error"]
    assert "waited for approval; it was not executed" in result["content"]
    assert [e.data["text"] for e in events if e.name == NOTICE][-1] == (
        "turn cancelled: stopped update_system_prompt (1 pending gate cancelled)")
    assert role_file.read_text() == before

    history = await engine.history("api-stop-gate")
    tool = next(m for m in history if m.role == "tool")
    assert tool.status == "cancelled" and tool.meta["gate"] == "cancelled"
    assert tool.content == result["content"]
    assert any(m.role == "gate" and m.content.startswith("cancelled") for m in history)
    # The gate is gone from the inbox.
    assert not engine.gatekeeper.broker.pending("api-stop-gate")


async def test_shutting_down_while_a_gate_waits_says_so_in_the_gates_record(engine_factory, fake_openai,
                                                                            tmp_path: Path):
    from aiops.config import SHIPPED_PROMPT_DIR

    folder = tmp_path / "prompt"
    shutil.copytree(SHIPPED_PROMPT_DIR / "default", folder)
    engine: Engine = await engine_factory(models={
        "m": openai_model_entry(fake_openai, system_prompt_folder=str(folder))})
    fake_openai.script(Reply.tool_calls(("update_system_prompt", {
        "section": "role", "operation": "append", "content": "x"})))
    sub = engine.bus.subscribe(session_id=None)
    await engine.submit("api-quit-gate", "change your role", kind="api")
    gate = (await next_event(sub, GATE)).data
    await engine.stop()
    resolved = [e.data for e in await collect_until(sub, DONE) if e.name == GATE_RESOLVED]
    # Not "task-cancelled": the operator reading the audit learns the gate closed with aiops.
    assert [(g["id"], g["decision"], g["by"]) for g in resolved] == [(gate["id"], "cancelled", "shutdown")]


async def test_a_second_stop_does_not_cut_the_record_of_the_first_short(engine_factory, fake_openai):
    plugin = SlowPlugin()
    engine: Engine = await engine_factory(extra_files={"plugins.toml": PLUGINS_ON}, plugins=[plugin])
    fake_openai.script(Reply.tool_calls(("slow", {"text": "x"})))
    second_stop: list[bool] = []

    def impatient(e: Event) -> None:
        # The user stops again just as the first stop is being recorded.
        if e.name == TOOL_RESULT and e.data.get("status") == "cancelled" and not second_stop:
            second_stop.append(engine.stop_turn("api-stop-twice"))

    engine.bus.add_listener(impatient)
    sub = engine.bus.subscribe(session_id=None, names=[DONE, NOTICE])
    turn = await engine.submit("api-stop-twice", "go", kind="api")
    await asyncio.wait_for(plugin.slow_started.wait(), 10)
    assert engine.stop_turn("api-stop-twice")
    assert (await turn.wait(10)).status == "cancelled"
    assert second_stop == [False]  # already being stopped: it says so, and cuts nothing short
    events = await collect_until(sub, DONE)
    assert [e.data.get("text") for e in events if e.name == NOTICE] == ["turn cancelled: stopped slow"]
    assert events[-1].data["status"] == "cancelled"
    history = await engine.history("api-stop-twice")
    assert [m.role for m in history] == ["user", "assistant", "tool", "notice"]
    fake_openai.script(Reply.text("fine"))
    assert (await engine.run("api-stop-twice", "still there?", kind="api", timeout=10)).text == "fine"


async def test_a_stop_at_any_moment_after_submit_ends_the_turn_with_its_record_and_done(engine_factory,
                                                                                      fake_openai):
    """A stop can come before the turn's task has run a single step (an Esc right after Enter, a
    client hanging up as its message is accepted). A task cancelled then never runs: the turn
    ended without a record or a `done`, and its session stayed 'running' for good."""
    engine: Engine = await engine_factory()
    fake_openai.responder = lambda body: Reply.hang()
    for k in range(6):
        sid = f"api-stop-{k}"
        sub = engine.bus.subscribe(session_id=sid, names=[DONE])
        turn = await engine.submit(sid, "go", kind="api")
        for _ in range(k):  # the worker starts the turn's task after a step or two
            await asyncio.sleep(0)
        assert engine.stop_turn(sid), k
        assert (await asyncio.wait_for(turn.wait(), 10)).status == "cancelled", k
        assert (await asyncio.wait_for(sub.get(), 10)).data["status"] == "cancelled", k
        sub.close()
        history = await engine.history(sid)
        assert history[0].role == "user" and history[-1].role == "notice", (k, history)
        live = await engine.session(sid)
        assert live is not None and live.current is None, k  # idle again: a next message runs
    fake_openai.responder = None
    assert (await engine.run("api-stop-0", "still there?", kind="api", timeout=10)).text == "echo: still there?"


async def test_a_dropped_stream_keeps_what_the_user_saw_marked_incomplete(engine_factory,
                                                                          fake_openai: FakeOpenAI):
    engine: Engine = await engine_factory()
    # Frame 0 opens the message; frames 1 and 2 carry text; then the connection drops.
    answer = "The disk is full because the logs grew"
    fake_openai.script(Reply.drop(3, Reply.text(answer, chunks=4)))
    sub = engine.bus.subscribe(session_id=None)
    result = await engine.run("api-drop", "why is the disk full?", kind="api", timeout=20)
    assert result.status == "error"
    events = await collect_until(sub, DONE)
    seen = "".join(e.data["text"] for e in events if e.name == TOK)
    assert seen == "".join(split_text(answer, 4)[:2])
    assert [e.data["code"] for e in events if e.name == ERROR] == ["model_error"]

    history = await engine.history("api-drop")
    assert [(m.role, m.status) for m in history] == [("user", "complete"), ("assistant", "error"),
                                                     ("error", "complete")]
    partial = history[1]
    assert partial.content == seen and partial.meta["incomplete"] is True

    # Sent back, it is marked as cut off, never passed off as a whole answer.
    fake_openai.script(Reply.text("let me finish: the logs grew"))
    await engine.run("api-drop", "go on", kind="api", timeout=10)
    sent = [(m["role"], m["content"]) for m in fake_openai.last_request.json["messages"]
            if m["role"] != "system"]
    assert sent == [("user", "why is the disk full?"),
                    ("assistant", f"{seen}\n\n{INCOMPLETE_REPLY['error']}"),
                    ("user", "go on")]


async def test_a_stopped_reply_goes_back_marked_as_stopped(engine_factory, fake_openai: FakeOpenAI):
    engine: Engine = await engine_factory()
    fake_openai.script(Reply.hang(after_chunks=2, reply=Reply.text("Rotating the logs now", chunks=3)))
    sub = engine.bus.subscribe(session_id=None, names=[TOK])
    turn = await engine.submit("api-stopped", "fix it", kind="api")
    shown = (await next_event(sub, TOK)).data["text"]
    assert engine.stop_turn("api-stopped")
    await turn.wait(10)
    fake_openai.script(Reply.text("ok"))
    await engine.run("api-stopped", "why did you stop?", kind="api", timeout=10)
    assistant = [m["content"] for m in fake_openai.last_request.json["messages"] if m["role"] == "assistant"]
    assert assistant == [f"{shown}\n\n{INCOMPLETE_REPLY['cancelled']}"]


async def test_a_stream_dropped_inside_a_text_call_never_keeps_its_markup(engine_factory, fake_openai):
    engine: Engine = await engine_factory()
    text = 'Checking now.\n<tool_call>{"name": "echo", "arguments": {"text": "a long argument"}}</tool_call>'
    # One character a frame; drop in the middle of the call's JSON.
    fake_openai.script(Reply.drop(1 + text.index("long"), Reply.text(text, chunks=len(text))))
    sub = engine.bus.subscribe(session_id=None)
    result = await engine.run("api-drop-call", "check", kind="api", timeout=20)
    assert result.status == "error"
    events = await collect_until(sub, DONE)
    assert "".join(e.data["text"] for e in events if e.name == TOK) == "Checking now.\n"
    partial = (await engine.history("api-drop-call"))[1]
    assert partial.role == "assistant" and partial.status == "error" and partial.content == "Checking now."


async def test_a_failing_call_ends_the_turn_only_once_its_siblings_have_stopped(engine_factory, fake_openai):
    plugin = RollbackPlugin()
    engine: Engine = await engine_factory(extra_files={"plugins.toml": "[rollbacktools]\nenabled = true\n"},
                                          plugins=[plugin])
    fake_openai.script(Reply.tool_calls(("slow", {"text": "x"}), ("bad", {"text": "y"})))
    events: list[Event] = []

    def watch(e: Event) -> None:
        events.append(e)
        if e.name == DONE:
            plugin.turn_done.set()

    engine.bus.add_listener(watch)
    result = await engine.run("api-sibling-fails", "run both", kind="api", timeout=20)
    assert result.status == "error" and result.error is not None
    assert result.error["code"] == "internal_error"
    await asyncio.wait_for(plugin.rolled_back.wait(), 10)

    # `done` is the turn's last word: the cancelled call's rollback came before it.
    turn = [e for e in events if e.turn_id == result.turn_id]
    assert turn[-1].name == DONE, [e.name for e in turn]
    assert "slow: rolled back" in [e.data["text"] for e in turn if e.name == NOTICE]
    # Each call has one result, the failed one too, none left running.
    calls = {e.data["id"]: e.data["name"] for e in turn if e.name == TOOL_CALL}
    results = [(calls[e.data["id"]], e.data["is_error"]) for e in turn if e.name == TOOL_RESULT]
    assert sorted(results) == [("bad", True), ("slow", True)]
    history = [m for m in await engine.history("api-sibling-fails") if m.role != "notice"]
    assert [(m.role, m.name, m.status) for m in history] == [
        ("user", None, "complete"), ("assistant", None, "complete"), ("tool", "slow", "error"),
        ("tool", "bad", "error"), ("error", None, "complete")]
    assert history[2].content.startswith("error: the turn failed before slow finished")

    # The session goes on.
    fake_openai.script(Reply.text("sorry"))
    assert (await engine.run("api-sibling-fails", "again?", kind="api", timeout=10)).text == "sorry"


class Unprintable:
    def __str__(self) -> str:
        raise RuntimeError("no text for this")


class StubbornPlugin(Plugin):
    """`stubborn` ignores its cancellation until the test releases it (a driver stuck in C code
    would); `unprintable` returns a value that cannot be turned into text."""

    name = "stubborntools"
    settings_model: ClassVar[type[PluginSettings]] = PluginSettings

    def __init__(self) -> None:
        super().__init__()
        self.started = asyncio.Event()
        self.release = asyncio.Event()
        self.ended = asyncio.Event()

    async def setup(self, api: PluginAPI) -> None:
        async def stubborn(args: TextArgs, ctx: ToolContext) -> str:
            self.started.set()
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                await self.release.wait()  # swallows the stop and goes on
            self.ended.set()
            return "late result"

        async def unprintable(args: TextArgs, ctx: ToolContext) -> Unprintable:
            return Unprintable()

        async def self_cancelling(args: TextArgs, ctx: ToolContext) -> str:
            raise asyncio.CancelledError  # as a library might, from inside a tool

        api.register_tool(Tool("stubborn", "ignores stops", TextArgs, "test", stubborn))
        api.register_tool(Tool("unprintable", "returns no text", TextArgs, "test", unprintable))
        api.register_tool(Tool("self_cancelling", "cancels itself", TextArgs, "test", self_cancelling))


async def test_a_tool_that_ignores_its_stop_does_not_hold_the_turn_and_its_late_result_is_dropped(
        engine_factory, fake_openai):
    plugin = StubbornPlugin()
    engine: Engine = await engine_factory(extra_files={"plugins.toml": "[stubborntools]\nenabled = true\n"},
                                          plugins=[plugin])
    fake_openai.script(Reply.tool_calls(("stubborn", {"text": "x"})))
    turn = await engine.submit("api-stubborn", "go", kind="api")
    await asyncio.wait_for(plugin.started.wait(), 10)
    engine.stop_turn("api-stubborn")
    # The turn ends after the grace period, although the tool is still running.
    result = await turn.wait(15)
    assert result.status == "cancelled" and not plugin.ended.is_set()
    plugin.release.set()
    await asyncio.wait_for(plugin.ended.wait(), 10)
    fake_openai.script(Reply.text("next"))
    assert (await engine.run("api-stubborn", "still there?", kind="api", timeout=10)).text == "next"
    tools = [m for m in await engine.history("api-stubborn") if m.role == "tool"]
    assert [(m.name, m.status) for m in tools] == [("stubborn", "cancelled")]  # no late second result


async def test_a_tool_result_that_cannot_become_text_is_an_error_the_model_sees(engine_factory, fake_openai):
    engine: Engine = await engine_factory(extra_files={"plugins.toml": "[stubborntools]\nenabled = true\n"},
                                          plugins=[StubbornPlugin()])
    fake_openai.script(Reply.tool_calls(("unprintable", {"text": "x"})), Reply.text("that tool broke"))
    result = await engine.run("api-unprintable", "go", kind="api", timeout=10)
    assert (result.status, result.text) == ("complete", "that tool broke")
    sent = [m for m in fake_openai.last_request.json["messages"] if m["role"] == "tool"]
    assert [m["content"] for m in sent] == ["error: unprintable failed: no text for this"]


async def test_a_call_cancelled_from_inside_ends_the_turn_as_a_stop_and_is_recorded(engine_factory, fake_openai):
    engine: Engine = await engine_factory(extra_files={"plugins.toml": "[stubborntools]\nenabled = true\n"},
                                          plugins=[StubbornPlugin()])
    fake_openai.script(Reply.tool_calls(("self_cancelling", {"text": "x"}), ("unprintable", {"text": "y"})))
    sub = engine.bus.subscribe(session_id=None)
    result = await engine.run("api-selfcancel", "go", kind="api", timeout=10)
    assert result.status == "cancelled"
    events = await collect_until(sub, DONE)
    calls = {e.data["id"] for e in events if e.name == TOOL_CALL}
    assert {e.data["id"] for e in events if e.name == TOOL_RESULT} == calls  # none left running
    tools = {m.name: m.status for m in await engine.history("api-selfcancel") if m.role == "tool"}
    assert tools["self_cancelling"] == "cancelled"
    fake_openai.script(Reply.text("fine"))
    assert (await engine.run("api-selfcancel", "again", kind="api", timeout=10)).text == "fine"
