"""`aiops chat` imports only what its run uses (issue 27): no Textual, no google-genai while no Gemini
model answers (though one is configured and the Google search plugin has its key), no Slack or MCP
SDK while their plugins do not start, no SQL classifier or MySQL driver with the mysql plugin off, no
second HTTP library for a plain-http model. Each of these costs a new user a share of a second on every
run; this pins the behaviour, not a time (speed is measured by `make bench`: benchmarks.startup)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.fakes.fixtures import make_config_dir, openai_model_entry
from tests.fakes.openai_server import FakeOpenAI, Reply
from tests.support.server import ServeProcess

# Runs the real `aiops` entry point, then writes the names of the modules it imported (at exit,
# after the run) to the file named by argv[1].
_RUN = """
import atexit, json, runpy, sys
out = sys.argv.pop(1)
atexit.register(lambda: open(out, "w").write(json.dumps(sorted(sys.modules))))
sys.argv[0] = "aiops"
runpy.run_module("aiops.cli", run_name="__main__")
"""

_NOT_USED = ("textual", "google.genai", "slack_sdk", "slack_bolt", "mcp", "sqlglot", "aiomysql")


def _modules_after(tmp_path: Path, *args: str, env: dict[str, str]) -> tuple[subprocess.CompletedProcess[str], set[str]]:
    out = tmp_path / "modules.json"
    r = subprocess.run([sys.executable, "-c", _RUN, str(out), *args], capture_output=True, text=True, timeout=60,
                       env=env, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr
    return r, set(json.loads(out.read_text()))


def _loaded(modules: set[str], name: str) -> bool:
    return any(m == name or m.startswith(name + ".") for m in modules)


def test_aiops_chat_on_an_openai_model_imports_no_textual_gemini_slack_mcp_or_mysql_sdk(
        tmp_path: Path, fake_openai: FakeOpenAI) -> None:
    models = {"local": openai_model_entry(fake_openai),
              "gem": {"type": "gemini", "model_id": "gemini-x", "base_url": "http://127.0.0.1:9"}}
    # Shipped plugins as they are (slack off, MCP on with no servers), the Google search plugin with
    # its key, so it starts: it must still not import google-genai before a search.
    cfg = make_config_dir(tmp_path, models, "local", {"plugins.toml": "[mysql]\nenabled = false\n\n"
                                                                      "[google_search]\nenabled = true\n"})
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIOPS_")}
    env["GEMINI_API_KEY"] = "not-a-real-key"
    fake_openai.script(Reply.text("hello there"))
    r, modules = _modules_after(tmp_path, "--config-dir", str(cfg), "--data-dir", str(tmp_path / "data"),
                                "chat", "hi", env=env)
    assert r.stdout.strip() == "hello there"
    assert "google_search" not in r.stderr  # it started (a skipped plugin is reported on stderr)
    assert _loaded(modules, "openai")  # the model it used: the check sees what was imported
    assert [m for m in _NOT_USED if _loaded(modules, m)] == []
    # A plain-http model needs no SSL context, which the SDK makes through httpcore2 (with h11), an
    # HTTP library its aiohttp transport never uses (~90 ms of a 0.9 s run).
    assert [m for m in ("httpcore2", "h11") if _loaded(modules, m)] == []


def test_aiops_help_imports_no_sdk_at_all(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIOPS_")}
    _, modules = _modules_after(tmp_path, "--help", env=env)
    assert [m for m in (*_NOT_USED, "openai", "aiohttp", "pydantic") if _loaded(modules, m)] == []


# Through a running aiops, `aiops chat` reads the run file and `.env`, posts one message and reads one
# event stream: issue 27 gives it 0.3 s to its first token, less than `import aiohttp` takes alone.
_NOT_USED_REMOTE = (*_NOT_USED, "openai", "aiohttp", "yarl", "multidict", "pydantic", "sqlite3", "aiops.config",
                    "aiops.engine.engine", "aiops.engine.store", "aiops.engine.events", "aiops.client",
                    "aiops.integrations.remote.engine", "aiops.integrations.server", "aiops.gates")


def test_aiops_chat_through_a_running_aiops_imports_no_http_library_pydantic_engine_or_sdk(
        tmp_path: Path, aiops_serve: ServeProcess, fake_openai: FakeOpenAI) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIOPS_")}
    fake_openai.script(Reply.text("through the server"))
    r, modules = _modules_after(tmp_path, "--config-dir", str(aiops_serve.config_dir), "--data-dir",
                                str(aiops_serve.data_dir), "chat", "hi", env=env)
    assert r.stdout.strip() == "through the server"
    assert aiops_serve.url in r.stderr  # it went through the server (found by its run file)
    assert _loaded(modules, "aiops.cli.remote_http")  # the check sees what was imported
    assert [m for m in _NOT_USED_REMOTE if _loaded(modules, m)] == []


def test_the_console_app_imports_no_http_library_or_sdk_before_its_first_frame() -> None:
    """The console draws its first frame, then loads the engine, the server and the SDKs in a
    thread (docs/PERFORMANCE.md). What `aiops.tui.app` imports is on the way to that frame: an HTTP
    library there (aiohttp with its ~100 modules, pulled in by a helper the model guidance used)
    made the console ~0.1 s slower to paint on a 2-core machine."""
    code = "import json, sys; import aiops.tui.app; print(json.dumps(sorted(sys.modules)))"
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIOPS_")}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 0, r.stderr
    modules = set(json.loads(r.stdout))
    assert [m for m in ("aiohttp", "openai", "httpx2", "google.genai", "slack_sdk", "mcp", "sqlglot")
            if _loaded(modules, m)] == []
