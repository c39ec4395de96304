"""The Slack plugin against the fake Slack: its plugins.toml table, the tokens' environment, and an
engine (or a console's engine) with it connected."""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel

from aiops.engine.plugins import Plugin, PluginAPI
from aiops.engine.tools import Tool, ToolContext, ToolOutput
from tests.fakes.slack_server import APP_TOKEN, BOT_TOKEN, FakeSlack

SLACK_ENV = {"SLACK_APP_TOKEN": APP_TOKEN, "SLACK_BOT_TOKEN": BOT_TOKEN}


def slack_table(slack: FakeSlack, **settings: Any) -> str:
    """plugins.toml's [slack] table, enabled and pointed at the fake, plus `settings`."""
    lines = ["[slack]", "enabled = true", f"api_url = {json.dumps(slack.api_url)}"]
    lines += [f"{key} = {json.dumps(value)}" for key, value in settings.items()]
    return "\n".join(lines) + "\n"


class NoteArgs(BaseModel):
    text: str = ""


class WriteNotePlugin(Plugin):
    """`write_note`, a write (the default gate asks for it)."""

    name = "notes"

    def __init__(self) -> None:
        super().__init__()
        self.notes: list[str] = []

    async def setup(self, api: PluginAPI) -> None:
        async def write(args: NoteArgs, ctx: ToolContext) -> ToolOutput:
            self.notes.append(args.text)
            return ToolOutput(f"noted: {args.text}")

        api.register_tool(Tool("write_note", "Write a note.", NoteArgs, "notes", write, operation="write"))
