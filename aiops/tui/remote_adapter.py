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
        self._cfg = cfg
        self._listening = False
        self._tasks: set[asyncio.Task[Any]] = set()
        self._prompts: dict[str, tuple[Path | None, PromptTree | None]] = {}
        self._prompt_models: dict[Path, str] = {}
        self._running: dict[str, str] = {}  # session id -> running turn id
        remote.on_event = self._on_event
        remote.on_state = self._on_state
        remote.on_reset = self._on_reset

    @property
    def label(self) -> str:
        """The header's server field: where the console is attached, and as whom."""
        return f"attached {self.remote.url} as {self.remote.principal or '?'}"

    # -- events --

    def connect(self) -> None:
        self._listening = True

    def disconnect(self) -> None:
        self._listening = False

    def _on_event(self, event: ev.Event) -> None:
        match event:
            case ev.TurnStarted(turn_id=str(tid)) if event.session_id:
                self._running[event.session_id] = tid
            case ev.Done() if event.session_id and self._running.get(event.session_id) == event.turn_id:
                del self._running[event.session_id]
        if self._listening:
            super()._on_event(event)

    def _on_state(self, state: str, reason: str) -> None:
        if self._listening:
            self.target.post_message(AttachState(state, reason))

    def _on_reset(self) -> None:
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

    async def probe_models(self) -> ModelsChecked:
        # The models are the attached aiops's to reach: its errors reach this console as events.
        return ModelsChecked({k: ModelProbe(k, True, "", self.describe_model(k)) for k in self.model_keys()})

    async def probe_model(self, key: str) -> ModelProbe:
        return ModelProbe(key, True, "", self.describe_model(key))

    # -- sessions and turns --

    async def sessions(self) -> list[dict[str, Any]]:
        return await self.remote.list_sessions()

    async def open_session(self, kind: str = "console") -> dict[str, Any]:
        # The server makes a session with its first message; until then it is this console's name.
        sid = f"console-{uuid.uuid4().hex[:8]}"
        return {"client_id": sid, "short_id": "", "kind": "api", "model": self.default_model(), "title": "",
                "state": "idle", "created_at": 0, "updated_at": 0, "message_count": 0}

    async def submit(self, session_id: str, text: str) -> str:
        try:
            data = await self.remote.submit(session_id, text)
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
        return self.remote.rate_usage()

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
