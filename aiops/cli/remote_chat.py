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
(an unknown session, the server unreachable or refusing the token).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
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


def chat_remote(args: argparse.Namespace, url: str) -> int:
    from aiops.cli.attach import resolve_token

    return asyncio.run(_chat(args, url, resolve_token(getattr(args, "token_env", None))))


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


async def _chat(args: argparse.Namespace, url: str, token: str | None) -> int:
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
        reply = await submit_as_cli(api, args.text, session, args.model)
        if reply.get("status") != "accepted":
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
                    asking[gate_id] = asyncio.create_task(answer(gate_id, str(data.get("tool"))))
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
                if data.get("status") == "error":
                    status = 1
                if not args.json:  # (a JSON line ends with its own newline: no blank line after it)
                    out.write("\n")
                break
            out.flush()
    except ApiError as e:
        if e.code == "connection_error":
            raise CliError(f"cannot reach the aiops at {url}: {e.message}") from None
        hint = " (give a token: --token-env NAME, or AIOPS_TOKEN)" if e.status == 401 else ""
        raise CliError(f"{url}: {e.message}{hint}") from None
    finally:
        for task in asking.values():
            task.cancel()
        if stream is not None:
            stream.close()
        out.flush()
    return status
