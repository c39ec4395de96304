"""Model reachability and the guidance shown when the selected session's model does not answer.

The probe at start-up (and `check models`) says which configured models answer; a model error in a
turn marks its model unreachable and a whole answer marks it reachable again, whatever the last probe
said. When the selected session's model is unreachable, a banner above the chat says what to set
and where, and which models answer now: commands, sessions and gates work without a model, so the
console stays useful meanwhile. Owned by the App, which feeds it from its event handlers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from textual.content import Content

from aiops.engine import events as ev
from aiops.tui.adapter import ModelProbe
from aiops.tui.format import one_line

if TYPE_CHECKING:
    from aiops.tui.app import AiopsApp


class ModelGuidance:
    """The last known reachability of each model, and the banner and status warning it implies."""

    def __init__(self, app: AiopsApp) -> None:
        self.app = app
        self.probes: dict[str, ModelProbe] = {}

    def checked(self, probes: dict[str, ModelProbe]) -> None:
        self.probes = dict(probes)
        self.update()

    def answered(self, done: ev.Done) -> None:
        """A whole answer: its model is reachable, whatever the last probe said."""
        model = done.model
        if model and done.status == "complete" and not done.command:
            self.probes[model] = ModelProbe(model, True, "", self.app.adapter.describe_model(model))
            self.update()

    def failed(self, error: ev.ErrorEvent) -> None:
        app = self.app
        info = app.sessions_list.sessions.get(error.session_id or "", {})
        key = info.get("model") or app.adapter.default_model()
        self.probes[key] = ModelProbe(key, False, one_line(error.message, 200), app.adapter.describe_model(key))
        self.update()

    def update(self) -> None:
        app = self.app
        guidance = app.main.query_one("#guidance")
        if not self.probes:
            guidance.remove_class("-shown")
            return
        reachable = sorted(k for k, p in self.probes.items() if p.ok)
        model = app.selected_model()
        probe = self.probes.get(model)
        if not reachable:
            app.status.warning = "no model reachable"
        elif probe is not None and not probe.ok:
            app.status.warning = f"model {model} unreachable"
        else:
            app.status.warning = ""
        if probe is None or probe.ok:
            guidance.remove_class("-shown")
            return
        cfg_dir = app.cfg.paths.config_dir
        text = (f"⚠ Model {model} ({probe.description}) is not reachable: {probe.reason}.\n"
                f"Set its key in the environment or {cfg_dir}/.env, or run `aiops config init` and edit "
                f"models.toml there (default_model, base_url for llama.cpp/Ollama/vLLM); `aiops models` "
                f"lists them, !model KEY switches this session. ")
        text += f"Reachable now: {', '.join(reachable)}." if reachable else "No configured model answers."
        text += " Commands, sessions and gates work without a model."
        guidance.update(Content(text))  # type: ignore[attr-defined]
        guidance.add_class("-shown")
