"""Request bodies: read within the limits (size, time, shutdown), parsed as strict JSON, validated
with pydantic; every failure an `HttpError` naming what is wrong (400, 408, 413, 503)."""

from __future__ import annotations

import asyncio
import json
import re
import sys
from typing import Any, TypeVar

from aiohttp import web
from aiohttp.web_protocol import RequestPayloadError
from pydantic import BaseModel, ValidationError

from aiops.integrations.server.context import CONFIG_KEY, STATE_KEY, Closing, ServerState
from aiops.integrations.server.errors import HttpError, shutting_down

M = TypeVar("M", bound=BaseModel)


async def read_body(request: web.Request) -> bytes:
    """The raw body, bounded by max_body_bytes (413) and request_timeout (408); 503 when the
    server begins to shut down before it has all arrived."""
    timeout = request.app[CONFIG_KEY].app.server.request_timeout
    try:
        async with asyncio.timeout(timeout):
            if request.content.is_eof():  # all here already (nearly always): nothing to wait for
                return await request.read()
            return await _read_unless_closing(request, request.app[STATE_KEY])
    except TimeoutError:
        raise HttpError(408, "request_timeout",
                        f"the request body did not arrive within {timeout:g} s") from None
    except RequestPayloadError as e:
        # A Content-Encoding (gzip, deflate, br) whose data does not decode: the client's fault.
        cause = e.__cause__ or e
        raise HttpError(400, "invalid_body", f"the request body could not be decoded "
                        f"(Content-Encoding: {request.headers.get('Content-Encoding', 'none')}): "
                        f"{getattr(cause, 'message', None) or cause}") from None


async def _read_unless_closing(request: web.Request, state: ServerState) -> bytes:
    if not state.closing:
        state.bodies.add(request.content)
        try:
            return await request.read()
        except Closing:
            pass
        finally:
            state.bodies.discard(request.content)
    raise shutting_down(request)


# A `\uD800`-`\uDFFF` escape: json.loads turns a pair of them into one character, but leaves a
# lone one as a surrogate, which no UTF-8 encoder (SQLite's, hashlib's, a socket's) accepts.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def _lone_surrogate(value: Any) -> bool:
    # A stack, not recursion: JSON nested as deep as the parser allows must not overflow here.
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return True
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


class _NotJson(Exception):
    pass


def _not_json(word: str) -> Any:
    # Python's parser takes NaN, Infinity and -Infinity; JSON has no such numbers.
    raise _NotJson(word)


_DECODER = json.JSONDecoder(parse_constant=_not_json)


# A body this large is decoded on a worker thread: a chat UI resending a chat's screenshots sends
# tens of MB, ~50 ms of parsing that would otherwise hold every other stream up.
PARSE_IN_THREAD_BYTES = 1 << 20


async def read_json(request: web.Request) -> Any:
    """The body parsed as JSON; 400 `invalid_json` with the position when it is not."""
    raw = await read_body(request)
    if len(raw) >= PARSE_IN_THREAD_BYTES:
        return await asyncio.to_thread(_parse_json, raw)
    return _parse_json(raw)


def _parse_json(raw: bytes) -> Any:
    if not raw.strip():
        raise HttpError(400, "invalid_json", "the request body is empty; expected a JSON object")
    encoding = json.detect_encoding(raw)  # UTF-8, or UTF-16/32 by their BOM or NUL bytes, as json.loads
    try:
        # Strict, unlike json.loads' "surrogatepass": encoded surrogates (CESU-8, WTF-8) are not
        # Unicode, and no encoder after this one (SQLite's, hashlib's) would accept them.
        text = raw.decode(encoding)
        # One decoder made once: json.loads with an option builds one per call.
        data = _DECODER.decode(text)
    except _NotJson as e:
        raise HttpError(400, "invalid_json", f"malformed JSON body: {e} is not JSON (a number must be "
                                             f"finite)") from None
    except json.JSONDecodeError as e:
        # Some messages end in "at" themselves ("Unterminated string starting at").
        raise HttpError(400, "invalid_json", f"malformed JSON body: {e.msg.removesuffix(' at')} at line "
                                             f"{e.lineno} column {e.colno}") from None
    except UnicodeDecodeError:
        name = encoding.upper().removesuffix("-SIG")  # "UTF-8", "UTF-16-LE", …
        raise HttpError(400, "invalid_json", f"malformed JSON body: not valid {name}") from None
    except ValueError:
        # The only other ValueError of json.loads: an integer past Python's conversion limit.
        raise HttpError(400, "invalid_json", f"malformed JSON body: a number has more than "
                                             f"{sys.get_int_max_str_digits()} digits") from None
    except RecursionError:
        raise HttpError(400, "invalid_json", "malformed JSON body: arrays or objects nested too deeply") from None
    if _SURROGATE_ESCAPE.search(text) and _lone_surrogate(data):
        raise HttpError(400, "invalid_json", "malformed JSON body: a string holds an unpaired UTF-16 "
                                             "surrogate escape (\\uD800-\\uDFFF), which is not valid Unicode")
    return data


# How pydantic names the member of a union an error came from, inside the error's location
# ("content.str", "content.list[_Part].0.text"): the names of our types, never a client's field.
_UNION_MEMBER = re.compile(r"(str|int|float|bool|none|(list|dict|tuple|literal)\[.*\]|_?[A-Z]\w*)")
_KINDS = {"str": "a string", "int": "a number", "float": "a number", "bool": "a boolean", "list": "an array",
          "tuple": "an array", "dict": "an object", "none": "null"}


def _kind(member: str) -> str:
    head = member.split("[", 1)[0]
    return _KINDS.get(head, "an object")  # a model


def _member_at(e: Any) -> int | None:
    """Where in an error's location a union member's name is, if anywhere. The name an unknown
    field has is the client's (`{"Text": ...}`), never a member's, whatever it looks like."""
    loc = tuple(e["loc"])
    if e["type"] == "extra_forbidden":
        loc = loc[:-1]
    return next((i for i, p in enumerate(loc) if isinstance(p, str) and _UNION_MEMBER.fullmatch(p)), None)


def validation_message(err: ValidationError) -> tuple[str, str | None]:
    """One line naming every bad field, and the first field's name. A field that may be of several
    types (a union) is named without pydantic's names for its members: where the value is of none
    of them, it says which it may be; where it is one of them, only that one's errors are shown."""
    parts: list[str] = []
    first: str | None = None
    unions: dict[tuple[Any, ...], list[str]] = {}  # a union's location -> its members' kinds
    deeper: set[tuple[Any, ...]] = set()  # unions whose value had a member's shape (errors within)
    errors = err.errors()
    for e in errors:
        loc = tuple(e["loc"])
        at = _member_at(e)
        if at is not None:
            unions.setdefault(loc[:at], []).append(loc[at])  # type: ignore[arg-type]
            if len(loc) > at + 1:
                deeper.add(loc[:at])
    said: set[tuple[Any, ...]] = set()
    for e in errors:
        loc = tuple(e["loc"])
        at = _member_at(e)
        if at is not None:
            union = loc[:at]
            if union in deeper and len(loc) == at + 1:
                continue  # a member whose shape the value does not have: the other's errors say it
            if union not in deeper:
                if union in said:
                    continue
                said.add(union)
                kinds = list(dict.fromkeys(_kind(m) for m in unions[union]))
                where = ".".join(str(p) for p in union) or "body"
                first = first or where
                parts.append(f"{where}: expected {' or '.join(kinds)}, not {json_type(e['input'])}")
                continue
            own = loc[-1:] if e["type"] == "extra_forbidden" else ()  # the client's field name
            loc = (*(p for p in loc[:len(loc) - len(own)]
                     if not (isinstance(p, str) and _UNION_MEMBER.fullmatch(p))), *own)
        where = ".".join(str(p) for p in loc) or "body"
        first = first or where
        msg = "unknown field" if e["type"] == "extra_forbidden" else e["msg"]
        if e["type"] == "missing":
            msg = "required field is missing"
        elif e["type"] in ("model_type", "model_attributes_type", "dict_type"):
            msg = f"expected an object, not {json_type(e['input'])}"  # not "instance of _Part"
        parts.append(f"{where}: {msg}")
    return "invalid request: " + "; ".join(parts), first


def json_type(value: Any) -> str:
    """A parsed JSON value's type as JSON names it (a client never wrote `NoneType`)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    names: dict[type, str] = {str: "a string", list: "an array", dict: "an object"}
    return names.get(type(value), type(value).__name__)


def validate(model: type[M], data: Any, what: str = "request body") -> M:
    if not isinstance(data, dict):
        raise HttpError(400, "invalid_request", f"the {what} must be a JSON object, not {json_type(data)}")
    try:
        return model.model_validate(data)
    except ValidationError as e:
        message, param = validation_message(e)
        raise HttpError(400, "invalid_request", message, param=param) from None


async def parse_body(request: web.Request, model: type[M]) -> M:
    """The JSON body validated by `model`; 400 naming the field otherwise."""
    return validate(model, await read_json(request))
