"""Slack text both ways (markup to text, Markdown to mrkdwn), long answers in parts, and which
events are a user's message."""

from __future__ import annotations

import re

import pytest

from aiops.engine.plugins import PluginUnavailable
from aiops.integrations.slack.intake import Seen, read_message
from aiops.integrations.slack.markup import markdown_to_mrkdwn, slack_to_text
from aiops.integrations.slack.settings import SlackSettings
from aiops.integrations.slack.splitting import split_message


@pytest.mark.parametrize(("raw", "text"), [
    ("<@UBOT> what is up?", "what is up?"),
    ("ask <@U2|bob> and <@U3>", "ask @bob and @U3"),
    ("see <#C1|ops> and <#C2>", "see #ops and #C2"),
    ("<https://example.com/a?b=1&amp;c=2|the docs>", "the docs (https://example.com/a?b=1&c=2)"),
    ("<https://example.com>", "https://example.com"),
    ("<https://example.com|example.com>", "example.com"),
    ("<mailto:a@b.c|a@b.c>", "a@b.c"),
    ("<!here> <!channel> <!subteam^S1|@oncall>", "@here @channel @oncall"),
    ("if a &lt; b &amp;&amp; c &gt; d", "if a < b && c > d"),
    ("&amp;lt; stays as typed", "&lt; stays as typed"),
])
def test_slack_markup_reads_as_the_user_saw_it(raw, text):
    assert slack_to_text(raw, "UBOT") == text


@pytest.mark.parametrize(("md", "mrkdwn"), [
    ("**bold**, *it*, ~~gone~~ and `code`", "*bold*, _it_, ~gone~ and `code`"),
    ("# Heading **x**\n\ntext", "*Heading x*\n\ntext"),
    ("[docs](https://x.y/a|b) and <https://z.w>", "<https://x.y/a%7Cb|docs> and <https://z.w>"),
    ("[files](ftp://host/x)", "files (ftp://host/x)"),  # Slack links: web and mail only
    ("[click](javascript:alert(1))", "[click](javascript:alert(1))"),  # no link at all
    ("- one\n- two\n  - nested\n\n3. three\n4. four", "• one\n• two\n    • nested\n\n3. three\n4. four"),
    ("> quoted\n> more", "> quoted\n> more"),
    ("```sql\nselect * from t where a < 3 && b > 2;\n```", "```\nselect * from t where a &lt; 3 &amp;&amp; b &gt; 2;\n```"),
    ("| a | bb |\n|---|----|\n| 1 | 2 |", "```\na | bb\n--+---\n1 | 2\n```"),
])
def test_markdown_becomes_mrkdwn(md, mrkdwn):
    assert markdown_to_mrkdwn(md) == mrkdwn


def test_nothing_the_model_writes_becomes_a_mention_or_a_broadcast():
    out = markdown_to_mrkdwn("hey <!channel> and <@U1> `<!here>`\n\n```\n<!everyone>\n```")
    assert "<!" not in out and "<@" not in out
    assert "&lt;!channel&gt;" in out and "&lt;@U1&gt;" in out


def test_a_short_answer_is_one_unlabelled_part():
    assert split_message("hello") == ["hello"]


def test_a_long_answer_splits_on_paragraphs_and_keeps_code_blocks_balanced():
    prose = "\n\n".join(f"paragraph {i} " + "word " * 120 for i in range(12))
    code = "```\n" + "\n".join(f"row {i:04d}" for i in range(900)) + "\n```"
    parts = split_message(f"{prose}\n\n{code}\n\nthe end", limit=3500)
    n = len(parts)
    assert n > 3
    for i, part in enumerate(parts, 1):
        assert part.startswith(f"_(part {i}/{n})_\n") and len(part) <= 3500
        assert sum(1 for line in part.split("\n") if line.startswith("```")) % 2 == 0
    joined = "\n".join(parts)
    # Every paragraph whole (never cut mid-paragraph: they fit), every code row once, in order.
    for i in range(12):
        assert sum(p.count(f"paragraph {i} ") for p in parts) == 1
        assert re.search(rf"paragraph {i} (word ){{120}}", joined)
    assert re.findall(r"row (\d{4})", joined) == [f"{i:04d}" for i in range(900)]
    assert parts[-1].endswith("the end")


def test_a_single_huge_line_is_cut_at_spaces():
    parts = split_message("word " * 2000, limit=1000)
    assert all(len(p) <= 1000 for p in parts)
    assert sum(p.count("word") for p in parts) == 2000


def event(**kw):
    return {"type": "message", "user": "U1", "text": "hi", "channel": "C1", "ts": "1.000001",
            "channel_type": "channel", **kw}


def test_which_events_are_user_messages():
    msg = read_message(event(text="<@UBOT> hi there"), "UBOT")
    assert msg is not None and msg.text == "hi there" and msg.mentioned and not msg.direct
    assert msg.session_id == "slack-C1-1.000001" and not msg.in_thread
    reply = read_message(event(thread_ts="0.5"), "UBOT")
    assert reply is not None and reply.session_id == "slack-C1-0.5" and reply.in_thread
    dm = read_message(event(channel="D1", channel_type="im"), "UBOT")
    assert dm is not None and dm.direct
    # The bot's own, other bots', edits, deletions, joins: none is a message to answer.
    for ignored in (event(user="UBOT"), event(bot_id="B2"), event(subtype="bot_message"),
                    event(subtype="message_changed"), event(subtype="message_deleted"),
                    event(subtype="channel_join"), event(type="reaction_added")):
        assert read_message(ignored, "UBOT") is None


def test_seen_remembers_recent_keys_only():
    seen = Seen(size=2)
    assert seen.add("a") and not seen.add("a")
    seen.add("b")
    seen.add("c")
    assert "a" not in seen and seen.add("a")


def test_tokens_are_checked_without_ever_being_shown():
    cfg = SlackSettings(enabled=True)
    assert cfg.tokens({"SLACK_APP_TOKEN": "xapp-1", "SLACK_BOT_TOKEN": "xoxb-2"}) == ("xapp-1", "xoxb-2")
    with pytest.raises(PluginUnavailable, match="SLACK_APP_TOKEN is not set"):
        cfg.tokens({"SLACK_BOT_TOKEN": "xoxb-2"})
    with pytest.raises(PluginUnavailable) as e:
        cfg.tokens({"SLACK_APP_TOKEN": "xoxb-secret-swapped", "SLACK_BOT_TOKEN": "xapp-other"})
    assert str(e.value) == "secret SLACK_APP_TOKEN is not a xapp-… token (app-level token, Socket Mode)"


def gate(**kw):
    from aiops.engine.events import GateInfo

    base = {"id": "g1", "session_id": "slack-C1-1.0", "client_kind": "slack", "tool": "db_query",
            "operation": "write", "summary": "db_query write on users: DELETE FROM users WHERE a < 3"}
    return GateInfo.from_dict(base | kw)


def test_a_gate_in_the_thread_says_what_waits_and_who_decided():
    from aiops.integrations.slack.gate_blocks import outcome_text, waiting_blocks, waiting_text

    assert waiting_text(gate()) == (":hourglass_flowing_sand: waiting for operator approval: "
                                    "`db_query write on users: DELETE FROM users WHERE a &lt; 3`")
    buttons = waiting_blocks(gate(), buttons=True)[1]["elements"]
    assert [(b["text"]["text"], b["value"]) for b in buttons] == [("Approve", "g1"), ("Deny", "g1")]
    assert all(b["type"] != "actions" for b in waiting_blocks(gate(), buttons=False))
    assert outcome_text(gate(decision="approved", scope="once", by="console")).startswith(
        ":white_check_mark: approved by console: `db_query")
    assert outcome_text(gate(decision="approved", scope="session", by="slack:U9")).startswith(
        ":white_check_mark: approved for the session by <@U9>: ")
    assert outcome_text(gate(decision="denied", by="api:<ops>")).startswith(":no_entry: denied by api:&lt;ops&gt;:")
    assert "no operator answered in time" in outcome_text(gate(decision="timeout", by="timeout"))
    # A summary's backticks cannot end the code span; a huge one is cut.
    tricky = waiting_text(gate(summary="run `rm -rf` " + "x" * 1000))
    assert tricky.count("`") == 2 and len(tricky) < 400
