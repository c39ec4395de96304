"""Plugins: enabled by plugins.toml; a missing dependency, secret or bad setting is reported and skipped."""

from __future__ import annotations

from typing import ClassVar

from pydantic import BaseModel

from aiops.engine.commands import Command
from aiops.engine.plugins import Plugin, PluginAPI, PluginSettings
from aiops.engine.tools import Tool


class NoArgs(BaseModel):
    pass


class GoodSettings(PluginSettings):
    greeting: str = "hi"


class Good(Plugin):
    name = "good"
    settings_model: ClassVar[type[PluginSettings]] = GoodSettings

    async def setup(self, api: PluginAPI) -> None:
        greeting = self.settings.greeting

        async def hello(args: NoArgs, ctx) -> str:
            return greeting

        async def cmd(ctx, argv, raw) -> str:
            return f"{greeting} from a plugin command"

        api.register_tool(Tool("hello", "say hello", NoArgs, "test", hello))
        api.register_command(Command("hello", "!hello", "greets", cmd))


class NeedsPackage(Plugin):
    name = "needs_pkg"
    requires = ("surely_not_installed_pkg_42",)


class NeedsSecret(Plugin):
    name = "needs_secret"

    async def setup(self, api: PluginAPI) -> None:
        api.require_env("SOME_API_TOKEN_FOR_TESTS", "the service's API token")


class Crashes(Plugin):
    name = "crashes"

    async def setup(self, api: PluginAPI) -> None:
        raise RuntimeError("bug in plugin")


PLUGINS = """
[good]
enabled = true
greeting = "ahoy"
[needs_pkg]
enabled = true
[needs_secret]
enabled = true
[crashes]
enabled = true
[typo]
enabled = true
colour = "red"
[mysql]
enabled = false
"""


class Typo(Plugin):
    name = "typo"


async def test_broken_plugins_are_reported_and_the_rest_start(engine_factory):
    engine = await engine_factory(extra_files={"plugins.toml": PLUGINS},
                                  plugins=[Good(), NeedsPackage(), NeedsSecret(), Crashes(), Typo()],
                                  env={})
    status = {s.name: s for s in engine.plugin_status}
    assert status["good"].state == "started"
    assert status["needs_pkg"].state == "skipped"
    assert "surely_not_installed_pkg_42" in status["needs_pkg"].reason
    assert status["needs_secret"].state == "skipped"
    assert "SOME_API_TOKEN_FOR_TESTS is not set" in status["needs_secret"].reason
    assert status["crashes"].state == "failed" and "bug in plugin" in status["crashes"].reason
    assert status["typo"].state == "skipped"
    assert "plugins.toml [typo]" in status["typo"].reason and "colour: unknown key" in status["typo"].reason
    assert status["mysql"].state == "disabled"  # the built-in, found through the entry point
    assert "hello" in engine.tools
    assert (await engine.run("console-1", "!hello", kind="console")).text == "ahoy from a plugin command"
