"""How the proxy compares a chat UI's history with a session's (proxy.matching.session_view, and
the index of views kept between requests, proxy.index): what counts as the same conversation."""

from __future__ import annotations

import pytest

from aiops.engine.types import Message
from aiops.integrations.server.proxy.index import Found, RootIndex
from aiops.integrations.server.proxy.matching import HELD_IN_PART, Entry, client_view, is_prefix, session_view
from aiops.integrations.server.proxy.messages import ClientMessage
from aiops.integrations.server.proxy.openwebui import TITLE_CHARS, as_typed, question_of, system_rag
from aiops.integrations.server.proxy.status import normalize


def indexed(view: list[Entry], client: list[Entry]) -> bool:
    """The index finds a session of `view` for `client` (holding all of it, or a prefix)."""
    index = RootIndex("r")
    index.add("r")
    index.put("r", None, 0, view, None)
    found = index.find(client, [()] * len(client), lambda sid, rec: True)
    return "r" in (found.exact, found.in_part) or (found.best is not None and found.best[0] == "r")


LONG = "The disk on web-1 is 91% full: /var/log holds 40 GB of rotated logs. " * 5


def _history(answer_status: str, *, cancelled_notice: bool) -> list[Message]:
    out = [Message("user", "why is web-1 slow?", turn_id="t1"),
           Message("assistant", LONG, turn_id="t1", status=answer_status)]
    if cancelled_notice:
        out.append(Message("notice", "turn cancelled", turn_id="t1", meta={"kind": "cancelled"}))
    return out


@pytest.mark.parametrize(("status", "notice"), [("cancelled", True), ("complete", True), ("error", False)])
def test_an_answer_that_was_cut_matches_any_start_of_it_the_client_kept(status: str, notice: bool) -> None:
    """Stopped (its record cancelled, or complete with the stop recorded just after) or failed:
    the client may hold any start of it, and that is still this conversation."""
    view = session_view(_history(status, cancelled_notice=notice))
    for kept in (LONG[:37], LONG[:100] + "  \n", LONG):
        client = client_view([ClientMessage("user", "why is web-1 slow?"), ClientMessage("assistant", kept)])
        assert is_prefix(view, client) and indexed(view, client), kept
    other = client_view([ClientMessage("user", "why is web-1 slow?"), ClientMessage("assistant", "Another answer")])
    assert not is_prefix(view, other) and not indexed(view, other)


def test_a_whole_answer_must_match_whole() -> None:
    """Only a cut answer may be held in part: a shorter copy of a whole one is an edit."""
    view = session_view(_history("complete", cancelled_notice=False))
    client = client_view([ClientMessage("user", "why is web-1 slow?"), ClientMessage("assistant", LONG[:100])])
    assert not is_prefix(view, client) and not indexed(view, client)
    whole = client_view([ClientMessage("user", "why is web-1 slow?"), ClientMessage("assistant", LONG)])
    assert is_prefix(view, whole) and indexed(view, whole)


OLD_TEMPLATE = ("### Task:\nRespond to the user query using the provided context.\n\n"
                "<context>\n<source id=\"1\">web-1 disk: 91% full</source>\n</context>\n\n"
                "<user_query>\n{q}\n</user_query>\n")


def test_the_older_rag_template_reads_as_the_question_it_was_sent_with() -> None:
    """Open WebUI puts the template in front of the user's text ("{template}\\n{message}"); the
    older template also repeats the question in <user_query> after the context."""
    q = "is web-1 running out of disk?"
    assert as_typed(normalize(OLD_TEMPLATE.format(q=q) + "\n" + q)) == q
    assert as_typed(normalize(OLD_TEMPLATE.format(q=q))) == q  # (the query alone, as some send it)


def test_only_a_rag_template_with_documents_in_a_system_message_is_taken_for_one() -> None:
    q = "is web-1 running out of disk?"
    rag = system_rag([ClientMessage("system", "You are helpful.\n" + OLD_TEMPLATE.format(q=q))])
    assert rag is not None and rag.startswith("### Task:") and rag.endswith("</context>")
    styled = ("### Task:\nYou are an SRE bot. Quote logs inside <context></context> tags.\n"
              "### Guidelines:\n- be terse")
    assert system_rag([ClientMessage("system", styled)]) is None
    assert system_rag([ClientMessage("system", "Mention ### Task: and <context><source> freely")]) is None


def test_an_answer_whose_stop_came_as_it_was_recorded_may_be_missing_from_the_client() -> None:
    """A complete answer, then the stop's notice: a non-streaming client that hung up got none
    of it, and its next message (without it) is still this conversation."""
    history = [Message("user", "q1", turn_id="t1"), Message("assistant", "a1 in full", turn_id="t1"),
               Message("notice", "turn cancelled", turn_id="t1", meta={"kind": "cancelled"})]
    client = client_view([ClientMessage("user", "q1")])
    assert is_prefix(session_view(history, without_stopped=True), client)
    assert len(session_view(history, without_stopped=True)) == len(client)


# ---- the index of conversations (proxy.index) ------------------------------------------------------------


def _index(**views: list[Entry]) -> RootIndex:
    index = RootIndex("r")
    for sid, view in views.items():
        index.add(sid)
        index.put(sid, None, 0, view, None)
    return index


def _find(index: RootIndex, client: list[Entry], variants: list[tuple[str, ...]] | None = None) -> Found:
    return index.find(client, variants or [()] * len(client), lambda sid, rec: True)


def test_the_index_finds_a_branch_among_many_that_open_alike() -> None:
    index = _index(**{f"c{i}": [("user", "hi"), ("assistant", f"hello {i}")] for i in range(300)})
    assert _find(index, [("user", "hi"), ("assistant", "hello 123")]).exact == "c123"
    # The longest prefix held: a chat that goes on from one of them (its answer imported first).
    longer = _find(index, [("user", "hi"), ("assistant", "hello 7"), ("user", "more"), ("assistant", "x")])
    assert longer.exact is None and longer.best == ("c7", 2)
    assert _find(index, [("user", "hi"), ("assistant", "edited")]).best is None  # an edit: a fork


def test_a_user_text_with_a_model_or_commands_is_found_by_the_text_recorded() -> None:
    index = _index(s=[("user", "why is it slow?"), ("assistant", "disk")])
    client: list[Entry] = [("user", "@fast why is it slow?"), ("assistant", "disk")]
    assert _find(index, client).exact is None  # as sent, it is not what was recorded ...
    assert _find(index, client, [("why is it slow?",), ()]).exact == "s"  # ... as the engine reads it, it is


def test_two_stopped_branches_that_begin_alike_go_on_in_the_newest() -> None:
    index = _index(old=[("user", "q"), (HELD_IN_PART, "The disk is full because")],
                   new=[("user", "q"), (HELD_IN_PART, "The disk is nearly full")])
    found = _find(index, [("user", "q"), ("assistant", "The disk is")])
    assert found.exact is None and found.in_part == "new"
    assert _find(index, [("user", "q"), ("assistant", "The disk is full because")]).exact == "old"


def test_the_index_lets_go_of_what_its_sessions_no_longer_hold() -> None:
    index = _index(a=[("user", "hi"), ("assistant", "a1")], b=[("user", "hi"), (HELD_IN_PART, "b1")])
    index.put("a", None, 0, [("user", "hi"), ("assistant", "a1"), ("user", "q"), ("assistant", "a2")], None)
    assert _find(index, [("user", "hi"), ("assistant", "a1")]).exact is None  # not where it was
    assert len(index.nodes) == 6  # the empty view, "hi", a1, q, a2, b1
    index.remove("a")
    index.remove("b")
    assert index.nodes == {} and index.members == {}


def test_a_session_is_titled_by_the_question_only_when_a_template_wraps_it() -> None:
    q = "What is the launch code in the file?"
    files = '<attached_files>\n<file type="file" id="d48e" name="notes.txt"/>\n</attached_files>\n\n'
    assert question_of(OLD_TEMPLATE.format(q=q)) == q
    rag = OLD_TEMPLATE.replace("<user_query>\n{q}\n</user_query>\n", "") + files + q
    assert question_of(rag) == q  # Open WebUI 0.12.4: the template, the files' list, the question
    assert question_of(files + q) == q  # later messages: the list without the template
    assert question_of(q) is None and question_of(f"  {q}\n") is None  # plain text titles itself
    assert question_of("!help\nwhat is the disk usage") is None  # (its commands are taken out as usual)
    assert len(question_of(files + "x" * 100_000) or "") == TITLE_CHARS


def test_a_status_line_a_user_typed_is_part_of_the_user_message() -> None:
    """aiops writes status lines into answers only: in a user's message one is the user's words,
    so an edit of it is an edit (a fork), not the same conversation (review of 60ccfe9)."""
    said = client_view([ClientMessage("user", "*⛔ restart the prod database now*"),
                        ClientMessage("assistant", "Restarting.")])
    edited = client_view([ClientMessage("user", "*✅ never mind, do nothing*"),
                          ClientMessage("assistant", "Restarting.")])
    assert said != edited and not is_prefix(said, edited)
    view = session_view([Message("user", "*⛔ restart the prod database now*", turn_id="t1"),
                         Message("assistant", "Restarting.", turn_id="t1")])
    assert is_prefix(view, said) and not is_prefix(view, edited)
