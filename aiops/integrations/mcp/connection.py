"""One persistent connection to one external MCP server, kept up by its own task.

The task connects, lists the server's tools, then lists them again every `ping_seconds`; a failure, a
transport error or the process exiting ends the connection and the task reconnects after a
backoff that doubles up to `retry_max_seconds`. Nothing here blocks another server: each has its
task, and a call to a server that is not connected answers at once with its state.

A stdio server's stderr goes to a file in the data dir; its tail is part of the state shown for a
server that failed (`!mcp`, the plugin status, /api/v1/health).

The MCP SDK is imported by the first connection's task, in a thread (~0.5 s of CPU): a turn that
starts meanwhile, offered the servers' tools from their last lists, does not wait for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TextIO

from aiops.mcp_config import McpConfig, McpServerConfig, expand

if TYPE_CHECKING:
    import mcp_types as mt
    from mcp import Client

log = logging.getLogger(__name__)

State = Literal["connecting", "connected", "retrying", "failed", "stopped"]
STDERR_TAIL_CHARS = 1500
_MARK = "--- aiops: "  # starts the line aiops writes to the stderr log before each start
# A server that never answers the handshake must not hold its slot forever.
CONNECT_SECONDS = 30.0


class NotConnected(Exception):
    pass


class ServerConnection:
    def __init__(self, name: str, cfg: McpServerConfig, settings: McpConfig, env: Mapping[str, str],
                 stderr_path: Path, on_change: Callable[[ServerConnection], Awaitable[None]],
                 on_elicit: Callable[[ServerConnection, mt.ElicitRequestParams], Awaitable[mt.ElicitResult]]
                 ) -> None:
        self.name = name
        self.cfg = cfg
        self.settings = settings
        self.env = env
        self.stderr_path = stderr_path
        self.state: State = "connecting"
        self.error = ""
        self.since = time.time()
        self.attempts = 0
        self.ever_connected = False
        self.tools: list[mt.Tool] = []
        self.client: Client | None = None
        self._on_change = on_change
        self._on_elicit = on_elicit
        self._broken = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._first_try = asyncio.Event()
        self._change = asyncio.Event()
        self._stopping = False

    # ---- lifecycle --------------------------------------------------------------------------------

    def start(self) -> None:
        if self._task is None and not self._stopping:
            self._task = asyncio.get_running_loop().create_task(self._run(), name=f"mcp:{self.name}")

    @property
    def started(self) -> bool:
        return self._task is not None

    async def first_attempt(self) -> None:
        """Return once the first connection attempt has succeeded or failed."""
        await self._first_try.wait()

    async def stop(self) -> None:
        self._stopping = True
        task = self._task
        # Cancel until it ends: a cancel that lands inside the SDK's anyio task group can come back
        # out wrapped in an exception group beside a transport error, and must not be taken for a
        # failed attempt (CI once saw a stop wait forever on a server that had gone away).
        while task is not None and not task.done():
            task.cancel()
            await asyncio.wait({task}, timeout=1.0)
        self.state = "stopped"
        self._first_try.set()  # nothing waits on a connection that will not be attempted

    async def next_change(self) -> None:
        """Return at the next state change (or tool list change)."""
        await self._change.wait()

    async def _set(self, state: State, error: str = "") -> None:
        self.state, self.error, self.since = state, error, time.time()
        self._change.set()
        self._change = asyncio.Event()
        try:
            await self._on_change(self)
        except Exception:  # noqa: BLE001 - a view's bookkeeping must not end the connection
            log.exception("mcp %s: state callback failed", self.name)

    async def _run(self) -> None:
        wait = self.settings.retry_first_seconds
        try:
            await _sdk_loaded()
        except Exception as e:  # noqa: BLE001 - a broken install: said, not retried
            self._first_try.set()
            await self._set("failed", f"the MCP SDK could not be imported: {describe(e)}")
            log.error("mcp %s: the MCP SDK could not be imported: %s", self.name, describe(e))
            return
        while not self._stopping:
            self.attempts += 1
            try:
                await self._session()
                error = "the connection ended"
            except asyncio.CancelledError:
                raise
            except BaseException as e:  # noqa: BLE001 - ExceptionGroups from anyio, OSError, ...
                if self._stopping or _holds_cancel(e):
                    raise asyncio.CancelledError from e
                error = describe(e)
            self.client = None
            if self.state == "connected":
                wait = self.settings.retry_first_seconds  # it was up: the first retry comes soon
            self._first_try.set()
            # "failed" until it has ever connected (a wrong command, a bad URL), then "retrying".
            await self._set("retrying" if self.ever_connected else "failed",
                            f"{error}; retrying in {wait:g} s")
            log.warning("mcp %s: %s; retrying in %g s", self.name, error, wait)
            await asyncio.sleep(wait)
            wait = min(wait * 2, self.settings.retry_max_seconds)

    async def _session(self) -> None:
        from mcp import Client

        async with contextlib.AsyncExitStack() as stack:
            transport = self._transport(stack)
            # No response cache: the liveness check must reach the server.
            client = Client(transport, read_timeout_seconds=self.cfg.timeout, mode=self.cfg.protocol,
                            elicitation_callback=self._elicit, cache=None)
            # asyncio.timeout, not wait_for: the client's anyio task group must be entered and
            # left by this same task.
            async with asyncio.timeout(CONNECT_SECONDS):
                await stack.enter_async_context(client)
                listed = await client.list_tools()
            self.tools = list(listed.tools)
            self.client = client
            self.ever_connected = True
            self._broken.clear()
            self._first_try.set()
            await self._set("connected")
            log.info("mcp %s: connected, %d tool(s)", self.name, len(self.tools))
            while True:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._broken.wait(), self.settings.ping_seconds)
                if self._broken.is_set():
                    return
                # tools/list, not ping: ping is gone from the 2026 protocol, and a changed tool
                # list is picked up on the way.
                async with asyncio.timeout(min(self.cfg.timeout, 30.0)):
                    listed = await client.list_tools()
                if [t.model_dump() for t in listed.tools] != [t.model_dump() for t in self.tools]:
                    self.tools = list(listed.tools)
                    await self._set("connected")

    def _transport(self, stack: contextlib.AsyncExitStack) -> Any:
        from mcp import StdioServerParameters
        from mcp.client.stdio import stdio_client
        from mcp.client.streamable_http import streamable_http_client
        from mcp.shared._httpx_utils import create_mcp_http_client

        try:
            if self.cfg.command:
                env = {k: expand(v, self.env) for k, v in self.cfg.env.items()}
                for var in self.cfg.inherit_env:
                    if var not in self.env:
                        raise KeyError(var)
                    env[var] = self.env[var]
                params = StdioServerParameters(command=self.cfg.command, args=self.cfg.args, env=env,
                                               cwd=self.cfg.cwd)
                self.stderr_path.parent.mkdir(parents=True, exist_ok=True)
                errlog: TextIO = stack.enter_context(self.stderr_path.open("a", encoding="utf-8"))
                errlog.write(f"{_MARK}{time.strftime('%Y-%m-%d %H:%M:%S')} starting {self.cfg.where()}\n")
                errlog.flush()
                return stdio_client(params, errlog=errlog)
            assert self.cfg.url
            headers = {k: expand(v, self.env) for k, v in self.cfg.headers.items()}
        except KeyError as e:
            raise ConfigProblem(f"environment variable {e.args[0]} is not set") from None
        http = create_mcp_http_client(headers=headers)
        return streamable_http_client(self.cfg.url, http_client=http)

    # ---- calls ------------------------------------------------------------------------------------

    def connected(self) -> Client:
        if self.client is None or self.state != "connected":
            raise NotConnected(f"MCP server {self.name} is not connected ({self.describe_state()})")
        return self.client

    async def call(self, what: Callable[[Client], Awaitable[Any]]) -> Any:
        """Run one request on the connection; a transport failure marks it for reconnecting."""
        client = self.connected()
        try:
            async with asyncio.timeout(self.cfg.timeout):
                return await what(client)
        except TimeoutError:
            raise NotConnected(f"MCP server {self.name} did not answer within {self.cfg.timeout:g} s") from None
        except Exception as e:
            if _is_transport_error(e):
                self._broken.set()
                raise NotConnected(f"MCP server {self.name} connection failed: {describe(e)}") from None
            raise

    async def _elicit(self, context: Any, params: mt.ElicitRequestParams) -> mt.ElicitResult:
        import mcp_types as mt

        try:
            return await self._on_elicit(self, params)
        except Exception:  # noqa: BLE001 - whatever went wrong, the server gets a clear "no"
            log.exception("mcp %s: elicitation failed; declined", self.name)
            return mt.ElicitResult(action="decline")

    # ---- state for views --------------------------------------------------------------------------

    def stderr_tail(self) -> str:
        try:
            with self.stderr_path.open("rb") as f:
                f.seek(0, 2)
                size = f.tell()
                f.seek(max(0, size - STDERR_TAIL_CHARS))
                text = f.read().decode("utf-8", "replace")
        except OSError:
            return ""
        # The latest run that said anything (a restart that has not written yet shows the run
        # before it), without aiops's own "--- aiops: ... starting" markers.
        runs: list[list[str]] = [[]]
        for line in text.splitlines():
            if line.startswith(_MARK):
                runs.append([])
            else:
                runs[-1].append(line)
        said = [run for run in runs if "".join(run).strip()]
        return "\n".join(said[-1]).strip() if said else ""

    def describe_state(self) -> str:
        if self._task is None and self.state == "connecting":
            return "not started"
        text = self.state + (f": {self.error}" if self.error and self.state != "connected" else "")
        return text

    def status(self) -> dict[str, Any]:
        d: dict[str, Any] = {"name": self.name, "transport": self.cfg.transport, "where": self.cfg.where(),
                             "state": self.state, "error": self.error, "since": self.since,
                             "tools": len(self.tools)}
        if self.cfg.command and self.state != "connected":
            d["stderr_tail"] = self.stderr_tail()
        return d


class ConfigProblem(Exception):
    pass


_SDK_MODULES = ("mcp_types", "mcp", "mcp.client.stdio", "mcp.client.streamable_http", "mcp.shared._httpx_utils",
                "mcp.shared.exceptions")
_sdk: asyncio.Future[None] | None = None


async def _sdk_loaded() -> None:
    """The SDK's modules, imported once, in a thread, for every connection."""
    global _sdk
    import sys

    if all(m in sys.modules for m in _SDK_MODULES):
        return
    if _sdk is None or _sdk.get_loop() is not asyncio.get_running_loop():
        import importlib

        def load() -> None:
            for m in _SDK_MODULES:
                importlib.import_module(m)

        _sdk = asyncio.ensure_future(asyncio.to_thread(load))
        # Read here too: every connection waiting on it may be cancelled before it ends.
        _sdk.add_done_callback(lambda f: f.cancelled() or f.exception())
    await asyncio.shield(_sdk)


def _is_transport_error(e: BaseException) -> bool:
    from mcp.shared.exceptions import MCPError

    if isinstance(e, MCPError):
        return False  # the server answered (with an error): the connection is fine
    return True


def _holds_cancel(e: BaseException) -> bool:
    """True for an exception group that carries a cancellation (anyio's way of reporting one)."""
    if isinstance(e, BaseExceptionGroup):
        return any(_holds_cancel(x) for x in e.exceptions)
    return isinstance(e, asyncio.CancelledError)


def describe(e: BaseException) -> str:
    """One line for an exception, looking inside anyio's exception groups."""
    while isinstance(e, BaseExceptionGroup) and e.exceptions:
        e = e.exceptions[0]
    text = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return f"{type(e).__name__}: {text}" if text else type(e).__name__
