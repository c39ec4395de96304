"""Model reachability and the guidance shown when the selected session's model does not answer.

The probe at start-up (and `check models`) says which configured models answer; each turn's `done`
says what became of the model it ran on — its session's, or a one-turn `@model`'s, never confused
(the `error` event names no model). A whole answer marks it reachable; so does an error its server
answered with (HTTP 500, a stream error: it is reachable, and the error line in the chat says it
all); a call that failed for want of a key or a connection marks it unusable, with that cause.

When the selected session's model is unusable, a banner above the chat says why and what fits that
cause (the key to set, or the server and `base_url` to check), and which models answer now:
commands, sessions and gates work without a model, so the console stays useful meanwhile. It takes
at most three lines on a small terminal (one each: what, what to do, what else; cut with `…`), F1
shows it whole, and `app.hide_guidance` hides it until the picture changes. Owned by the App, which
feeds it from its event handlers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from textual.content import Content

from aiops.engine import events as ev
from aiops.integrations.model_probe import turn_verdict
from aiops.tui.adapter import ModelProbe
from aiops.tui.format import one_line

if TYPE_CHECKING:
    from aiops.tui.app import AiopsApp

REASON_WIDTH = 200


class ModelGuidance:
    """The last known reachability of each model, and the banner and status warning it implies."""

    def __init__(self, app: AiopsApp) -> None:
        self.app = app
        self.probes: dict[str, ModelProbe] = {}
        # The banner the operator hid (its lines): it stays hidden until what it would say changes.
        self.hidden: tuple[str, ...] | None = None
        self.lines: tuple[str, ...] = ()  # what the banner says (or would, hidden)

    def checked(self, probes: dict[str, ModelProbe]) -> None:
        self.probes = dict(probes)
        self.update()

    def answered(self, done: ev.Done) -> None:
        """A turn ended: what it says of the model it ran on (`done.model`)."""
        verdict = turn_verdict(done)
        if verdict is None:
            return
        ok, why = verdict
        model = done.model
        self.probes[model] = ModelProbe(model, ok, one_line(why.reason, REASON_WIDTH) if why else "",
                                        self.app.adapter.describe_model(model), why.cause if why else "")
        self.update()

    def toggle(self) -> None:
        """Hide the banner, or show the hidden one again."""
        if not self.lines:
            self.app.notify("no model warning to show", timeout=3)
            return
        self.hidden = None if self.hidden == self.lines else self.lines
        self._show()

    def help_markdown(self) -> str:
        """The banner whole, for F1 ("" when there is none)."""
        if not self.lines:
            return ""
        return "### Model\n\n" + "\n\n".join(self.lines) + "\n\n"

    def update(self) -> None:
        app = self.app
        reachable = sorted(k for k, p in self.probes.items() if p.ok)
        model = app.selected_model()
        probe = self.probes.get(model)
        if not self.probes:
            app.status.warning = ""
        elif not reachable:
            app.status.warning = "no model reachable"
        elif probe is not None and not probe.ok:
            app.status.warning = f"model {model} {'needs a key' if probe.cause == 'key' else 'unreachable'}"
        else:
            app.status.warning = ""
        self.lines = self._lines(model, probe, reachable) if probe is not None and not probe.ok else ()
        self._show()

    def _show(self) -> None:
        guidance = self.app.main.query_one("#guidance")
        if not self.lines or self.hidden == self.lines:
            guidance.remove_class("-shown")
            return
        guidance.update(Content("\n".join(self.lines)))  # type: ignore[attr-defined]
        guidance.add_class("-shown")

    def _lines(self, model: str, probe: ModelProbe, reachable: list[str]) -> tuple[str, ...]:
        """What is wrong, what to do about it, what else there is: one line each, so that a small
        terminal, which cuts each at its width, still shows all three (the reason before the
        model's address, which the reason often repeats)."""
        app = self.app
        cfg_dir = app.cfg.paths.config_dir
        if probe.cause == "key":
            key_env = app.adapter.key_env(model)
            if key_env is None:  # an attached console: the attached aiops's configuration names it
                what = f"⚠ Model {model} has no usable API key: {probe.reason} ({probe.description})."
                todo = ("Set the variable its api_key_env names (models.toml) to a key its server accepts, "
                        "in the environment or .env of the aiops you are attached to.")
            elif key_env:
                what = f"⚠ Model {model} has no usable API key: {probe.reason} ({probe.description})."
                todo = (f"Set {key_env} in the environment or {cfg_dir}/.env to a key its server accepts, "
                        f"or run `aiops config init` and pick another default_model in models.toml.")
            else:
                what = f"⚠ Model {model} asks for an API key: {probe.reason} ({probe.description})."
                todo = (f"Name the variable that holds it as api_key_env for {model} in {cfg_dir}/models.toml "
                        f"(`aiops config init` writes one), and set it in the environment or .env.")
        else:
            what = f"⚠ Model {model} is not reachable: {probe.reason} ({probe.description})."
            todo = (f"Check that its server runs and answers there, or correct base_url for {model} in "
                    f"{cfg_dir}/models.toml (`aiops config init` writes one; llama.cpp, Ollama, vLLM).")
        hide, helpkey = app.key_name("app.hide_guidance"), app.key_name("app.help")
        others = f"Reachable now: {', '.join(reachable)}." if reachable else "No configured model answers."
        rest = (f"{hide} hides this, {helpkey} shows it whole · {others} !model KEY switches this session; "
                f"`aiops models` lists them. Commands, sessions and gates work without a model.")
        return what, todo, rest
