"""The server-sent-events reader behind the three API clients: what a client makes of a stream
however the network cuts it."""

from __future__ import annotations

import pytest

from aiops.sse import EventTooLarge, ServerEvent, SseParser

STREAM = (b": keep-alive\n\n"
          b"id: 7-1\nevent: tok\ndata: {\"text\": \"h\\u00e9\"}\n\n"
          b": ping\n"
          b"event: done\ndata: {\"text\":\ndata:  \"h\xc3\xa9llo\"}\n\n")
EVENTS = [ServerEvent("tok", '{"text": "h\\u00e9"}', "7-1"),
          ServerEvent("done", '{"text":\n "h\u00e9llo"}', None)]


def _feed_all(parser: SseParser, chunks: list[bytes]) -> list[ServerEvent]:
    return [event for chunk in chunks for event in parser.feed(chunk)]


def test_a_stream_in_one_read_gives_its_events_in_order_without_the_comments() -> None:
    assert _feed_all(SseParser(), [STREAM]) == EVENTS


@pytest.mark.parametrize("size", [1, 2, 3, 5, 7, 16])
def test_events_cut_anywhere_between_reads_come_out_whole(size: int) -> None:
    # Every cut, including inside a line, between CR and LF and inside a two-byte UTF-8 character.
    chunks = [STREAM[i:i + size] for i in range(0, len(STREAM), size)]
    assert _feed_all(SseParser(), chunks) == EVENTS


def test_an_event_is_handed_out_only_once_its_blank_line_came() -> None:
    parser = SseParser()
    assert parser.feed(b"event: tok\ndata: {}\n") == []
    assert parser.feed(b"\n") == [ServerEvent("tok", "{}")]


def test_crlf_line_ends_read_as_lf() -> None:
    assert SseParser().feed(STREAM.replace(b"\n", b"\r\n")) == EVENTS


def test_multi_line_data_is_joined_by_newlines_and_one_leading_space_is_dropped() -> None:
    parser = SseParser()
    assert parser.feed(b"data:a\ndata:  b\ndata\n\n") == [ServerEvent("message", "a\n b\n")]


def test_a_stream_that_ends_mid_event_gives_no_half_event() -> None:
    parser = SseParser()
    assert parser.feed(b"event: tok\ndata: {}\n\nevent: done\ndata: {\"text\": \"par") == [ServerEvent("tok", "{}")]


def test_an_event_without_data_is_no_event_and_does_not_leak_into_the_next() -> None:
    parser = SseParser()
    assert parser.feed(b"event: hello\nid: 3\n\ndata: {}\n\n") == [ServerEvent("message", "{}")]


def test_unknown_fields_are_passed_over() -> None:
    assert SseParser().feed(b"retry: 1000\nfoo: bar\nevent: tok\ndata: x\n\n") == [ServerEvent("tok", "x")]


def test_an_event_past_the_limit_is_refused_rather_than_held() -> None:
    parser = SseParser(max_event=100)
    parser.feed(b"data: " + b"x" * 60 + b"\n")
    with pytest.raises(EventTooLarge):
        parser.feed(b"data: " + b"x" * 60 + b"\n")
    # A line that never ends, in many reads, is refused too.
    parser = SseParser(max_event=100)
    with pytest.raises(EventTooLarge):
        for _ in range(20):
            parser.feed(b"x" * 10)
