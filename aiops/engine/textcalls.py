"""Tool calls written as text, for models without native tool calling (`tool_calling = "text"`).

Such a model is told (by `describe_tools_for_prompt`) to write
`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, and in practice writes a handful of
variants of that. `parse_text_tool_calls` turns them back into neutral `ToolCall`s.

This is a safety boundary: what lands in `calls` is executed (after its gate). So only explicit
call formats are recognised, never text that merely looks like code or JSON, and only registered
tool names ever become calls. The scanner is linear in the input: the text comes from a model and
may be huge or hostile, and this runs on the event loop.

Recognised, in order of appearance:
  1. `<tool_call>{...}</tool_call>` (a missing closing tag at the end of the text is tolerated)
  2. `<tool_code>{...}</tool_code>`, name key `tool_name` or `name`
  3. a ```json (or language-less ```) fence holding call objects only
  4. the whole message being one call object, or a list of them
  5. Llama-style `<function=NAME>{...arguments...}</function>`
A call object has "name" (or "tool_name") and "arguments" (or "parameters"); arguments may be a
JSON-encoded string. Doubled braces (`{{ ... }}`, a prompt-template artefact) are undone when the
JSON does not parse as written. Inside explicit tags (1, 2, 5) a body is recognised when it starts
like JSON, and then any problem is reported in `errors` so the model can correct itself; formats 3
and 4 have no markup of their own, so they must be unambiguous call objects or they stay text.
Recognised markup is removed from `text` whether or not its name is registered; unregistered names
are listed in `unknown` so the caller can tell the model, and are never executed.

Known limit: a body ends at the first closing tag, so an argument string that itself contains
`</tool_call>` (or `</function>`) breaks that call (reported as malformed JSON). Searching past it
would need unbounded re-parsing of the text, which is what keeps hostile input linear.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

from aiops.engine.types import ToolCall, ToolSpec, new_id

__all__ = ["StreamGuard", "TextCallParse", "describe_tools_for_prompt", "looks_like_tool_call",
           "parse_text_tool_calls"]

_FENCE = "```"
_FUNC_OPEN = "<function="
_FUNC_CLOSE = "</function>"
_TAG_OPENERS = ("<tool_call>", "<tool_code>")
_OPENERS = (*_TAG_OPENERS, _FUNC_OPEN, _FENCE)
# Languages of a fence that may hold a call; any other fence (sql, python, ...) is text, whole.
_CALL_FENCE_LANGS = frozenset({"", "json"})
_MAX_INFO = 32  # longer than this after ``` is not a language tag
_MAX_FUNC_NAME = 128
_FUNC_NAME_RE = re.compile(r"[A-Za-z0-9_.:\-]+")
_OPENER_RE = re.compile("|".join(re.escape(o) for o in _OPENERS))
_BACKTICKS_RE = re.compile("`*")
_NON_SPACE_RE = re.compile(r"\S")
_BLANK_LINES_RE = re.compile(r"\n{3,}")
_NAME_CHARS_RE = re.compile(r"[A-Za-z0-9_.:\-]*")
_JSON_PLAIN_RE = re.compile(r'[^"\\{}\[\]\s]+')  # outside strings: nothing that changes the state
_JSON_STRING_RE = re.compile(r'[^"\\]+')  # inside a string: nothing that ends it
_SPACE_RE = re.compile(r"\s+")
# Keeps the report back to the model (and names echoed from it) a readable size.
_MAX_ERRORS = 20
_MAX_SHOWN = 80
# Keys a call object may have where there is no markup to say it is a call (formats 3 and 4): an
# object with more (a "description", a "result") is an example or a tool definition, not a call.
_CALL_KEYS = frozenset({"name", "tool_name", "arguments", "parameters", "id", "type"})
_WRAPPER_KEYS = frozenset({"function", "id", "type"})

_decoder = json.JSONDecoder()


@dataclass
class TextCallParse:
    """What a model's text asked for."""

    calls: list[ToolCall] = field(default_factory=list)  # registered names only, in order
    unknown: list[str] = field(default_factory=list)  # unregistered names (never executed)
    errors: list[str] = field(default_factory=list)  # problems to report back to the model
    text: str = ""  # the text with recognised call markup removed, stripped


def parse_text_tool_calls(text: str, known_tools: Collection[str]) -> TextCallParse:
    """Find the tool calls a model wrote as text; see the module docstring for the formats."""
    out = _Collector(frozenset(known_tools))
    bare = _bare_calls(text)
    if bare is not None:
        for value in bare:
            out.add(value, "tool call")
        return out.result("")
    return out.result(_Scanner(text, out).run())


def looks_like_tool_call(text: str) -> bool:
    """Whether `text` (a reply still streaming) holds, or may be about to become, a tool call.

    Cheap and generous: a yes only delays showing the text until the reply is parsed whole, a
    wrong no would show call markup to the user.
    """
    first = _NON_SPACE_RE.search(text)
    if first is None:
        return False
    if first.group() in "{[":
        return True
    if any(opener in text for opener in (*_TAG_OPENERS, _FUNC_OPEN)):
        return True
    if _has_call_fence(text):
        return True
    # The reply may stop in the middle of an opener ("... <tool_" or "``").
    tail = text[-len(_TAG_OPENERS[0]):]
    return any(tail.endswith(opener[:n]) for opener in _OPENERS for n in range(1, len(opener)))


def describe_tools_for_prompt(tools: list[ToolSpec]) -> str:
    """Instructions for the system prompt of a text-calling model; empty when there are no tools."""
    if not tools:
        return ""
    lines = [
        "# Tools",
        "",
        "You can call the tools listed below. To call a tool, write the tag <tool_call>, then one JSON "
        'object with the keys "name" (the tool\'s exact name) and "arguments" (a JSON object matching '
        "the tool's argument schema), then the tag </tool_call>, all on one line. For example:",
        "",
        _example_call(tools[0]),
        "",
        "Rules:",
        "- Write strict JSON: double quotes, no comments, no trailing commas, no code fence around the block.",
        "- One <tool_call> block per call; to call several tools, write several blocks.",
        "- Only call tools from the list below, by their exact names.",
        "- After your tool calls, stop. The results come back in the next message; never invent them.",
        "- When no tool is needed, answer normally, without any tool call block.",
        "",
        "## Available tools",
    ]
    for tool in tools:
        schema = tool.parameters or {"type": "object", "properties": {}}
        lines += [
            "",
            f"### {tool.name}",
            tool.description.strip() or "(no description)",
            "Arguments (JSON schema): " + json.dumps(schema, ensure_ascii=False, sort_keys=True),
        ]
    return "\n".join(lines)


# ---- parsing ------------------------------------------------------------------------------------


class _Collector:
    """Sorts call objects into calls, unknown names and errors."""

    def __init__(self, known: frozenset[str]) -> None:
        self._known = known
        self._calls: list[ToolCall] = []
        self._unknown: list[str] = []
        self._errors: list[str] = []
        self._dropped_errors = 0

    def add(self, value: Any, where: str) -> None:
        """One decoded JSON value that explicit markup (or an unambiguous shape) says is a call."""
        if isinstance(value, list):
            if not value:
                self.error(f"{where}: an empty list holds no call")
            for item in value:
                self.add_object(item, where)
        else:
            self.add_object(value, where)

    def add_object(self, value: Any, where: str) -> None:
        if not isinstance(value, dict):
            self.error(f'{where}: expected a JSON object with "name" and "arguments", got {_kind(value)}')
            return
        obj = _unwrap(value)
        name = obj.get("name", obj.get("tool_name"))
        if name is None:
            self.error(f'{where}: the object has no "name"')
            return
        if not isinstance(name, str) or not name.strip():
            self.error(f'{where}: "name" must be a non-empty string, got {_kind(name)}')
            return
        raw = obj["arguments"] if "arguments" in obj else obj.get("parameters")
        self.add_call(name.strip(), raw)

    def add_call(self, name: str, raw_arguments: Any) -> None:
        if name not in self._known:
            # Checked before the arguments: an unregistered tool is never run, whatever it was given.
            shown = _clip(name)
            if shown not in self._unknown:
                self._unknown.append(shown)
            return
        arguments, problem = _arguments(raw_arguments)
        if arguments is None:
            self.error(f"tool call {name!r}: {problem}")
            return
        self._calls.append(ToolCall(id=new_id(f"txt_{len(self._calls)}_"), name=name, arguments=arguments))

    def error(self, message: str) -> None:
        if len(self._errors) < _MAX_ERRORS:
            self._errors.append(message)
        else:
            self._dropped_errors += 1

    def result(self, text: str) -> TextCallParse:
        errors = list(self._errors)
        if self._dropped_errors:
            errors.append(f"... and {self._dropped_errors} more malformed tool calls")
        return TextCallParse(calls=list(self._calls), unknown=list(self._unknown), errors=errors, text=text)


class _Finder:
    """`str.find` that remembers, per needle, the last hit.

    The scanner looks for the same needles again and again from positions that only move forward;
    without the memory, e.g. 100k openers and no closer would rescan to the end 100k times.
    """

    def __init__(self, text: str) -> None:
        self._text = text
        self._last: dict[str, tuple[int, int]] = {}  # needle -> (searched from, hit or len(text))

    def find(self, needle: str, start: int) -> int:
        last = self._last.get(needle)
        if last is not None and last[0] <= start <= last[1]:
            return last[1]
        hit = self._text.find(needle, start)
        if hit < 0:
            hit = len(self._text)
        self._last[needle] = (start, hit)
        return hit


class _Scanner:
    """One forward pass over the text: copies text, hands markup to the collector."""

    def __init__(self, text: str, out: _Collector) -> None:
        self._text = text
        self._out = out
        self._find = _Finder(text).find
        self._kept: list[str] = []
        self._removed = False

    def run(self) -> str:
        text, pos = self._text, 0
        while (found := _OPENER_RE.search(text, pos)) is not None:
            start, opener = found.start(), found.group()
            self._kept.append(text[pos:start])
            if opener == _FENCE:
                pos = self._fence(start)
            elif opener == _FUNC_OPEN:
                pos = self._function(start)
            else:
                pos = self._tag(start, opener)
        self._kept.append(text[pos:])
        kept = "".join(self._kept)
        if self._removed:
            kept = _BLANK_LINES_RE.sub("\n\n", kept)
        return kept.strip()

    def _keep(self, start: int, end: int) -> int:
        self._kept.append(self._text[start:end])
        return end

    def _body(self, body_start: int, opener: str, closer: str) -> tuple[int, bool]:
        """Where a tag's body ends: its closing tag, or else the next opener of the same kind."""
        close = self._find(closer, body_start)
        following = self._find(opener, body_start)
        if close < following:
            return close, True
        return following, False

    def _tag(self, start: int, opener: str) -> int:
        """`<tool_call>` / `<tool_code>`; returns where scanning continues."""
        tag = opener[1:-1]
        closer = f"</{tag}>"
        body_start = start + len(opener)
        body_end, closed = self._body(body_start, opener, closer)
        body, lead = _tag_body(self._text[body_start:body_end])
        if not body.startswith(("{", "[")):
            # Prose that mentions the tag ("wrap calls in <tool_call> tags") is not a call.
            return self._keep(start, body_start)
        self._removed = True
        values, used, problem = _decode(body)
        for value in values:
            self._out.add(value, f"<{tag}>")
        if problem is not None:
            self._out.error(f"<{tag}>: {problem}")
        if closed:
            return body_end + len(closer)
        if problem is not None or used is None or lead is None:
            return body_end  # a call cut off (e.g. at max tokens): nothing after it is worth showing
        return body_start + lead + used

    def _function(self, start: int) -> int:
        """Llama-style `<function=NAME>{...}</function>`; returns where scanning continues."""
        name_start = start + len(_FUNC_OPEN)
        gt = self._text.find(">", name_start, name_start + _MAX_FUNC_NAME + 1)
        name = self._text[name_start:gt] if gt >= 0 else ""
        if not _FUNC_NAME_RE.fullmatch(name):
            return self._keep(start, name_start)
        body_start = gt + 1
        body_end, closed = self._body(body_start, _FUNC_OPEN, _FUNC_CLOSE)
        body, lead = _tag_body(self._text[body_start:body_end])
        empty_call = closed and not body
        if not (empty_call or body.startswith("{")):
            return self._keep(start, body_start)
        self._removed = True
        end = body_end + len(_FUNC_CLOSE) if closed else body_end
        if empty_call:
            self._out.add_call(name, {})
            return end
        values, used, problem = _decode(body)
        if problem is not None or len(values) != 1:
            self._out.error(f"<function={_clip(name)}>: {problem or 'expected one JSON object of arguments'}")
            return end
        self._out.add_call(name, values[0])
        if closed or used is None or lead is None:
            return end
        return body_start + lead + used

    def _fence(self, start: int) -> int:
        """A ``` fence; returns where scanning continues (after the fence, kept or removed)."""
        info = _fence_info(self._text, start)
        if info is None:
            # Inline backticks or an over-long info string: not a code block, just characters.
            return self._keep(start, _after_backticks(self._text, start))
        lang, content_start = info
        close = self._find(_FENCE, content_start)
        end = min(close + len(_FENCE), len(self._text))
        if lang in _CALL_FENCE_LANGS:
            values = _only_calls(self._text[content_start:close])
            if values is not None:
                for value in values:
                    self._out.add(value, "```json block")
                self._removed = True
                return end
        # Everything inside any other fence is text, even tags: it is code or an example.
        return self._keep(start, end)


def _bare_calls(text: str) -> list[Any] | None:
    """The call objects when the whole message is nothing but call JSON (format 4)."""
    first = _NON_SPACE_RE.search(text)
    if first is None or first.group() not in "{[":
        return None
    return _only_calls(text)


def _only_calls(block: str) -> list[Any] | None:
    """The values of `block` when it holds unambiguous call objects and nothing else; else None."""
    body = block.strip()
    if not body.startswith(("{", "[")):
        return None
    values, used, problem = _decode(body)
    if problem is not None or not values or (used is not None and used != len(body)):
        return None
    items = [item for value in values for item in (value if isinstance(value, list) else [value])]
    if not items or not all(_is_call_object(item) for item in items):
        return None
    return values


def _is_call_object(value: Any) -> bool:
    if not isinstance(value, dict):
        return False
    inner = _unwrap(value)
    if inner is not value:
        if not value.keys() <= _WRAPPER_KEYS:
            return False
        value = inner
    name = value.get("name", value.get("tool_name"))
    return (
        isinstance(name, str)
        and bool(name.strip())
        and ("arguments" in value or "parameters" in value)
        and value.keys() <= _CALL_KEYS
    )


def _unwrap(obj: dict[str, Any]) -> dict[str, Any]:
    """OpenAI's own shape, `{"type": "function", "function": {"name", "arguments"}}`, written as text."""
    inner = obj.get("function")
    if "name" not in obj and "tool_name" not in obj and isinstance(inner, dict):
        return inner
    return obj


def _decode(body: str) -> tuple[list[Any], int | None, str | None]:
    """JSON values at the start of `body`, one after another.

    Returns (values, how much of `body` they used, problem). `used` is None when the values were
    only found after undoubling braces, where offsets no longer match the original.
    """
    values, used, problem = _decode_as_written(body)
    if problem is not None and "{{" in body:
        undoubled = body.replace("{{", "{").replace("}}", "}")
        values2, _, problem2 = _decode_as_written(undoubled)
        if problem2 is None:
            return values2, None, None
    return values, used, problem


def _decode_as_written(body: str) -> tuple[list[Any], int, str | None]:
    values: list[Any] = []
    pos = 0
    while pos < len(body) and body[pos] in "{[":
        try:
            value, end = _decoder.raw_decode(body, pos)
        except RecursionError:
            return values, pos, "the JSON is nested too deeply"
        except ValueError as exc:
            return values, pos, f"malformed JSON: {_json_problem(exc)}"
        values.append(value)
        following = _NON_SPACE_RE.search(body, end)
        if following is None or following.group() not in "{[":
            return values, end, None
        pos = following.start()
    return values, pos, None


def _arguments(raw: Any) -> tuple[dict[str, Any] | None, str]:
    """The arguments as an object, or None and why not."""
    if raw is None:
        return {}, ""
    if isinstance(raw, str):
        if not raw.strip():
            return {}, ""
        try:
            raw = json.loads(raw)
        except RecursionError:
            return None, "the arguments string is nested too deeply"
        except ValueError as exc:
            return None, f"the arguments string is not valid JSON: {_json_problem(exc)}"
    if isinstance(raw, dict):
        return raw, ""
    return None, f'"arguments" must be a JSON object, got {_kind(raw)}'


def _tag_body(raw: str) -> tuple[str, int | None]:
    """A tag's body, stripped, without the code fence some models put around the JSON.

    Also returns where the stripped body starts in `raw`, or None when a fence was taken off (the
    offsets of what follows no longer match).
    """
    first = _NON_SPACE_RE.search(raw)
    if first is None:
        return "", 0
    body = raw[first.start() :].rstrip()
    if body.startswith(_FENCE):
        newline = body.find("\n", 0, _MAX_INFO + len(_FENCE) + 1)
        if newline >= 0 and body[len(_FENCE) : newline].strip().lower() in _CALL_FENCE_LANGS:
            return body[newline + 1 :].rstrip().removesuffix(_FENCE).strip(), None
    return body, first.start()


def _fence_info(text: str, start: int) -> tuple[str, int] | None:
    """The language and content start of a fence opening at `start`, or None for plain backticks.

    The info string ends at a newline, or at the JSON itself for one-line ```json{...}``` blocks.
    """
    info_start = start + len(_FENCE)
    window = text[info_start : info_start + _MAX_INFO + 1]
    cut = min((i for i in (window.find(c) for c in "\n{[") if i >= 0), default=-1)
    if cut < 0 or "`" in window[:cut]:
        return None
    return window[:cut].strip().lower(), info_start + cut + (1 if window[cut] == "\n" else 0)


def _after_backticks(text: str, start: int) -> int:
    """The end of the run of backticks at `start` (one step, however long the run)."""
    run = _BACKTICKS_RE.match(text, start)
    return run.end() if run is not None else start + 1


def _has_call_fence(text: str) -> bool:
    """Whether a ```json (or bare ```) block opens in `text`, or a fence's first line is incomplete."""
    pos = text.find(_FENCE)
    while pos >= 0:
        info = _fence_info(text, pos)
        if info is None:
            rest = text[pos + len(_FENCE) : pos + len(_FENCE) + _MAX_INFO + 1]
            if len(rest) <= _MAX_INFO and "`" not in rest and "\n" not in rest:
                return True  # the info line is still streaming in
            pos = text.find(_FENCE, _after_backticks(text, pos))
            continue
        lang, content_start = info
        if lang in _CALL_FENCE_LANGS:
            return True
        close = text.find(_FENCE, content_start)
        if close < 0:
            return False
        pos = text.find(_FENCE, close + len(_FENCE))
    return False


def _json_problem(exc: ValueError) -> str:
    if isinstance(exc, json.JSONDecodeError):
        return f"{exc.msg} at line {exc.lineno} column {exc.colno}"
    return _clip(str(exc))


def _kind(value: Any) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number"
    )


def _clip(s: str) -> str:
    return s if len(s) <= _MAX_SHOWN else s[: _MAX_SHOWN - 1] + "…"


# ---- streaming ----------------------------------------------------------------------------------


class StreamGuard:
    """How much of a reply that is still streaming is certainly text, never part of a call.

    Mirrors `parse_text_tool_calls` on a growing text, so the user sees a reply as it streams while
    call markup never reaches them: `feed` returns the text that became safe to show, `finish` what
    remains once the whole reply is parsed. Text is held only while it may still become a call, and
    released as soon as it cannot: a ```sql fence, a ``` fence whose content is not JSON, JSON that
    turns out not to be a call object, a tag mentioned in prose. It errs on holding: what it
    releases is always text the parser keeps. Once real call markup is seen, the rest of the reply
    waits for the parse (calls end a reply; nothing is lost by waiting). Linear in the reply.
    """

    def __init__(self) -> None:
        self._buf = ""
        self._shown = 0  # released up to here
        self._lead = 0  # leading whitespace is never shown (the parser strips it)
        self._safe = 0  # certainly text up to here
        self._state = "start"  # start | bare | text | ticks | code | json_fence | held
        self._pos = 0  # text: where the search for openers resumes
        self._content = 0  # a fence's content start
        self._close_from = 0  # where the search for a fence's closing ``` resumes
        self._json: _JsonScan | None = None

    def feed(self, text: str) -> str:
        """Add a delta; returns the text that is now certainly not call markup (maybe "")."""
        # Detached while appending: a str with no other reference grows in place in CPython,
        # where `self._buf += text` would copy the whole reply on every delta.
        buf, self._buf = self._buf, ""
        buf += text
        self._buf = buf
        del buf
        self._advance()
        if self._safe <= self._shown:
            return ""
        out = self._buf[self._shown : self._safe]
        self._shown = self._safe
        return out

    def finish(self, visible: str) -> str:
        """What is left to show of `visible` (the reply's final text) after what `feed` released."""
        shown = self._buf[self._lead : self._shown]
        target = visible.lstrip()
        # The parser strips the text and, when it removed markup, closes up the blank lines left.
        for candidate in (shown, _BLANK_LINES_RE.sub("\n\n", shown)):
            if target.startswith(candidate):
                return target[len(candidate) :]
        return "" if shown else target

    def _advance(self) -> None:
        buf = self._buf
        while True:
            state = self._state
            if state == "start":
                first = _NON_SPACE_RE.search(buf, self._pos)
                if first is None:
                    self._pos = len(buf)
                    return
                self._lead = self._shown = self._safe = first.start()
                if first.group() in "{[":
                    self._state, self._json = "bare", _JsonScan(first.start())
                else:
                    self._state, self._pos = "text", first.start()
            elif state == "bare":
                if not self._bare_ruled_out(buf):
                    return
                # Not only call JSON: the whole reply is scanned like any other text.
                self._state, self._pos, self._safe = "text", self._lead, self._lead
            elif state == "text":
                if not self._text(buf):
                    return
            elif state == "ticks":
                # A run of four or more backticks is text, however long it grows.
                self._pos = _match_end(_BACKTICKS_RE, buf, self._pos)
                self._safe = self._pos
                if self._pos == len(buf):
                    return
                self._state = "text"
            elif state == "code":
                close = buf.find(_FENCE, self._close_from)
                if close < 0:
                    # Everything inside a fence that holds no call is text, its closing fence too.
                    self._safe = len(buf)
                    self._close_from = max(self._content, len(buf) - len(_FENCE) + 1)
                    return
                self._state, self._pos = "text", close + len(_FENCE)
                self._safe = self._pos
            elif state == "json_fence":
                if not self._json_fence(buf):
                    return
            else:  # held: a call; the rest waits for the parse
                return

    def _bare_ruled_out(self, buf: str) -> bool:
        """Format 4: whether the reply can no longer be nothing but call objects."""
        assert self._json is not None
        while True:
            kind, start, end = self._json.step(buf)
            if kind == "more":
                return False
            if kind != "value" or _only_calls(buf[start:end]) is None:
                return True

    def _text(self, buf: str) -> bool:
        """Scan prose for openers; False when more text is needed or a call began."""
        found = _OPENER_RE.search(buf, self._pos)
        if found is None:
            # Hold back only a tail that may be the start of an opener split across deltas.
            self._safe = self._pos = max(self._pos, len(buf) - _opener_prefix_len(buf, self._pos))
            return False
        start, opener = found.start(), found.group()
        self._safe = self._pos = start
        if opener == _FENCE:
            verdict, at = _fence_verdict(buf, start)
        elif opener == _FUNC_OPEN:
            verdict, at = _function_verdict(buf, start)
        else:
            verdict, at = _tag_verdict(buf, start, opener)
        if verdict == "wait":
            return False
        if verdict == "call":
            self._state = "held"
            return False
        if verdict == "text":
            self._safe = self._pos = at
        elif verdict == "ticks":
            self._state = "ticks"
        else:  # a fence opens at `at`: code, or a json fence that may hold calls
            self._state, self._content, self._close_from = verdict, at, at
            self._json = _JsonScan(at) if verdict == "json_fence" else None
        return True

    def _json_fence(self, buf: str) -> bool:
        """A ```json (or bare ```) fence: held while its content may be calls."""
        close = buf.find(_FENCE, self._close_from)
        if close >= 0:  # the content is final: the parser's own test decides
            if _only_calls(buf[self._content : close]) is not None:
                self._state = "held"
                return False
            self._state, self._pos = "text", close + len(_FENCE)
            self._safe = self._pos
            return True
        self._close_from = max(self._content, len(buf) - len(_FENCE) + 1)
        assert self._json is not None
        while True:
            kind, start, end = self._json.step(buf)
            if kind == "more":
                return False
            if kind == "value" and _only_calls(buf[start:end]) is not None:
                continue
            if kind == "other" and _FENCE.startswith(buf[start:]):
                return False  # may be the closing fence, still arriving
            # Content that is not call objects only: the fence is text, whole.
            self._state = "code"
            return True


class _JsonScan:
    """Finds where consecutive top-level JSON values begin and end, as text streams in.

    Only brackets, strings and escapes are tracked; nothing is validated (the parser does that
    on each complete value). Resumes where it stopped, so a long value costs linear time.
    """

    def __init__(self, pos: int) -> None:
        self.pos = pos
        self.depth = 0
        self.in_string = False
        self.escaped = False
        self.start = pos
        self.list_opened = False  # just after a top-level "[": a list of calls holds objects

    def step(self, buf: str) -> tuple[str, int, int]:
        """("value", start, end) when a value closes; ("other", at, at) at a character that
        starts no value; ("bad", at, at) inside a value that cannot be calls; ("more", ...)."""
        end = len(buf)
        while self.pos < end:
            i, c = self.pos, buf[self.pos]
            if self.in_string:
                if self.escaped:
                    self.escaped = False
                elif c == "\\":
                    self.escaped = True
                elif c == '"':
                    self.in_string = False
                else:
                    self.pos = max(_match_end(_JSON_STRING_RE, buf, i), i + 1)
                    continue
                self.pos += 1
                continue
            if c.isspace():
                self.pos = max(_match_end(_SPACE_RE, buf, i), i + 1)
                continue
            if self.depth == 0:
                if c not in "{[":
                    return "other", i, i
                self.start, self.depth, self.list_opened = i, 1, c == "["
                self.pos += 1
                continue
            if self.list_opened:
                self.list_opened = False
                if c != "{":
                    return "bad", i, i
            if c == '"':
                self.in_string = True
            elif c in "{[":
                self.depth += 1
            elif c in "}]":
                self.depth -= 1
                if self.depth == 0:
                    self.pos = i + 1
                    return "value", self.start, i + 1
            else:
                self.pos = max(_match_end(_JSON_PLAIN_RE, buf, i), i + 1)
                continue
            self.pos += 1
        return "more", end, end


def _match_end(regex: re.Pattern[str], buf: str, pos: int, endpos: int | None = None) -> int:
    """Where a match of `regex` at `pos` ends (`pos` when there is none)."""
    found = regex.match(buf, pos, len(buf) if endpos is None else endpos)
    return found.end() if found is not None else pos


def _opener_prefix_len(buf: str, floor: int) -> int:
    """Length of the longest tail of `buf` (from `floor` on) that is a proper prefix of an opener."""
    best = 0
    for opener in _OPENERS:
        for k in range(min(len(opener) - 1, len(buf) - floor), best, -1):
            if buf.endswith(opener[:k]):
                best = k
                break
    return best


def _fence_verdict(buf: str, start: int) -> tuple[str, int]:
    """A ``` at `start`, as `_Scanner._fence` will see it: text / code / json_fence / wait."""
    window = buf[start + len(_FENCE) : start + len(_FENCE) + _MAX_INFO + 1]
    decided = any(c in window for c in "\n{[`") or len(window) > _MAX_INFO
    if not decided:
        return "wait", start  # the info line is still streaming in
    info = _fence_info(buf, start)
    if info is None:  # plain backticks
        run_end = _after_backticks(buf, start)
        # A run still growing at the end has four or more backticks (three would have left a
        # decided window): text whatever comes, but where it ends is not known yet.
        return ("ticks", start) if run_end == len(buf) else ("text", run_end)
    lang, content_start = info
    return ("json_fence" if lang in _CALL_FENCE_LANGS else "code"), content_start


def _tag_verdict(buf: str, start: int, opener: str) -> tuple[str, int]:
    """`<tool_call>` / `<tool_code>` at `start`, as `_Scanner._tag` will see it."""
    body_start = start + len(opener)
    first = _NON_SPACE_RE.search(buf, body_start)
    if first is None:
        return "wait", start
    c, at = first.group(), first.start()
    if c in "{[":
        return "call", start
    if c != "`":
        return "text", body_start  # prose that mentions the tag
    # A fence around the JSON inside the tag (see _tag_body).
    head = buf[at : at + len(_FENCE)]
    if head != _FENCE:
        return ("wait", start) if _FENCE.startswith(head) else ("text", body_start)
    newline = buf.find("\n", at, at + _MAX_INFO + len(_FENCE) + 1)
    if newline < 0:
        return ("text", body_start) if len(buf) >= at + _MAX_INFO + len(_FENCE) + 1 else ("wait", start)
    if buf[at + len(_FENCE) : newline].strip().lower() not in _CALL_FENCE_LANGS:
        return "text", body_start
    inner = _NON_SPACE_RE.search(buf, newline + 1)
    if inner is None:
        return "wait", start
    return ("call", start) if inner.group() in "{[" else ("text", body_start)


def _function_verdict(buf: str, start: int) -> tuple[str, int]:
    """`<function=NAME>` at `start`, as `_Scanner._function` will see it."""
    name_start = start + len(_FUNC_OPEN)
    name_end = _match_end(_NAME_CHARS_RE, buf, name_start, name_start + _MAX_FUNC_NAME + 1)
    if name_end - name_start > _MAX_FUNC_NAME:
        return "text", name_start
    if name_end == len(buf):
        return "wait", start
    if buf[name_end] != ">" or name_end == name_start:
        return "text", name_start
    body_start = name_end + 1
    first = _NON_SPACE_RE.search(buf, body_start)
    if first is None:
        return "wait", start
    if first.group() == "{":
        return "call", start
    rest = buf[first.start() : first.start() + len(_FUNC_CLOSE)]
    if rest == _FUNC_CLOSE:
        return "call", start  # an empty call
    if _FUNC_CLOSE.startswith(rest):
        return "wait", start
    return "text", body_start


# ---- prompt -------------------------------------------------------------------------------------


def _example_call(tool: ToolSpec) -> str:
    """A call to `tool` with a placeholder for each required argument: a shape to copy, valid JSON."""
    params = tool.parameters if isinstance(tool.parameters, dict) else {}
    properties, required = params.get("properties"), params.get("required")
    arguments: dict[str, Any] = {}
    if isinstance(properties, dict) and isinstance(required, list):
        for key in required:
            if isinstance(key, str):
                schema = properties.get(key)
                arguments[key] = _example_value(schema if isinstance(schema, dict) else {})
    call = {"name": tool.name, "arguments": arguments}
    return f"<tool_call>{json.dumps(call, ensure_ascii=False)}</tool_call>"


def _example_value(schema: dict[str, Any]) -> Any:
    for key in ("examples", "enum"):
        choices = schema.get(key)
        if isinstance(choices, list) and choices:
            return choices[0]
    if "default" in schema:
        return schema["default"]
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "string")
    return {"integer": 1, "number": 1, "boolean": True, "array": [], "object": {}, "null": None}.get(
        kind if isinstance(kind, str) else "string", "..."
    )
