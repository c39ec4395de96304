"""Plugins for tests: registered programmatically (`engine_factory(plugins=[...])`,
`api_server_factory(plugins=[...])`), or installed for an aiops subprocess (`installed_plugin`)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from pydantic import BaseModel

from aiops.engine.plugins import Plugin, PluginAPI, PluginSettings
from aiops.engine.tools import Tool, ToolContext
from tests.fakes.fixtures import make_config_dir, openai_model_entry
from tests.fakes.openai_server import FakeOpenAI


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


# A plugin whose tool blocks a thread (a synchronous library called through asyncio.to_thread):
# cancelling the task does not stop the thread, and Python waits for every such thread at exit.
THREAD_PLUGIN = """
import asyncio
import time
from pathlib import Path

from pydantic import BaseModel

from aiops.engine.plugins import Plugin
from aiops.engine.tools import Tool


class Args(BaseModel):
    marker: str


class BlockingPlugin(Plugin):
    name = "blocking"

    async def setup(self, api):
        async def blocking_tool(args, ctx):
            Path(args.marker).write_text("running")
            await asyncio.to_thread(time.sleep, 300)
            return "woke up"

        api.register_tool(Tool("blocking_tool", "blocks a thread", Args, "test", blocking_tool))
"""


def installed_plugin(tmp_path: Path, fake: FakeOpenAI, env: dict[str, str], name: str, entry: str,
                     code: str) -> tuple[Path, dict[str, str]]:
    """A third-party plugin installed as a user installs one: module `aiops_<name>_plugin` and its
    dist-info with the entry point `name = aiops_<name>_plugin:<entry>`, on PYTHONPATH; enabled in
    a config dir on the fake. Returns the config dir and `env` with the plugin on PYTHONPATH."""
    site = tmp_path / "site"
    module = f"aiops_{name}_plugin"
    dist = site / f"{module}-0.1.dist-info"
    dist.mkdir(parents=True)
    (site / f"{module}.py").write_text(code)
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: aiops-{name}-plugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(f"[aiops.plugins]\n{name} = {module}:{entry}\n")
    cfg = make_config_dir(tmp_path, {"local": openai_model_entry(fake)}, "local",
                          {"plugins.toml": f"[mysql]\nenabled = false\n\n[{name}]\nenabled = true\n"})
    return cfg, env | {"PYTHONPATH": os.pathsep.join(p for p in (str(site), env.get("PYTHONPATH")) if p)}
