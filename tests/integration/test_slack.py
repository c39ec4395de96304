"""The Slack plugin end to end: the real slack-sdk clients against the fake Slack (Web API and
Socket Mode), the real engine against the fake model."""

from __future__ import annotations

import asyncio
import logging
import os
import re
import subprocess
import sys

from aiops.engine.engine import Engine
from aiops.integrations.slack.gate_blocks import APPROVE, DENY
from aiops.integrations.slack.plugin import HELP, NOT_PERMITTED, USER_REFUSED
from aiops.integrations.slack.threads import WORKING
from tests.fakes.fixtures import make_config_dir, openai_model_entry
from tests.fakes.openai_server import FakeOpenAI, Reply, call_tool_when, message_text
from tests.fakes.slack_server import APP_TOKEN, BOT_TOKEN, FakeSlack, Posted
from tests.support.slack import SLACK_ENV, WriteNotePlugin, slack_table

NOTE = ("write_note", {"text": "disk at 91%"})
# How a reply still in progress starts: the placeholder's states and a gate still waiting.
STATUSES = (WORKING, ":raised_hand:", ":hourglass_flowing_sand:")


async def slack_engine(engine_factory, slack: FakeSlack, *, plugins=None, env=None, files=None,
                       **settings) -> Engine:
    """An engine with the Slack plugin (found through its entry point) connected to the fake."""
    toml = slack_table(slack, **settings) + ("\n[notes]\nenabled = true\n" if plugins else "")
    engine = await engine_factory(extra_files={"plugins.toml": toml, **(files or {})}, plugins=plugins,
                                  env=SLACK_ENV if env is None else env)
    if env is None:
        await slack.wait_connected()
        await engine.plugins_ready()
    return engine


def status(engine: Engine):
    return next(s for s in engine.plugin_status if s.name == "slack")


async def answered(slack: FakeSlack, thread_ts: str, n: int = 1, channel: str = "C1") -> list[Posted]:
    """The thread once it holds `n` finished replies (none still saying "working…")."""
    def done():
        msgs = slack.thread(channel, thread_ts)
        finished = [m for m in msgs if not m.text.startswith(STATUSES)]
        return msgs if len(finished) >= n and len(finished) == len(msgs) else None
    return await slack.wait_for(done, f"{n} answer(s) in thread {thread_ts}")


def user_texts(fake: FakeOpenAI) -> list[str]:
    """What the model was asked, per request (its last user message)."""
    out = []
    for r in fake.requests:
        users = [m for m in r.json["messages"] if m.get("role") == "user"]
        out.append(message_text(users[-1]) if users else "")
    return out


async def test_a_mention_is_answered_in_its_thread(fake_slack, engine_factory, fake_openai):
    engine = await slack_engine(engine_factory, fake_slack)
    assert status(engine).state == "started" and status(engine).reason == "connected as @aiops (Fake Team)"
    fake_openai.script(Reply.text("The **disk** is at `91%` & <rising>"))
    event = fake_slack.mention("U1", "how full is <#C9|ops>'s disk?")
    envelope = await fake_slack.send_event(event)
    (reply,) = await answered(fake_slack, event["ts"])
    # Acknowledged at once, before anything was posted; the placeholder became the answer.
    assert fake_slack.log.index(f"ack {envelope}") < fake_slack.log.index(f"chat.postMessage {reply.ts}")
    assert reply.versions[0] == WORKING
    assert reply.text == "The *disk* is at `91%` &amp; &lt;rising&gt;"
    # The model read the user's words: no mention token, the channel by name.
    assert user_texts(fake_openai) == ["how full is #ops's disk?"]
    sessions = await engine.list_sessions(kind="slack")
    assert [s["client_id"] for s in sessions] == [f"slack-C1-{event['ts']}"]


async def test_one_message_as_message_and_app_mention_and_redelivered_is_answered_once(
        engine_factory, fake_slack, fake_openai):
    await slack_engine(engine_factory, fake_slack)
    mention = fake_slack.mention("U1", "status?")
    twin = {**mention, "type": "message"}  # the same message, as the `message` event
    envelopes = [await fake_slack.send_event(twin), await fake_slack.send_event(mention, event_id="Ev1"),
                 await fake_slack.send_event(mention, event_id="Ev1", retry_attempt=1)]
    for env in envelopes:
        await fake_slack.wait_acked(env)
    await answered(fake_slack, mention["ts"])
    # A later message of the thread queues behind any duplicate turn: once it is answered, a
    # duplicate would have been too.
    await fake_slack.send_event(fake_slack.mention("U1", "and now?", thread_ts=mention["ts"]))
    msgs = await answered(fake_slack, mention["ts"], 2)
    assert [m.text for m in msgs] == ["echo: status?", "echo: and now?"]
    assert user_texts(fake_openai) == ["status?", "and now?"]


async def test_a_second_message_in_the_thread_continues_the_session(fake_slack, engine_factory, fake_openai):
    engine = await slack_engine(engine_factory, fake_slack)
    first = fake_slack.mention("U1", "remember 42")
    await fake_slack.send_event(first)
    await answered(fake_slack, first["ts"])
    # No mention needed in a thread the agent is part of; another user may continue it.
    await fake_slack.send_event(fake_slack.message("U2", "what did I ask?", thread_ts=first["ts"]))
    await answered(fake_slack, first["ts"], 2)
    convo = [(m["role"], message_text(m)) for m in fake_openai.requests[1].json["messages"] if m["role"] != "system"]
    assert convo == [("user", "remember 42"), ("assistant", "echo: remember 42"), ("user", "what did I ask?")]
    assert len(await engine.list_sessions(kind="slack")) == 1
    # A plain channel message outside any thread of the agent's is not for it.
    other = fake_slack.message("U1", "lunch?")
    await fake_slack.wait_acked(await fake_slack.send_event(other))
    await fake_slack.send_event(fake_slack.mention("U1", "ping", thread_ts=first["ts"]))
    await answered(fake_slack, first["ts"], 3)
    assert fake_slack.thread("C1", other["ts"]) == []


async def test_a_direct_message_is_answered_and_a_failing_model_is_an_error_in_the_thread(
        fake_slack, engine_factory, fake_openai):
    await slack_engine(engine_factory, fake_slack)
    fake_openai.script(Reply.error(500, "the model is down"))
    dm = fake_slack.message("U1", "are you there?", channel="D1")
    await fake_slack.send_event(dm)
    (reply,) = await answered(fake_slack, dm["ts"], channel="D1")
    assert reply.text.startswith("*error:*") and "the model is down" in reply.text
    # The session still works.
    await fake_slack.send_event(fake_slack.message("U1", "now?", channel="D1", thread_ts=dm["ts"]))
    assert (await answered(fake_slack, dm["ts"], 2, channel="D1"))[1].text == "echo: now?"


async def test_with_channel_messages_on_every_message_in_its_channels_is_answered(fake_slack, engine_factory,
                                                                                fake_openai):
    await slack_engine(engine_factory, fake_slack, channel_messages=True)
    plain = fake_slack.message("U1", "disk alert on db-3")
    await fake_slack.send_event(plain)
    assert [m.text for m in await answered(fake_slack, plain["ts"])] == ["echo: disk alert on db-3"]
    # Still not the bot's own messages, other bots' or edits.
    for ignored in (fake_slack.message("UBOT", "echo"), fake_slack.message("U7", "beep", bot_id="B7"),
                    fake_slack.message("U1", "fixed typo", subtype="message_changed")):
        await fake_slack.wait_acked(await fake_slack.send_event(ignored))
    last = fake_slack.message("U1", "and now?")
    await fake_slack.send_event(last)
    await answered(fake_slack, last["ts"])
    assert user_texts(fake_openai) == ["disk alert on db-3", "and now?"]


async def test_a_thread_continues_after_a_restart(fake_slack, engine_factory, fake_openai):
    first_engine = await slack_engine(engine_factory, fake_slack)
    first = fake_slack.mention("U1", "remember 42")
    await fake_slack.send_event(first)
    await answered(fake_slack, first["ts"])
    await first_engine.stop()
    await slack_engine(engine_factory, fake_slack)  # the same data dir, a new process's plugin
    # No mention: the thread is known from the store, and its conversation goes on.
    await fake_slack.send_event(fake_slack.message("U1", "what was it?", thread_ts=first["ts"]))
    await answered(fake_slack, first["ts"], 2)
    convo = [message_text(m) for m in fake_openai.requests[-1].json["messages"] if m["role"] == "user"]
    assert convo == ["remember 42", "what was it?"]


async def test_an_approver_answers_a_gate_with_a_button_and_no_one_else_can(fake_slack, engine_factory,
                                                                          fake_openai):
    notes = WriteNotePlugin()
    engine = await slack_engine(engine_factory, fake_slack, plugins=[notes], approvers=["UBOSS"])
    fake_openai.responder = call_tool_when("note this", NOTE)
    event = fake_slack.mention("U1", "please note this")
    await fake_slack.send_event(event)
    gate_msg = await fake_slack.wait_for(
        lambda: next((m for m in fake_slack.thread("C1", event["ts"]) if "waiting for operator approval:" in m.text),
                     None), "the gate's message")
    assert "write_note write" in gate_msg.text
    placeholder = fake_slack.thread("C1", event["ts"])[0]
    await fake_slack.wait_for(lambda: "waiting for operator approval of `write_note write" in placeholder.text,
                              "the placeholder to say what waits")
    # Someone who is not an approver: told so, and the gate still waits.
    await fake_slack.wait_acked(await fake_slack.press("UEVE", gate_msg, APPROVE))
    await fake_slack.wait_for(lambda: fake_slack.ephemerals("UEVE"), "the refusal")
    assert "not one of this agent's approvers" in fake_slack.ephemerals("UEVE")[0]
    assert [g.tool for g in engine.pending_gates()] == ["write_note"] and notes.notes == []
    # The approver: the gate is approved through the broker, the thread says by whom.
    await fake_slack.press("UBOSS", gate_msg, APPROVE)
    msgs = await answered(fake_slack, event["ts"], 2)
    assert msgs[0].text == "tool said: noted: disk at 91%"
    assert msgs[1].text.startswith(":white_check_mark: approved by <@UBOSS>: `write_note write")
    assert msgs[1].blocks[0]["text"]["text"] == msgs[1].text and len(msgs[1].blocks) == 1  # buttons gone
    assert notes.notes == ["disk at 91%"]
    record = [m for m in await engine.history(f"slack-C1-{event['ts']}") if m.role == "gate"][-1]
    assert record.meta["decision"] == "approved" and record.meta["by"] == "slack:UBOSS"
    # A second answer (a stale button): the first answer won, and the presser is told.
    await fake_slack.press("UBOSS", gate_msg, DENY)
    await fake_slack.wait_for(lambda: fake_slack.ephemerals("UBOSS"), "the late answer's reply")
    assert fake_slack.ephemerals("UBOSS") == ["Already answered: approved by <@UBOSS>."]


async def test_a_gate_denied_elsewhere_says_so_in_the_thread(fake_slack, engine_factory, fake_openai):
    notes = WriteNotePlugin()
    engine = await slack_engine(engine_factory, fake_slack, plugins=[notes])
    fake_openai.responder = call_tool_when("note this", NOTE)
    event = fake_slack.mention("U1", "note this")
    await fake_slack.send_event(event)
    gate_msg = await fake_slack.wait_for(
        lambda: next((m for m in fake_slack.thread("C1", event["ts"]) if "waiting" in m.text and "approval:" in m.text),
                     None), "the gate's message")
    assert not any(b["type"] == "actions" for b in gate_msg.blocks)  # no approvers: no buttons
    (gate,) = engine.pending_gates()
    engine.resolve_gate(gate.id, "denied", by="api:alice")
    msgs = await answered(fake_slack, event["ts"], 2)
    assert msgs[1].text.startswith(":no_entry: denied by api:alice: `write_note write")
    assert "did not allow" in msgs[0].text and notes.notes == []


async def test_a_dropped_socket_reconnects(fake_slack, engine_factory, fake_openai):
    engine = await slack_engine(engine_factory, fake_slack)
    # Slack's refresh (a `disconnect` message, then the close), then a bare close.
    for n, announce in ((2, True), (3, False)):
        await fake_slack.drop(announce=announce)
        await fake_slack.wait_connected(n)
        assert len(fake_slack.calls_of("apps.connections.open")) >= n  # a fresh URL for each socket
        event = fake_slack.mention("U1", f"still there? {n}")
        await fake_slack.send_event(event)
        (reply,) = await answered(fake_slack, event["ts"])
        assert reply.text == f"echo: still there? {n}"
    assert status(engine).reason == "connected as @aiops (Fake Team)"


async def test_a_429_on_post_message_is_waited_out(fake_slack, engine_factory, fake_openai):
    await slack_engine(engine_factory, fake_slack)
    fake_slack.rate_limit("chat.postMessage", 1, retry_after=1)
    event = fake_slack.mention("U1", "hi")
    await fake_slack.send_event(event)
    (reply,) = await answered(fake_slack, event["ts"])
    assert reply.text == "echo: hi"
    limited, posted = fake_slack.calls_of("chat.postMessage")[:2]
    assert (limited.status, posted.status) == (429, 200)
    assert posted.at - limited.at >= 1.0  # Retry-After: 1 was honoured


async def test_a_reply_slack_fails_to_take_is_retried(fake_slack, engine_factory, fake_openai):
    engine = await slack_engine(engine_factory, fake_slack)
    fake_slack.fail("chat.update", 1, status=503)
    event = fake_slack.mention("U1", "hi")
    await fake_slack.send_event(event)
    (reply,) = await answered(fake_slack, event["ts"])
    assert reply.text == "echo: hi"
    assert [c.status for c in fake_slack.calls_of("chat.update")] == [503, 200]
    history = await engine.history(f"slack-C1-{event['ts']}")
    assert [m.content for m in history if m.role == "assistant"] == ["echo: hi"]


async def test_a_long_answer_is_split_in_labelled_parts_with_balanced_fences(fake_slack, engine_factory,
                                                                          fake_openai):
    await slack_engine(engine_factory, fake_slack)
    prose = "\n\n".join(f"Paragraph {i}: " + "lorem ipsum " * 60 for i in range(8))
    code = "\n".join(f"line {i:03d} = {i} * 2" for i in range(400))
    fake_openai.script(Reply.text(f"{prose}\n\n```python\n{code}\n```\n\nThat is all.", chunks=20))
    event = fake_slack.mention("U1", "dump it")
    await fake_slack.send_event(event)
    parts = await fake_slack.wait_for(
        lambda: (msgs := fake_slack.thread_texts("C1", event["ts"])) and re.search(r"part (\d+)/\1\)", msgs[-1])
        and msgs, "the last part")
    n = len(parts)
    assert n >= 4
    for i, text in enumerate(parts, 1):
        assert text.startswith(f"_(part {i}/{n})_\n")
        assert len(text) <= 3500
        assert text.count("```") % 2 == 0
    body = "\n".join(parts)
    assert re.findall(r"line (\d{3}) =", body) == [f"{i:03d}" for i in range(400)]  # all, in order
    assert parts[-1].endswith("That is all.")
    assert [p for p in parts if "Paragraph 7" in p]


async def test_users_and_channels_outside_the_allowlists_are_refused(fake_slack, engine_factory, fake_openai):
    engine = await slack_engine(engine_factory, fake_slack, allowed_users=["U1"], allowed_channels=["C1"])
    stranger = fake_slack.mention("U2", "give me the db")
    await fake_slack.send_event(stranger)
    await fake_slack.wait_for(lambda: fake_slack.thread_texts("C1", stranger["ts"]), "the refusal")
    elsewhere = fake_slack.mention("U1", "hi", channel="C2")
    await fake_slack.send_event(elsewhere)
    await fake_slack.wait_for(lambda: fake_slack.thread_texts("C2", elsewhere["ts"]), "the refusal")
    allowed = fake_slack.mention("U1", "hi")
    await fake_slack.send_event(allowed)
    await answered(fake_slack, allowed["ts"])
    assert fake_slack.thread_texts("C1", stranger["ts"]) == [USER_REFUSED]
    assert fake_slack.thread_texts("C2", elsewhere["ts"]) == ["Sorry, this agent does not answer in this channel."]
    assert user_texts(fake_openai) == ["hi"]  # nothing of the refused ones reached the model
    assert [s["client_id"] for s in await engine.list_sessions(kind="slack")] == [f"slack-C1-{allowed['ts']}"]


async def test_only_help_reset_and_stop_work_from_slack(fake_slack, engine_factory, fake_openai):
    engine = await slack_engine(engine_factory, fake_slack)
    first = fake_slack.mention("U1", "remember 7")
    await fake_slack.send_event(first)
    await answered(fake_slack, first["ts"])
    for text in ("!model other", "!session all", "!db select 1", "!help", "!reset"):
        before = len(fake_slack.thread("C1", first["ts"]))
        await fake_slack.send_event(fake_slack.mention("U1", text, thread_ts=first["ts"]))
        await fake_slack.wait_for(lambda: len(fake_slack.thread("C1", first["ts"])) > before,  # noqa: B023
                                  f"the answer to {text}")
    texts = fake_slack.thread_texts("C1", first["ts"])
    assert texts[1:4] == [NOT_PERMITTED] * 3
    assert texts[4] == HELP
    assert texts[5].startswith("session reset")
    await fake_slack.send_event(fake_slack.mention("U1", "what was it?", thread_ts=first["ts"]))
    await answered(fake_slack, first["ts"], 7)
    convo = [message_text(m) for m in fake_openai.requests[-1].json["messages"] if m["role"] == "user"]
    assert convo == ["what was it?"]  # the reset took: the model starts afresh
    assert status(engine).state == "started"


async def test_stop_from_the_thread_stops_the_running_answer(fake_slack, engine_factory, fake_openai):
    await slack_engine(engine_factory, fake_slack)
    fake_openai.script(Reply.hang(after_chunks=1, reply=Reply.text("partial then more", chunks=3)))
    event = fake_slack.mention("U1", "write a novel")
    await fake_slack.send_event(event)
    await fake_openai.wait_for_requests_async(1)
    await fake_slack.send_event(fake_slack.mention("U1", "!stop", thread_ts=event["ts"]))
    msgs = await answered(fake_slack, event["ts"], 2)
    assert msgs[1].text == "stopping the running turn"
    assert msgs[0].text.endswith("_(stopped)_")


async def test_a_thread_that_falls_behind_the_events_still_gets_the_answer(fake_slack, engine_factory,
                                                                           fake_openai):
    # Readers may fall 2 events behind: the thread's reader, waiting on Slack while a turn calls
    # five tools at once, is dropped from the stream and takes the answer from the turn itself.
    notes = WriteNotePlugin()
    engine = await slack_engine(engine_factory, fake_slack, plugins=[notes],
                                files={"aiops.toml": "[engine]\nqueue_size = 2\n",
                                       "gates.toml": "[defaults]\nread = \"allow\"\nwrite = \"allow\"\n"})
    calls = [("write_note", {"text": f"n{i}"}) for i in range(5)]
    fake_openai.responder = call_tool_when("note five", *calls, then_text="five notes written")
    event = fake_slack.mention("U1", "note five")
    await fake_slack.send_event(event)
    (reply,) = await answered(fake_slack, event["ts"])
    assert reply.text == "five notes written"
    assert sorted(notes.notes) == [f"n{i}" for i in range(5)]
    assert status(engine).state == "started"


async def test_a_bad_token_is_a_clear_error_and_aiops_runs_on(fake_slack, engine_factory, fake_openai):
    env = {"SLACK_APP_TOKEN": APP_TOKEN, "SLACK_BOT_TOKEN": "xoxb-revoked-token"}
    engine = await slack_engine(engine_factory, fake_slack, env=env)
    await engine.plugins_ready()
    assert status(engine).state == "started"
    assert status(engine).reason == "auth.test failed: invalid_auth (HTTP 200): check SLACK_BOT_TOKEN"
    assert "revoked" not in status(engine).reason
    assert fake_slack.connections == 0
    assert (await engine.run(None, "hi", kind="api")).text == "echo: hi"


async def test_a_bad_app_token_is_a_clear_error(fake_slack, engine_factory):
    env = {"SLACK_APP_TOKEN": "xapp-not-this-app", "SLACK_BOT_TOKEN": BOT_TOKEN}
    engine = await slack_engine(engine_factory, fake_slack, env=env)
    await engine.plugins_ready()
    assert status(engine).reason == ("apps.connections.open failed: invalid_auth (HTTP 200): check "
                                     "SLACK_APP_TOKEN and that Socket Mode is on for the app")


async def test_slack_down_at_start_up_is_retried_until_it_answers(fake_slack, engine_factory, fake_openai):
    fake_slack.fail("auth.test", 1, status=503)
    engine = await slack_engine(engine_factory, fake_slack, env=dict(SLACK_ENV))
    # Start-up does not wait for Slack: the plugin keeps trying in the background until it answers.
    assert status(engine).state == "started"
    await fake_slack.wait_connected()
    await engine.plugins_ready()
    assert [c.status for c in fake_slack.calls_of("auth.test")] == [503, 200]
    assert status(engine).reason == "connected as @aiops (Fake Team)"
    event = fake_slack.mention("U1", "hi")
    await fake_slack.send_event(event)
    assert [m.text for m in await answered(fake_slack, event["ts"])] == ["echo: hi"]


async def test_aiops_plugins_shows_a_refused_token(fake_slack, fake_openai, tmp_path):
    """`aiops plugins` (its own process, the plugin found through its entry point) says what Slack
    said about a token (the connected case: test_a_mention_is_answered_in_its_thread)."""
    config = make_config_dir(tmp_path, {"m": openai_model_entry(fake_openai)}, "m",
                             {"plugins.toml": slack_table(fake_slack)})

    def plugins(**env: str) -> str:
        base = {k: v for k, v in os.environ.items() if not k.startswith("SLACK_")}
        r = subprocess.run([sys.executable, "-m", "aiops.cli", "--config-dir", str(config), "--data-dir",
                            str(tmp_path / "data"), "plugins"], capture_output=True, text=True, timeout=60,
                           env=base | env)
        assert r.returncode == 0, r.stderr
        return next(line for line in r.stdout.splitlines() if line.startswith("slack"))

    bad = await asyncio.to_thread(plugins, **(SLACK_ENV | {"SLACK_BOT_TOKEN": "xoxb-revoked"}))
    assert bad.split(None, 2) == ["slack", "started",
                                  "auth.test failed: invalid_auth (HTTP 200): check SLACK_BOT_TOKEN"]


async def test_a_missing_token_skips_the_plugin(fake_slack, engine_factory):
    engine = await slack_engine(engine_factory, fake_slack, env={"SLACK_APP_TOKEN": APP_TOKEN})
    assert (status(engine).state, status(engine).reason) == (
        "skipped", "secret SLACK_BOT_TOKEN is not set (bot token, Web API)")


async def test_tokens_are_never_logged(fake_slack, engine_factory, fake_openai, caplog):
    caplog.set_level(logging.DEBUG)
    await slack_engine(engine_factory, fake_slack)
    event = fake_slack.mention("U1", "hi")
    await fake_slack.send_event(event)
    await answered(fake_slack, event["ts"])
    await fake_slack.drop()
    await fake_slack.wait_connected(2)
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "chat.postMessage" in logged  # the SDK's debug log was on
    for token in (BOT_TOKEN, APP_TOKEN):
        assert token[:10] not in logged
