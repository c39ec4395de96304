"""The aiops server under test: in-process (engine + server on the test's loop) or as a real
`aiops serve` subprocess. Both listen on 127.0.0.1 with an ephemeral port and use tmp_path dirs.

In-process (async tests):

    async def test_x(api_server):                      # fake model "local", no tokens (loopback)
        api_server.fake.script(Reply.text("hi"))
        async with api_server.client() as agent:       # an AgentClient
            ...

    async def test_y(api_server_factory):
        tokens = Tokens.make(ops="operator", bot="client")
        srv = await api_server_factory(tokens=tokens, plugins=[MyPlugin()],
                                       server={"keepalive_seconds": 0.2},
                                       extra_files={"plugins.toml": "[mine]\\nenabled = true\\n"})
        async with aiohttp.ClientSession() as s:
            await s.get(srv.url + "/api/v1/gates", headers=tokens.header("ops"))

Subprocess (sync or async tests):

    def test_z(aiops_serve):                           # `aiops serve` on the fake model, no tokens
        aiops_serve.fake.script(Reply.text("hi"))
        openai.OpenAI(base_url=aiops_serve.url + "/v1", api_key="x")...
        assert aiops_serve.stop() == 0                 # SIGTERM; the exit status

    def test_w(aiops_serve_factory, fake_openai):
        tokens = Tokens.make(ops="operator")
        proc = aiops_serve_factory(tokens=tokens, server={"extra_ports": []})
        ...

`start_serve(config_dir, data_dir, ...)` and `run_serve(...)` (run to exit, e.g. a refused bind)
work without fixtures.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import tomli_w

from aiops.client import AgentClient
from aiops.config import Config, load_config, resolve_paths
from aiops.engine.engine import Engine
from aiops.engine.plugins import Plugin
from aiops.integrations.server.run import ServerHandle, start_server
from tests.fakes.fixtures import make_config_dir, openai_model_entry
from tests.fakes.openai_server import FakeOpenAI

BANNER = re.compile(r"aiops serving on (http://\S+)")


def pytest_configure(config: pytest.Config) -> None:
    # request["role"] / request["principal"] are string keys by contract; aiohttp's hint about
    # RequestKey is silenced in production by the app module, and here for the test run.
    config.addinivalue_line("filterwarnings", "ignore::aiohttp.web_exceptions.NotAppKeyWarning:"
                                              "aiops.integrations.server.middlewares")


# ---- tokens and config files ---------------------------------------------------------------------------


@dataclass
class Tokens:
    """Test tokens: name -> role, with a random secret each, passed through the environment."""

    roles: dict[str, str]
    secrets: dict[str, str] = field(default_factory=dict)

    @classmethod
    def make(cls, **roles: str) -> Tokens:
        return cls(dict(roles), {name: secrets.token_urlsafe(24) for name in roles})

    @staticmethod
    def var(name: str) -> str:
        return f"AIOPS_TEST_TOKEN_{name.upper()}"

    def env(self) -> dict[str, str]:
        return {self.var(n): s for n, s in self.secrets.items()}

    def table(self) -> dict[str, Any]:
        return {n: {"token_env": self.var(n), "role": r} for n, r in self.roles.items()}

    def header(self, name: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.secrets[name]}"}


def aiops_toml(tokens: Tokens | None = None, *, host: str = "127.0.0.1", port: int = 0,
               engine: dict[str, Any] | None = None, **server: Any) -> str:
    """An aiops.toml: [server] on host:port with `server` settings, exactly `tokens` (none: no auth)."""
    data: dict[str, Any] = {"server": {"host": host, "port": port, **server},
                            "auth": {"tokens": tokens.table() if tokens else {}}}
    if engine:
        data["engine"] = engine
    return tomli_w.dumps(data)


def server_config_dir(root: Path, fake: FakeOpenAI, *, tokens: Tokens | None = None,
                      server: dict[str, Any] | None = None, engine: dict[str, Any] | None = None,
                      models: dict[str, dict[str, Any]] | None = None, default: str = "local",
                      extra_files: dict[str, str] | None = None) -> Path:
    """root/"config": models on the fake (key "local" unless given), aiops.toml, plugins.toml with
    nothing enabled unless `extra_files` says otherwise."""
    files = {"aiops.toml": aiops_toml(tokens, engine=engine, **(server or {})),
             "plugins.toml": "[mysql]\nenabled = false\n"}
    files.update(extra_files or {})
    return make_config_dir(root, models or {"local": openai_model_entry(fake)}, default, files)


def clean_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The test process's environment without AIOPS_* settings, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIOPS_")}
    env.update(extra or {})
    return env


# ---- in-process ----------------------------------------------------------------------------------------


@dataclass
class ApiServer:
    engine: Engine
    cfg: Config
    handle: ServerHandle
    fake: FakeOpenAI
    tokens: Tokens | None

    @property
    def url(self) -> str:
        return self.handle.url

    def client(self, token: str | None = None, **kw: Any) -> AgentClient:
        """An AgentClient; `token` is a token *name* of `tokens` (None: no token)."""
        secret = self.tokens.secrets[token] if (token and self.tokens) else None
        return AgentClient(self.url, token=secret or "", **kw)

    def headers(self, token: str | None) -> dict[str, str]:
        return self.tokens.header(token) if (token and self.tokens) else {}

    async def stop(self) -> None:
        await self.handle.close_listeners()
        if self.engine.started:
            await self.engine.stop()
        await self.handle.stop()


ApiServerFactory = Callable[..., Awaitable[ApiServer]]


@pytest.fixture
async def api_server_factory(tmp_path: Path, fake_openai: FakeOpenAI) -> AsyncIterator[ApiServerFactory]:
    """`await api_server_factory(tokens=, plugins=, server=, engine=, models=, default=, extra_files=,
    data_dir=)`: an engine and its server on this test's loop, stopped after the test (pass a
    stopped server's `cfg.paths.data_dir` to restart on its data)."""
    servers: list[ApiServer] = []

    async def make(*, tokens: Tokens | None = None, plugins: Sequence[Plugin] = (),
                   server: dict[str, Any] | None = None, engine: dict[str, Any] | None = None,
                   models: dict[str, dict[str, Any]] | None = None, default: str = "local",
                   extra_files: dict[str, str] | None = None, data_dir: Path | None = None) -> ApiServer:
        root = tmp_path / f"server{len(servers)}"
        cfg_dir = server_config_dir(root, fake_openai, tokens=tokens, server=server, engine=engine,
                                    models=models, default=default, extra_files=extra_files)
        cfg = load_config(resolve_paths(cfg_dir, data_dir or root / "data"), load_dotenv=False)
        eng = Engine(cfg, env=clean_env(tokens.env() if tokens else None), plugins=list(plugins),
                     discover_plugins=False)
        await eng.start()
        try:
            handle = await start_server(eng, cfg)
        except BaseException:
            await eng.stop()
            raise
        srv = ApiServer(eng, cfg, handle, fake_openai, tokens)
        servers.append(srv)
        return srv

    yield make
    for srv in reversed(servers):
        await srv.stop()


@pytest.fixture
async def api_server(api_server_factory: ApiServerFactory) -> ApiServer:
    """An in-process server on the fake model "local", no tokens (loopback callers are operators)."""
    return await api_server_factory()


# ---- subprocess ----------------------------------------------------------------------------------------


@dataclass
class ServeProcess:
    """A running `aiops serve`."""

    proc: subprocess.Popen[bytes]
    url: str
    banner: str
    config_dir: Path
    data_dir: Path
    stdout_path: Path
    stderr_path: Path
    fake: FakeOpenAI | None = None
    tokens: Tokens | None = None

    @property
    def stdout(self) -> str:
        return self.stdout_path.read_text(errors="replace")

    @property
    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def headers(self, token: str | None) -> dict[str, str]:
        return self.tokens.header(token) if (token and self.tokens) else {}

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        """Send `sig` and wait for the exit; returns the exit status (killed after `timeout`)."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
                raise AssertionError(f"aiops serve ignored signal {sig} for {timeout}s; stderr:\n"
                                     f"{self.stderr}") from None
        return self.proc.returncode


def _serve_cmd(config_dir: Path, data_dir: Path, host: str, port: int, args: Sequence[str]) -> list[str]:
    return [sys.executable, "-m", "aiops.cli", "--config-dir", str(config_dir), "--data-dir", str(data_dir),
            "serve", "--host", host, "--port", str(port), *args]


def _wait_for(cond: Callable[[], bool], timeout: float, what: str, proc: subprocess.Popen[bytes],
              stderr: Path) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if proc.poll() is not None:
            raise AssertionError(f"aiops serve exited with {proc.returncode} before {what}; stderr:\n"
                                 f"{stderr.read_text(errors='replace')}")
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"aiops serve: no {what} within {timeout}s; stderr:\n"
                                 f"{stderr.read_text(errors='replace')}")
        time.sleep(0.02)  # polling another process's output: there is nothing to await


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/api/v1/health", timeout=2) as r:
            return r.status == 200 and json.loads(r.read()).get("status") == "ok"
    except (urllib.error.URLError, OSError, ValueError):
        return False


def _limit_open_files(limits: tuple[int, int]) -> Callable[[], None]:
    def apply() -> None:
        import resource

        resource.setrlimit(resource.RLIMIT_NOFILE, limits)

    return apply


def start_serve(config_dir: Path, data_dir: Path, *, host: str = "127.0.0.1", port: int = 0,
                env: dict[str, str] | None = None, args: Sequence[str] = (), timeout: float = 30.0,
                fake: FakeOpenAI | None = None, tokens: Tokens | None = None,
                open_files: tuple[int, int] | None = None) -> ServeProcess:
    """Start `aiops serve` and return once its banner is printed and /api/v1/health answers.

    `open_files`: the child's (soft, hard) RLIMIT_NOFILE, as a service manager would set it.

    Port 0 (the default) lets the OS choose; the real URL is read from the banner. The child's
    cwd is data_dir's parent (so no stray .env is read) and its environment is the test's without
    AIOPS_* variables, plus `env` (and the tokens' variables).
    """
    data_dir.mkdir(parents=True, exist_ok=True)
    out, err = data_dir.parent / "serve.stdout", data_dir.parent / "serve.stderr"
    child_env = clean_env({**(tokens.env() if tokens else {}), **(env or {})})
    with out.open("wb") as o, err.open("wb") as e:
        proc = subprocess.Popen(_serve_cmd(config_dir, data_dir, host, port, args), stdout=o, stderr=e,
                                env=child_env, cwd=data_dir.parent, start_new_session=True,
                                preexec_fn=_limit_open_files(open_files) if open_files else None)
    match: list[re.Match[str]] = []

    def banner() -> bool:
        m = BANNER.search(out.read_text(errors="replace"))
        if m:
            match.append(m)
        return m is not None

    _wait_for(banner, timeout, "banner on stdout", proc, err)
    url = match[0].group(1)
    _wait_for(lambda: _healthy(url), timeout, f"healthy answer from {url}", proc, err)
    return ServeProcess(proc, url, match[0].group(0), config_dir, data_dir, out, err, fake, tokens)


def run_serve(config_dir: Path, data_dir: Path, *, host: str = "127.0.0.1", port: int = 0,
              env: dict[str, str] | None = None, args: Sequence[str] = (),
              timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
    """Run `aiops serve` expecting it to exit by itself (a refused bind, a bad config)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    return subprocess.run(_serve_cmd(config_dir, data_dir, host, port, args), capture_output=True, text=True,
                          env=clean_env(env), cwd=data_dir.parent, timeout=timeout)


ServeFactory = Callable[..., ServeProcess]


@pytest.fixture
def aiops_serve_factory(tmp_path: Path, fake_openai: FakeOpenAI) -> Iterator[ServeFactory]:
    """`aiops_serve_factory(tokens=, server=, engine=, models=, default=, extra_files=, env=, args=,
    config_dir=, data_dir=)` → a running ServeProcess (config on the fake model unless config_dir is
    given; pass an earlier process's data_dir to restart on the same data); every process still
    running is stopped after the test."""
    procs: list[ServeProcess] = []

    def make(*, tokens: Tokens | None = None, server: dict[str, Any] | None = None,
             engine: dict[str, Any] | None = None, models: dict[str, dict[str, Any]] | None = None,
             default: str = "local", extra_files: dict[str, str] | None = None,
             env: dict[str, str] | None = None, args: Sequence[str] = (),
             config_dir: Path | None = None, data_dir: Path | None = None) -> ServeProcess:
        root = tmp_path / f"serve{len(procs)}"
        if config_dir is None:
            config_dir = server_config_dir(root, fake_openai, tokens=tokens, server=server, engine=engine,
                                           models=models, default=default, extra_files=extra_files)
        proc = start_serve(config_dir, data_dir or root / "data", env=env, args=args, fake=fake_openai,
                           tokens=tokens)
        procs.append(proc)
        return proc

    yield make
    for p in procs:
        if p.proc.poll() is None:
            with contextlib.suppress(AssertionError):
                p.stop(timeout=15)
            if p.proc.poll() is None:
                p.proc.kill()
                p.proc.wait(10)


@pytest.fixture
def aiops_serve(aiops_serve_factory: ServeFactory) -> ServeProcess:
    """A running `aiops serve` subprocess on the fake model "local", no tokens."""
    return aiops_serve_factory()
