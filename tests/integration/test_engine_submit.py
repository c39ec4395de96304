"""Engine.submit at its edges: a session deleting itself, command-only messages, the model a new
session is given, `!session` paging, and the prompt tree the engine reads and edits."""

from __future__ import annotations

import pytest

from aiops.config import SHIPPED_PROMPT_DIR
from aiops.engine.engine import EngineError
from aiops.engine.events import NOTICE
from tests.fakes.fixtures import openai_model_entry
from tests.fakes.openai_server import Reply

MYSQL_OFF = {"plugins.toml": "[mysql]\nenabled = false\n"}


def two_models(fake) -> dict:
    return {"m": openai_model_entry(fake), "off": openai_model_entry(fake, "off-model", enabled=False)}


async def sessions(engine) -> list[str]:
    return [r["client_id"] for r in await engine.list_sessions()]


# ---- a session deleting itself ---------------------------------------------------------------------


async def test_a_session_deletes_itself_and_is_answered(engine_factory, fake_openai):
    engine = await engine_factory(extra_files=MYSQL_OFF)
    fake_openai.script(Reply.text("hello"))
    await engine.run("console-a", "hi", kind="console", is_operator=True, timeout=10)
    short = (await engine.session("console-a")).row.short_id
    notices = []
    engine.bus.add_listener(lambda e: notices.append(e.data) if e.name == NOTICE else None)
    result = await engine.run(str(short), f"!session {short} delete", kind="console", is_operator=True,
                              timeout=10)
    assert result.status == "complete"
    assert result.text == f"deleted session {short} (console-a)"
    assert notices[-1]["text"] == result.text and notices[-1]["ok"] is True
    assert await engine.session("console-a") is None and await sessions(engine) == []
    # nothing was written afterwards: no stray row, no error from a background write
    assert await engine.store.history("console-a") == []


async def test_the_rest_of_a_message_after_deleting_its_session_is_not_run(engine_factory, fake_openai):
    engine = await engine_factory(extra_files=MYSQL_OFF)
    fake_openai.script(Reply.text("hello"))
    await engine.run("api-x", "hi", kind="api", timeout=10)
    result = await engine.run("api-x", "!session api-x delete\n!help\nand tell me more", kind="api",
                              timeout=10)
    assert result.text.startswith("deleted session 101 (api-x)")
    assert "the rest of the message was not run" in result.text
    assert "Commands:" not in result.text
    assert len(fake_openai.requests) == 1  # the plain text never reached the model
    assert await sessions(engine) == []


async def test_a_client_deletes_its_own_session_through_the_api(api_server):
    api_server.fake.script(Reply.text("hello"))
    async with api_server.client() as agent:
        first = await agent.send("hi", client_id="mine", timeout=10)
        assert first["status"] == "complete"
        out = await agent.send("!session mine delete", client_id="mine", timeout=10)
        assert out["status"] == "complete" and out["text"] == "deleted session 101 (mine)"
        assert await agent.sessions() == []


# ---- command-only messages ---------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["!help", "!session", "!model", "!stop", "!nope"])
async def test_command_only_messages_create_no_session(engine_factory, text):
    engine = await engine_factory()
    result = await engine.run("api-new", text, kind="api", is_operator=True, timeout=10)
    # (an unknown command fails the message: status `error`, code `command_failed`)
    assert result.status == ("error" if text == "!nope" else "complete") and result.text
    assert await sessions(engine) == []


async def test_commands_that_need_a_session_say_so(engine_factory):
    engine = await engine_factory()
    notices = []
    engine.bus.add_listener(lambda e: notices.append(e.data) if e.name == NOTICE else None)
    out = (await engine.run("api-new", "!model m", kind="api", timeout=10)).text
    assert "this session does not exist yet" in out and "--model" in out
    out = (await engine.run("api-new", "!reset", kind="api", timeout=10)).text
    assert "this session does not exist yet" in out and "nothing to reset" in out
    # !model cannot switch a session there is not; !reset leaves it as asked: with no history.
    assert [n["ok"] for n in notices] == [False, True]
    assert await sessions(engine) == []


async def test_a_failed_command_is_flagged_on_its_notice(engine_factory, fake_openai):
    engine = await engine_factory()
    fake_openai.script(Reply.text("ok"))
    await engine.run("console-a", "hi", kind="console", is_operator=True, timeout=10)
    notices = []
    engine.bus.add_listener(lambda e: notices.append(e.data) if e.name == NOTICE and "command" in e.data else None)
    await engine.run("console-a", "!help\n!nope\n!model nope\n!session 999 delete", kind="console",
                     is_operator=True, timeout=10)
    assert [(n["command"], n["ok"]) for n in notices] == [
        ("!help", True), ("!nope", False), ("!model nope", False), ("!session 999 delete", False)]


# ---- the model of a new session ----------------------------------------------------------------------


@pytest.mark.parametrize("model, why", [("nope", "unknown model 'nope'"), ("off", "model 'off' is disabled")])
async def test_a_new_session_with_an_unusable_model_is_refused_and_not_created(engine_factory, fake_openai,
                                                                               model, why):
    engine = await engine_factory(models=two_models(fake_openai))
    with pytest.raises(EngineError, match=why):
        await engine.submit("console-new", "hi", kind="console", model=model)
    with pytest.raises(EngineError, match=why):
        await engine.session("console-new2", kind="console", create=True, model=model)
    assert await sessions(engine) == []
    assert fake_openai.requests == []  # no turn ran on any model


async def test_an_unusable_model_for_an_existing_session_is_refused_before_anything_runs(engine_factory,
                                                                                        fake_openai):
    engine = await engine_factory(models=two_models(fake_openai))
    fake_openai.script(Reply.text("ok"))
    await engine.run("console-a", "hi", kind="console", timeout=10)
    with pytest.raises(EngineError, match="disabled"):
        await engine.submit("console-a", "again", kind="console", model="off")
    assert len(fake_openai.requests) == 1
    assert [m.content for m in await engine.history("console-a") if m.role == "user"] == ["hi"]


# ---- !session paging ---------------------------------------------------------------------------------


async def test_session_list_shows_the_most_recent_page_and_says_how_to_see_more(engine_factory):
    engine = await engine_factory()
    for i in range(35):
        await engine.session(f"api-{i:02d}", kind="api", create=True)
    # (an API client's commands: a console's first message, commands or not, makes its session)
    out = (await engine.run("api-op", "!session", kind="api", is_operator=True, timeout=10)).text
    rows = out.splitlines()[1:-1]
    assert len(rows) == 30
    assert rows[0].split()[0] == "135"  # the most recently created first
    assert out.splitlines()[-1] == "… 5 more (`!session page 2`, or `!session all`)"
    page2 = (await engine.run("api-op", "!session page 2", kind="api", is_operator=True,
                              timeout=10)).text
    assert [line.split()[0] for line in page2.splitlines()[1:-1]] == [str(n) for n in range(105, 100, -1)]
    assert page2.splitlines()[-1] == "… 30 more recent (`!session page 1`)"
    everything = (await engine.run("api-op", "!session all", kind="api", is_operator=True,
                                   timeout=10)).text
    assert len(everything.splitlines()) == 36 and "more" not in everything
    assert "no page 3" in (await engine.run("api-op", "!session page 3", kind="api",
                                            is_operator=True, timeout=10)).text
    for odd in ("³", "٣"):  # Unicode digits are not page numbers (int() refuses "³", reads "٣" as 3)
        out = (await engine.run("api-op", f"!session page {odd}", kind="api", is_operator=True,
                                timeout=10)).text
        assert "expected: !session page N" in out, out
    # ...nor shorthand session ids: "٣" would have named session 3, and "³" failed with a ValueError.
    assert await engine.session("³") is None and await engine.session("١٠١") is None
    assert (await engine.session("101")) is not None


async def test_a_client_lists_only_its_own_session(engine_factory, fake_openai):
    engine = await engine_factory(extra_files=MYSQL_OFF)
    fake_openai.script(Reply.text("ok"), Reply.text("ok"))
    await engine.run("api-secret", "payroll for the board", kind="api", is_operator=True, timeout=10)
    await engine.run("proxy-mine", "hello there", kind="proxy", timeout=10)
    out = (await engine.run("proxy-mine", "!session", kind="proxy", timeout=10)).text
    assert "hello there" in out and "payroll" not in out
    assert "payroll" not in (await engine.run("proxy-mine", "!session all", kind="proxy", timeout=10)).text
    assert "payroll" in (await engine.run("console-op", "!session", kind="console", is_operator=True,
                                          timeout=10)).text


# ---- the prompt tree lives in the config dir -------------------------------------------------------


async def test_prompt_edits_change_the_users_copy_never_the_shipped_tree(engine_factory, fake_openai, tmp_path):
    shipped = {p.name: p.read_bytes() for p in (SHIPPED_PROMPT_DIR / "default").iterdir()}
    engine = await engine_factory()
    user = tmp_path / "config" / "system_prompt" / "default"
    out = (await engine.run("console-a", "!prompt", kind="console", is_operator=True, timeout=10)).text
    assert str(user) in out and str(SHIPPED_PROMPT_DIR) not in out
    out = (await engine.run("console-a", "!prompt edit role append Always cite the query.", kind="console",
                            is_operator=True, timeout=10)).text
    assert "append" in out
    assert "Always cite the query." in (user / ".system_prompt_role").read_text()
    assert {p.name: p.read_bytes() for p in (SHIPPED_PROMPT_DIR / "default").iterdir()} == shipped
    # and the model is sent the edited copy
    fake_openai.script(Reply.text("ok"))
    await engine.run("console-a", "hi", kind="console", timeout=10)
    assert "Always cite the query." in fake_openai.requests[-1].json["messages"][0]["content"]


async def test_when_the_users_copy_cannot_be_made_turns_read_the_shipped_tree_and_edits_are_refused(
        engine_factory, fake_openai, tmp_path):
    shipped = {p.name: p.read_bytes() for p in (SHIPPED_PROMPT_DIR / "default").iterdir()}
    engine = await engine_factory()
    # A file where the copy's directory must go: the copy fails (as in a read-only config dir).
    (tmp_path / "config" / "system_prompt").write_text("not a directory")
    fake_openai.script(Reply.text("ok"))
    await engine.run("console-a", "hi", kind="console", timeout=10)
    assert "role:" in fake_openai.requests[-1].json["messages"][0]["content"]  # the prompt still goes out
    result = await engine.run("console-a", "!prompt edit role append Always cite the query.", kind="console",
                              is_operator=True, timeout=10)
    assert "cannot edit the shipped system prompt" in result.text and "writable" in result.text
    assert {p.name: p.read_bytes() for p in (SHIPPED_PROMPT_DIR / "default").iterdir()} == shipped


@pytest.mark.parametrize("window", ["nan", "inf", "0", "-5", "soon"])
async def test_a_rate_limit_window_must_be_a_positive_number_of_seconds(engine_factory, window):
    engine = await engine_factory()
    out = (await engine.run("console-op", f"!limits set web 3 {window}", kind="console", is_operator=True,
                            timeout=10)).text
    assert "WINDOW positive seconds" in out, out
    assert "3 calls" in (await engine.run("console-op", "!limits set web 3 60", kind="console",
                                          is_operator=True, timeout=10)).text


async def test_plugins_command_shows_each_plugins_state_and_why_to_operators_only(engine_factory):
    """From any chat the operator sees why a tool is missing (a data tool without its key) or a
    bot is silent, without leaving for `aiops plugins`."""
    engine = await engine_factory(extra_files=MYSQL_OFF)
    out = (await engine.run("console-op", "!plugins", kind="console", is_operator=True, timeout=10)).text
    lines = out.splitlines()
    assert len(lines) == len(engine.plugin_status) > 0
    for status, line in zip(engine.plugin_status, lines, strict=True):
        assert line.split()[:2] == [status.name, status.state]
        assert status.reason in line
    assert any(line.split()[:2] == ["mysql", "disabled"] for line in lines)
    refused = await engine.run("api-bot", "!plugins", kind="api", timeout=10)
    assert "not permitted" in refused.text and "mysql" not in refused.text
