"""`aiops chat` through a running aiops (its run file, or `--url`): the message goes to its API, the
turn's events come back on the session's stream, so scripts and cron jobs work beside the console.

A gate of the turn is asked on this terminal (when there is one) and shows in every console's inbox
at the same time: the first answer wins; a later one is told who answered. Without a terminal the
gate waits for a console (or its timeout). Its session is of kind `cli`, as an in-process one is.

Issue 27 gives this path 0.3 s to the first token, so it imports no engine, no model SDK, no
pydantic (the configuration is not loaded: the data dir's run file and `.env` are all it reads) and
no aiohttp (aiops/cli/remote_http.py speaks the little HTTP it needs). The in-process path,
aiops/cli/chat.py, is for when no aiops runs.
Exit status as in-process: 0 done, 1 the turn or a `!command` reported an error, 2 usage errors
(an unknown session, the server unreachable or refusing the token); 128 + the signal when one ended
it (130 for Ctrl-C).

Leaving before the turn's `done` (a signal, a closed terminal, the stream cut or ended) stops the
turn on the server, which cancels its pending gates: a `cli` gate waits for good (`[wait] cli = 0`),
and one left behind would sit in every inbox for anyone to approve with nobody watching its turn.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
from typing import TYPE_CHECKING, Any

from aiops.cli.common import CliError

if TYPE_CHECKING:
    from aiops.cli.remote_http import Api, EventStream
    from aiops.paths import Paths


def remote_url(paths: Paths, args: argparse.Namespace) -> str | None:
    """Where `aiops chat` sends its message: `--url`, else the aiops running on the data dir."""
    from aiops.integrations.remote.find import client_url, running_url

    url = getattr(args, "url", None)
    if url:
        return client_url(url if "://" in url else f"http://{url}")
    found = running_url(paths.data_dir, paths.lock_path)
    return client_url(found) if found else None


def chat_remote(args: argparse.Namespace, url: str, paths: Paths | None = None) -> int:
    from aiops.cli.attach import resolve_token, token_hint

    token = resolve_token(getattr(args, "token_env", None), paths)
    return asyncio.run(_chat(args, url, token, token_hint(paths)))


async def submit_as_cli(api: Api, text: str, session: str, model: str | None) -> dict[str, Any]:
    """POST the message as the CLI's (`kind: "cli"`): its new session is a `cli` session, as an
    in-process `aiops chat` makes. An aiops from before `kind` refuses the unknown field (400,
    nothing taken in): the message goes again without it, as the API client's."""
    from aiops.cli.remote_http import ApiError

    body: dict[str, Any] = {"text": text, "client_id": session, "kind": "cli"}
    if model is not None:
        body["model"] = model
    try:
        return await api.call("POST", "/api/v1/submit", body, expect=("client_id", "status"))
    except ApiError as e:
        if e.status != 400 or "kind: unknown field" not in e.message:
            raise
    del body["kind"]
    return await api.call("POST", "/api/v1/submit", body, expect=("client_id", "status"))


COMMANDS_WAIT = 2.0  # seconds the stream has to bring a !command's own verdict (see below)
STOP_WAIT = 5.0  # seconds the stop of a turn left behind may take: leaving must not hang on a dead server
# What ends `aiops chat` from outside: Ctrl-C, `kill`/`timeout`/cron's SIGTERM, a closed terminal
# (no SIGHUP on Windows).
LEAVING_SIGNALS = tuple(getattr(signal, n) for n in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, n))


async def _a_command_failed(stream: EventStream, turn_id: object) -> bool:
    """Whether a `!command` of this turn reported an error (exit 1, as in-process), for an aiops
    whose reply says `complete` either way (before `command_failed`): each command's verdict (`ok`)
    is in its notice on the stream, read up to the turn's `done`. A stream that may not show them (a client token's commands to
    a session they created none of) ends the wait after COMMANDS_WAIT: the reply's status stands."""
    failed = False
    try:
        async with asyncio.timeout(COMMANDS_WAIT):
            async for item in stream:
                name, data = item["event"], item["data"]
                if data.get("turn_id") != turn_id:
                    continue
                if name == "notice" and data.get("command") and data.get("ok") is False:
                    failed = True
                elif name == "done":
                    break
    except TimeoutError:
        pass
    return failed


async def _stop_left_turn(url: str, token: str | None, session: str, turn_id: str | None,
                          ours: bool) -> None:
    """Stop the turn this run submitted and is leaving before its `done`, so that its gates are
    cancelled rather than left waiting in every inbox. By its id: the session's running turn may
    be another client's, ours queued behind it. Left while the submit was unanswered, its id is
    unknown: the session's turn is stopped only when the session is `ours` (made by this run)."""
    from aiops.cli.remote_http import Api, ApiError, segment

    # (Each line below starts with a newline: a gate's question, and the ^C typed at it, leave one open.)
    where = f"turn {turn_id} of session {session}" if turn_id else f"the turn of session {session}"
    path = f"/api/v1/sessions/{segment(session)}/stop"
    if turn_id is None and not ours:
        print(f"\n[left before {url} said which turn is ours: stop it with POST {path} (or !stop in a console) "
              f"if it runs; its gates wait in the consoles' inboxes]", file=sys.stderr)
        return
    try:
        reply = await Api(url, token, timeout=STOP_WAIT).call(
            "POST", path + (f"?turn_id={segment(turn_id)}" if turn_id else ""), expect=("stopped",))
    except ApiError as e:
        if e.status == 404:
            return  # the session was deleted, its turn and gates with it
        print(f"\n[could not stop {where} on {url}: {e.message}; if it still runs, its gates stay open "
              f"until it is stopped (POST {path}, or !stop in a console)]", file=sys.stderr)
        return
    if reply.get("stopped"):
        print(f"\n[stopped {where}: its pending gates are cancelled]", file=sys.stderr)


async def _chat(args: argparse.Namespace, url: str, token: str | None,
                hint_401: str = " (give a token: --token-env NAME, or AIOPS_TOKEN)") -> int:
    from aiops.cli.remote_http import Api, ApiError, segment
    from aiops.cli.terminal import TerminalAsker, shown

    out = sys.stdout
    say = sys.stderr if args.json else out
    status = 0
    asker = TerminalAsker() if sys.stdin.isatty() else None
    asking: dict[str, asyncio.Task[None]] = {}
    try:
        api = Api(url, token)
    except ValueError as e:
        raise CliError(f"--url: {e}") from None
    # A signal cancels this task, so that the `finally` below stops the turn before the process
    # goes (SIGTERM and SIGHUP would otherwise end it on the spot, and Ctrl-C's KeyboardInterrupt
    # would skip the stop). Only the first counts: a second Ctrl-C while the stop is sent (at most
    # STOP_WAIT) must not cut it short and leave the gates open after all.
    loop = asyncio.get_running_loop()
    main = asyncio.current_task()
    assert main is not None
    received: list[int] = []

    def leave(signum: int) -> None:
        if not received:
            received.append(signum)
            main.cancel()

    handled: list[int] = []
    for sig in LEAVING_SIGNALS:
        try:
            loop.add_signal_handler(sig, leave, sig)
        except NotImplementedError:  # Windows event loops catch no signals: Ctrl-C still cancels us
            continue
        handled.append(sig)
    session = ""
    submitted = False  # the message may have been taken in: a turn of ours may run
    turn_id: str | None = None
    ended = False  # our turn's `done` came: nothing to stop

    async def answer(gate_id: str, tool: str) -> None:
        assert asker is not None
        decision, scope = await asker.ask(tool)
        try:
            await api.call("POST", "/api/v1/gates/" + segment(gate_id),
                           {"decision": "approve" if decision == "approved" else "deny", "scope": scope},
                           expect=("gate",))
        except ApiError as e:
            say.write(f"[gate {gate_id}: {e.message}]\n")  # answered first in a console
        else:
            say.write(f"[{decision}{' for this session' if scope == 'session' else ''}]\n")
        say.flush()

    def show(name: str, data: dict[str, Any]) -> None:
        match name:
            case "tok":
                out.write(shown(str(data.get("text", ""))))
            case "tool_call":
                out.write(f"\n→ {shown(str(data.get('name')))}({json.dumps(data.get('arguments'))[:200]})\n")
            case "tool_result":
                first = (str(data.get("content", "")).strip().splitlines() or [""])[0][:200]
                mark = "✗" if data.get("is_error") else "←"
                out.write(f"{mark} {shown(str(data.get('name')))}: {shown(first)} "
                          f"({float(data.get('duration_ms') or 0):.0f} ms)\n")
            case "notice" if data.get("gate_id"):
                pass  # the waiting notice: asked (or said) below instead
            case "notice" if data.get("command"):
                out.write(f"{shown(str(data.get('text', '')))}\n")
            case "notice":
                out.write(f"\n[{shown(str(data.get('text', '')))}]\n")
            case "gate":
                out.write(f"\n[gate {data.get('id')}: {shown(str(data.get('summary', '')))}]\n")
            case "error":
                out.write(f"\nerror: {shown(str(data.get('message', '')))}\n")

    stream: EventStream | None = None
    try:
        session = args.session
        if session:
            try:
                found = await api.call("GET", f"/api/v1/sessions/{segment(session)}?limit=1", expect=("session",))
            except ApiError as e:
                if e.status == 404:
                    raise CliError(f"no session {args.session!r} on {url}") from None
                raise
            session = str(found["session"]["client_id"])
        else:
            session = f"chat-{os.urandom(4).hex()}"  # (not uuid: its import is a few ms more)
        stream = await api.stream(session)  # subscribed before the message goes: no event is missed
        submitted = True  # from here a turn of ours may run, even if no answer comes
        try:
            reply = await submit_as_cli(api, args.text, session, args.model)
        except ApiError as e:
            submitted = e.status == 0  # an error status: refused, nothing taken in (no answer: unknown)
            raise
        if reply.get("status") != "accepted":
            ended = True
            # Only !commands: answered at once (their output is the reply's text).
            failed = reply.get("status") == "error" or await _a_command_failed(stream, reply.get("turn_id"))
            if args.json:
                out.write(json.dumps({"event": "done", **reply}, default=str) + "\n")
            elif reply.get("text"):
                out.write(shown(str(reply["text"])) + "\n")
            return 1 if failed else 0
        turn_id = reply.get("turn_id")
        if not args.json:
            print(f"[session {session} · {url}]", file=sys.stderr)
        async for item in stream:
            name, data = item["event"], item["data"]
            if data.get("turn_id") not in (None, turn_id):
                continue
            if args.json:
                out.write(json.dumps({"event": name, **data}, default=str) + "\n")
            else:
                show(name, data)
            if name == "gate":
                gate_id = str(data.get("id"))
                if asker is not None:
                    named = data.get("rule_target") or data.get("tool")  # as gates.toml names it
                    asking[gate_id] = asyncio.create_task(answer(gate_id, str(named)))
                else:
                    say.write(f"[waiting for an operator to answer gate {gate_id} in a console of {url}]\n")
            elif name == "gate_resolved":
                task = asking.pop(str(data.get("id")), None)
                if task is not None and not task.done():  # answered in a console first
                    task.cancel()
                    say.write(f"\n[gate {data.get('id')}: {data.get('decision')} by {data.get('by')}]\n")
            elif name == "notice" and data.get("command") and data.get("ok") is False:
                status = 1
            elif name == "error":
                status = 1
            elif name == "done":
                ended = True
                if data.get("status") == "error":
                    status = 1
                if not args.json:  # (a JSON line ends with its own newline: no blank line after it)
                    out.write("\n")
                break
            out.flush()
    except ApiError as e:
        if e.code == "connection_error":
            raise CliError(f"cannot reach the aiops at {url}: {e.message}") from None
        hint = hint_401 if e.status == 401 else ""
        raise CliError(f"{url}: {e.message}{hint}") from None
    except asyncio.CancelledError:
        if not received:
            raise
        main.uncancel()  # our own cancellation, handled: the stop below must not be cut short
        status = 128 + received[0]  # as a shell reports a command a signal ended (130: Ctrl-C)
    finally:
        for task in asking.values():
            task.cancel()
        if stream is not None:
            stream.close()
        try:
            if submitted and not ended:
                # Not the turn's end (a signal, a broken pipe, the stream cut, ended or refused):
                # whatever made us leave, the turn must not go on without anyone at its gates.
                await _stop_left_turn(url, token, session, turn_id, ours=not args.session)
        finally:
            for sig in handled:
                loop.remove_signal_handler(sig)
        out.flush()
    return status
