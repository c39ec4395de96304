"""The chat and the input: streaming, commands, @model, cancel, history, switching sessions."""

from __future__ import annotations

from textual import events
from textual.geometry import Region

from aiops.tui.widgets.chat import AssistantMessage, CommandOutput, EarlierButton, UserMessage
from aiops.tui.widgets.chat_input import ChatInput
from tests.fakes.openai_server import Reply, call_tool_when, split_text
from tests.tui.conftest import (
    SIZE,
    chat_text,
    ready,
    screen_text,
    send,
    type_text,
    wait_chat,
    wait_for,
    wait_text,
)


async def test_sending_a_message_streams_the_answer(make_app, fake_openai):
    answer = "The **disk** on db-2 is at 91 percent; the largest table is `events`."
    # Held at the fake after the first two pieces (frame 0 is the role) until they are on screen.
    fake_openai.script(Reply.text(answer, chunks=6, hold_after=3))
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await send(pilot, "how full is db-2?")
        await wait_chat(pilot, "how full is db-2?")
        # Part of the answer is on screen while the rest is still coming, through one stream.
        msg = await wait_for(pilot, lambda: next(iter(app.chat.query(AssistantMessage)), None), "an answer")
        await wait_chat(pilot, "The disk on db-2 is")
        assert msg.streaming and msg.text == "".join(split_text(answer, 6)[:2]) and app.chat_input.busy
        fake_openai.release()
        # The final re-render shows the whole message, Markdown rendered (no ** or backticks).
        # (`streaming` turns false as the stream is ended, before that render: wait for both.)
        await wait_for(pilot, lambda: not msg.streaming and msg.markdown.source == answer,
                       "the stream to end and the whole message rendered")
        await wait_chat(pilot, "The disk on db-2 is at 91 percent; the largest table is events.")
        assert "**" not in chat_text(app)
        assert not app.chat_input.busy
        request = fake_openai.last_request.json
        assert request["messages"][-1] == {"role": "user", "content": "how full is db-2?"}


async def test_enter_sends_ctrl_j_breaks_the_line_and_history_comes_back(make_app, fake_openai):
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await type_text(pilot, "first line")
        await pilot.press("ctrl+j")
        await type_text(pilot, "second line")
        assert app.chat_input.text == "first line\nsecond line"
        await pilot.press("enter")
        await wait_text(pilot, "echo: first line")
        assert fake_openai.last_request.json["messages"][-1]["content"] == "first line\nsecond line"
        assert app.chat_input.text == ""
        await send(pilot, "again")
        await wait_text(pilot, "echo: again")
        await pilot.press("up")
        assert app.chat_input.text == "again"
        await pilot.press("up")
        assert app.chat_input.text == "first line\nsecond line"
        await pilot.press("down")
        assert app.chat_input.text == "again"
        await pilot.press("down")
        assert app.chat_input.text == ""


async def test_bang_commands_complete_and_run(make_app, fake_openai):
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await type_text(pilot, "!he")
        assert app.chat_input.suggestion == "lp"
        assert "!help" in screen_text(app)  # the candidates under the input
        await pilot.press("tab")
        assert app.chat_input.text == "!help "
        await pilot.press("enter")
        # (The list is longer than the pane once plugins add theirs: read the output, not the screen.)
        out = await wait_for(pilot, lambda: next((w for w in app.chat.query(CommandOutput)
                                                  if w.text.startswith("Commands:")), None), "the !help output")
        assert "!model [KEY]" in out.text
        await send(pilot, "!model")
        await wait_text(pilot, "Models (* = this session")
        assert fake_openai.requests == []  # commands never reach the model


async def test_typing_asks_the_key_bar_again_only_when_a_completion_comes_or_goes(make_app):
    """The key bar works out its keys from every binding of the focus chain; asked at every key
    typed, that was ~7 % of a key's cost to the console's loop. Only whether there is something
    to complete changes a binding of the input."""
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        asked: list[object] = []
        app.screen.bindings_updated_signal.subscribe(app.chat_input, asked.append, immediate=True)
        await type_text(pilot, "check the disk on db-2")
        await pilot.pause()
        assert asked == []
        await pilot.press("ctrl+l")  # the draft cleared
        await type_text(pilot, "!he")
        await pilot.pause()
        came = len(asked)
        assert came >= 1 and app.chat_input.suggestion == "lp"  # a completion came: asked
        await type_text(pilot, "x")  # "!hex" completes to nothing (TextArea clears the suggestion first)
        await pilot.pause()
        assert len(asked) > came and app.chat_input.suggestion == ""  # it went: asked again
        await pilot.press("backspace")
        await pilot.pause()
        came = len(asked)
        assert app.chat_input.suggestion == "lp"
        await pilot.press("backspace", "backspace", "backspace")
        await pilot.pause()
        assert len(asked) > came and app.chat_input.suggestion == ""  # and went: asked again
        asked.clear()
        await type_text(pilot, "and more plain words")
        await pilot.pause()
        assert asked == []
        await pilot.press("ctrl+l")
        await type_text(pilot, "!he")
        await pilot.press("tab")
        assert app.chat_input.text == "!help "


async def test_tab_on_text_it_cannot_complete_keeps_the_cursor_in_the_input_and_says_why(make_app, fake_openai):
    """Issue 21: tab on a half-typed message moved the focus out of the input without a word."""
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await type_text(pilot, "check the disk")
        await pilot.press("tab")
        assert app.focused is app.chat_input
        assert app.chat_input.text == "check the disk"
        assert "nothing to complete · f6 next pane" in screen_text(app)
        await type_text(pilot, " on db-2")  # the hint goes once the text changes; typing goes on here
        assert app.chat_input.text == "check the disk on db-2"
        assert "nothing to complete" not in screen_text(app)
        # From an empty input tab still moves to the next pane, as everywhere else.
        await pilot.press("ctrl+l")
        await pilot.press("tab")
        assert app.focused is not app.chat_input


async def test_ctrl_l_clears_a_multi_line_draft_and_undo_brings_it_back(make_app, fake_openai):
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await type_text(pilot, "first line")
        await pilot.press("ctrl+j")
        await type_text(pilot, "second line")
        await pilot.press("ctrl+j")
        await type_text(pilot, "third")
        await pilot.press("ctrl+l")
        assert app.chat_input.text == ""
        assert app.focused is app.chat_input
        await pilot.press("ctrl+z")
        assert app.chat_input.text == "first line\nsecond line\nthird"
        await pilot.press("ctrl+l")
        await send(pilot, "something else")
        await wait_text(pilot, "echo: something else")
        assert fake_openai.last_request.json["messages"][-1]["content"] == "something else"
        # F1 on the input names the key.
        await pilot.press("f1")
        await wait_for(pilot, lambda: "clears the whole draft" in screen_text(app), "the input's help")
        assert "ctrl+l clears the whole draft" in screen_text(app)


async def test_at_model_completes_and_sends_one_turn_to_that_model(make_app, fake_openai):
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await type_text(pilot, "@ot")
        assert app.chat_input.suggestion == "her"
        await pilot.press("tab")
        await type_text(pilot, "status please")
        assert app.chat_input.text == "@other status please"
        await pilot.press("enter")
        await wait_text(pilot, "echo: status please")
        assert fake_openai.last_request.json["model"] == "other-model"
        user = app.chat.query(UserMessage).last()
        assert "you @other" in str(user.visual)
        # The session itself stays on its model.
        await send(pilot, "and you?")
        await wait_text(pilot, "echo: and you?")
        assert fake_openai.last_request.json["model"] == "fake-model"


async def test_escape_cancels_the_running_turn_and_puts_the_prompt_back(make_app, fake_openai):
    fake_openai.script(Reply.hang(after_chunks=2))
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await send(pilot, "a very long job")
        await wait_for(pilot, lambda: app.chat_input.busy, "the turn to run")
        await pilot.press("escape")
        await wait_text(pilot, "turn cancelled")
        assert app.chat_input.text == "a very long job"
        await wait_for(pilot, lambda: not app.chat_input.busy, "the turn to end")
        session = app.sessions_list.sessions[app.selected]
        assert session["state"] == "idle"
        history = await app.adapter.engine.history(app.selected)
        assert history[-1].role == "notice" and history[-1].content == "turn cancelled"
        # The prompt is back: enter sends it again.
        await pilot.press("enter")
        await wait_text(pilot, "echo: a very long job")


async def test_escape_right_after_enter_still_puts_the_prompt_back(make_app, fake_openai):
    """Before the turn has begun (no `turn` event yet) a stop ends it all the same: the prompt
    comes back then too."""
    fake_openai.script(Reply.hang())
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await send(pilot, "rotate every log")
        await pilot.press("escape")
        await wait_text(pilot, "turn cancelled")
        assert app.chat_input.text == "rotate every log"
        await wait_for(pilot, lambda: not app.chat_input.busy, "the turn to end")


async def test_escape_on_another_clients_turn_stops_it_but_leaves_the_input_alone(make_app, fake_openai):
    """Their prompt in the operator's input would be one Enter away from being sent again, as the
    operator, into their conversation."""
    fake_openai.script(Reply.hang(after_chunks=2))
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await app.adapter.engine.submit(app.selected, "a script's long question", kind="api")
        await wait_for(pilot, lambda: app.chat_input.busy, "the turn to run")
        await pilot.press("escape")
        await wait_text(pilot, "turn cancelled")
        assert app.chat_input.text == ""


async def test_a_tool_call_stopped_with_escape_shows_cancelled_live_and_from_history(make_app, fake_openai,
                                                                                      notes):
    fake_openai.responder = call_tool_when("slowly", ("slow_read", {}))
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        session = app.selected
        await send(pilot, "read the notes slowly")
        await wait_chat(pilot, "⚙ slow_read {} · running…")
        await wait_for(pilot, notes.slow_started.is_set, "the tool to run")
        await pilot.press("escape")
        await wait_chat(pilot, "turn cancelled")
        # Live: the row says cancelled, neither running nor a plain error.
        await wait_chat(pilot, "⚙ slow_read {} · ⊘ cancelled")
        text = chat_text(app)
        assert "running…" not in text and "✗" not in text
        # From history: another session, then back to this one through the sessions list.
        await pilot.press("ctrl+n")
        await wait_for(pilot, lambda: app.selected != session and app.chat.session_id == app.selected,
                       "the new session")
        await pilot.press("shift+f6")  # the input -> the sessions pane
        await wait_for(pilot, lambda: app.focused is app.sessions_list, "the sessions list")
        await pilot.press("down", "enter")  # the cursor is on the new session; this one is next
        await wait_for(pilot, lambda: app.chat.session_id == session, "the cancelled session again")
        await wait_chat(pilot, "⚙ slow_read {} · ⊘ cancelled")
        assert "running…" not in chat_text(app) and "✗" not in chat_text(app)
        app.chat.focus()
        await pilot.press("t")  # open the blocks: the result says what happened
        await wait_chat(pilot, "cancelled: the turn was stopped before slow_read finished")


async def test_escape_with_nothing_running_keeps_the_text(make_app):
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await type_text(pilot, "draft")
        await pilot.press("escape")
        assert app.chat_input.text == "draft"
        assert "turn cancelled" not in screen_text(app)


async def test_switching_sessions_shows_each_history_and_marks_unread(make_app, fake_openai):
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        first = app.selected
        await send(pilot, "alpha in the console")
        await wait_text(pilot, "echo: alpha in the console")
        engine = app.adapter.engine
        # Another client (an API script) starts its own session.
        await engine.run("script-1", "beta from a script", kind="api", timeout=10)
        await wait_text(pilot, "api (1)")
        api_short = str(app.sessions_list.sessions["script-1"]["short_id"])
        await wait_for(pilot, lambda: "●" in screen_text(app), "the unread marker")
        # Pick the api session from the list.
        sessions = app.sessions_list
        sessions.focus()
        sessions.cursor = "script-1"
        await pilot.press("enter")
        await wait_text(pilot, "echo: beta from a script")
        assert app.selected == "script-1"
        assert f"#{api_short}" in screen_text(app)
        assert "alpha in the console" not in screen_text(app)
        await wait_for(pilot, lambda: "●" not in screen_text(app), "the unread marker gone (the list redraws at 10 Hz)")
        # A new console session from anywhere, then back to the first one.
        await pilot.press("ctrl+n")
        await wait_for(pilot, lambda: app.selected not in (first, "script-1"), "a new session")
        assert isinstance(app.focused, ChatInput)
        await wait_for(pilot, lambda: not app.chat.query(UserMessage), "an empty chat")
        sessions.cursor = first
        sessions.focus()
        await pilot.press("enter")
        await wait_text(pilot, "echo: alpha in the console")


async def test_a_new_session_asked_for_from_one_still_empty_is_that_one(make_app, fake_openai):
    """ctrl+n again and again makes one new session, not one stored and listed per press."""
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        first = app.selected
        await send(pilot, "hello")
        await wait_text(pilot, "echo: hello")
        await pilot.press("ctrl+n")
        await wait_for(pilot, lambda: app.selected != first and app.chat.session_id == app.selected, "a new session")
        fresh, count = app.selected, len(app.sessions_list.sessions)
        app.sessions_list.focus()
        for _ in range(3):
            await pilot.press("ctrl+n")
            await pilot.pause()
        assert app.selected == fresh and len(app.sessions_list.sessions) == count
        assert isinstance(app.focused, ChatInput)
        await send(pilot, "now it has a message")
        await wait_text(pilot, "echo: now it has a message")
        await pilot.press("ctrl+n")  # from a session in use: a new one, as always
        await wait_for(pilot, lambda: app.selected not in (first, fresh), "another new session")
        assert len(app.sessions_list.sessions) == count + 1


async def test_picking_a_session_with_enter_puts_what_is_typed_next_in_the_input(make_app, fake_openai):
    fake_openai.script(Reply.hang(after_chunks=1))
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        busy = app.selected
        await send(pilot, "a long job")
        await wait_for(pilot, lambda: busy in app.live_turn, "the turn to run")
        await pilot.press("ctrl+n")
        await wait_for(pilot, lambda: app.selected != busy and app.chat.session_id == app.selected, "a new session")
        count = len(app.sessions_list.sessions)
        await pilot.press("shift+f6")  # the input -> the sessions pane
        await wait_for(pilot, lambda: app.focused is app.sessions_list, "the sessions list")
        await pilot.press("down", "enter")  # from the new session to the busy one, and pick it
        # Typed right away: the message, not `n` (new session) and `x` (stop the turn).
        await type_text(pilot, "nx hello")
        assert app.chat_input.text == "nx hello" and isinstance(app.focused, ChatInput)
        assert app.selected == busy and len(app.sessions_list.sessions) == count
        await wait_chat(pilot, "› you a long job")
        assert busy in app.live_turn and app.chat_input.busy  # still running
        # Other text typed in the list goes to the input as well, with the focus.
        await pilot.press("shift+f6")
        await wait_for(pilot, lambda: app.focused is app.sessions_list, "the sessions list")
        await type_text(pilot, " again")
        assert app.chat_input.text == "nx hello again" and isinstance(app.focused, ChatInput)
        assert len(app.sessions_list.sessions) == count


async def test_a_burst_typed_in_the_sessions_list_goes_to_the_input_and_opens_nothing(make_app):
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        selected, count = app.selected, len(app.sessions_list.sessions)
        await pilot.press("shift+f6")  # the input -> the sessions pane
        await wait_for(pilot, lambda: app.focused is app.sessions_list, "the sessions list")
        # Both keys from one terminal read: `n` (new session) is queued for the list before the App
        # has moved the focus for `h`.
        app.post_message(events.Key("h", "h"))
        app.post_message(events.Key("n", "n"))
        await wait_for(pilot, lambda: app.chat_input.text == "hn", "both letters in the input")
        await pilot.pause()
        assert isinstance(app.focused, ChatInput)
        assert app.selected == selected and len(app.sessions_list.sessions) == count


async def test_a_running_turn_of_another_session_is_shown_live_when_selected(make_app, fake_openai):
    # Held at the fake after two pieces ("one two th"; frame 0 is the role) until the session is
    # shown: the turn is still running when it is selected, however slow the machine.
    fake_openai.script(Reply.text("one two three four five six seven eight", chunks=8, hold_after=3))
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        engine = app.adapter.engine
        turn = await engine.submit("proxy-chat", "count slowly", kind="proxy")
        await wait_for(pilot, lambda: "proxy-chat" in app.live_turn, "the proxy turn to run")
        await wait_for(pilot, lambda: app.live_events.get("proxy-chat") and any(
            e.name == "tok" for e in app.live_events["proxy-chat"]), "streamed text")
        await app.select_session("proxy-chat")
        await wait_chat(pilot, "› you count slowly")
        await wait_chat(pilot, "one two th")  # what streamed before it was selected
        assert not turn.done
        fake_openai.release()
        await turn.wait(30)
        await wait_chat(pilot, "one two three four five six seven eight")
        # Nothing twice: the history of the live turn is replaced by its events, not added to them.
        assert [m.text for m in app.chat.query(UserMessage)] == ["count slowly"]
        assert [m.text for m in app.chat.query(AssistantMessage)] == ["one two three four five six seven eight"]


async def test_long_history_loads_the_latest_first_and_earlier_on_demand(make_app, fake_openai):
    app = make_app(extra_files={"aiops.toml": "[console]\nhistory_page = 4\n"})
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        engine = app.adapter.engine
        for i in range(1, 5):
            await engine.run("long-1", f"question {i}", kind="api", timeout=10)
        await app.select_session("long-1")
        await wait_text(pilot, "echo: question 4")
        assert "question 2" not in screen_text(app)
        assert app.chat.query(EarlierButton)
        app.chat.focus()
        await pilot.press("e")
        await wait_text(pilot, "echo: question 2")
        await pilot.press("e")
        await wait_text(pilot, "question 1")
        await wait_for(pilot, lambda: not app.chat.query(EarlierButton), "the beginning")


async def test_the_view_follows_the_bottom_only_when_the_reader_is_there(make_app, fake_openai):
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        engine = app.adapter.engine
        for i in range(8):
            await engine.run(app.selected, f"line {i}\n\n" + "filler\n\n" * 3, kind="console", timeout=10)
        chat = app.chat
        await wait_for(pilot, lambda: chat.max_scroll_y > 10, "a scrollable chat")
        await wait_for(pilot, lambda: chat.scroll_y == chat.max_scroll_y, "the bottom")
        chat.focus()
        await pilot.press("home")
        await wait_for(pilot, lambda: chat.scroll_y == 0, "the top")
        await engine.run(app.selected, "while reading above", kind="console", timeout=10)
        await wait_for(pilot, lambda: chat.query(UserMessage).last().text == "while reading above", "the new message")
        await pilot.pause()
        assert chat.scroll_y == 0  # the reader keeps their place
        await pilot.press("end")
        await wait_for(pilot, lambda: chat.scroll_y == chat.max_scroll_y, "the bottom again")
        await engine.run(app.selected, "now following", kind="console", timeout=10)
        await wait_text(pilot, "echo: now following")
        await wait_for(pilot, lambda: chat.scroll_y == chat.max_scroll_y, "following")
        # Scrolled up to read, the operator sends a message of their own: the view goes to it and
        # follows its answer.
        chat.focus()
        await pilot.press("home")
        await wait_for(pilot, lambda: chat.scroll_y == 0, "the top")
        app.chat_input.focus()
        await send(pilot, "my own words")
        await wait_text(pilot, "echo: my own words")
        await wait_for(pilot, lambda: chat.scroll_y == chat.max_scroll_y > 10, "the bottom, following")


async def test_thinking_is_collapsed_and_tool_calls_show_arguments_result_and_duration(make_app, fake_openai):
    fake_openai.script(Reply.reasoning("The user wants the notes, so read them first.",
                                       calls=[("read_note", {"text": ""})]),
                       Reply.text("There are no notes yet."))
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await send(pilot, "what do the notes say?")
        await wait_chat(pilot, "There are no notes yet.")
        # The title grows as thinking arrives; the frame that lays it out may follow the answer's.
        await wait_chat(pilot, "▶ thinking (9 words)")
        text = chat_text(app)
        assert "read them first" not in text
        assert "▶ ⚙ read_note" in text and "✓" in text and " ms" in text
        app.chat.focus()
        await pilot.press("t")  # every block open
        await wait_chat(pilot, "The user wants the notes, so read them first.")
        text = chat_text(app)
        assert '"text": ""' in text and "notes:" in text  # the arguments, then the result preview
        await pilot.press("t")
        await wait_for(pilot, lambda: "read them first" not in chat_text(app), "the blocks to close")


async def test_quitting_cancels_a_running_turn_and_records_it(make_app, fake_openai, tmp_path):
    from aiops.engine.store import Store

    fake_openai.script(Reply.hang(after_chunks=2))
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        session = app.selected
        await send(pilot, "a job that never ends")
        await wait_for(pilot, lambda: app.chat_input.busy, "the turn to run")
        await pilot.press("ctrl+q")
    assert not app.adapter.engine.started
    store = Store(tmp_path / "data" / "aiops.sqlite3")
    await store.open()
    try:
        history = await store.history(session)
    finally:
        await store.close()
    assert [m.role for m in history][:1] == ["user"]
    assert history[-1].role == "notice" and history[-1].content == "turn cancelled"


async def test_a_fresh_session_says_how_to_start_until_something_happens(make_app):
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await ready(pilot)
        await wait_chat(pilot, "New session.")
        text = chat_text(app)
        assert "New session. Type a message below and press enter to send it." in text
        assert "!help lists the commands" in text and "@model text asks another model" in text
        assert "f1 explains the focused pane" in text
        await send(pilot, "hello")
        await wait_chat(pilot, "echo: hello")
        assert "New session." not in chat_text(app)


async def test_command_output_wraps_under_its_columns_in_a_narrow_chat(make_app):
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await ready(pilot)
        await send(pilot, "!help")
        await wait_for(pilot, lambda: app.chat.query(CommandOutput), "the command output")
        output = app.chat.query(CommandOutput).last()
        await wait_for(pilot, lambda: output.size.height > 0, "the output laid out")
        # The lines as the widget draws them (its left border and padding stripped).
        strips = output.render_lines(Region(0, 0, output.size.width, output.size.height))
        lines = [strip.text[2:].rstrip() for strip in strips]
        # Every line after the heading is indented: a wrapped description never starts at the edge.
        assert lines[0] == "Commands:" and all(line.startswith("  ") for line in lines[1:] if line), lines
        # A description too long for the width continues under its own column.
        i = next(i for i, line in enumerate(lines) if "list models /" in line)
        column = lines[i].index("list models /")
        assert lines[i + 1].strip() and len(lines[i + 1]) - len(lines[i + 1].lstrip()) == column, lines[i:i + 2]
        assert all(len(line) < output.size.width for line in lines)


async def test_f6_reaches_the_transcript_so_its_keys_work_from_the_keyboard(make_app, fake_openai):
    """Its keys (expand, think, end) were reachable only by Tab or the mouse."""
    from aiops.tui.widgets.chat import ChatView

    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        assert isinstance(app.focused, ChatInput)
        await pilot.press("f6")
        await wait_for(pilot, lambda: isinstance(app.focused, ChatView), "the transcript")
        await pilot.press("shift+f6")
        await wait_for(pilot, lambda: isinstance(app.focused, ChatInput), "back to the input")
        await pilot.press("shift+f6")  # the input -> the sessions pane, as before
        await wait_for(pilot, lambda: not isinstance(app.focused, (ChatInput, ChatView)), "the sessions pane")


async def test_a_client_tool_call_shows_as_one_until_its_client_answers(make_app, fake_openai):
    """A chat client's own tool (offered through the proxy): the console shows the call as the
    client's, not as running here and not as waiting at a gate; its result, once the client sends
    it, closes it like any other."""
    from aiops.engine.types import ToolSpec

    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await send(pilot, "hi")
        await wait_text(pilot, "echo: hi")
        fake_openai.script(Reply.tool_calls(("get_time", {"tz": "UTC"}, "call_ct")), Reply.text("It is 10:42."))
        engine = app.adapter.engine
        spec = ToolSpec("get_time", "The time.", {"type": "object", "properties": {"tz": {"type": "string"}}})
        turn = await engine.submit(app.selected, "what time is it?", kind="proxy", client_tools=[spec])
        await turn.wait(10)
        await wait_chat(pilot, "⏳ client tool call: runs in the chat client")
        assert "get_time" in chat_text(app)
        assert "running…" not in chat_text(app)
        resumed = await engine.resume(app.selected, [("call_ct", '{"time": "10:42"}')], kind="proxy",
                                      client_tools=[spec])
        await resumed.wait(10)
        await wait_chat(pilot, "It is 10:42.")
        assert "client tool call: runs in the chat client" not in chat_text(app)
