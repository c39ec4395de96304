"""Text tool calls: every format a text-calling model writes becomes a call, and nothing else does."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aiops.engine.textcalls import (
    _OPENERS,
    StreamGuard,
    TextCallParse,
    _opener_prefix_len,
    describe_tools_for_prompt,
    looks_like_tool_call,
    parse_text_tool_calls,
)
from aiops.engine.types import ToolSpec

KNOWN = frozenset({"get_weather", "run_sql", "search"})
FENCE = "```"
MB = 1024 * 1024


def tc(name: str, arguments: Any = None, *, key: str = "arguments") -> str:
    """A call object as a model writes it."""
    return json.dumps({"name": name, key: {} if arguments is None else arguments})


@dataclass
class Case:
    text: str
    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    text_out: str | None = None  # None: the input, stripped (nothing was recognised)
    unknown: list[str] = field(default_factory=list)
    errors: int = 0


def check(result: TextCallParse, case: Case) -> None:
    assert [(c.name, c.arguments) for c in result.calls] == case.calls
    assert result.unknown == case.unknown
    assert len(result.errors) == case.errors, result.errors
    assert result.text == (case.text.strip() if case.text_out is None else case.text_out)


WEATHER = ("get_weather", {"city": "Oslo"})
SEARCH = ("search", {"q": "disk full"})

FORMATS = {
    # 1. <tool_call>
    "tool_call": Case(f"<tool_call>{tc(*WEATHER)}</tool_call>", [WEATHER], ""),
    "tool_call-in-prose": Case(
        f"Let me check.\n<tool_call>{tc(*WEATHER)}</tool_call>\nOne moment.", [WEATHER],
        "Let me check.\n\nOne moment.",
    ),
    "tool_call-multiline-json": Case(
        '<tool_call>\n{\n  "name": "get_weather",\n  "arguments": {"city": "Oslo"}\n}\n</tool_call>', [WEATHER], "",
    ),
    "tool_call-unclosed-at-end": Case(f"Checking.\n<tool_call>{tc(*WEATHER)}", [WEATHER], "Checking."),
    "tool_call-unclosed-then-prose": Case(f"<tool_call>{tc(*WEATHER)}\nAnything else?", [WEATHER], "Anything else?"),
    "tool_call-parameters-key": Case(f"<tool_call>{tc(*WEATHER, key='parameters')}</tool_call>", [WEATHER], ""),
    "tool_call-arguments-as-string": Case(
        "<tool_call>" + json.dumps({"name": "get_weather", "arguments": json.dumps({"city": "Oslo"})}) + "</tool_call>",
        [WEATHER], "",
    ),
    "tool_call-empty-arguments-string": Case(
        '<tool_call>{"name": "search", "arguments": ""}</tool_call>', [("search", {})], "",
    ),
    "tool_call-no-arguments": Case('<tool_call>{"name": "search"}</tool_call>', [("search", {})], ""),
    "tool_call-first-unclosed": Case(
        f"<tool_call>{tc(*WEATHER)}\n<tool_call>{tc(*SEARCH)}</tool_call>", [WEATHER, SEARCH], "",
    ),
    "tool_call-list-inside": Case(
        f"<tool_call>[{tc(*WEATHER)}, {tc(*SEARCH)}]</tool_call>", [WEATHER, SEARCH], "",
    ),
    "tool_call-several-tags-in-order": Case(
        f"<tool_call>{tc(*SEARCH)}</tool_call>\n<tool_call>{tc(*WEATHER)}</tool_call>", [SEARCH, WEATHER], "",
    ),
    "tool_call-fenced-json-inside": Case(
        f"<tool_call>\n{FENCE}json\n{tc(*WEATHER)}\n{FENCE}\n</tool_call>", [WEATHER], "",
    ),
    "tool_call-openai-wrapper": Case(
        "<tool_call>"
        + json.dumps({"type": "function", "function": {"name": "search", "arguments": json.dumps(SEARCH[1])}})
        + "</tool_call>",
        [SEARCH], "",
    ),
    "tool_call-name-padded": Case('<tool_call>{"name": " search ", "arguments": {}}</tool_call>', [("search", {})], ""),
    "tool_call-trailing-extra-brace": Case(f"<tool_call>{tc(*WEATHER)}}}</tool_call>", [WEATHER], ""),
    "tool_call-argument-holds-markup": Case(
        "<tool_call>" + tc("run_sql", {"sql": "SELECT '```' , '<tool_code>'"}) + "</tool_call>",
        [("run_sql", {"sql": "SELECT '```' , '<tool_code>'"})], "",
    ),
    # 2. <tool_code>
    "tool_code-tool_name": Case(
        '<tool_code>{"tool_name": "get_weather", "parameters": {"city": "Oslo"}}</tool_code>', [WEATHER], "",
    ),
    "tool_code-name": Case(f"Sure.\n<tool_code>{tc(*SEARCH)}</tool_code>", [SEARCH], "Sure."),
    # 3. fences
    "fence-json": Case(f"{FENCE}json\n{tc(*WEATHER)}\n{FENCE}", [WEATHER], ""),
    "fence-json-in-prose": Case(f"Looking it up:\n{FENCE}json\n{tc(*WEATHER)}\n{FENCE}\nWait.", [WEATHER],
                                "Looking it up:\n\nWait."),
    "fence-no-language": Case(f"{FENCE}\n{tc(*SEARCH)}\n{FENCE}", [SEARCH], ""),
    "fence-uppercase-json": Case(f"{FENCE}JSON\n{tc(*SEARCH)}\n{FENCE}", [SEARCH], ""),
    "fence-one-line": Case(f"{FENCE}json{tc(*SEARCH)}{FENCE}", [SEARCH], ""),
    "fence-list": Case(f"{FENCE}json\n[{tc(*WEATHER)}, {tc(*SEARCH)}]\n{FENCE}", [WEATHER, SEARCH], ""),
    "fence-one-object-per-line": Case(f"{FENCE}json\n{tc(*WEATHER)}\n{tc(*SEARCH)}\n{FENCE}", [WEATHER, SEARCH], ""),
    "fence-unclosed-at-end": Case(f"{FENCE}json\n{tc(*WEATHER)}", [WEATHER], ""),
    # 4. bare
    "bare-object": Case(f"  {tc(*WEATHER)}\n", [WEATHER], ""),
    "bare-list": Case(f"[{tc(*WEATHER)}, {tc(*SEARCH)}]", [WEATHER, SEARCH], ""),
    "bare-tool_name-parameters": Case('{"tool_name": "search", "parameters": {"q": "disk full"}}', [SEARCH], ""),
    # 5. Llama
    "function-tag": Case('<function=get_weather>{"city": "Oslo"}</function>', [WEATHER], ""),
    "function-tag-empty-body": Case("<function=search></function>", [("search", {})], ""),
    "function-tag-unclosed-at-end": Case('Checking <function=get_weather>{"city": "Oslo"}', [WEATHER], "Checking"),
    "function-tag-fenced-json": Case(
        f'Checking.\n<function=get_weather>\n{FENCE}json\n{{"city": "Oslo"}}\n{FENCE}\n</function>', [WEATHER], "Checking.",
    ),
    "function-tag-fenced-empty": Case(f"<function=search>{FENCE}json\n{FENCE}</function>", [("search", {})], ""),
    "function-tags-several": Case(
        '<function=search>{"q": "disk full"}</function>\n<function=get_weather>{"city": "Oslo"}</function>',
        [SEARCH, WEATHER], "",
    ),
    # 6. doubled braces
    "doubled-braces-tool_call": Case(
        '<tool_call>{{"name": "get_weather", "arguments": {{"city": "Oslo"}}}}</tool_call>', [WEATHER], "",
    ),
    "doubled-braces-bare": Case('{{"name": "get_weather", "arguments": {{"city": "Oslo"}}}}', [WEATHER], ""),
    "doubled-braces-fence": Case(f'{FENCE}json\n{{{{"name": "search", "arguments": {{{{}}}}}}}}\n{FENCE}',
                                 [("search", {})], ""),
    "doubled-braces-function": Case('<function=get_weather>{{"city": "Oslo"}}</function>', [WEATHER], ""),
    "single-braces-in-string-untouched": Case(
        '<tool_call>{"name": "search", "arguments": {"q": "{{template}}"}}</tool_call>',
        [("search", {"q": "{{template}}"})], "",
    ),
    # Mixed
    "mixed-formats-in-order": Case(
        f'<function=search>{{"q": "disk full"}}</function> then <tool_call>{tc(*WEATHER)}</tool_call>',
        [SEARCH, WEATHER], "then",
    ),
}

STAYS_TEXT = {
    "empty": Case(""),
    "plain-prose": Case("The disk is 93% full; I'd rotate the logs."),
    "plain-sql": Case("SELECT * FROM users"),
    "sql-fence": Case(f"Run this:\n{FENCE}sql\nSELECT * FROM users WHERE name = 'search';\n{FENCE}"),
    "python-fence-with-call-inside": Case(f"{FENCE}python\nprint('<tool_call>{tc(*WEATHER)}</tool_call>')\n{FENCE}"),
    "json-fence-without-name": Case(f'{FENCE}json\n{{"city": "Oslo", "arguments": {{}}}}\n{FENCE}'),
    "json-fence-name-without-arguments": Case(f'{FENCE}json\n{{"name": "search", "age": 3}}\n{FENCE}'),
    "json-fence-tool-definition": Case(
        f'{FENCE}json\n{{"name": "run_sql", "description": "Runs SQL", '
        f'"parameters": {{"type": "object", "properties": {{"sql": {{"type": "string"}}}}}}}}\n{FENCE}'
    ),
    "json-fence-call-with-result": Case(f'{FENCE}json\n{{"name": "search", "arguments": {{}}, "result": 3}}\n{FENCE}'),
    "json-fence-with-prose-after-object": Case(f"{FENCE}json\n{tc(*SEARCH)}\nand so on\n{FENCE}"),
    "json-fence-name-not-string": Case(f'{FENCE}json\n{{"name": 7, "arguments": {{}}}}\n{FENCE}'),
    "json-fence-empty-list": Case(f"{FENCE}json\n[]\n{FENCE}"),
    "json-fence-mixed-list": Case(f'{FENCE}json\n[{tc(*SEARCH)}, {{"city": "Oslo"}}]\n{FENCE}'),
    "call-json-in-prose-unfenced": Case(f"You could send {tc(*WEATHER)} to the API yourself."),
    "bare-object-without-name": Case('{"city": "Oslo", "arguments": {"a": 1}}'),
    "bare-object-then-prose": Case(f"{tc(*WEATHER)} is what I would send."),
    "bare-scalar-json": Case('"search"'),
    "bare-list-of-numbers": Case("[1, 2, 3]"),
    "tag-mentioned-in-prose": Case("Models wrap calls in <tool_call> and </tool_call> tags."),
    "tag-mentioned-at-end": Case("I will reply with <tool_call>"),
    "tag-with-python-call-syntax": Case('<tool_code>print(get_weather(city="Oslo"))</tool_code>'),
    "function-tag-in-prose": Case("Llama writes <function=name> followed by arguments."),
    "function-tag-bad-name": Case('<function=rm -rf />{"a": 1}</function>'),
    "stray-closing-tags": Case("</tool_call></function></tool_code>"),
    "inline-backticks": Case("Type ``` to start a code block; then ```json on the next line is fine."),
    "function-tag-sql-fence": Case(f"<function=run_sql>\n{FENCE}sql\nSELECT 1\n{FENCE}\n</function>"),
    # Formats 3 and 4 are calls only when nothing else is there, doubled braces or not.
    "doubled-braces-bare-then-prose": Case('{{"name": "search", "arguments": {{}}}} is what I would send.'),
    "doubled-braces-fence-then-prose": Case(
        f'{FENCE}json\n{{{{"name": "search", "arguments": {{{{}}}}}}}}\nand so on\n{FENCE}'
    ),
    "json-fence-empty-list-then-call": Case(f"{FENCE}json\n[]\n{tc(*SEARCH)}\n{FENCE}"),
}

UNKNOWN = {
    "tool_call-unknown": Case(f"<tool_call>{tc('rm_rf', {'path': '/'})}</tool_call>", [], "", ["rm_rf"]),
    "tool_call-unknown-and-known": Case(
        f"<tool_call>{tc('nope')}</tool_call><tool_call>{tc(*SEARCH)}</tool_call><tool_call>{tc('nope')}</tool_call>",
        [SEARCH], "", ["nope"],
    ),
    "tool_call-case-differs": Case(f"<tool_call>{tc('Get_Weather')}</tool_call>", [], "", ["Get_Weather"]),
    "tool_code-unknown": Case('<tool_code>{"tool_name": "shell", "parameters": {"cmd": "id"}}</tool_code>',
                              [], "", ["shell"]),
    "fence-unknown": Case(f"{FENCE}json\n{tc('shell', {'cmd': 'id'})}\n{FENCE}", [], "", ["shell"]),
    "bare-unknown": Case(tc("shell", {"cmd": "id"}), [], "", ["shell"]),
    "function-unknown": Case('<function=shell>{"cmd": "id"}</function>', [], "", ["shell"]),
    "unknown-with-bad-arguments": Case('<tool_call>{"name": "shell", "arguments": 5}</tool_call>', [], "", ["shell"]),
    "unknown-long-name-clipped": Case(f"<tool_call>{tc('x' * 500)}</tool_call>", [], "", ["x" * 79 + "…"]),
    "function-unknown-fenced": Case(
        'Checking.\n<function=echo>\n```json\n{"text":"hi"}\n```\n</function>', [], "Checking.", ["echo"],
    ),
}

MALFORMED = {
    "tool_call-broken-json": Case('<tool_call>{"name": "search", "arguments": {"q": }</tool_call>', [], "", errors=1),
    "tool_call-truncated-at-end": Case('Checking.\n<tool_call>{"name": "search", "argu', [], "Checking.", errors=1),
    "tool_call-arguments-list": Case('<tool_call>{"name": "search", "arguments": [1, 2]}</tool_call>', [], "", errors=1),
    "tool_call-arguments-number": Case('<tool_call>{"name": "search", "arguments": 3}</tool_call>', [], "", errors=1),
    "tool_call-arguments-bad-string": Case(
        '<tool_call>{"name": "search", "arguments": "{q: 1"}</tool_call>', [], "", errors=1,
    ),
    "tool_call-arguments-string-of-list": Case(
        '<tool_call>{"name": "search", "arguments": "[1]"}</tool_call>', [], "", errors=1,
    ),
    "tool_call-name-number": Case('<tool_call>{"name": 42, "arguments": {}}</tool_call>', [], "", errors=1),
    "tool_call-name-object": Case('<tool_call>{"name": {"x": 1}, "arguments": {}}</tool_call>', [], "", errors=1),
    "tool_call-name-empty": Case('<tool_call>{"name": " ", "arguments": {}}</tool_call>', [], "", errors=1),
    "tool_call-no-name": Case('<tool_call>{"arguments": {"q": 1}}</tool_call>', [], "", errors=1),
    "tool_call-non-dict-json": Case("<tool_call>[1, \"two\", null]</tool_call>", [], "", errors=3),
    "tool_call-empty-list": Case("<tool_call>[]</tool_call>", [], "", errors=1),
    "tool_call-bad-then-good": Case(
        f'<tool_call>{{"name": "search", "arguments": [1]}}</tool_call><tool_call>{tc(*WEATHER)}</tool_call>',
        [WEATHER], "", errors=1,
    ),
    "function-broken-json": Case('<function=search>{"q": </function>', [], "", errors=1),
    "function-two-objects": Case('<function=search>{"q": 1} {"q": 2}</function>', [], "", errors=1),
    "fence-known-bad-arguments": Case(f'{FENCE}json\n{{"name": "search", "arguments": [1]}}\n{FENCE}', [], "",
                                      errors=1),
}


def _params(cases: dict[str, Case]) -> Any:
    return pytest.mark.parametrize("case", list(cases.values()), ids=list(cases))


@_params(FORMATS)
def test_each_format_becomes_calls(case: Case) -> None:
    check(parse_text_tool_calls(case.text, KNOWN), case)


@_params(STAYS_TEXT)
def test_things_that_are_not_calls_stay_text(case: Case) -> None:
    check(parse_text_tool_calls(case.text, KNOWN), case)


@_params(UNKNOWN)
def test_unregistered_names_are_never_calls(case: Case) -> None:
    check(parse_text_tool_calls(case.text, KNOWN), case)


@_params(MALFORMED)
def test_malformed_calls_are_reported_not_run(case: Case) -> None:
    result = parse_text_tool_calls(case.text, KNOWN)
    check(result, case)
    assert all(isinstance(e, str) and e for e in result.errors)


def test_errors_say_what_is_wrong() -> None:
    result = parse_text_tool_calls('<tool_call>{"name": "search", "arguments": [1]}</tool_call>', KNOWN)
    assert "search" in result.errors[0] and "object" in result.errors[0]
    result = parse_text_tool_calls('<tool_call>{"name": "search", "arguments": {"q": }</tool_call>', KNOWN)
    assert "JSON" in result.errors[0] and "column" in result.errors[0]


def test_no_known_tools_means_no_calls() -> None:
    result = parse_text_tool_calls(f"<tool_call>{tc(*WEATHER)}</tool_call>", [])
    assert result.calls == [] and result.unknown == ["get_weather"]


def test_call_ids_are_unique_and_shaped() -> None:
    text = "".join(f"<tool_call>{tc('search', {'q': i})}</tool_call>" for i in range(5))
    ids = [c.id for c in parse_text_tool_calls(text, KNOWN).calls]
    assert len(set(ids)) == 5
    assert all(re.fullmatch(r"txt_\d+_[0-9a-f]+", i) for i in ids), ids
    assert [int(i.split("_")[1]) for i in ids] == sorted(int(i.split("_")[1]) for i in ids)


HOSTILE = {
    "deep-nesting-in-tag": "<tool_call>" + "[" * 200_000 + "</tool_call>",
    "deep-nesting-in-arguments": '<tool_call>{"name": "search", "arguments": ' + '{"a": ' * 100_000 + "1",
    "deep-nesting-in-arguments-string": "<tool_call>"
    + json.dumps({"name": "search", "arguments": "[" * 100_000 + "]" * 100_000})
    + "</tool_call>",
    "deep-nesting-bare": "[" * 200_000,
    "deep-nesting-doubled": "<tool_call>" + "{{" * 200_000 + "</tool_call>",
    "deep-nesting-fence": f"{FENCE}json\n" + "{" * 200_000 + f"\n{FENCE}",
    "many-openers": "<tool_call>" * (MB // 11),
    "many-openers-with-brace": "<tool_call>{" * (MB // 12),
    "many-tool-code-openers-one-closer": "<tool_code>" * (MB // 11) + "</tool_code>",
    "many-function-openers": "<function=" * (MB // 10),
    "long-function-name": "<function=" + "a" * MB + ">{}</function>",
    "many-fences": FENCE * (MB // 3),
    "many-inline-fences": f"{FENCE} " * (MB // 4),
    "many-json-fences": f"{FENCE}json\n" * (MB // 8),
    "fence-then-spaces": FENCE + " " * MB,
    "spaces-then-brace": " " * MB + "{",
    # Markup whose body is still all whitespace: undecided on every delta, decided in linear time.
    "tag-then-spaces": "<tool_call>" + " " * MB,
    "function-then-spaces": "<function=search>" + " " * MB,
    "function-fence-then-spaces": f"<function=search>{FENCE}json\n" + " " * MB,
    "many-doubled-braces": "<tool_call>" + "{{" * (MB // 4) + "}}" * (MB // 4) + "</tool_call>",
    "interleaved-tags": "<tool_call><tool_code><function=x>```" * (MB // 40),
    "unbalanced-closers": "</tool_call></function></tool_code>```" * (MB // 40),
    "unterminated-string": '<tool_call>{"name": "' + "a" * MB,
    "nested-unclosed-strings": '<tool_call>{"a": "' * (MB // 18),
    "huge-prose": "SELECT * FROM users; " * (MB // 21),
    "non-dict-bare-list": "[" + "1, " * (MB // 3) + "1]",
}


@pytest.mark.parametrize("text", list(HOSTILE.values()), ids=list(HOSTILE))
def test_hostile_input_neither_crashes_nor_hangs_nor_calls(text: str) -> None:
    result = parse_text_tool_calls(text, KNOWN)
    assert result.calls == []
    # What goes back to the model stays readable, whatever came in.
    assert len(result.errors) <= 25
    assert sum(len(e) for e in result.errors) < 10_000
    looks_like_tool_call(text)


def test_many_openers_and_one_real_call_at_the_end() -> None:
    text = "<tool_call>" * 50_000 + f"{tc(*SEARCH)}</tool_call>"
    result = parse_text_tool_calls(text, KNOWN)
    assert [(c.name, c.arguments) for c in result.calls] == [SEARCH]
    assert result.text == "<tool_call>" * 49_999


def test_many_calls_and_a_huge_argument() -> None:
    big = "x" * MB
    text = f"<tool_call>{tc('search', {'q': big})}</tool_call>" + f"<tool_call>{tc(*WEATHER)}</tool_call>" * 10_000
    result = parse_text_tool_calls(text, KNOWN)
    assert len(result.calls) == 10_001
    assert result.calls[0].arguments == {"q": big}
    assert len({c.id for c in result.calls}) == 10_001


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.one_of(
            st.sampled_from(
                ["<tool_call>", "</tool_call>", "<tool_code>", "</tool_code>", "<function=search>", "</function>",
                 FENCE, f"{FENCE}json\n", "{", "}", "{{", "}}", "[", "]", '"', ":", ",", "\n",
                 '"name"', '"tool_name"', '"arguments"', '"parameters"', '"search"', '"shell"', "null"]
            ),
            st.text(max_size=8),
        ),
        max_size=40,
    ).map("".join)
)
def test_any_text_yields_only_known_calls_with_object_arguments(text: str) -> None:
    result = parse_text_tool_calls(text, KNOWN)
    for call in result.calls:
        assert call.name in KNOWN
        assert isinstance(call.arguments, dict)
    assert not set(result.unknown) & KNOWN
    assert result.text == result.text.strip()


@given(st.text(alphabet=st.characters(blacklist_characters="<`{[")))
def test_text_without_markup_comes_back_unchanged(text: str) -> None:
    result = parse_text_tool_calls(text, KNOWN)
    assert (result.calls, result.unknown, result.errors, result.text) == ([], [], [], text.strip())


LOOKS = {
    "tag": ("Sure.\n<tool_call>{", True),
    "tool_code": ("<tool_code>", True),
    "function": ("<function=search>", True),
    "bare-object-start": ('  {"na', True),
    "bare-list-start": ("[", True),
    "json-fence": (f"Here:\n{FENCE}json\n{{", True),
    "plain-fence": (f"{FENCE}\n", True),
    "fence-info-streaming": (f"Here:\n{FENCE}js", True),
    "partial-tag": ("Let me check <tool_", True),
    "partial-angle": ("Let me check <", True),
    "partial-function": ("<functi", True),
    "partial-fence": ("Here ``", True),
    "prose": ("The disk is 93% full.", False),
    "empty": ("", False),
    "sql": ("SELECT * FROM users WHERE a < b", False),
    "python-fence-closed": (f"{FENCE}python\nprint(1)\n{FENCE}\nDone.", False),
    "sql-fence-streaming": (f"{FENCE}sql\nSELECT 1", False),
    "inline-backticks-then-prose": ("Type ``` to open a block, then write your code on the next line.", False),
}


@pytest.mark.parametrize(("text", "expected"), list(LOOKS.values()), ids=list(LOOKS))
def test_looks_like_tool_call(text: str, expected: bool) -> None:
    assert looks_like_tool_call(text) is expected


@pytest.mark.parametrize("case", list(FORMATS.values()), ids=list(FORMATS))
def test_every_recognised_format_is_held_back_while_streaming(case: Case) -> None:
    # Any prefix that will end up a call must be held back from the user (the first few
    # characters of bare prose may still pass: only the prefix from the markup on matters).
    text = case.text
    starts = [i for i in (text.find(m) for m in ("<tool_call>", "<tool_code>", "<function=", FENCE, "{", "["))
              if i >= 0]
    first = min(starts)
    for end in range(first + 1, len(text) + 1):
        assert looks_like_tool_call(text[:end]), text[:end]


# ---- streaming: what may be shown before the reply is complete ---------------------------------


def _visible(text: str) -> str:
    """The final text of a reply, as the turn computes it."""
    result = parse_text_tool_calls(text, KNOWN)
    return result.text if (result.calls or result.unknown or result.errors) else text


def _stream(text: str, pieces: list[str]) -> tuple[str, str]:
    """(shown before the reply ended, shown in all) when `text` arrives as `pieces`.

    After every delta, what was shown so far must be the start of the final text: text shown is
    never taken back, so no call markup (which the final text has removed) ever reaches the user.
    """
    final = _visible(text)
    guard = StreamGuard()
    early = ""
    for piece in pieces:
        early += guard.feed(piece)
        assert _starts_with(final, early), (pieces, early, final)
    return early, early + guard.finish(final)


def _blank_lines_closed(s: str) -> str:
    # The parser strips the text and closes up blank lines left by removed markup.
    return re.sub(r"\n{3,}", "\n\n", s)


def _same_text(a: str, b: str) -> bool:
    return _blank_lines_closed(a).strip() == _blank_lines_closed(b).strip()


def _starts_with(final: str, shown: str) -> bool:
    return _blank_lines_closed(final).lstrip().startswith(_blank_lines_closed(shown).strip())


def _pieces(text: str, sizes: list[int]) -> list[str]:
    pieces, pos = [], 0
    while pos < len(text):
        size = sizes[len(pieces) % len(sizes)]
        pieces.append(text[pos : pos + size])
        pos += size
    return pieces


ALL_CASES = {**FORMATS, **STAYS_TEXT, **UNKNOWN, **MALFORMED}


@pytest.mark.parametrize("case", list(ALL_CASES.values()), ids=list(ALL_CASES))
@pytest.mark.parametrize("size", [1, 3, 10_000])
def test_streaming_shows_exactly_the_final_text(case: Case, size: int) -> None:
    # Whatever the deltas, the user ends up with the final text, and nothing shown early had to
    # be taken back (markup shown early would not line up with the final text).
    text = case.text
    early, total = _stream(text, [text[i : i + size] for i in range(0, len(text), size)])
    assert _same_text(total, _visible(text)), (early, total)
    if case.calls or case.unknown or case.errors:
        for marker in ("<tool_call>", "<tool_code>", "<function=", '"arguments"', '"name"'):
            assert early.count(marker) <= _visible(text).count(marker), early


# (reply so far, what may already be shown): text is held only while it may still be a call.
SHOWN_EARLY = {
    "prose": ("The disk is 93% full.", "The disk is 93% full."),
    "sql-fence-streaming": (f"Run this:\n{FENCE}sql\nSELECT * FROM users", f"Run this:\n{FENCE}sql\nSELECT * FROM users"),
    "sql-fence-closed-then-prose": (f"{FENCE}sql\nSELECT 1;\n{FENCE}\nThen", f"{FENCE}sql\nSELECT 1;\n{FENCE}\nThen"),
    "plain-fence-with-shell": (f"{FENCE}\ndf -h /var", f"{FENCE}\ndf -h /var"),
    "json-fence-not-a-call": (f'{FENCE}json\n{{"disk": "93%"}}\nmore', f'{FENCE}json\n{{"disk": "93%"}}\nmore'),
    "json-fence-prose-inside": (f"{FENCE}json\n// a comment", f"{FENCE}json\n// a comment"),
    "json-fence-call-after-prose": (f'See:\n{FENCE}json\n{{"name": "search", "arguments": {{}}}}', "See:\n"),
    "json-fence-may-be-a-call": (f'{FENCE}json\n{{"name": "search", "argu', ""),
    "json-fence-info-streaming": (f"Here:\n{FENCE}js", "Here:\n"),
    "json-fence-call-then-prose": (f'{FENCE}json\n{tc(*SEARCH)}\nand so on', f'{FENCE}json\n{tc(*SEARCH)}\nand so on'),
    "list-of-numbers": ("[1, 2, 3] are the ids", "[1, 2, 3] are the ids"),
    "list-just-opened": ("[1", "[1"),
    "markdown-link": ("[the docs](https://example.com)", "[the docs](https://example.com)"),
    "object-not-a-call": ('{"disk": "93%"} is the status', '{"disk": "93%"} is the status'),
    "call-object-then-prose": (f"{tc(*SEARCH)} is what I would send", f"{tc(*SEARCH)} is what I would send"),
    "bare-call-so-far": (tc(*SEARCH), ""),
    "bare-call-incomplete": ('{"name": "search", "arguments": {"q": "di', ""),
    "tag-in-prose": ("Models wrap calls in <tool_call> and more", "Models wrap calls in <tool_call> and more"),
    "tag-at-the-end": ("I will reply with <tool_call>", "I will reply with "),
    "tag-opener-split": ("Let me check <tool_", "Let me check "),
    "tag-call": ('Checking.\n<tool_call>{"na', "Checking.\n"),
    "tag-fenced-call": (f"<tool_call>\n{FENCE}json\n{{", ""),
    "tag-python-syntax": ("<tool_code>print(1)", "<tool_code>print(1)"),
    "function-call": ('Sure <function=search>{"q"', "Sure "),
    "function-in-prose": ("Llama writes <function=name> then", "Llama writes <function=name> then"),
    "function-empty-call-may-close": ("<function=search></func", ""),
    "function-bad-name": ("<function=rm -rf />", "<function=rm -rf />"),
    "function-fenced-call": ('Checking.\n<function=echo>\n```json\n{"text":"hi"}\n```\n</function>', "Checking.\n"),
    "function-fenced-call-streaming": (f"Checking.\n<function=echo>\n{FENCE}json\n", "Checking.\n"),
    "function-fence-may-be-empty-call": (f"<function=search>{FENCE}json\n``", ""),
    "function-sql-fence": (f"<function=search>\n{FENCE}sql\nSELECT 1", f"<function=search>\n{FENCE}sql\nSELECT 1"),
    "doubled-braces-fence": (f'{FENCE}json\n{{{{"name": "search", "arguments": {{{{}}}}}}}}\nand', ""),
    "four-backticks": ("````\nnot a fence", "````\nnot a fence"),
    "inline-triple-backticks": ("Type ``` to open a block, then write your code",
                                "Type ``` to open a block, then write your code"),
    # The line after ``` may still turn out a language ("json"): held for at most its first line.
    "fence-info-undecided": ("Type ``` to open a block", "Type "),
    "partial-fence": ("Here ``", "Here "),
    "leading-blank-lines": ("\n\n  hello", "hello"),
    "doubled-braces-call": ('{{"name": "search", "arguments": {{}}}}', ""),
}


@pytest.mark.parametrize(("text", "expected"), list(SHOWN_EARLY.values()), ids=list(SHOWN_EARLY))
def test_streaming_holds_only_what_may_still_be_a_call(text: str, expected: str) -> None:
    for size in (1, 4, len(text)):
        early, _ = _stream(text, [text[i : i + size] for i in range(0, len(text), size)])
        assert early == expected, (size, early)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.one_of(
            st.sampled_from(
                ["<tool_call>", "</tool_call>", "<tool_code>", "<function=search>", "<function=", ">",
                 "</function>", FENCE, f"{FENCE}json\n", f"{FENCE}sql\n", "`", "{", "}", "{{", "}}", "[", "]",
                 '"', "\\", ":", ",", "\n", " ", '"name"', '"arguments"', '"search"', '"shell"', tc(*SEARCH)]
            ),
            st.text(max_size=6),
        ),
        max_size=30,
    ).map("".join),
    st.lists(st.integers(min_value=1, max_value=6), min_size=1, max_size=40),
)
def test_any_reply_in_any_deltas_streams_to_its_final_text(text: str, sizes: list[int]) -> None:
    pieces = _pieces(text, sizes)
    early, total = _stream(text, pieces)
    assert _same_text(total, _visible(text)), (pieces, early)


# Replies as models write them: prose, code fences, tags mentioned and used, calls well and badly
# formed, in any order. Each part is small; the mix is what finds the parser and the guard apart.
_WS = st.sampled_from(["", " ", "\n", "\n\n", "  \n"])
_ARGS = st.sampled_from(['{"q": "x"}', "{}", '{"q": "```"}', '{"q": "</function>"}', '{{"q": 1}}', '{"q": ', "[1]"])
_OBJECT = st.one_of(
    st.builds(lambda name, args: f'{{"name": "{name}", "arguments": {args}}}',
              st.sampled_from(["search", "echo", ""]), _ARGS),
    st.sampled_from(['{{"name": "search", "arguments": {{}}}}', '{"disk": 1}', "[1, 2]", "[]", '"x"']),
)
_FENCED = st.builds(
    lambda lang, lead, body, trail, closed: f"{FENCE}{lang}\n{lead}{body}{trail}" + (FENCE if closed else ""),
    st.sampled_from(["json", "", "JSON", " json", "sql", "python"]), _WS,
    st.one_of(_OBJECT, _ARGS, st.sampled_from(["SELECT 1", "x", ""])), _WS, st.booleans(),
)
_BODY = st.one_of(_OBJECT, _ARGS, _FENCED, st.sampled_from(["print(1)", "", FENCE, f"{FENCE}json", "`", "<", "</func"]))
_TAGGED = st.builds(
    lambda tag, lead, body, trail, closed: f"<{tag}>{lead}{body}{trail}" + (f"</{tag}>" if closed else ""),
    st.sampled_from(["tool_call", "tool_code"]), _WS, _BODY, _WS, st.booleans(),
)
_FUNCTION = st.builds(
    lambda name, lead, body, trail, closed: f"<function={name}>{lead}{body}{trail}" + ("</function>" if closed else ""),
    st.sampled_from(["search", "echo", "", "a b"]), _WS, _BODY, _WS, st.booleans(),
)
_PROSE = st.sampled_from(["Checking.", "The disk is full", "see `df -h`", "Type ``` here", "a < b", "[docs](u)",
                          "{x}", "I use <tool_call> tags", "Llama writes <function=name> then"])
_REPLIES = st.lists(
    st.one_of(_PROSE, _TAGGED, _FUNCTION, _FENCED, _OBJECT, _WS, st.text(alphabet=" \n<>/{}[]`\"", max_size=3)),
    max_size=6,
).map("".join)


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_REPLIES, st.lists(st.integers(min_value=1, max_value=7), min_size=1, max_size=10))
def test_mixed_replies_show_only_the_parsers_text_while_streaming(text: str, sizes: list[int]) -> None:
    # _stream checks, after every delta, that what was shown is the start of the parser's text.
    early, total = _stream(text, _pieces(text, sizes))
    assert _same_text(total, _visible(text)), early


@pytest.mark.parametrize("text", list(HOSTILE.values()), ids=list(HOSTILE))
def test_hostile_replies_stream_in_linear_time(text: str) -> None:
    guard = StreamGuard()
    shown = "".join(guard.feed(text[i : i + 64]) for i in range(0, len(text), 64))
    assert text.startswith(shown)


TOOLS = [
    ToolSpec(
        name="get_weather",
        description="Current weather for a city.",
        parameters={
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}, "unit": {"enum": ["C", "F"]}},
            "required": ["city", "unit"],
        },
    ),
    ToolSpec(
        name="run_sql",
        description="Run one SQL statement against the ops database.",
        parameters={"type": "object", "properties": {"sql": {"type": "string"}}, "required": ["sql"]},
    ),
    ToolSpec(name="search", description="", parameters={}),
]


def test_prompt_lists_every_tool_and_the_calling_convention() -> None:
    prompt = describe_tools_for_prompt(TOOLS)
    for tool in TOOLS:
        assert f"### {tool.name}" in prompt
        assert tool.description in prompt
    assert json.dumps(TOOLS[1].parameters, sort_keys=True) in prompt
    assert "<tool_call>" in prompt and "</tool_call>" in prompt
    assert '"name"' in prompt and '"arguments"' in prompt


def test_prompt_is_empty_without_tools() -> None:
    assert describe_tools_for_prompt([]) == ""


def test_prompt_example_round_trips_to_a_call() -> None:
    prompt = describe_tools_for_prompt(TOOLS)
    example = re.search(r"^<tool_call>.*</tool_call>$", prompt, re.MULTILINE)
    assert example is not None
    result = parse_text_tool_calls(example.group(), {t.name for t in TOOLS})
    assert [(c.name, c.arguments) for c in result.calls] == [("get_weather", {"city": "...", "unit": "C"})]
    assert (result.unknown, result.errors, result.text) == ([], [], "")


def test_prompt_itself_parses_to_just_its_example() -> None:
    # The prose of the instructions mentions the tags; only the example is a call.
    result = parse_text_tool_calls(describe_tools_for_prompt(TOOLS), {t.name for t in TOOLS})
    assert [c.name for c in result.calls] == ["get_weather"]
    assert result.errors == [] and result.unknown == []


@pytest.mark.parametrize("tool", TOOLS, ids=[t.name for t in TOOLS])
def test_the_convention_the_prompt_states_parses_for_every_tool(tool: ToolSpec) -> None:
    prompt = describe_tools_for_prompt([tool])
    example = re.search(r"^<tool_call>.*</tool_call>$", prompt, re.MULTILINE)
    assert example is not None and tool.name in example.group()
    written = f"Checking now.\n{example.group()}"
    result = parse_text_tool_calls(written, {tool.name})
    assert [c.name for c in result.calls] == [tool.name]
    assert result.text == "Checking now."


@settings(max_examples=500, deadline=None)
@given(st.text(alphabet="<`abcdefilnotu_=>{}", max_size=30), st.sampled_from(_OPENERS),
       st.integers(min_value=0, max_value=12), st.integers(min_value=0, max_value=45))
def test_the_tail_held_back_is_the_longest_that_may_begin_an_opener(text: str, opener: str, cut: int,
                                                                    floor: int) -> None:
    buf = text + opener[:cut]  # often a piece (or all) of an opener at the end, as a delta may leave
    floor = min(floor, len(buf))
    # The definition, spelled out: the longest tail of buf[floor:] that an opener starts with and
    # that is not the whole opener.
    expected = max((k for k in range(1, len(buf) - floor + 1)
                    for o in _OPENERS if k < len(o) and o.startswith(buf[len(buf) - k:])), default=0)
    assert _opener_prefix_len(buf, floor) == expected
