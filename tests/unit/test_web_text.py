"""The data tools' shared text handling: snippets, the model's cut copy, redaction, link numbering."""

from __future__ import annotations

from aiops.integrations.extract import normalize_url, number_links
from aiops.integrations.web_text import cut_middle, output, redact, snippet


def test_snippets_are_one_line_of_at_most_the_limit():
    assert snippet("  a\n\tb  ") == "a b"
    long = snippet("word " * 100)
    assert len(long) == 200 and long.endswith("…") and "\n" not in long


def test_a_result_over_the_cap_keeps_head_and_tail_and_the_whole_for_the_operator():
    text = "H" * 5000 + "M" * 5000 + "T" * 5000
    out = output(text, 3000)
    assert out.text.startswith("H" * 2000) and out.text.endswith("T" * 1000)
    assert "[… 12000 characters cut here" in out.text and "M" not in out.text
    assert out.data["full_text"] == text and out.data["cut"] == {"chars": 15000, "kept": 3000}
    assert cut_middle("short", 3000) == "short" and output("short", 3000).data is None


def test_redaction_removes_secret_values_and_key_parameters():
    assert redact("GET https://x/y?key=AIzaSECRET&alt=sse failed", []) == \
        "GET https://x/y?key=[redacted]&alt=sse failed"
    assert redact("bad token tvly-123 here", ["tvly-123", ""]) == "bad token [redacted] here"


def test_links_become_numbered_references_listed_once():
    text, refs = number_links('See [a](https://a.example "A") and [b](<https://b.example>), '
                              'again [a](https://a.example), ![](https://i.example/x.png) and [](https://c.example).')
    assert text == "See a [1] and b [2], again a [1], [image 3] and [4]."
    assert refs == ["https://a.example", "https://b.example", "https://i.example/x.png", "https://c.example"]


def test_a_url_without_a_scheme_gets_https():
    assert normalize_url(" example.com/x ") == "https://example.com/x"
    assert normalize_url("http://example.com") == "http://example.com"
    assert normalize_url("//example.com/x") == "https://example.com/x"
