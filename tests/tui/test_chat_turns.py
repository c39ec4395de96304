"""The chat turn by turn: a message queued behind a running turn, live, reloaded and paged back.

A message sent while a turn runs is committed (and posted) at once, before that turn's answer. The
chat shows each turn whole all the same: the running answer grows in place above the queued
prompt, the queued turn's answer goes right after its own prompt, and the history reads the same: the `queued` line (never stored) shows only while its
turn waits.
"""

from __future__ import annotations

import asyncio
from typing import Any

from textual.app import App, ComposeResult

from aiops.engine import events as ev
from aiops.engine.types import Message
from aiops.tui.widgets.chat import (
    AssistantMessage,
    ChatView,
    EarlierButton,
    GateLine,
    ToolCallBlock,
    UserMessage,
)
from tests.fakes.openai_server import Reply
from tests.tui.conftest import SIZE, chat_text, ready, send, wait_chat, wait_for

SLOW = " ".join(f"word{i}" for i in range(1, 31))


def transcript(chat: ChatView) -> list[str]:
    """The chat's widgets top to bottom, one short line each."""
    lines = []
    for w in chat.children:
        match w:
            case UserMessage():
                lines.append(f"› {w.text}")
            case AssistantMessage():
                lines.append(f"« {w.text.strip()}")
            case ToolCallBlock():
                lines.append(f"⚙ {w.tool_name}")
            case GateLine():
                lines.append(f"⚑ {w.gate.decision}")
            case EarlierButton():
                lines.append("↑ earlier")
            case _:  # notices, command output, errors
                lines.append(getattr(w, "text", None) or str(getattr(w, "content", type(w).__name__)))
    return lines


def conversation(chat: ChatView) -> list[str]:
    """The prompts and answers alone (what the store keeps of both, for reloads)."""
    return [line for line in transcript(chat) if line[:2] in ("› ", "« ")]


async def handled(pilot: Any) -> None:
    """What the App is handling now (a history page being drawn) is done: a callback queued
    behind it has run."""
    done = asyncio.Event()
    pilot.app.call_later(done.set)
    await wait_for(pilot, done.is_set, "the App's queue")


async def reload(pilot: Any, session: str) -> None:
    """The session shown again from its history, as picking it in the list does."""
    app = pilot.app
    await app.select_session(session)
    await wait_for(pilot, lambda: app.chat.session_id == session, "the session's history")
    await handled(pilot)


async def test_a_message_queued_behind_a_streaming_answer_does_not_cut_it(make_app, fake_openai):
    # The slow answer streams a third, is held at the fake, then goes on with a tool call of its
    # own turn after the second message was queued.
    fake_openai.script(
        Reply.tool_calls(("read_note", {"text": ""}), text=SLOW, chunks=6, hold_after=3),
        Reply.text("the notes are empty"),
    )
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        session = app.selected
        await send(pilot, "slow one")
        await fake_openai.wait_for_held_async()
        await wait_for(pilot, lambda: any(line.startswith("« word1 ") for line in transcript(app.chat)),
                       "the answer streaming")
        await send(pilot, "second msg")
        await wait_for(pilot, lambda: "queued behind the running turn (1 waiting)" in transcript(app.chat),
                       "the queued notice")
        fake_openai.release()
        await wait_for(pilot, lambda: "« echo: second msg" in transcript(app.chat), "the queued turn's answer")
        await wait_for(pilot, lambda: not app.chat_input.busy, "both turns to end")
        assert transcript(app.chat) == [
            "› slow one",
            f"« {SLOW}",  # one message, whole: the queued prompt did not cut it
            "⚙ read_note",
            "« the notes are empty",
            "› second msg",  # (its `queued` line went when its turn began)
            "« echo: second msg",
        ]
        # Reloaded, the history (stored: both prompts, then the answers) reads the same way.
        await reload(pilot, session)
        assert transcript(app.chat) == [
            "› slow one", f"« {SLOW}", "⚙ read_note", "« the notes are empty",
            "› second msg", "« echo: second msg",
        ]


async def test_the_queued_line_shows_while_the_prompt_waits_and_reopened_the_chat_reads_the_same(
        make_app, fake_openai):
    # What the operator reads: the line while the message waits (live, and in the session shown
    # again meanwhile), gone once its turn begins, so the live chat and the session reopened from
    # the store (which never keeps the line) read alike.
    fake_openai.script(Reply.text(SLOW, chunks=6, hold_after=3))
    queued = "queued behind the running turn (1 waiting)"
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        session = app.selected
        await send(pilot, "slow one")
        await fake_openai.wait_for_held_async()
        await send(pilot, "second msg")
        await wait_chat(pilot, queued)
        await reload(pilot, session)
        await wait_chat(pilot, queued)
        assert chat_text(app).count(queued) == 1
        assert chat_text(app).index("second msg") < chat_text(app).index(queued)
        fake_openai.release()
        await wait_chat(pilot, "echo: second msg")
        await wait_for(pilot, lambda: not app.chat_input.busy, "both turns to end")
        await pilot.pause()
        live = chat_text(app)
        assert "queued behind" not in live
        await reload(pilot, session)
        await wait_chat(pilot, "echo: second msg")
        assert chat_text(app) == live


async def test_several_queued_messages_each_get_their_answer_below_their_prompt(make_app, fake_openai):
    fake_openai.script(Reply.text(SLOW, chunks=6, hold_after=3))
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        engine = app.adapter.engine
        first = await engine.submit("proxy-q", "slow one", kind="proxy")
        await fake_openai.wait_for_held_async()
        await reload(pilot, "proxy-q")
        second = await engine.submit("proxy-q", "second msg", kind="proxy")
        third = await engine.submit("proxy-q", "third msg", kind="proxy")
        fourth = await engine.submit("proxy-q", "fourth msg", kind="proxy")
        await wait_for(pilot, lambda: "queued behind the running turn (3 waiting)" in transcript(app.chat),
                       "three queued")
        # Cancelled before it ran: its prompt stays where it is, and the answer streaming above
        # goes on in one piece.
        assert engine.drop_queued_turn(engine.cache.find("proxy-q"), third)
        await third.wait(10)
        fake_openai.release()
        for turn in (first, second, fourth):
            await turn.wait(30)
        await wait_for(pilot, lambda: "« echo: fourth msg" in transcript(app.chat), "the last answer")
        assert transcript(app.chat) == [
            "› slow one",
            f"« {SLOW}",
            "› second msg",
            "« echo: second msg",
            "› third msg",
            "› fourth msg",
            "« echo: fourth msg",
        ]
        await reload(pilot, "proxy-q")
        assert transcript(app.chat) == [
            "› slow one", f"« {SLOW}", "› second msg", "« echo: second msg", "› third msg",
            "› fourth msg", "« echo: fourth msg",
        ]


async def test_a_session_shown_mid_turn_puts_the_running_answer_above_the_queued_prompts(make_app,
                                                                                        fake_openai):
    fake_openai.script(Reply.text(SLOW, chunks=6, hold_after=3))
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        engine = app.adapter.engine
        first = await engine.submit("proxy-r", "slow one", kind="proxy")
        await fake_openai.wait_for_held_async()
        second = await engine.submit("proxy-r", "second msg", kind="proxy")
        third = await engine.submit("proxy-r", "third msg", kind="proxy")
        await wait_for(pilot, lambda: app.live_events.get("proxy-r") and any(
            isinstance(e, ev.Tok) for e in app.live_events["proxy-r"]), "streamed text")
        # Shown now: the history holds the three prompts (in commit order), the live buffer the
        # running turn's prompt and what it streamed so far.
        await reload(pilot, "proxy-r")
        lines = transcript(app.chat)
        assert lines[0] == "› slow one" and lines[1].startswith("« word1 ") and lines[2:] == [
            "› second msg", "queued behind the running turn (1 waiting)",
            "› third msg", "queued behind the running turn (2 waiting)"]
        fake_openai.release()
        for turn in (first, second, third):
            await turn.wait(30)
        await wait_for(pilot, lambda: "« echo: third msg" in transcript(app.chat), "the last answer")
        assert transcript(app.chat) == [
            "› slow one", f"« {SLOW}", "› second msg", "« echo: second msg", "› third msg",
            "« echo: third msg",
        ]


async def test_a_session_shown_after_its_queue_ran_reads_turn_by_turn(make_app, fake_openai):
    fake_openai.script(Reply.text(SLOW, chunks=6, hold_after=3))
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        engine = app.adapter.engine
        first = await engine.submit("proxy-h", "slow one", kind="proxy")
        await fake_openai.wait_for_held_async()
        second = await engine.submit("proxy-h", "second msg", kind="proxy")
        third = await engine.submit("proxy-h", "third msg", kind="proxy")
        fake_openai.release()
        for turn in (first, second, third):
            await turn.wait(30)
        # Stored in commit order: the three prompts, then the three answers.
        assert [m.role for m in await engine.history("proxy-h")] == ["user"] * 3 + ["assistant"] * 3
        await reload(pilot, "proxy-h")
        assert transcript(app.chat) == [
            "› slow one", f"« {SLOW}", "› second msg", "« echo: second msg", "› third msg",
            "« echo: third msg",
        ]


async def test_earlier_pages_join_their_turns(make_app, fake_openai):
    # Stored: slow one, second msg (queued), then both answers. A page of two splits every turn.
    fake_openai.script(Reply.text(SLOW, chunks=6, hold_after=3))
    app = make_app(extra_files={"aiops.toml": "[console]\nhistory_page = 2\n"})
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        engine = app.adapter.engine
        first = await engine.submit("proxy-p", "slow one", kind="proxy")
        await fake_openai.wait_for_held_async()
        second = await engine.submit("proxy-p", "second msg", kind="proxy")
        fake_openai.release()
        await first.wait(30)
        await second.wait(30)
        assert [m.role for m in await engine.history("proxy-p")] == ["user", "user", "assistant", "assistant"]
        await reload(pilot, "proxy-p")
        assert transcript(app.chat) == ["↑ earlier", f"« {SLOW}", "« echo: second msg"]
        app.chat.focus()
        await pilot.press("e")
        await wait_for(pilot, lambda: "› slow one" in transcript(app.chat), "the earlier page")
        await handled(pilot)
        assert transcript(app.chat) == ["↑ earlier", "› slow one", f"« {SLOW}", "› second msg",
                                        "« echo: second msg"]
        await pilot.press("e")  # (a full page: there may be more)
        await wait_for(pilot, lambda: not app.chat.query(EarlierButton), "the beginning")
        await handled(pilot)
        assert transcript(app.chat) == ["› slow one", f"« {SLOW}", "› second msg", "« echo: second msg"]


# ---- the chat alone, fed events: what else a running turn draws while a prompt waits behind it ----


class ChatOnly(App[None]):
    def compose(self) -> ComposeResult:
        yield ChatView(id="chat")


def _gate(decision: str | None = None) -> ev.GateInfo:
    return ev.GateInfo(id="g1", session_id="s", client_id="s", client_kind="proxy", tool="write_note",
                       tool_type="notes", args={}, operation="write", tables=(), summary="write a note",
                       created_at=0.0, expires_at=None, decision=decision, scope="once" if decision else None)


async def test_the_running_turns_gates_notices_and_errors_stay_with_it():
    app = ChatOnly()
    async with app.run_test(size=SIZE) as pilot:
        chat = app.query_one(ChatView)
        await chat.show("s", [Message("user", "earlier", id=1, turn_id="t0"),
                              Message("assistant", "earlier answer", id=2, turn_id="t0")], has_more=False)
        events: list[ev.Event] = [
            ev.UserPosted(session_id="s", turn_id="t1", text="slow one"),
            ev.TurnStarted(session_id="s", turn_id="t1", model="local"),
            ev.Tok(session_id="s", turn_id="t1", text="word1 wo"),
            ev.UserPosted(session_id="s", turn_id="t2", text="second msg"),
            ev.Notice(session_id="s", turn_id="t2", text="queued behind the running turn (1 waiting)"),
            ev.UserPosted(session_id="s", turn_id="c1", text="!help", command=True),
            ev.Notice(session_id="s", turn_id="c1", text="Commands: …", command="!help", ok=True),
            ev.Done(session_id="s", turn_id="c1", text="", status="complete", model="local", command=True),
            ev.Tok(session_id="s", turn_id="t1", text="rd2 word3"),
            ev.ToolCalled(session_id="s", turn_id="t1", call_id="k1", tool="write_note", arguments={}),
            ev.GateOpened(session_id="s", turn_id="t1", gate=_gate()),
            ev.GateResolved(session_id="s", turn_id="t1", gate=_gate("approved")),
            ev.ToolReturned(session_id="s", turn_id="t1", call_id="k1", tool="write_note", content="noted"),
            ev.Notice(session_id="s", turn_id="t1", text="a notice of the running turn"),
            ev.Tok(session_id="s", turn_id="t1", text="after the tool"),
            ev.ErrorEvent(session_id="s", turn_id="t1", error=ev.ErrorInfo("model_error", "boom")),
            ev.Done(session_id="s", turn_id="t1", text="", status="error", model="local"),
            ev.TurnStarted(session_id="s", turn_id="t2", model="local"),
            ev.Tok(session_id="s", turn_id="t2", text="echo: second msg"),
            ev.Done(session_id="s", turn_id="t2", text="echo: second msg", status="complete", model="local"),
        ]
        for event in events:
            await chat.apply(event)
        await pilot.pause()
        lines = transcript(chat)
        assert lines[:2] == ["› earlier", "« earlier answer"]
        assert lines[2:6] == ["› slow one", "« word1 word2 word3", "⚙ write_note", "⚑ approved"]
        assert lines[6:10] == ["a notice of the running turn", "« after the tool", "error (model_error): boom",
                               "› second msg"]
        assert lines[10:] == ["« echo: second msg", "› !help", "Commands: …"]


async def test_an_earlier_page_adds_nothing_of_the_turn_drawn_from_its_events():
    """A running turn whose prompt is older than the latest page (a long turn, a long queue) is
    drawn from its events; the earlier page's stored prompt is not drawn a second time."""
    app = ChatOnly()
    async with app.run_test(size=SIZE) as pilot:
        chat = app.query_one(ChatView)
        live: list[ev.Event] = [ev.UserPosted(session_id="s", turn_id="t1", text="slow one"),
                                ev.TurnStarted(session_id="s", turn_id="t1", model="local"),
                                ev.Tok(session_id="s", turn_id="t1", text="word1 word2")]
        await chat.show("s", [Message("user", "second msg", id=3, turn_id="t2")], has_more=True, live=live)
        await chat.prepend([Message("user", "earlier", id=1, turn_id="t0"),
                            Message("user", "slow one", id=2, turn_id="t1")], has_more=False)
        await pilot.pause()
        assert [line for line in transcript(chat) if line.startswith("› ")].count("› slow one") == 1


def _write_gate(gid: str, call_id: str, decision: str | None = None) -> ev.GateInfo:
    return ev.GateInfo(id=gid, session_id="s", client_id="s", client_kind="proxy", tool="write_note",
                       tool_type="notes", args={}, operation="write", tables=(), summary="w",
                       created_at=0.0, expires_at=None, call_id=call_id, decision=decision,
                       scope="once" if decision else None)


async def test_a_gate_marks_the_call_it_names_whatever_order_the_events_come_in():
    # Two calls of one tool drawn before either gate arrives (the engine runs them concurrently):
    # each gate names its call (`call_id`), so answering the second leaves the first waiting.
    # (Matched by tool name, the first gate took the latest block.) From the review of b51f0bb.
    app = ChatOnly()
    async with app.run_test(size=SIZE) as pilot:
        chat = app.query_one(ChatView)
        await chat.show("s", [], has_more=False)
        for e in [ev.UserPosted(session_id="s", turn_id="t1", text="two"),
                  ev.TurnStarted(session_id="s", turn_id="t1", model="local"),
                  ev.ToolCalled(session_id="s", turn_id="t1", call_id="k1", tool="write_note", arguments={}),
                  ev.ToolCalled(session_id="s", turn_id="t1", call_id="k2", tool="write_note", arguments={}),
                  ev.GateOpened(session_id="s", turn_id="t1", gate=_write_gate("g1", "k1")),
                  ev.GateOpened(session_id="s", turn_id="t1", gate=_write_gate("g2", "k2")),
                  ev.GateResolved(session_id="s", turn_id="t1", gate=_write_gate("g2", "k2", "approved"))]:
            await chat.apply(e)
        await pilot.pause()
        blocks = {b.call_id: b for b in chat.query(ToolCallBlock)}
        assert blocks["k1"].waiting, "k1's gate is still open"
        assert not blocks["k2"].waiting


async def test_details_opens_the_calls_of_a_session_switched_to_at_the_first_press():
    # QA as a new user: `t` in one session, then in another whose calls are drawn closed, did
    # nothing at the first press (it toggled the remembered "open" to closed).
    from aiops.engine.types import ToolCall

    def history(sid: str) -> list[Message]:
        call = ToolCall(f"c-{sid}", "read_note", {"name": "a"})
        return [Message("user", "read it", id=1, turn_id="t1"),
                Message("assistant", "", tool_calls=[call], id=2, turn_id="t1"),
                Message("tool", "buy milk", tool_call_id=call.id, name="read_note", id=3, turn_id="t1"),
                Message("assistant", "it says buy milk", id=4, turn_id="t1")]

    app = ChatOnly()
    async with app.run_test(size=SIZE) as pilot:
        chat = app.query_one(ChatView)
        await chat.show("s1", history("s1"), has_more=False)
        assert all(b.collapsed for b in chat.query(ToolCallBlock))
        chat.action_toggle_details()
        await pilot.pause()
        assert not any(b.collapsed for b in chat.query(ToolCallBlock))
        await chat.show("s2", history("s2"), has_more=False)
        await pilot.pause()
        assert all(b.collapsed for b in chat.query(ToolCallBlock))
        chat.action_toggle_details()
        await pilot.pause()
        assert not any(b.collapsed for b in chat.query(ToolCallBlock)), "opened at the first press"
        chat.action_toggle_details()
        assert all(b.collapsed for b in chat.query(ToolCallBlock))
