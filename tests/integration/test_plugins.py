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


async def test_a_database_host_that_never_answers_does_not_hold_up_start_up(engine_factory):
    # A firewalled host: the TCP connection opens, the MySQL greeting never comes.
    import asyncio

    held: list[asyncio.StreamWriter] = []

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        engine = await engine_factory(extra_files={
            "plugins.toml": f'[mysql]\nenabled = true\nhost = "127.0.0.1"\nport = {port}\n'})
        mysql = next(s for s in engine.plugin_status if s.name == "mysql")
        # Start-up is over while the check still waits (only its own timeout can end it).
        assert (mysql.state, mysql.reason) == ("started", "")
        await engine.plugins_ready()
        assert mysql.reason == "could not connect at start-up: no answer in 3 s"
    finally:
        for w in held:
            w.close()
        server.close()
        await server.wait_closed()


class HangsOnStop(Plugin):
    """A plugin whose stop never ends by itself and shrugs off its first cancel (as a library can)."""

    name = "hangs"
    stop_seconds: ClassVar[float] = 0.3

    async def stop(self) -> None:
        import asyncio

        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            await asyncio.sleep(3600)


class StopsLast(Plugin):
    name = "stops_last"

    def __init__(self) -> None:
        super().__init__()
        self.stopped = False

    async def stop(self) -> None:
        self.stopped = True


async def test_a_plugin_that_never_stops_does_not_keep_the_engine(engine_factory, caplog):
    import asyncio

    first = StopsLast()
    engine = await engine_factory(extra_files={"plugins.toml": "[hangs]\nenabled = true\n"
                                                               "[stops_last]\nenabled = true\n"},
                                  plugins=[first, HangsOnStop()], env={})
    await asyncio.wait_for(engine.stop(), 10)
    assert not engine.started
    assert first.stopped, "the plugins started before the hung one still stop"
    assert "plugin hangs did not stop within 0.3 s; left behind" in caplog.text


async def test_a_plugin_whose_table_is_missing_or_misspelled_is_not_said_to_be_switched_off(engine_factory):
    """QA: with [mysql] misspelled [myslq], `aiops plugins` said "enabled = false in plugins.toml",
    which the file never said. The status says what the file holds, and points at the typo."""
    engine = await engine_factory(extra_files={"plugins.toml": "[myslq]\nenabled = true\n[slack]\n"
                                                               "[good]\nenabled = false\n"},
                                  plugins=[Good()], env={})
    status = {s.name: s for s in engine.plugin_status}
    plugins_toml = str(engine.config.sources["plugins.toml"])
    assert status["mysql"].state == "disabled"
    assert status["mysql"].reason == (f"no [mysql] table in {plugins_toml} (off by default); [myslq] there "
                                      f"matches no plugin: a misspelling of [mysql]?")
    assert status["slack"].reason == f"[slack] in {plugins_toml} does not set enabled = true (off by default)"
    assert status["good"].reason == f"enabled = false in {plugins_toml}"
    assert status["delegation"].reason == f"no [delegation] table in {plugins_toml} (off by default)"
