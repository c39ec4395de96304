"""`!commands` and `@model` one-turn switches.

A message may mix command lines and plain lines: each `!` line runs in order, and the remaining
plain lines go to the model as one message. Commands never reach the model. Plugins add commands
through the same registry, and the API and console call them programmatically.

A `raw` command (such as `!db SQL`) takes its argument verbatim, never shell-split (SQL is full of
apostrophes), and takes every following line of the message as part of it (SQL spans lines).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Awaitable, Callable, Container
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from pathlib import Path

    from aiops.config import Config
    from aiops.engine.gatekeeper import Gatekeeper
    from aiops.engine.plugins import PluginStatus
    from aiops.engine.sessions import LiveSession
    from aiops.engine.store import Store
    from aiops.engine.tools import ToolRegistry
    from aiops.engine.types import Message, SessionKey
    from aiops.gates.limits import LimitsConfig


class CommandError(Exception):
    """A command failed in a way the user can fix; the message says how."""


class CommandHost(Protocol):
    """What a `!command` (the engine's own, a plugin's) and the prompt tools reach of the engine:
    the sessions, models, prompts, tools and gates an operator administers from a chat line."""

    @property
    def config(self) -> Config: ...

    @property
    def commands(self) -> CommandRegistry: ...

    @property
    def tools(self) -> ToolRegistry: ...

    @property
    def limits(self) -> LimitsConfig: ...

    @property
    def store(self) -> Store: ...

    @property
    def gatekeeper(self) -> Gatekeeper: ...

    @property
    def prompts(self) -> Any: ...  # aiops.prompts.tree.PromptStore

    def prompt_folder(self, model_key: str | None = None) -> Path | None: ...

    def check_model(self, key: str) -> str | None: ...

    def notice(self, session_id: str | None, text: str, turn_id: str | None = None) -> None: ...

    async def session(self, ref: str, *, kind: str = "api", create: bool = False,
                      model: str | None = None, meta: dict[str, Any] | None = None,
                      wait_for_delete: bool = True) -> LiveSession | None: ...

    async def list_sessions(self, kind: str | None = None, limit: int = 1000, offset: int = 0, *,
                            owner: str | None = None, before: SessionKey | None = None) -> list[dict[str, Any]]: ...

    async def delete_session(self, ref: str) -> bool: ...

    async def reset_session(self, ref: str) -> None: ...

    async def set_session_model(self, ref: str, model: str) -> None: ...

    def stop_turn(self, ref: str, *, clear_queue: bool = False, by: str = "stop") -> bool: ...

    @property
    def plugin_status(self) -> list[PluginStatus]: ...

    async def history(self, ref: str, *, limit: int | None = None,
                      before_id: int | None = None) -> list[Message]: ...

    async def submit(self, client_id: str | None, text: str, *, kind: str = "api",
                     model: str | None = None, is_operator: bool = False, depth: int = 0,
                     tools: bool = True, meta: dict[str, Any] | None = None,
                     owner_only: bool = False, hops: tuple[str, ...] = ()) -> Any: ...


@dataclass(slots=True)
class CommandContext:
    engine: CommandHost
    session_id: str
    client_kind: str
    is_operator: bool
    turn_id: str | None = None
    # Set by CommandRegistry.run when the command reported an error (unknown, not permitted, bad
    # arguments, CommandError), so callers such as `aiops chat` can exit non-zero.
    failed: bool = False
    # A client token's principal (Engine.submit's `owner_only`): its commands act only on a
    # session it owns. None for callers that may use every session.
    owner: str | None = None

    def foreign(self, live: LiveSession) -> bool:
        """`live` has this message's session id but is not the sender's: a client's message named
        a session that did not exist, and another caller started one of that name meanwhile. A
        command acting on it would read, switch, reset or delete someone else's conversation."""
        return self.owner is not None and live.row.owner != self.owner

    async def session(self) -> LiveSession | None:
        """This message's session ("this session" to a command); None while it does not exist."""
        live = await self.engine.session(self.session_id)
        if live is not None and self.foreign(live):
            raise CommandError(not_the_senders(self.session_id))
        return live

    async def audit_session_id(self) -> str | None:
        """The session an audit record of this command names: this message's, or None while it
        does not exist (a message of only commands creates none, and a record must not name an
        id that never comes to be: `aiops audit --session` could never find it)."""
        return self.session_id if await self.engine.session(self.session_id) is not None else None


def not_the_senders(session_id: str) -> str:
    return (f"session {session_id!r} belongs to another caller (started while this message was "
            f"being taken in): nothing in this message acts on it")


Handler = Callable[[CommandContext, list[str], str], Awaitable[str]]


@dataclass(slots=True)
class Command:
    name: str
    usage: str
    help: str
    handler: Handler  # (ctx, argv, raw argument text) -> output text
    operator_only: bool = False
    plugin: str = "core"
    # The argument is raw text: not shell-split (argv is then the whitespace-split words) and it
    # runs to the end of the message, following lines included.
    raw: bool = False


# Session kinds whose users type chat, not commands (see CommandRegistry.parse).
KNOWN_COMMANDS_ONLY = frozenset({"proxy"})
# Session kinds whose messages are all text: another aiops's model wrote them (a swarm call), and
# neither a `!` line nor an `@model` it wrote may act on this instance.
TEXT_ONLY = frozenset({"swarm"})

# A command's name: `!!! ALERT`, `![image](url)` and `!= 0` are text, whoever sends them.
_COMMAND_NAME = re.compile(r"[a-z][\w.-]*")


def command_name(line: str) -> str:
    """The name a `!command` line calls, lower-cased, as `parse_input` and the registry read it
    (`! reset` and `!RESET` call `reset`); "" when there is none."""
    rest = line.lstrip()[1:]
    return rest.split(maxsplit=1)[0].lower() if rest.strip() else ""


NOT_PERMITTED = "not permitted: {name} is an operator command (console or operator token only)"


class CommandRegistry:
    def __init__(self) -> None:
        self._commands: dict[str, Command] = {}

    def register(self, cmd: Command) -> None:
        if not _COMMAND_NAME.fullmatch(cmd.name):
            # parse_input would read `!<name>` as text: a command no one could ever run.
            raise ValueError(f"command name {cmd.name!r} is not a name: a lower-case letter, then "
                             f"letters, digits, '_', '.' or '-'")
        if cmd.name in self._commands:
            raise ValueError(f"command !{cmd.name} is already registered (by {self._commands[cmd.name].plugin})")
        self._commands[cmd.name] = cmd

    def get(self, name: str) -> Command | None:
        return self._commands.get(name)

    def all(self) -> list[Command]:
        return [self._commands[n] for n in sorted(self._commands)]

    def names(self) -> list[str]:
        return sorted(self._commands)

    def raw_names(self) -> frozenset[str]:
        """Commands whose argument runs to the end of the message (for `parse_input`)."""
        return frozenset(n for n, c in self._commands.items() if c.raw)

    def parse(self, text: str, kind: str) -> ParsedInput:
        """`text` as a message from a client of `kind` (a session kind) is read: `parse_input`
        with this registry's commands. A chat UI's user did not learn our commands, pastes logs
        and notes full of `!important`, and attaches documents the chat UI puts in the message:
        there, only a line naming a real command, before any text, is one. A swarm peer's message
        is text only."""
        if kind in TEXT_ONLY:
            return ParsedInput([], text.strip(), None)
        known = self._commands.keys() if kind in KNOWN_COMMANDS_ONLY else None
        return parse_input(text, self.raw_names(), known)

    def help_text(self, is_operator: bool = True) -> str:
        lines = ["Commands:"]
        for c in self.all():
            mark = " (operator)" if c.operator_only else ""
            lines.append(f"  {c.usage:<34} {c.help}{mark}")
        lines.append("  @<model> <prompt>                  one turn on another model, then back")
        return "\n".join(lines)

    async def run(self, ctx: CommandContext, line: str) -> str:
        """Run one `!command` line and return its output (errors are output too)."""
        body = line.strip()[1:].strip()
        if not body:
            return self.help_text(ctx.is_operator)
        # The name ends at any whitespace: a raw command's argument may start on the next line.
        name, rest = (re.split(r"\s+", body, maxsplit=1) + [""])[:2]
        name = name.lower()
        cmd = self._commands.get(name)
        if cmd is None:
            ctx.failed = True
            return f"unknown command !{name}\n\n" + self.help_text(ctx.is_operator)
        if cmd.operator_only and not ctx.is_operator:
            ctx.failed = True
            return NOT_PERMITTED.format(name=f"!{name}")
        if cmd.raw:
            argv = rest.split()
        else:
            try:
                argv = shlex.split(rest)
            except ValueError as e:
                ctx.failed = True
                return f"!{name}: {e}\nusage: {cmd.usage}"
        try:
            return await cmd.handler(ctx, argv, rest.strip())
        except CommandError as e:
            ctx.failed = True
            return f"!{name}: {e}\nusage: {cmd.usage}"


@dataclass(slots=True)
class ParsedInput:
    commands: list[str]
    text: str  # plain lines, joined, for the model ("" when none)
    model: str | None  # from a leading @model



def parse_input(text: str, raw_commands: Container[str] = frozenset(),
                known: Container[str] | None = None) -> ParsedInput:
    """Split a message into command lines, an optional `@model` switch and plain text.

    A command named in `raw_commands` (CommandRegistry.raw_names()) takes the rest of the message,
    following lines included, as its argument. With `known` (see CommandRegistry.parse), a `!word`
    line that names no command in it is plain text, and so is every line after the first plain
    one: commands lead the message.
    """
    commands: list[str] = []
    plain: list[str] = []
    model: str | None = None
    lines = text.splitlines()
    text_began = False
    for index, line in enumerate(lines):
        stripped = line.lstrip()
        name = command_name(stripped)
        if (stripped.startswith("!") and _COMMAND_NAME.fullmatch(name)
                and (known is None or (name in known and not text_began))):
            if name in raw_commands:
                commands.append("\n".join([stripped, *lines[index + 1:]]).rstrip())
                break
            commands.append(stripped)
        else:
            plain.append(line)
            text_began = text_began or bool(stripped)
    body = "\n".join(plain).strip()
    if body.startswith("@"):
        first, _, rest = body.partition("\n")
        key, _, prompt = first[1:].partition(" ")
        if key:
            model = key.strip()
            body = (prompt + ("\n" + rest if rest else "")).strip()
    return ParsedInput(commands, body, model)
