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
JSON does not parse as written (in formats 3 and 4 only in a block that starts doubled). Inside
explicit tags (1, 2, 5) a body is recognised when it starts like JSON, also inside a ```json fence,
and then any problem is reported in `errors` so the model can correct itself; formats 3 and 4 have
no markup of their own, so they must be unambiguous call objects or they stay text.
Recognised markup is removed from `text` whether or not its name is registered; unregistered names
are listed in `unknown` so the caller can tell the model, and are never executed.

Known limit: a body ends at the first closing tag, so an argument string that itself contains
`</tool_call>` (or `</function>`) breaks that call (reported as malformed JSON). Searching past it
would need unbounded re-parsing of the text, which is what keeps hostile input linear.

`StreamGuard` decides, while a reply streams, which text can no longer become a call. It asks the
parser's own verdict functions (`_markup_verdict`, `_fence_verdict`, `_only_calls`) on the text so
far, so the two cannot disagree about what is a call.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any, NamedTuple

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
_OPENER_RE = re.compile("|".join(re.escape(o) for o in _OPENERS))
_OPENER_START_RE = re.compile("[" + re.escape("".join(sorted({o[0] for o in _OPENERS}))) + "]")
_LONGEST_OPENER = max(map(len, _OPENERS))
_BACKTICKS_RE = re.compile("`*")
_NON_SPACE_RE = re.compile(r"\S")
_BLANK_LINES_RE = re.compile(r"\n{3,}")
_DOUBLED_RE = re.compile(r"\[?\s*\{\{")  # a block written with doubled braces (see _only_calls)
_NAME_CHARS_RE = re.compile(r"[A-Za-z0-9_.:\-]*")  # a <function=NAME> name
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


class _Source:
    """The text being scanned, with searches that remember their last answer.

    The scanner and the guard look for the same needles again and again from positions that only
    move forward; without the memory, e.g. 100k openers and no closer would rescan to the end 100k
    times. The guard's text grows as the reply streams (`complete` is then False: more may come),
    and a search that found nothing resumes where it stopped.
    """

    def __init__(self, text: str, *, complete: bool) -> None:
        self.text = text
        self.complete = complete
        self._last: dict[str, tuple[int, int, int]] = {}  # needle -> (searched from, hit or -1, text length)
        self._spaces: dict[int, tuple[int, int]] = {}  # streaming: from -> (hit or -1, text length)

    def find(self, needle: str, start: int) -> int:
        """Where `needle` first occurs at or after `start`; -1 when it does not (yet)."""
        last = self._last.get(needle)
        if last is not None and last[0] <= start:
            searched_from, hit, length = last
            if start <= hit:
                return hit
            if hit < 0 and start <= length:
                # Nothing up to `length` then: only text that arrived since can hold a hit.
                hit = self.text.find(needle, max(start, length - len(needle) + 1))
                self._last[needle] = (searched_from, hit, len(self.text))
                return hit
        hit = self.text.find(needle, start)
        self._last[needle] = (start, hit, len(self.text))
        return hit

    def non_space(self, start: int, end: int) -> int:
        """The first non-whitespace character in [start, end); -1 when there is none (yet).

        A complete text is asked once per position; a streaming one again on every delta, from
        the few positions of the markup being decided, so those answers resume where they stopped.
        """
        if self.complete:
            hit = self._non_space_from(start)
        else:
            hit, length = self._spaces.get(start, (-1, start))
            if hit < 0:
                hit = self._non_space_from(length)
                if len(self._spaces) >= 8:  # the markup decided earlier is done with
                    self._spaces.clear()
                self._spaces[start] = (hit, len(self.text))
        return hit if 0 <= hit < end else -1

    def _non_space_from(self, pos: int) -> int:
        found = _NON_SPACE_RE.search(self.text, pos)
        return found.start() if found is not None else -1


# Verdicts on the markup at an opener. The parser and the streaming guard both decide through the
# functions below, so what the guard shows while a reply streams is what the parser keeps as text.
# On a complete text (the parser) the verdict is "call" or "text" (and for fences "code" or
# "json_fence"); on a text still streaming it may also be "wait": more text decides.
_CALL, _TEXT, _WAIT = "call", "text", "wait"


class _Markup(NamedTuple):
    """The verdict on a `<tool_call>`, `<tool_code>` or `<function=NAME>` at an opener."""

    verdict: str  # call | text | wait
    resume: int  # text: scanning goes on here, right after the opener (the opener alone is text)
    name: str = ""  # <function=NAME>: the name
    body_start: int = 0
    body_end: int = 0  # its closing tag, the next opener of its kind, or the end of the text
    closed: bool = False  # the body ends at its closing tag
    body: str = ""  # call, complete text only: stripped, without a code fence around the JSON
    lead: int | None = 0  # where `body` starts after body_start; None when a fence was taken off


def _markup_verdict(src: _Source, start: int, opener: str) -> _Markup:
    """Whether the tag opening at `start` is a call.

    A body is a call when it starts like JSON (`{`, or `[` for the two tags, whose JSON may be a
    list of calls), also inside a ```json fence (some models put one there); `<function=NAME>`
    with an empty body (fence or not) is a call without arguments. Anything else is prose that
    mentions the tag. While the text streams, each point where that rule would need characters
    that have not arrived answers "wait".
    """
    text, streaming = src.text, not src.complete
    function = opener == _FUNC_OPEN
    name = ""
    if function:
        name_start = start + len(_FUNC_OPEN)
        name_end = _match_end(_NAME_CHARS_RE, text, name_start, name_start + _MAX_FUNC_NAME + 1)
        if name_end == len(text) and streaming and name_end - name_start <= _MAX_FUNC_NAME:
            return _Markup(_WAIT, start)
        if name_end in (name_start, len(text)) or name_end - name_start > _MAX_FUNC_NAME or text[name_end] != ">":
            return _Markup(_TEXT, name_start)
        name, body_start, closer = text[name_start:name_end], name_end + 1, _FUNC_CLOSE
    else:
        body_start, closer = start + len(opener), f"</{opener[1:-1]}>"
    wait, prose = _Markup(_WAIT, start), _Markup(_TEXT, body_start)

    # The body ends at its closing tag, or else at the next opener of the same kind. Neither can
    # overlap the other ("<" starts both), so the first one found is the first one there will be.
    close, following = src.find(closer, body_start), src.find(opener, body_start)
    closed: bool | None
    if close >= 0 and (following < 0 or close < following):
        body_end, closed = close, True
    elif following >= 0:
        body_end, closed = following, False
    else:
        body_end, closed = len(text), (None if streaming else False)
    streaming = closed is None  # from here: whether the body may still grow

    def call(body: str, lead: int | None) -> _Markup:
        return _Markup(_CALL, start, name, body_start, body_end, bool(closed), body, lead)

    def may_become(word: str, at: int) -> bool:
        """Whether the body, from `at` to the end of the text so far, may still grow into `word`."""
        return streaming and len(text) - at < len(word) and word.startswith(text[at:])

    first = src.non_space(body_start, body_end)
    if first < 0:
        if streaming:
            return wait
        return call("", 0) if function and closed else prose
    c = text[first]
    if c == "{" or (c == "[" and not function):
        return call("" if streaming else text[first:body_end].rstrip(), first - body_start)
    if c != "`":
        # Prose, unless a function's body, so far, may be the start of its closing tag (an empty call).
        return wait if function and may_become(_FUNC_CLOSE, first) else prose

    # A ```json (or bare ```) fence around the JSON: the language line ends within _MAX_INFO.
    if not text.startswith(_FENCE, first, body_end):
        return wait if may_become(_FENCE, first) else prose
    limit = first + len(_FENCE) + _MAX_INFO + 1
    newline = text.find("\n", first + len(_FENCE), min(limit, body_end))
    if newline < 0:
        return wait if streaming and body_end < limit else prose
    if text[first + len(_FENCE) : newline].strip().lower() not in _CALL_FENCE_LANGS:
        return prose
    inner = src.non_space(newline + 1, body_end)
    if inner < 0:
        return wait if streaming else prose
    c = text[inner]
    if c == "{" or (c == "[" and not function):
        return call("" if streaming else text[inner:body_end].rstrip().removesuffix(_FENCE).strip(), None)
    if not (function and c == "`"):
        return prose
    # `<function=NAME>` holding just "```json\n```" is an empty call, like an empty body.
    if not streaming:
        return call("", None) if closed and text[inner:body_end].rstrip() == _FENCE else prose
    if not text.startswith(_FENCE, inner):
        return wait if may_become(_FENCE, inner) else prose
    after = src.non_space(inner + len(_FENCE), body_end)
    return wait if after < 0 or may_become(_FUNC_CLOSE, after) else prose


def _fence_verdict(src: _Source, start: int) -> tuple[str, int]:
    """The ``` at `start`: ("text", end of the backticks) for inline backticks, else where the
    content starts and whether it may hold calls ("json_fence", by its language) or not ("code").
    While streaming also ("wait", start) while the language line is undecided, and ("ticks",
    start) for a run of four or more backticks still growing at the end."""
    text = src.text
    if not src.complete:
        window = text[start + len(_FENCE) : start + len(_FENCE) + _MAX_INFO + 1]
        if not (any(c in window for c in "\n{[`") or len(window) > _MAX_INFO):
            return _WAIT, start  # the info line is still streaming in
    info = _fence_info(text, start)
    if info is None:  # plain backticks
        run_end = _after_backticks(text, start)
        # A run still growing at the end has four or more backticks (three would have left an
        # undecided window): text whatever comes, but where it ends is not known yet.
        return ("ticks", start) if run_end == len(text) and not src.complete else (_TEXT, run_end)
    lang, content_start = info
    return ("json_fence" if lang in _CALL_FENCE_LANGS else "code"), content_start


class _Scanner:
    """One forward pass over the text: copies text, hands markup to the collector."""

    def __init__(self, text: str, out: _Collector) -> None:
        self._text = text
        self._src = _Source(text, complete=True)
        self._out = out
        self._kept: list[str] = []
        self._removed = False

    def run(self) -> str:
        text, pos = self._text, 0
        while (found := _OPENER_RE.search(text, pos)) is not None:
            start, opener = found.start(), found.group()
            self._kept.append(text[pos:start])
            if opener == _FENCE:
                pos = self._fence(start)
                continue
            markup = _markup_verdict(self._src, start, opener)
            if markup.verdict != _CALL:
                pos = self._keep(start, markup.resume)
                continue
            self._removed = True
            pos = self._function(markup) if opener == _FUNC_OPEN else self._tag(markup, opener)
        self._kept.append(text[pos:])
        kept = "".join(self._kept)
        if self._removed:
            kept = _BLANK_LINES_RE.sub("\n\n", kept)
        return kept.strip()

    def _keep(self, start: int, end: int) -> int:
        self._kept.append(self._text[start:end])
        return end

    def _tag(self, m: _Markup, opener: str) -> int:
        """A `<tool_call>` / `<tool_code>` call; returns where scanning continues."""
        tag = opener[1:-1]
        values, used, problem = _decode(m.body)
        for value in values:
            self._out.add(value, f"<{tag}>")
        if problem is not None:
            self._out.error(f"<{tag}>: {problem}")
        if m.closed:
            return m.body_end + len(f"</{tag}>")
        if problem is not None or used is None or m.lead is None:
            return m.body_end  # a call cut off (e.g. at max tokens): nothing after it is worth showing
        return m.body_start + m.lead + used

    def _function(self, m: _Markup) -> int:
        """A Llama-style `<function=NAME>{...}</function>` call; returns where scanning continues."""
        end = m.body_end + len(_FUNC_CLOSE) if m.closed else m.body_end
        if not m.body:  # checked by the verdict: closed and empty, an empty call
            self._out.add_call(m.name, {})
            return end
        values, used, problem = _decode(m.body)
        if problem is not None or len(values) != 1:
            self._out.error(f"<function={_clip(m.name)}>: {problem or 'expected one JSON object of arguments'}")
            return end
        self._out.add_call(m.name, values[0])
        if m.closed or used is None or m.lead is None:
            return end
        return m.body_start + m.lead + used

    def _fence(self, start: int) -> int:
        """A ``` fence; returns where scanning continues (after the fence, kept or removed)."""
        verdict, at = _fence_verdict(self._src, start)
        if verdict == _TEXT:
            # Inline backticks or an over-long info string: not a code block, just characters.
            return self._keep(start, at)
        close = self._src.find(_FENCE, at)
        if close < 0:
            close = len(self._text)
        end = min(close + len(_FENCE), len(self._text))
        if verdict == "json_fence":
            values = _only_calls(self._text[at:close])
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


def _only_calls(block: str, *, undouble: bool = True) -> list[Any] | None:
    """The values of `block` when it holds unambiguous call objects and nothing else; else None.

    Doubled braces are undone only in a block that starts doubled (`{{` or `[{{`), and then the
    block undoubled must still be nothing but calls: `{{...}} and then prose` is text.
    """
    body = block.strip()
    if not body.startswith(("{", "[")):
        return None
    values, used, problem = _decode_as_written(body)
    if problem is not None and undouble and _DOUBLED_RE.match(body):
        body = _undouble(body)
        values, used, problem = _decode_as_written(body)
    if problem is not None or not values or used != len(body):
        return None
    # Each value a call object or a list of them; an empty list is no call, so not only calls.
    if not all(_is_call_object(item) for value in values
               for item in (value if isinstance(value, list) and value else [value])):
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
        values2, _, problem2 = _decode_as_written(_undouble(body))
        if problem2 is None:
            return values2, None, None
    return values, used, problem


def _undouble(body: str) -> str:
    return body.replace("{{", "{").replace("}}", "}")


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

    Runs the verdicts of `parse_text_tool_calls` on a growing text, so the user sees a reply as it
    streams while call markup never reaches them: `feed` returns the text that became safe to show, `finish` what
    remains once the whole reply is parsed. Text is held only while it may still become a call, and
    released as soon as it cannot: a ```sql fence, a ``` fence whose content is not JSON, JSON that
    turns out not to be a call object, a tag mentioned in prose. It errs on holding: what it
    releases is always text the parser keeps. Once real call markup is seen, the rest of the reply
    waits for the parse (calls end a reply; nothing is lost by waiting). Linear in the reply.
    """

    def __init__(self) -> None:
        self._src = _Source("", complete=False)  # the reply so far, searched as the parser does
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
        # where `self._src.text += text` would copy the whole reply on every delta.
        buf, self._src.text = self._src.text, ""
        buf += text
        self._src.text = buf
        del buf
        self._advance()
        if self._safe <= self._shown:
            return ""
        out = self._src.text[self._shown : self._safe]
        self._shown = self._safe
        return out

    def finish(self, visible: str) -> str:
        """What is left to show of `visible` (the reply's final text) after what `feed` released."""
        shown = self._src.text[self._lead : self._shown]
        target = visible.lstrip()
        # The parser strips the text and, when it removed markup, closes up the blank lines left.
        for candidate in (shown, _BLANK_LINES_RE.sub("\n\n", shown)):
            if target.startswith(candidate):
                return target[len(candidate) :]
        return "" if shown else target

    def _advance(self) -> None:
        buf = self._src.text
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
        while not self._json.doubled:
            kind, start, end = self._json.step(buf)
            if kind == "more" or self._json.starts_doubled(buf):
                return False
            if kind != "value" or _only_calls(buf[start:end], undouble=False) is None:
                return True
        return False  # only the whole reply decides

    def _text(self, buf: str) -> bool:
        """Scan prose for openers; False when more text is needed or a call began."""
        found = _OPENER_RE.search(buf, self._pos)
        if found is None:
            # Hold back only a tail that may be the start of an opener split across deltas.
            self._safe = self._pos = max(self._pos, len(buf) - _opener_prefix_len(buf, self._pos))
            return False
        start, opener = found.start(), found.group()
        self._safe = self._pos = start
        # The parser's own verdicts, on the text so far: what they call text stays text.
        if opener == _FENCE:
            verdict, at = _fence_verdict(self._src, start)
        else:
            markup = _markup_verdict(self._src, start, opener)
            verdict, at = markup.verdict, markup.resume
        if verdict == _WAIT:
            return False
        if verdict == _CALL:
            self._state = "held"
            return False
        if verdict == _TEXT:
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
        while not self._json.doubled:
            kind, start, end = self._json.step(buf)
            if kind == "more" or self._json.starts_doubled(buf):
                return False
            if kind == "value" and _only_calls(buf[start:end], undouble=False) is not None:
                continue
            if kind == "other" and _FENCE.startswith(buf[start:]):
                return False  # may be the closing fence, still arriving
            # Content that is not call objects only: the fence is text, whole.
            self._state = "code"
            return True
        return False  # only the whole content, at the closing fence, decides


class _JsonScan:
    """Finds where consecutive top-level JSON values begin and end, as text streams in.

    Only brackets, strings and escapes are tracked; nothing is validated (the parser does that
    on each complete value). Resumes where it stopped, so a long value costs linear time.

    Values as written are only where the parser's values are when it takes the block as written;
    a block that starts with doubled braces may be undoubled whole (see `_only_calls`), and then
    only the whole block decides.
    """

    def __init__(self, pos: int) -> None:
        self.first = -1  # where the first value starts
        self.doubled = False  # the block starts with doubled braces
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
                if self.first < 0:
                    self.first = i
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

    def starts_doubled(self, buf: str) -> bool:
        """Whether the block starts with doubled braces; asked once `step` has decided something,
        when the block's first characters are all there."""
        if self.first >= 0 and _DOUBLED_RE.match(buf, self.first):
            self.doubled = True
        return self.doubled


def _match_end(regex: re.Pattern[str], buf: str, pos: int, endpos: int | None = None) -> int:
    """Where a match of `regex` at `pos` ends (`pos` when there is none)."""
    found = regex.match(buf, pos, len(buf) if endpos is None else endpos)
    return found.end() if found is not None else pos


def _opener_prefix_len(buf: str, floor: int) -> int:
    """Length of the longest tail of `buf` (from `floor` on) that is a proper prefix of an opener.

    Called on every streamed delta: only a tail that starts with an opener's first character can
    be one, and most deltas end with none in reach (one regex scan of the last few characters)."""
    end = len(buf)
    for at in _OPENER_START_RE.finditer(buf, max(floor, end - _LONGEST_OPENER + 1)):
        tail = buf[at.start():]
        if any(len(tail) < len(opener) and opener.startswith(tail) for opener in _OPENERS):
            return end - at.start()
    return 0


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
