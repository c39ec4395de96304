"""The one turn driver both dialects call: a chat request after its dialect has parsed it.

    dialect parses  →  `answer_task` (a background prompt: one plain model call), or
                       `answer_turn` (the turn started in its session, then streamed or completed)
                    →  the dialect's `Framer` writes each frame and body

A stream's frames go out through a `Channel` (few writes, keep-alives, a hang-up noticed); a
client that hangs up, streaming or not, cancels its turn and its gates (`_hang_up`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

from aiohttp import web

from aiops.engine import events as ev
from aiops.engine.backends import ModelError
from aiops.engine.types import Message, ToolSpec
from aiops.integrations.server.addresses import configured_hosts, shown_to
from aiops.integrations.server.context import get_engine, prepare_stream, server_state
from aiops.integrations.server.errors import HttpError
from aiops.integrations.server.owners import caller
from aiops.integrations.server.proxy.channel import BufferedStreamResponse, Channel
from aiops.integrations.server.proxy.identity import SESSION_HEADER, ConversationId
from aiops.integrations.server.proxy.messages import ClientMessage
from aiops.integrations.server.proxy.models import PublishedModel
from aiops.integrations.server.proxy.output import TurnEnd, output_events, turn_output, wait_done
from aiops.integrations.server.proxy.sessions import StartedTurn, cancel_turn
from aiops.integrations.server.proxy.state import ProxySettings, proxy_state
from aiops.integrations.server.proxy.status import REFUSED, STOPPED, status_line
from aiops.integrations.server.proxy.tool_results import is_continuation

STREAM_CLOSED = "the stream ended before the answer: the server is shutting down"


class Framer(Protocol):
    """A dialect's writer of one answer: OpenAI's SSE chunks and completion object, Ollama's NDJSON
    lines. Every method returns bytes to write (or a body to send); the driver decides when."""

    # The status of a non-streamed answer whose model or turn failed (OpenAI: 502, Ollama: 500).
    failed_status: int
    # The answer reports when its text began (Ollama's durations): a non-streamed turn then
    # follows its `tok` events too, and calls `text_began` at the first.
    times_text: bool
    # Headers of a streamed answer (its content type, mostly).
    stream_headers: dict[str, str]
    # The client takes the model's reasoning (OpenAI: always, as `reasoning_content`; Ollama: when
    # the request asks with `think`). It gets it unless the operator withholds it (`proxy_reasoning`).
    wants_reasoning: bool

    def begin(self, turn_id: str | None) -> None:
        """The answer's id is known: its turn's, or None for a background task."""

    def head(self) -> bytes:
        """What opens a stream (OpenAI's role chunk); b"" for none."""

    def text(self, text: str) -> bytes:
        """Answer text, streamed."""

    def reasoning(self, text: str) -> bytes:
        """The model's reasoning, streamed (only when `wants_reasoning`)."""

    def end(self, end: TurnEnd) -> bytes:
        """What closes a stream whose turn ended without an error (finish reason, usage, `[DONE]`)."""

    def error(self, code: str, message: str) -> bytes:
        """What closes a stream whose turn failed."""

    def keepalive(self) -> bytes:
        """A frame for an idle stream, made when it is sent."""

    def text_began(self) -> None:
        """A non-streamed turn's first text arrived (with `times_text`)."""

    def whole(self, end: TurnEnd) -> bytes:
        """A streamed answer that came whole at once (a background task): every frame of it."""

    def answer(self, text: str, end: TurnEnd) -> dict[str, object]:
        """The body of a non-streamed answer (with `end.reasoning`, when there is any)."""


# ---- what chat users are told ------------------------------------------------------------------------


def turn_error(request: web.Request, error: ev.ErrorInfo | None, default_code: str) -> tuple[str, str]:
    """The code and message a chat client gets for a turn that ended in error."""
    if error is None:
        return default_code, "the turn failed"
    return error.code, shown_to(caller(request), error.message, configured_hosts(get_engine(request)))


def answer_text(request: web.Request, end: TurnEnd, session_id: str, settings: ProxySettings) -> str:
    """The text of a non-streaming answer. A turn stopped midway (by the operator, a `!stop`, a
    deleted session) or ended by the engine at a limit says so at its end, as a stream does,
    instead of passing its partial (often empty) text off as the whole answer. A shutdown that
    cut it is a 503 with no text: the client should not take a half answer for a reply. The
    partial answer stays recorded either way."""
    if end.status == "cancelled" and server_state(request).closing:
        raise HttpError(503, "shutting_down", "the server shut down before the answer was done; the "
                        "partial answer is kept in the session", headers={SESSION_HEADER: session_id,
                                                                          "x-should-retry": "false"})
    text = end.text
    if not settings.status_lines:
        return text
    why = STOPPED if end.status == "cancelled" else end.ended
    if why:
        line = status_line(REFUSED, why)
        text = f"{text.rstrip()}\n\n{line}" if text.strip() else line
    return text


# ---- background tasks: one plain model call ------------------------------------------------------------


async def answer_task(request: web.Request, model: PublishedModel, messages: Sequence[ClientMessage],
                      framer: Framer, *, stream: bool) -> web.StreamResponse:
    """Open WebUI's background prompts (see openwebui.is_background_task): a plain model call, no
    tools, no gates, no session, nothing recorded; a failure is the dialect's `failed_status`."""
    engine = get_engine(request)
    system = "\n\n".join(m.text for m in messages if m.role == "system" and m.text) or None
    convo = [Message("user" if m.role == "user" else "assistant", m.text)
             for m in messages if m.role in ("user", "assistant")]
    try:
        completion = await engine.complete_plain(model.key, convo, system=system)
    except ModelError as e:
        raise HttpError(framer.failed_status, "model_error",
                        shown_to(caller(request), str(e), configured_hosts(engine))) from None
    end = TurnEnd("complete", completion.text, completion.usage.counts() if completion.usage is not None else None,
                  None, "length" if completion.finish_reason == "length" else "stop")
    framer.begin(None)
    if not stream:
        return web.json_response(framer.answer(end.text, end))
    resp = BufferedStreamResponse(headers=framer.stream_headers)
    await prepare_stream(request, resp)
    await resp.write_eof(framer.whole(end))
    return resp


# ---- "continue this answer" ------------------------------------------------------------------------------

CANNOT_CONTINUE = "aiops does not continue an answer it has ended: send a message to go on (\"continue\", say)"


def asks_to_continue(messages: Sequence[ClientMessage]) -> bool:
    """A history that ends with the assistant's answer to a user's message, no new message: a
    chat UI's "Continue Response" (Open WebUI shows the button under every answer)."""
    return (bool(messages) and messages[-1].role == "assistant" and not messages[-1].tool_calls
            and any(m.role == "user" for m in messages[:-1]))


async def _answer_note(request: web.Request, framer: Framer, note: str, *, stream: bool) -> web.StreamResponse:
    """An answer that is only a status line, and no turn: the session is left as it was. The chat
    UI appends it to the answer it asked to continue, so it starts on a line of its own (as a
    status line it is then left out when that answer comes back as history: no fork)."""
    text = "\n\n" + status_line(REFUSED, note)
    end = TurnEnd("complete", text, None, None, "stop")
    framer.begin(None)
    if not stream:
        return web.json_response(framer.answer(text, end))
    resp = BufferedStreamResponse(headers=framer.stream_headers)
    await prepare_stream(request, resp)
    await resp.write_eof(framer.whole(end))
    return resp


# ---- agent turns ----------------------------------------------------------------------------------------


async def answer_turn(request: web.Request, conv: ConversationId, messages: Sequence[ClientMessage],
                      model: PublishedModel, framer: Framer, *, stream: bool,
                      client_tools: Sequence[ToolSpec] = ()) -> web.StreamResponse:
    """Start the turn in the conversation's session (see sessions), offering the model the
    client's tools, then stream it or wait for it. A request that ends with the results of client
    tool calls continues the turn that made them instead (see client_tools)."""
    proxy = proxy_state(request)
    if asks_to_continue(messages) and proxy.settings.status_lines:
        return await _answer_note(request, framer, CANNOT_CONTINUE, stream=stream)
    reasoning = proxy.settings.reasoning and framer.wants_reasoning
    events = output_events(stream=stream, times_text=framer.times_text, reasoning=reasoning)
    if is_continuation(messages):
        if proxy.settings.client_tools != "offer":
            raise HttpError(400, "tools_not_supported",
                            f"the request ends with tool results, but this server does not offer client tools "
                            f"(client_tools = {proxy.settings.client_tools!r} in [server] of aiops.toml)",
                            param="messages")
        started = await proxy.sessions.resume(conv, messages, caller(request), events=events,
                                              client_tools=client_tools)
    else:
        started = await proxy.sessions.start(conv, messages, model, caller(request), events=events,
                                             client_tools=client_tools)
    framer.begin(started.turn.id)
    if stream:
        return await _stream(request, started, framer, proxy.settings, reasoning=reasoning)
    return await _complete(request, started, framer, proxy.settings)


def _hang_up(request: web.Request, started: StartedTurn) -> Callable[[], Awaitable[None]]:
    """What a client hanging up does: its stream ends, its turn (and the turn's gates) is cancelled."""
    async def gone() -> None:
        if started.sub is not None:
            started.sub.close()
        await cancel_turn(get_engine(request), started.session_id, started.turn, "the client disconnected")

    return gone


async def _stream(request: web.Request, started: StartedTurn, framer: Framer,
                  settings: ProxySettings, *, reasoning: bool = False) -> web.StreamResponse:
    resp = BufferedStreamResponse(headers={**framer.stream_headers, SESSION_HEADER: started.session_id})
    channel = Channel(request, resp, _hang_up(request, started), keepalive=framer.keepalive,
                      keepalive_seconds=settings.keepalive_seconds, head=framer.head())
    end: TurnEnd | None = None
    assert started.sub is not None
    with server_state(request).track(started.sub):
        try:
            await prepare_stream(request, resp)
            channel.start()
            async for thought, text, end in turn_output(started, settings, reasoning=reasoning):
                frames = framer.text(text) if text else b""
                if thought:
                    frames = framer.reasoning(thought) + frames
                if end is None:
                    if frames:
                        await channel.write(frames)
                    continue
                if end.status == "error":
                    frames += framer.error(*turn_error(request, end.error, "error"))
                else:
                    frames += framer.end(end)
                await channel.finish(frames)
            if channel.gone:
                return resp
            if end is None:
                await channel.finish(framer.error("stream_closed", STREAM_CLOSED))
        except ConnectionError:
            await channel.disconnected()  # a write to a client that hung up
        except BaseException:
            await channel.disconnected()  # the handler was cancelled (the client hung up) or failed
            raise
        finally:
            await channel.close()
    return resp


async def _complete(request: web.Request, started: StartedTurn, framer: Framer,
                    settings: ProxySettings) -> web.Response:
    channel = Channel(request, None, _hang_up(request, started)).start()
    try:
        end = await wait_done(started, framer.text_began if framer.times_text else None)
    except BaseException:
        await channel.disconnected()
        raise
    finally:
        if started.sub is not None:
            started.sub.close()
        await channel.close()
    if end.status == "error":
        code, message = turn_error(request, end.error, "model_error")
        raise HttpError(framer.failed_status, code, message, headers={SESSION_HEADER: started.session_id})
    resp = web.json_response(framer.answer(answer_text(request, end, started.session_id, settings), end))
    resp.headers[SESSION_HEADER] = started.session_id
    return resp
