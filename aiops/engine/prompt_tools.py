"""The system-prompt tree as model tools and the operator's `!prompt` command.

Reading is a plain read tool. Writing is tool type `system`, operation write, so it passes the gate
(it asks by default) like any other write; every change lands in the audit log with its diff.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, Field

from aiops.engine.commands import Command, CommandContext, CommandError
from aiops.engine.tools import Classification, Tool, ToolContext, ToolOutput
from aiops.prompts.ops import OPERATIONS, ConfirmationRequired, EditResult, edit_section, read_section
from aiops.prompts.tree import ROOT, ROOT_FILE, PromptEditError

if TYPE_CHECKING:
    from aiops.engine.commands import CommandHost

log = logging.getLogger(__name__)


class ReadPromptArgs(BaseModel):
    section: str = Field("", description="section name or 1-based index; empty for the whole prompt")


class UpdatePromptArgs(BaseModel):
    section: str = Field(..., description="section name or 1-based index (for create: the new name)")
    operation: Literal["append", "prepend", "replace", "delete_lines", "overwrite", "create", "remove"]
    content: str = Field("", description="text to add, the replacement, or the new body")
    target: str = Field("", description="replace: the text to replace; delete_lines: lines containing it")
    confirm: bool = Field(False, description="overwrite needs confirm=true")
    # Used by create only; optional so the core signature stays (section, operation, content,
    # target, confirm).
    description: str = Field("", description="create: the new section's one-line description")
    parent: str = Field("", description="create: the container to put it under (name or index); "
                                        "empty for the root")


async def apply_edit(engine: CommandHost, folder: Path, session_id: str | None, actor: str, ref: str,
                     operation: str, content: str = "", target: str = "", confirm: bool = False,
                     description: str = "", parent: str = "") -> EditResult:
    """Edit one section (atomic write in a thread), audit the diff, refresh the cached tree."""
    paths = engine.config.paths

    def edit() -> EditResult:
        if folder.resolve().is_relative_to(paths.shipped_prompt_dir.resolve()):
            # Only when the user's copy could not be made: turns may read the shipped tree, but an
            # edit would change the installation (the repository, or site-packages) for everyone.
            raise PromptEditError(
                f"cannot edit the shipped system prompt {folder}: its copy in the config dir "
                f"({paths.config_dir / 'system_prompt'}) could not be made; make that directory "
                "writable (the log says why the copy failed)")
        return edit_section(folder, ref, operation, content, target, confirm, description, parent)

    result = await asyncio.to_thread(edit)
    engine.prompts.reload(folder)
    await engine.store.add_audit(
        "prompt_edit", session_id=session_id, tool="update_system_prompt", operation="write",
        actor=actor, data={"folder": str(folder), "section": result.section, "operation": operation,
                           "diff": result.diff, "before": result.before, "after": result.after},
    )
    return result


def _folder(engine: CommandHost, model_key: str | None) -> Path:
    folder = engine.prompt_folder(model_key)
    if folder is None:
        raise PromptEditError("this model has no system prompt (system_prompt_folder = \"none\")")
    return folder


def _classify_edit(args: UpdatePromptArgs) -> Classification:
    """Each edit asks on its own: the prompt is shared by every session on that model, and one
    "approve for the session" of an append must not cover an overwrite of another section. The
    summary leads with what and where, before any text that could push them out of sight."""
    where = f"{args.operation} section {args.section[:40]!r}"
    if args.operation == "create":
        where += f" under {args.parent[:40]!r}" if args.parent else " at the root"
    text = " ".join((args.content or args.target).split())
    if len(text) > 120:
        text = text[:119].rstrip() + "…"
    return Classification("write", summary=f"update_system_prompt {where}" + (f": {text}" if text else ""),
                          grantable=False)


def register_prompt_tools(engine: CommandHost) -> None:
    async def read_tool(args: ReadPromptArgs, ctx: ToolContext) -> ToolOutput:
        try:
            tree = engine.prompts.get(_folder(engine, ctx.model_key))
            return ToolOutput(read_section(tree, args.section, engine.tools.names()))
        except PromptEditError as e:
            return ToolOutput(f"error: {e}", is_error=True)

    async def update_tool(args: UpdatePromptArgs, ctx: ToolContext) -> ToolOutput:
        try:
            result = await apply_edit(engine, _folder(engine, ctx.model_key), ctx.session_id,
                                      f"model:{ctx.model_key}", args.section, args.operation,
                                      args.content, args.target, args.confirm,
                                      description=args.description, parent=args.parent)
        except ConfirmationRequired as e:
            return ToolOutput(f"error: {e}; repeat the call with confirm=true to do it", is_error=True)
        except PromptEditError as e:
            return ToolOutput(f"error: {e}", is_error=True)
        return ToolOutput(result.summary, data={"diff": result.diff})

    engine.tools.register(Tool(
        "read_system_prompt", "Read your own system prompt: the whole prompt, or one section by name or "
        "index.", ReadPromptArgs, "system", read_tool, operation="read"))
    engine.tools.register(Tool(
        "update_system_prompt", "Change one section of your system prompt. Needs operator approval. "
        f"Operations: {', '.join(OPERATIONS)}.", UpdatePromptArgs, "system", update_tool,
        operation="write", classify=_classify_edit))
    engine.commands.register(Command(
        "prompt", "!prompt [read REF|edit REF OP TEXT|create NAME DESC [--parent P]|reload]",
        "the system-prompt tree: show (everyone); read, edit, create, reload (operator)", _prompt_command))


PROMPT_HELP = """\
!prompt                          the tree with indexes and errors
!prompt read REF                 one section (name or index)
!prompt edit REF append TEXT     also: prepend TEXT, overwrite TEXT --confirm,
                                 replace OLD => NEW, delete_lines TEXT, remove
!prompt create NAME "DESC" [--parent P] [TEXT]
!prompt reload                   re-read the files
(\\n in TEXT is a newline)"""


async def _prompt_command(ctx: CommandContext, argv: list[str], raw: str) -> str:
    engine = ctx.engine
    live = await ctx.session()
    model_key = live.model_key(engine) if live else None
    try:
        folder = _folder(engine, model_key)
        if not argv:
            if not folder.is_dir():
                return (f"system prompt: {folder}\n  (this folder does not exist: the model runs without "
                        "a system prompt)")
            return engine.prompts.get(folder).render_tree(engine.tools.names())
        sub = argv[0]
        if sub in ("read", "reload", "edit", "create") and not ctx.is_operator:
            # Reading a section shows the operator's instructions word for word; reloading makes
            # every session pick up files changed on disk. Clients see the tree of names only.
            raise CommandError(f"not permitted: !prompt {sub} is an operator command")
        if sub == "read":
            return read_section(engine.prompts.get(folder), " ".join(argv[1:]), engine.tools.names())
        if sub == "reload":
            engine.prompts.reload(folder)
            tree = engine.prompts.get(folder)
            return f"reloaded: {len(tree.sections)} sections, {len(tree.errors)} errors"
        if sub in ("edit", "create"):
            return await _edit(ctx, folder, sub, raw)
        if sub == "help":
            return PROMPT_HELP
    except PromptEditError as e:
        raise CommandError(str(e)) from None
    raise CommandError(f"unknown sub-command {sub!r}\n{PROMPT_HELP}")


async def _edit(ctx: CommandContext, folder: Path, sub: str, raw: str) -> str:
    import shlex

    rest = raw.split(None, 1)[1] if len(raw.split(None, 1)) > 1 else ""
    actor = "operator" if ctx.client_kind == "console" else f"operator:{ctx.client_kind}"
    if sub == "create":
        parts = shlex.split(rest)
        if len(parts) < 2:
            raise CommandError(PROMPT_HELP)
        name, desc, *more = parts
        parent = ""
        if "--parent" in more:
            i = more.index("--parent")
            parent = more[i + 1] if i + 1 < len(more) else ""
            del more[i:i + 2]
        content = " ".join(more).replace("\\n", "\n")
        result = await apply_edit(ctx.engine, folder, ctx.session_id, actor, name, "create", content,
                                  description=desc, parent=parent)
        return result.summary
    ref, _, rest = rest.partition(" ")
    op, _, text = rest.strip().partition(" ")
    if not ref or not op:
        raise CommandError(PROMPT_HELP)
    confirm = "--confirm" in text.split()
    text = " ".join(w for w in text.split(" ") if w != "--confirm").replace("\\n", "\n")
    target = ""
    if op == "replace":
        if "=>" not in text:
            raise CommandError("replace needs OLD => NEW")
        target, _, text = (p.strip() for p in text.partition("=>"))
    elif op == "delete_lines":
        target, text = text.strip(), ""
    try:
        result = await apply_edit(ctx.engine, folder, ctx.session_id, actor, ref, op, text, target, confirm)
    except ConfirmationRequired as e:
        raise CommandError(f"{e}; add --confirm: !prompt edit {e.section} overwrite TEXT --confirm") from None
    return result.summary


# ---- the prompt sent each turn --------------------------------------------------------------------


def turn_prompt(engine: CommandHost, model_key: str, session_id: str | None = None,
                turn_id: str | None = None) -> str:
    """The assembled prompt for one turn of `model_key`, with the sections whose tools are
    registered; "" when the model has none.

    A configured folder that is missing (or has no root file) would otherwise mean a model running
    without its prompt and nobody knowing: that is logged and said in a notice, once per session.
    """
    folder = engine.prompt_folder(model_key)
    if folder is None:
        return ""  # system_prompt_folder = "none": no prompt, as asked
    if not folder.is_dir():
        problem = f"system prompt folder {folder} does not exist"
    else:
        tree = engine.prompts.get(folder)
        if not any(e.chain == (ROOT,) for e in tree.errors):
            engine.prompts.found(folder)
            return tree.assemble(engine.tools.names())
        problem = f"system prompt folder {folder} has no {ROOT_FILE} file"
    if engine.prompts.first_miss(folder, session_id):
        text = (f"{problem} (system_prompt_folder of model {model_key!r} in models.toml); "
                "the model runs without a system prompt")
        log.warning("%s", text)
        if session_id is not None:
            engine.notice(session_id, text, turn_id)
    return ""


def tool_guidance(engine: CommandHost, model_key: str, tool: str) -> str:
    """The sections of `model_key`'s prompt tree about `tool` (see PromptTree.about_tool); "" when
    the model has no prompt (`system_prompt_folder = "none"`, a missing folder) or no such section.
    A delegate given that one tool gets them as its whole system prompt."""
    folder = engine.prompt_folder(model_key)
    if folder is None or not folder.is_dir():
        return ""
    tree = engine.prompts.get(folder)
    return str(tree.about_tool(tool))
