"""The console's door to an engine in another process: `EngineAdapter`'s operations over HTTP.

`RemoteAdapter` stands where `EngineAdapter` stands (aiops/tui/adapter.py), so the App, its panes and
helpers run unchanged on top of a `RemoteEngine` (aiops/integrations/remote/). Events arrive from the
operator stream and are posted as the same Textual messages; what the console asks synchronously
(pending gates, rate usage, the prompt tree) is answered from what the stream and earlier reads
told; what it asks to be done synchronously (answer a gate, stop a turn, re-enable a tool type) is
sent in a task whose refusal is said in a notification — its effect, as in-process, comes back as
events (`gate_resolved`, `done`, `rate`). The link itself is shown in the header: where, as whom,
and a disconnection while it lasts (`AttachState`).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from textual.message import Message

from aiops.engine import events as ev
from aiops.integrations.remote import RemoteEngine, RemoteError
from aiops.tui.adapter import (
    _ANSWERS,
    SESSIONS_PAGE,
    EngineAdapter,
    HistoryLoaded,
    ModelProbe,
    ModelsChecked,
    ServicesStarted,
    to_message,
)

if TYPE_CHECKING:
    from textual.message_pump import MessagePump

    from aiops.config import Config
    from aiops.engine.lock import DataDirLock
    from aiops.engine.types import SessionKey
    from aiops.prompts.tree import PromptTree

log = logging.getLogger(__name__)


class AttachState(Message):
    """The link to the attached aiops: "connected" or "disconnected" (with why), or "reset": it
    restarted, or the console was away longer than its event ring reaches; state is read again."""

    def __init__(self, state: str, reason: str = "") -> None:
        super().__init__()
        self.state = state
        self.reason = reason


class RemoteAdapter(EngineAdapter):
    """An attached console's engine: a `RemoteEngine`, with the adapter's operations."""

    def __init__(self, remote: RemoteEngine, target: MessagePump, cfg: Config) -> None:
        # No engine object here: every operation below goes to `remote`.
        self.remote = remote
        self.target = target
        self.server = None
        self._unlisten = None
        self.outbox = self._make_outbox()  # the stream's deltas batched as in-process
        self._cfg = cfg
        self._listening = False
        self._tasks: set[asyncio.Task[Any]] = set()
        self._prompts: dict[str, tuple[Path | None, PromptTree | None]] = {}
        self._prompt_models: dict[Path, str] = {}
        self._running: dict[str, str] = {}  # session id -> running turn id
        self._models_shown = False
        remote.on_event = self._on_event
        remote.on_state = self._on_state
        remote.on_reset = self._on_reset

    @property
    def label(self) -> str:
        """The header's server field: where the console is attached, and as whom."""
        return f"attached {self.remote.url} as {self.remote.principal or '?'}"

    @property
    def owner(self) -> str | None:
        """An attached console opens its operator's own console sessions, not another operator's."""
        return self.remote.principal or None

    # -- events --

    def connect(self) -> None:
        self._listening = True

    def disconnect(self) -> None:
        self._listening = False
        self.outbox.flush()

    def _on_event(self, event: ev.Event) -> None:
        match event:
            case ev.TurnStarted(turn_id=str(tid)) if event.session_id:
                self._running[event.session_id] = tid
            case ev.Done() if event.session_id and self._running.get(event.session_id) == event.turn_id:
                del self._running[event.session_id]
        if isinstance(event, ev.Done) and event.command and self.remote.operator and self._listening:
            self._reread_rates()  # `!limits set` changes a limit without a `rate` event
        if self._listening:
            super()._on_event(event)

    def _on_state(self, state: str, reason: str) -> None:
        self.outbox.flush()  # the deltas read before the link changed come before it is said
        if self._listening:
            self.target.post_message(AttachState(state, reason))

    def _on_reset(self) -> None:
        self.outbox.flush()
        self._running.clear()
        self._prompts.clear()
        if self._listening:
            self.target.post_message(AttachState("reset", "the event history was read again"))

    def _spawn(self, coro: Any, failed: str) -> None:
        async def run() -> None:
            try:
                await coro
            except RemoteError as e:
                self._say(f"{failed}: {e.message}", "warning")
            except Exception as e:  # noqa: BLE001 - said where the operator looks
                log.exception("%s", failed)
                self._say(f"{failed}: {type(e).__name__}: {e}", "error")

        task = asyncio.get_running_loop().create_task(run())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _say(self, text: str, severity: str = "information") -> None:
        notify = getattr(self.target, "notify", None)
        if callable(notify):
            notify(text, severity=severity, timeout=6)

    # -- lifecycle --

    async def start(self, *, server: bool, host: str | None, port: int | None,
                    lock: DataDirLock | None = None) -> ServicesStarted:
        if self.remote._http is None:
            await self.remote.start()
        self.connect()
        return ServicesStarted([self.remote.url], None)

    async def stop(self) -> None:
        self.disconnect()
        for task in list(self._tasks):
            task.cancel()
        await self.remote.close()

    @property
    def started(self) -> bool:
        return self.remote._http is not None

    async def warm_backends(self) -> None:
        """The attached aiops runs the models: no SDK is needed here."""

    def connected_clients(self) -> int | None:
        return None

    # -- models and commands --

    @property
    def config(self) -> Config:
        return self._cfg

    def default_model(self) -> str:
        return str(self.remote.info.get("default_model") or "")

    def model_keys(self) -> list[str]:
        return sorted(self.remote.info.get("models") or {})

    def command_names(self) -> list[str]:
        return list(self.remote.info.get("commands") or [])

    def describe_model(self, key: str) -> str:
        return str((self.remote.info.get("models") or {}).get(key, key))

    def key_env(self, key: str) -> str | None:
        # The attached aiops's configuration names it, and does not say.
        return None

    async def probe_models(self) -> ModelsChecked:
        # The models are the attached aiops's to reach, so it probes them: at start-up its picture is
        # shown when it has one (another console asked, or its turns told), later ones (`check
        # models`) ask it to probe again. Its answer comes to every attached console as an event too.
        remote = self.remote
        if not remote.operator:
            return ModelsChecked({})  # a client token may not have the server probe: nothing known
        first, self._models_shown = not self._models_shown, True
        if first and remote.models and set(self.model_keys()) <= set(remote.models):
            return self.models_checked(remote.models.values())
        try:
            return self.models_checked(await remote.check_models())
        except RemoteError as e:
            self._say(f"checking models failed: {e.message}", "warning")
            return self.models_checked(remote.models.values())

    async def probe_model(self, key: str) -> ModelProbe:
        state = self.remote.models.get(key)
        if state is None:
            return ModelProbe(key, True, "", self.describe_model(key))
        return ModelProbe(key, state.ok, state.reason, self.describe_model(key), state.cause)

    # -- sessions and turns --

    @property
    def _console_sessions(self) -> bool:
        # An operator's sessions are `console` sessions, as in-process, where the server's submit
        # takes that kind; elsewhere (an older aiops, a client token) they are `api` sessions.
        return self.remote.operator and bool(self.remote.info.get("console_sessions"))

    async def sessions(self, limit: int = SESSIONS_PAGE, *, before: SessionKey | None = None) -> list[dict[str, Any]]:
        return await self.remote.list_sessions(limit=limit, before=before)

    async def open_session(self, kind: str = "console") -> dict[str, Any]:
        # The server makes a session with its first message; until then it is this console's name.
        sid = f"console-{uuid.uuid4().hex[:8]}"
        made = "console" if self._console_sessions else "api"  # (`kind`: what the App asked for)
        return {"client_id": sid, "short_id": "", "kind": made, "model": self.default_model(), "title": "",
                "state": "idle", "created_at": 0, "updated_at": 0, "message_count": 0}

    async def submit(self, session_id: str, text: str) -> str:
        try:
            data = await self.remote.submit(session_id, text, kind="console" if self._console_sessions else None)
        except RemoteError as e:
            raise RuntimeError(e.message) from None
        return str(data.get("turn_id", ""))

    def stop_turn(self, session_id: str) -> bool:
        if session_id not in self._running:
            return False
        self._spawn(self.remote.stop_turn(session_id), "stopping the turn failed")
        return True

    async def load_history(self, session_id: str, limit: int, before_id: int | None = None) -> HistoryLoaded:
        messages = await self.remote.history(session_id, limit=limit, before_id=before_id)
        return HistoryLoaded(session_id, messages, limit, before_id)

    # -- gates --

    def pending_gates(self) -> list[ev.GateInfo]:
        return self.remote.pending_gates()

    def answered_elsewhere(self, gate: ev.GateInfo) -> bool:
        return gate.decision in ("approved", "denied") and gate.by != self.remote.principal

    def resolve_gate(self, gate_id: str, decision: str, scope: str = "once") -> str | None:
        answer = _ANSWERS[decision]
        if gate_id not in self.remote.gates:
            return f"gate {gate_id} is no longer pending"
        # The inbox drops the row when `gate_resolved` comes back, as in-process; a refusal (someone
        # answered first) is said, and that answer's event clears the row too.
        self._spawn(self.remote.resolve_gate(gate_id, answer, "session" if scope == "session" else "once"),
                    f"gate {gate_id}")
        return None

    # -- rate limits --

    def rate_usage(self, session_id: str | None = None) -> list[ev.RateInfo]:
        # As in-process: every session's used (or disabled) types, and every configured limit of the
        # selected session, at 0 where it has not been used.
        rows = {(u.session_id, u.tool_type): u for u in self.remote.rate_usage()
                if u.used or u.disabled or u.session_id == session_id}
        if session_id is not None:
            for tool_type, (limit, window) in self.remote.limits.items():
                rows.setdefault((session_id, tool_type), ev.RateInfo(session_id, tool_type, 0, limit, window, False))
        return [rows[k] for k in sorted(rows)]

    def _reread_rates(self) -> None:
        async def read() -> None:
            await self.remote.read_rates()
            side = getattr(self.target, "side", None)
            if side is not None:
                side.refresh_limits()

        self._spawn(read(), "reading the rate limits")

    def enable_rate(self, session_id: str, tool_type: str) -> bool:
        async def enable() -> None:
            if await self.remote.enable_rate(session_id, tool_type):
                self._say(f"{tool_type} re-enabled")

        self._spawn(enable(), f"re-enabling {tool_type}")
        return False

    # -- the prompt tree --

    def _fetch_prompt(self, model_key: str | None, *, reload: bool = False) -> None:
        key = model_key or self.default_model()

        async def fetch() -> None:
            from aiops.prompts.wire import tree_from_wire

            data = await self.remote.prompt(key, reload=reload)
            folder = Path(data["folder"]) if data.get("folder") else None
            tree = tree_from_wire(data["tree"]) if data.get("tree") else None
            self._prompts[key] = (folder, tree)
            if folder is not None:
                self._prompt_models[folder] = key
            side = getattr(self.target, "side", None)
            if side is not None:
                side.refresh_prompt()

        self._spawn(fetch(), "reading the prompt tree")

    def prompt_folder(self, model_key: str | None) -> Path | None:
        return self.prompt_tree(model_key)[0]

    def prompt_tree(self, model_key: str | None) -> tuple[Path | None, PromptTree | None]:
        key = model_key or self.default_model()
        if key not in self._prompts:
            self._prompts[key] = (None, None)  # asked once; the answer refreshes the pane
            self._fetch_prompt(key)
        return self._prompts[key]

    def tool_names(self) -> list[str]:
        return list(self.remote.info.get("tools") or [])

    def reload_prompt(self, folder: Path) -> None:
        self._fetch_prompt(self._prompt_models.get(folder), reload=True)

    async def save_prompt_section(self, folder: Path, session_id: str | None, section: str, body: str) -> str:
        model = self._prompt_models.get(folder)
        try:
            summary = await self.remote.save_prompt_section(model, session_id, section, body)
        except RemoteError as e:
            raise RuntimeError(e.message) from None
        self._prompts.pop(model or self.default_model(), None)
        return summary


__all__ = ["AttachState", "RemoteAdapter", "to_message"]
