"""Replies stream as they arrive; only what may be a text-form tool call waits for the whole reply.

Each reply comes one character a frame, and the fake stops sending at a chosen point and holds the
connection open: what the user has seen by then is what the engine released before the end. The
tests wait for a condition (text shown), never for time; a reply held back wrongly never shows it.
"""

from __future__ import annotations

import asyncio
from typing import ClassVar

from pydantic import BaseModel

from aiops.engine.engine import Engine
from aiops.engine.events import DONE, TOK, Event
from aiops.engine.plugins import Plugin, PluginAPI, PluginSettings
from aiops.engine.tools import Tool, ToolContext
from tests.fakes.fixtures import openai_model_entry
from tests.fakes.openai_server import FakeOpenAI, Reply

PLUGINS_ON = "[echotool]\nenabled = true\n"


class EchoArgs(BaseModel):
    text: str


class EchoPlugin(Plugin):
    name = "echotool"
    settings_model: ClassVar[type[PluginSettings]] = PluginSettings

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    async def setup(self, api: PluginAPI) -> None:
        async def echo(args: EchoArgs, ctx: ToolContext) -> str:
            self.calls.append(args.text)
            return f"echoed {args.text}"

        api.register_tool(Tool("echo", "echo text back", EchoArgs, "test", echo))


def paused_after(text: str, upto: str) -> Reply:
    """`text` one character a frame; the stream stalls once `upto` (its first occurrence) is sent."""
    sent = text.index(upto) + len(upto)
    return Reply.hang(after_chunks=1 + sent, reply=Reply.text(text, chunks=len(text)))


async def shown_while_paused(engine: Engine, fake: FakeOpenAI, text: str, upto: str, expected: str) -> str:
    """Run a turn whose reply stalls after `upto`; wait until the user has seen `expected`."""
    fake.script(paused_after(text, upto))
    sub = engine.bus.subscribe(session_id="api-stream", names=[TOK])
    turn = await engine.submit("api-stream", "show me", kind="api")
    shown = ""

    async def until_shown() -> None:
        nonlocal shown
        async for e in sub:
            shown += e.data["text"]
            if expected in shown:
                return

    try:
        await asyncio.wait_for(until_shown(), 10)
    except TimeoutError:
        raise AssertionError(f"{expected!r} was never shown while the stream paused; shown: {shown!r}") from None
    finally:
        engine.stop_turn("api-stream")
        await turn.wait(10)
    return shown


SQL_REPLY = "Here is the query:\n```sql\nSELECT name FROM users WHERE id = 3;\n```\nRun it when you are ready."


async def test_text_inside_a_sql_fence_streams_before_the_reply_ends(engine_factory, fake_openai):
    engine = await engine_factory()
    shown = await shown_while_paused(engine, fake_openai, SQL_REPLY, upto="FROM users",
                                     expected="SELECT name FROM users")
    assert shown.startswith("Here is the query:\n```sql\n")


async def test_text_after_a_closed_code_fence_streams_on(engine_factory, fake_openai):
    engine = await engine_factory()
    await shown_while_paused(engine, fake_openai, SQL_REPLY, upto="Run it", expected="```\nRun it")


async def test_a_bash_block_in_a_plain_fence_streams(engine_factory, fake_openai):
    engine = await engine_factory()
    text = "Try:\n```\ndf -h /var\n```\nThen look at the biggest directory."
    await shown_while_paused(engine, fake_openai, text, upto="df -h", expected="```\ndf -h")


async def test_a_reply_opening_with_a_list_of_numbers_streams(engine_factory, fake_openai):
    engine = await engine_factory()
    text = "[1, 2, 3] are the ids that failed; the rest went through."
    await shown_while_paused(engine, fake_openai, text, upto="the ids", expected="[1, 2, 3] are the ids")


async def test_json_that_is_no_call_is_shown_once_it_is_whole(engine_factory, fake_openai):
    engine = await engine_factory()
    text = 'The status:\n```json\n{"disk": "93%", "name": "db1"}\nmore lines follow here\n```\n'
    await shown_while_paused(engine, fake_openai, text, upto='"db1"}', expected='{"disk": "93%", "name": "db1"}')


async def test_a_tag_mentioned_in_prose_streams(engine_factory, fake_openai):
    engine = await engine_factory()
    text = "Text-calling models wrap calls in <tool_call> tags, which I do not need here."
    await shown_while_paused(engine, fake_openai, text, upto="tags, which", expected="<tool_call> tags")


async def run_collecting(engine: Engine, session: str, prompt: str) -> tuple[str, str]:
    """(everything streamed as tok events, the final text) of one turn."""
    events: list[Event] = []
    engine.bus.add_listener(lambda e: events.append(e) if e.session_id == session else None)
    result = await engine.run(session, prompt, kind="api", timeout=15)
    done = [e for e in events if e.name == DONE]
    assert len(done) == 1
    return "".join(e.data["text"] for e in events if e.name == TOK), result.text


CALL = '{"name": "echo", "arguments": {"text": "ping"}}'


async def test_a_native_model_writing_a_json_fence_call_never_shows_its_markup(engine_factory, fake_openai):
    plugin = EchoPlugin()
    engine = await engine_factory(extra_files={"plugins.toml": PLUGINS_ON}, plugins=[plugin])
    text = f"Let me check.\n```json\n{CALL}\n```"
    fake_openai.script(Reply.text(text, chunks=len(text)), Reply.text("pong came back"))
    streamed, final = await run_collecting(engine, "api-call-fence", "ping it")
    assert plugin.calls == ["ping"]
    assert final == "Let me check.\n\npong came back"
    # What streamed reads the same (a line break before the removed call may have gone out).
    assert streamed.replace("\n\n\n", "\n\n") == final


async def test_a_llama_call_with_a_fenced_body_never_shows_its_markup(engine_factory, fake_openai):
    # The parser takes the ```json fence off a <function=NAME> body; what streams must agree.
    plugin = EchoPlugin()
    engine = await engine_factory(extra_files={"plugins.toml": PLUGINS_ON}, plugins=[plugin])
    text = 'Checking.\n<function=echo>\n```json\n{"text": "ping"}\n```\n</function>'
    fake_openai.script(Reply.text(text, chunks=len(text)), Reply.text("pong came back"))
    streamed, final = await run_collecting(engine, "api-call-function-fence", "ping it")
    assert plugin.calls == ["ping"]
    assert final == "Checking.\n\npong came back"
    assert streamed.replace("\n\n\n", "\n\n") == final


async def test_bare_call_json_never_shows(engine_factory, fake_openai):
    plugin = EchoPlugin()
    engine = await engine_factory(extra_files={"plugins.toml": PLUGINS_ON}, plugins=[plugin])
    fake_openai.script(Reply.text(CALL, chunks=len(CALL)), Reply.text("done"))
    streamed, final = await run_collecting(engine, "api-call-bare", "ping it")
    assert plugin.calls == ["ping"]
    assert streamed == final == "done"


async def test_a_text_mode_model_streams_its_prose_but_not_its_calls(engine_factory, fake_openai):
    plugin = EchoPlugin()
    engine = await engine_factory(extra_files={"plugins.toml": PLUGINS_ON}, plugins=[plugin],
                                  models={"m": openai_model_entry(fake_openai, tool_calling="text")})
    text = f"Checking the host.\n<tool_call>{CALL}</tool_call>"
    fake_openai.script(Reply.text(text, chunks=len(text)), Reply.text("pong came back"))
    streamed, final = await run_collecting(engine, "api-text-mode", "ping it")
    assert plugin.calls == ["ping"]
    assert "<tool_call>" not in streamed and '"name"' not in streamed
    assert streamed.startswith("Checking the host.") and final.endswith("pong came back")
    sql = "Sure:\n```sql\nSELECT 1;\n```\n"
    shown = await shown_while_paused(engine, fake_openai, sql, upto="SELECT", expected="SELECT")
    assert shown.startswith("Sure:")
