"""The console attached to an `aiops serve` subprocess (issue 22): the same console over the API.

A proxy client's gate reaches the attached console's inbox and is approved there; two attached
consoles see each other's answers (who answered); the server restarted under an attached console,
which says it lost the link, reconnects and shows the history once. What the in-process console
shows, attached too: which models answer (the server's picture, and its changes in every console),
every configured limit, and the operator's sessions as console sessions where the server allows.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from pathlib import Path
from typing import Any

import openai

from aiops.config import load_config, resolve_paths
from aiops.engine import runfile
from aiops.engine.lock import running
from aiops.integrations.remote import RemoteEngine
from aiops.tui.adapter import SESSIONS_PAGE
from aiops.tui.app import AiopsApp
from aiops.tui.widgets.gates import GatesInbox
from tests.fakes.openai_server import FakeOpenAI, Reply
from tests.support.server import ApiServerFactory, ServeFactory, ServeProcess
from tests.tui.conftest import chat_text, ready, region_text, send, wait_chat, wait_for

EDIT = ("update_system_prompt", {"section": "role", "operation": "append", "content": "Be brief."})


def attached_app(serve: ServeProcess, token: str | None = None) -> AiopsApp:
    cfg = load_config(resolve_paths(serve.config_dir, serve.data_dir.parent / "attached-data"), load_dotenv=False)
    # A clock far ahead at every reading: no gate counts as just moved under the cursor.
    ticks = itertools.count(0, 100)
    return AiopsApp(cfg, remote=RemoteEngine(serve.url, token), server=False, clock=lambda: float(next(ticks)))


async def approve_oldest(pilot: Any) -> None:
    await pilot.press("ctrl+g")
    await wait_for(pilot, lambda: isinstance(pilot.app.focused, GatesInbox), "the inbox focused")
    await pilot.press("a")


def proxy_chat_in_thread(serve: ServeProcess, text: str) -> tuple[threading.Thread, list[Any]]:
    """A chat UI's request through the OpenAI proxy, in a thread (it waits for the gate's answer)."""
    out: list[Any] = []

    def run() -> None:
        client = openai.OpenAI(base_url=serve.url + "/v1", api_key="x", timeout=60)
        r = client.chat.completions.create(model="aiops", messages=[{"role": "user", "content": text}])
        out.append(r.choices[0].message.content)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out


def test_serve_writes_a_run_file_and_removes_it_on_exit(aiops_serve: ServeProcess) -> None:
    info = running(aiops_serve.data_dir)
    assert info is not None and info["url"] == aiops_serve.url
    assert info["pid"] == aiops_serve.proc.pid and info["port"] == int(aiops_serve.url.rsplit(":", 1)[1])
    assert aiops_serve.stop() == 0
    assert not runfile.run_path(aiops_serve.data_dir).exists()


def test_a_stale_run_file_is_not_a_running_aiops_and_the_next_holder_replaces_it(tmp_path: Path) -> None:
    import os

    from aiops.engine.lock import DataDirLock

    data = tmp_path / "data"
    runfile.write(data, "http://127.0.0.1:1", pid=999_999)  # left by a killed aiops: nobody holds the lock
    assert running(data) is None
    lock = DataDirLock(data / "aiops.lock")
    lock.acquire()
    assert not runfile.run_path(data).exists()  # no server yet: no run file, not the stale one
    lock.update(url="http://127.0.0.1:2345")
    info = running(data)
    assert info is not None and info["pid"] == os.getpid() and info["port"] == 2345
    assert info["address"] == "127.0.0.1"
    lock.release()
    assert not runfile.run_path(data).exists()


async def test_a_proxy_clients_gate_is_approved_from_the_attached_console(
        aiops_serve: ServeProcess, fake_openai: FakeOpenAI) -> None:
    fake_openai.script(Reply.tool_calls(EDIT), Reply.text("Changed it."))
    app = attached_app(aiops_serve)
    async with app.run_test(size=(160, 48)) as pilot:
        await ready(pilot)
        assert f"attached {aiops_serve.url} as loopback:" in region_text(app, "StatusBar")
        # The prompt tree is the attached aiops's (its config dir), read over the API.
        app.main.show_pane("prompt")
        await wait_for(pilot, lambda: str(aiops_serve.config_dir) in "".join(region_text(app, "#prompt-folder").split())
                       and "1. role" in region_text(app, "#prompt-sections"), "the server's prompt tree", 20)
        app.main.show_pane("input")
        await send(pilot, "!limits")  # a !command runs on the attached aiops; its output shows here
        await wait_for(pilot, lambda: "max_tool_iterations = 10" in chat_text(app),
                       "the command's output", 20)
        thread, out = proxy_chat_in_thread(aiops_serve, "make it brief")
        await wait_for(pilot, lambda: app.inbox.gates, "the proxy's gate in the inbox", 20)
        gate = next(iter(app.inbox.gates.values()))
        assert gate.client_kind == "proxy" and gate.tool == "update_system_prompt"
        await approve_oldest(pilot)
        await wait_for(pilot, lambda: not app.inbox.gates, "the inbox to clear", 20)
        await asyncio.to_thread(thread.join, 30)
        assert out == ["Changed it."]


async def test_two_attached_consoles_one_approves_the_others_inbox_clears_saying_who(
        aiops_serve_factory: ServeFactory, fake_openai: FakeOpenAI) -> None:
    from tests.support.server import Tokens

    tokens = Tokens.make(alice="operator", bob="operator")
    serve = aiops_serve_factory(tokens=tokens)
    fake_openai.script(Reply.tool_calls(EDIT), Reply.text("Changed it."))
    one, two = attached_app(serve, tokens.secrets["alice"]), attached_app(serve, tokens.secrets["bob"])
    async with one.run_test(size=(160, 48)) as p1, two.run_test(size=(160, 48), notifications=True) as p2:
        await ready(p1)
        await ready(p2)
        assert "as alice" in region_text(one, "StatusBar") and "as bob" in region_text(two, "StatusBar")
        thread, out = proxy_chat_in_thread_token(serve, tokens.secrets["alice"], "make it brief")
        await wait_for(p1, lambda: one.inbox.gates, "the gate in console one", 20)
        await wait_for(p2, lambda: two.inbox.gates, "the gate in console two", 20)
        await approve_oldest(p1)
        await wait_for(p2, lambda: not two.inbox.gates, "console two's inbox to clear", 20)
        await wait_for(p2, lambda: any("approved by alice" in n.message for n in two._notifications),
                       "who answered, said in console two", 20)
        await asyncio.to_thread(thread.join, 30)
        assert out == ["Changed it."]


def proxy_chat_in_thread_token(serve: ServeProcess, token: str, text: str) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []

    def run() -> None:
        client = openai.OpenAI(base_url=serve.url + "/v1", api_key=token, timeout=60)
        r = client.chat.completions.create(model="aiops", messages=[{"role": "user", "content": text}])
        out.append(r.choices[0].message.content)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out


async def test_the_server_restarts_under_an_attached_console_which_reconnects_without_duplicates(
        aiops_serve_factory: ServeFactory, fake_openai: FakeOpenAI) -> None:
    serve = aiops_serve_factory(args=["--port", "0"])
    fake_openai.script(Reply.text("first answer"))
    app = attached_app(serve)
    async with app.run_test(size=(160, 48)) as pilot:
        await ready(pilot)
        await send(pilot, "hello there")
        await wait_chat(pilot, "first answer", 20)
        port = int(serve.url.rsplit(":", 1)[1])
        assert serve.stop() == 0
        await wait_for(pilot, lambda: "DISCONNECTED" in region_text(app, "StatusBar"), "the disconnection shown", 20)
        again = aiops_serve_factory(config_dir=serve.config_dir, data_dir=serve.data_dir, args=["--port", str(port)])
        assert again.url == serve.url
        await wait_for(pilot, lambda: "DISCONNECTED" not in region_text(app, "StatusBar"), "the reconnection", 30)
        await wait_for(pilot, lambda: chat_text(app).count("first answer") == 1 and "hello there" in chat_text(app),
                       "the history once", 20)
        fake_openai.script(Reply.text("second answer"))
        await send(pilot, "and again")
        await wait_chat(pilot, "second answer", 20)
        text = chat_text(app)
        assert text.count("first answer") == 1 and text.count("you hello there") == 1
        assert text.count("second answer") == 1


def test_attach_refusals_are_one_line_before_the_screen_is_taken(aiops_serve_factory: ServeFactory,
                                                                 tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    from tests.support.server import Tokens

    tokens = Tokens.make(ops="operator")
    serve = aiops_serve_factory(tokens=tokens)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIOPS_")}
    base = [sys.executable, "-m", "aiops.cli", "--config-dir", str(serve.config_dir), "--data-dir",
            str(tmp_path / "elsewhere"), "attach"]
    r = subprocess.run([*base, serve.url], capture_output=True, text=True, timeout=60, env=env,
                       stdin=subprocess.DEVNULL)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        f"aiops: cannot attach to {serve.url}: missing bearer token: send 'Authorization: Bearer <token>' "
        f"(give an operator token: --token-env NAME, or AIOPS_TOKEN, or AIOPS_TEST_TOKEN_OPS "
        f"(the operator token aiops.toml names))"], r.stderr
    r = subprocess.run([*base, serve.url, "--token-env", "NOT_SET_ANYWHERE"], capture_output=True, text=True,
                       timeout=60, env=env, stdin=subprocess.DEVNULL)
    assert r.returncode == 2 and r.stderr.strip() == ("aiops: --token-env NOT_SET_ANYWHERE: the variable "
                                                      "NOT_SET_ANYWHERE is not set"), r.stderr


class CuttableRelay:
    """A TCP relay between the attached console and the server that the test can cut (a network
    drop: every connection closed, new ones refused) and restore."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.server: asyncio.Server | None = None
        self.conns: set[asyncio.StreamWriter] = set()
        self.port = 0

    async def start(self, port: int = 0) -> None:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", port)
        self.port = self.server.sockets[0].getsockname()[1]

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        self.conns.update((writer, up_writer))
        conn: dict[str, Any] = {}  # what `_passing` notes about this connection

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter, down: bool) -> None:
            try:
                while data := await src.read(65536):
                    await self._passing(conn, data, down)
                    dst.write(data)
                    await dst.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                dst.close()

        await asyncio.gather(pipe(reader, up_writer, False), pipe(up_reader, writer, True))

    async def _passing(self, conn: dict[str, Any], data: bytes, down: bool) -> None:
        """Each read, before it is passed on (`down`: from aiops to the console)."""

    async def cut(self) -> None:
        assert self.server is not None
        self.server.close()
        for w in list(self.conns):
            w.transport.abort()
        self.conns.clear()
        await self.server.wait_closed()

    async def restore(self) -> None:
        await self.start(self.port)


async def test_a_network_drop_is_shown_and_the_missed_events_are_caught_up_once(
        aiops_serve: ServeProcess, fake_openai: FakeOpenAI) -> None:
    import aiohttp

    relay = CuttableRelay(int(aiops_serve.url.rsplit(":", 1)[1]))
    await relay.start()
    cfg = load_config(resolve_paths(aiops_serve.config_dir, aiops_serve.data_dir.parent / "attached-data"),
                      load_dotenv=False)
    app = AiopsApp(cfg, remote=RemoteEngine(f"http://127.0.0.1:{relay.port}"), server=False)
    fake_openai.script(Reply.text("before the drop"), Reply.text("during the drop"))
    async with app.run_test(size=(160, 48)) as pilot:
        await ready(pilot)
        await send(pilot, "first question")
        await wait_chat(pilot, "before the drop", 20)
        sid = app.selected
        await relay.cut()
        await wait_for(pilot, lambda: "DISCONNECTED" in region_text(app, "StatusBar"), "the drop shown", 20)
        # Meanwhile a script talks in the same session, straight to the server.
        async with aiohttp.ClientSession() as http, http.post(
                aiops_serve.url + "/api/v1/submit",
                json={"text": "asked while you were away", "client_id": sid, "wait": True}) as r:
            assert (await r.json())["text"] == "during the drop"
        await relay.restore()
        await wait_for(pilot, lambda: "DISCONNECTED" not in region_text(app, "StatusBar"), "the reconnection", 30)
        await wait_chat(pilot, "during the drop", 20)
        text = chat_text(app)
        assert text.count("asked while you were away") == 1 and text.count("during the drop") == 1
        assert text.count("before the drop") == 1 and text.count("you first question") == 1


async def test_the_attached_console_shows_the_servers_model_reachability_and_every_configured_limit(
        aiops_serve_factory: ServeFactory, fake_openai: FakeOpenAI) -> None:
    """What the in-process console shows (tests/tui/test_panes.py): which models answer, said as the
    server sees them (it probes, not the attached console), and the limits pane's every limit of the
    selected session, used or not."""
    from tests.fakes.fixtures import openai_model_entry

    models = {"gpt": {"type": "openai", "model_id": "gpt-x", "api_key_env": "AIOPS_TEST_UNSET_KEY"},
              "local": openai_model_entry(fake_openai)}
    serve = aiops_serve_factory(models=models, default="gpt",
                                extra_files={"limits.toml": "[rate.notes]\ncalls = 3\nwindow_seconds = 600\n"
                                                           "[rate.db]\ncalls = 20\nwindow_seconds = 60\n"})
    app = attached_app(serve)
    async with app.run_test(size=(160, 48)) as pilot:
        await ready(pilot)
        await wait_for(pilot, lambda: "no usable API key" in region_text(app, "#guidance"), "the guidance", 20)
        guidance = region_text(app, "#guidance")
        assert "Model gpt has no usable API key: AIOPS_TEST_UNSET_KEY is not set" in guidance
        assert "(openai gpt-x at https://api.openai.com/v1)" in guidance and "Reachable now: local." in guidance
        assert "model gpt needs a key" in region_text(app, "StatusBar")
        app.main.show_pane("limits")
        rules = app.cfg.limits.rate
        assert sorted(rules) == ["db", "notes"]
        await wait_for(pilot, lambda: all(f"{t} 0/{r.calls} in {r.window_seconds:g}s" in region_text(app, "LimitsTable")
                                          for t, r in rules.items()), "every configured limit at 0", 20)
        # A limit changed on the attached aiops (no `rate` event says so) is shown once the command ran.
        app.main.show_pane("input")
        await send(pilot, "!limits set notes 5 900")
        await wait_for(pilot, lambda: "notes 0/5 in 900s" in region_text(app, "LimitsTable"), "the new limit", 20)


async def test_a_session_started_from_the_attached_console_is_the_operators_console_session(
        aiops_serve: ServeProcess, fake_openai: FakeOpenAI) -> None:
    """As in-process: a `console` session owned by the operator's name (the server's submit takes that
    kind from an operator, and `/api/v1/console` says so: against an older server that does not, the
    attached console sends no kind and its sessions are `api` ones)."""
    fake_openai.script(Reply.text("hello back"))
    app = attached_app(aiops_serve)
    async with app.run_test(size=(160, 48)) as pilot:
        await ready(pilot)
        remote = app.adapter.remote  # type: ignore[attr-defined]
        assert remote.info["console_sessions"] is True
        expected = "console"
        await send(pilot, "hi")
        await wait_for(pilot, lambda: "hello back" in chat_text(app), "the answer", 20)
        rows = await remote.list_sessions()
        assert [(r["client_id"], r["kind"]) for r in rows] == [(app.chat.session_id, expected)]
        assert rows[0]["owner"] == remote.principal  # the name the header shows
        await wait_for(pilot, lambda: app.sessions_list.sessions[app.chat.session_id].get("kind") == expected,
                       "the sessions list says its kind", 20)


async def test_a_model_check_from_one_attached_console_is_shown_in_every_other(
        aiops_serve_factory: ServeFactory) -> None:
    """The server's picture changes (a probe finds its model gone): a console that did not ask says so
    too, from the `models` event, as the one that asked does."""
    from tests.fakes.fixtures import openai_model_entry

    with FakeOpenAI() as other:
        serve = aiops_serve_factory(models={"second": openai_model_entry(other)}, default="second")
        one, two = attached_app(serve), attached_app(serve)
        async with one.run_test(size=(160, 48)) as p1, two.run_test(size=(160, 48)) as p2:
            await ready(p1)
            await ready(p2)
            await wait_for(p2, lambda: two.guidance.probes.get("second") is not None, "the first picture", 20)
            assert "unreachable" not in region_text(two, "StatusBar")
            await asyncio.to_thread(other.stop)  # the model's server goes away
            one.action_check_models()
            for pilot, app in ((p1, one), (p2, two)):
                await wait_for(pilot, lambda app=app: "no model reachable" in region_text(app, "StatusBar")
                               and "cannot connect to" in region_text(app, "#guidance"), "the model gone", 20)


async def test_an_attached_console_opens_its_own_operators_console_session_not_anothers(
        aiops_serve_factory: ServeFactory, fake_openai: FakeOpenAI) -> None:
    """A console opens on its last console session: an attached one on its operator's, since alice's
    console sessions are hers to go on with — bob's console starts one of its own beside them."""
    from tests.support.server import Tokens

    tokens = Tokens.make(alice="operator", bob="operator")
    serve = aiops_serve_factory(tokens=tokens)
    fake_openai.script(Reply.text("hello alice"))
    alice = attached_app(serve, tokens.secrets["alice"])
    async with alice.run_test(size=(160, 48)) as pilot:
        await ready(pilot)
        await send(pilot, "hi")
        await wait_for(pilot, lambda: "hello alice" in chat_text(alice), "alice's answer", 20)
        hers = alice.chat.session_id
    bob = attached_app(serve, tokens.secrets["bob"])
    async with bob.run_test(size=(160, 48)) as pilot:
        await ready(pilot)
        assert bob.chat.session_id != hers
        assert "hello alice" not in chat_text(bob)
    again = attached_app(serve, tokens.secrets["alice"])
    async with again.run_test(size=(160, 48)) as pilot:
        await ready(pilot)
        await wait_for(pilot, lambda: again.chat.session_id == hers and "hello alice" in chat_text(again),
                       "alice's console back on her session", 20)


async def test_model_on_an_attached_consoles_new_session_sets_the_model_of_its_first_turn(
        aiops_serve_factory: ServeFactory, fake_openai: FakeOpenAI) -> None:
    """As in-process: `!model KEY` before the session's first message switches it (the server makes
    the console's session with that command), and the first turn runs on KEY."""
    from tests.fakes.fixtures import openai_model_entry

    serve = aiops_serve_factory(models={"local": openai_model_entry(fake_openai),
                                        "second": openai_model_entry(fake_openai, "second-model")})
    fake_openai.script(Reply.text("answered by the second"))
    app = attached_app(serve)
    async with app.run_test(size=(160, 48)) as pilot:
        await ready(pilot)
        await send(pilot, "!model second")
        await wait_chat(pilot, "this session now uses second", 20)
        assert "does not exist yet" not in chat_text(app)
        await send(pilot, "hi")
        await wait_chat(pilot, "answered by the second", 20)
    assert fake_openai.last_request.json["model"] == "second-model"


async def test_the_attached_console_lists_every_stored_session_past_the_first_page(
        api_server_factory: ApiServerFactory, tmp_path: Path) -> None:
    """As in-process (tests/tui/test_startup.py): the first page at start, the older ones in pages
    over the API once the console is up."""
    from benchmarks import history

    data = tmp_path / "served-data"
    stored = SESSIONS_PAGE + 500
    history.build(resolve_paths(tmp_path, data).db_path, stored, 2)
    srv = await api_server_factory(data_dir=data)
    cfg = load_config(resolve_paths(srv.cfg.paths.config_dir, tmp_path / "attached-data"), load_dotenv=False)
    app = AiopsApp(cfg, remote=RemoteEngine(srv.url), server=False)
    async with app.run_test(size=(160, 48)) as pilot:
        await ready(pilot)
        await wait_for(pilot, lambda: len(app.sessions_list.sessions) >= stored, "every stored session listed", 30)
        await pilot.pause(0.2)  # (the list redraws at most ten times a second)
        listing = app.sessions_list.listing()
        assert len(listing) - sum(" (" in line for line in listing) == len(app.sessions_list.sessions)
        assert f"console-{0:08x}" in listing  # the oldest


class LaggingRelay(CuttableRelay):
    """A relay whose event streams the test can hold back (their bytes kept, then passed on in
    order) while every other answer passes: the console's events lag behind the answers to its
    requests, as on a slow or congested link."""

    def __init__(self, target_port: int) -> None:
        super().__init__(target_port)
        self.flowing = asyncio.Event()
        self.flowing.set()

    async def _passing(self, conn: dict[str, Any], data: bytes, down: bool) -> None:
        if not down:  # a request: the one on this connection (one at a time) may be the event stream
            if data.startswith((b"GET ", b"POST ", b"DELETE ")):
                conn["events"] = data.startswith(b"GET /api/v1/events")
        elif conn.get("events"):
            await self.flowing.wait()


async def test_a_deletion_the_attached_console_has_not_heard_of_yet_hides_no_older_session(
        api_server_factory: ApiServerFactory, tmp_path: Path) -> None:
    """Another client deletes a session of the first page just before the next page of older
    sessions is read, and the console's event stream lags behind the answers to its requests (a
    slow link): the page is read with the deletion made and not yet heard of. Paged by offset, the
    sessions after the deleted one moved up a place under that page and one was never listed;
    paged after the last session read, every session still stored is listed, and the deleted one
    goes once its event comes."""
    import aiohttp

    from benchmarks import history

    data = tmp_path / "served-data"
    stored = SESSIONS_PAGE + 500
    history.build(resolve_paths(tmp_path, data).db_path, stored, 2)
    srv = await api_server_factory(data_dir=data)
    relay = LaggingRelay(int(srv.url.rsplit(":", 1)[1]))
    await relay.start()
    cfg = load_config(resolve_paths(srv.cfg.paths.config_dir, tmp_path / "attached-data"), load_dotenv=False)
    app = AiopsApp(cfg, remote=RemoteEngine(f"http://127.0.0.1:{relay.port}"), server=False)
    reads: list[dict[str, Any]] = []
    deleted: list[str] = []
    read = app.adapter.sessions

    async def another_client_meanwhile(*args: Any, **kwargs: Any) -> list[dict[str, Any]]:
        reads.append(kwargs)
        if len(reads) != 2:  # (the first page at start; the second read is the first older page)
            return await read(*args, **kwargs)
        relay.flowing.clear()  # the deletion's event waits in the link
        async with aiohttp.ClientSession() as http:
            async with http.get(srv.url + "/api/v1/sessions?limit=1") as r:
                newest = (await r.json())["sessions"][0]["client_id"]
            async with http.delete(f"{srv.url}/api/v1/sessions/{newest}") as r:
                assert r.status == 200, await r.text()
        deleted.append(newest)
        page = await read(*args, **kwargs)
        asyncio.get_running_loop().call_soon(relay.flowing.set)  # heard of once this page is in
        return page

    def older_ones_read() -> bool:
        listed = app.sessions_list.sessions
        return bool(deleted) and deleted[0] not in listed and not any(
            w.name == "older_sessions" and not w.is_finished for w in app.workers)

    app.adapter.sessions = another_client_meanwhile  # type: ignore[method-assign]
    try:
        async with app.run_test(size=(160, 48)) as pilot:
            await ready(pilot)
            await wait_for(pilot, older_ones_read, "the older sessions read and the deletion heard of", 30)
            kept = {s["client_id"] for s in await srv.engine.list_sessions(limit=2 * stored)}
            assert len(kept) == stored - 1
            listed = set(app.sessions_list.sessions)
            assert sorted(kept - listed) == []  # every session still stored is listed
            assert listed - kept == {app.selected}  # and beside them only the console's new session
    finally:
        await relay.cut()
