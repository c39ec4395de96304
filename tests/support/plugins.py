"""Plugins that tests register programmatically (`engine_factory(plugins=[...])`,
`api_server_factory(plugins=[...])`)."""

from __future__ import annotations

import asyncio

from pydantic import BaseModel

from aiops.engine.plugins import Plugin, PluginAPI, PluginSettings
from aiops.engine.tools import Tool, ToolContext


class TextArgs(BaseModel):
    text: str


class SlowStopPlugin(Plugin):
    """`slow_job`, a read tool that runs until cancelled, then takes a moment to wind down (as a
    database query being killed does): the window in which a stop or a delete waits for the turn.
    Enable it with `[slowstop] enabled = true` in plugins.toml."""

    name = "slowstop"
    settings_model = PluginSettings

    def __init__(self) -> None:
        super().__init__()
        self.running = asyncio.Event()
        self.winding_down = asyncio.Event()

    async def setup(self, api: PluginAPI) -> None:
        async def slow_job(args: TextArgs, ctx: ToolContext) -> str:
            self.running.set()
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                self.winding_down.set()
                await asyncio.sleep(0.5)
                raise
            return "done"

        api.register_tool(Tool("slow_job", "A long job", TextArgs, "slowstop", slow_job, operation="read"))
