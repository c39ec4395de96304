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

__all__ = ["TextCallParse", "describe_tools_for_prompt", "looks_like_tool_call", "parse_text_tool_calls"]

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
