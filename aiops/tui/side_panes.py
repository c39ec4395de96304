"""The rate-limits table and the prompt tree, kept in step with the selected session.

Both show the selected session's view (its rate usage; its model's prompt folder), so the App asks
for a refresh when the selection, the session's model or the limits change. The panes post what the
operator asked for (re-enable a tool type, re-read the prompt, edit a section) and the App's handlers
delegate here. Saving a section runs in a worker; it only notifies and refreshes afterwards, on the
App's loop.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

from aiops.tui.widgets.limits import LimitsTable
from aiops.tui.widgets.prompt_tree import PromptPane

if TYPE_CHECKING:
    from pathlib import Path

    from aiops.tui.app import AiopsApp


class SidePanes:
    """Rate limits and the prompt tree of the selected session."""

    def __init__(self, app: AiopsApp) -> None:
        self.app = app

    def refresh_limits(self) -> None:
        app = self.app
        if app.services_ready:
            app.main.query_one(LimitsTable).show_usage(app.adapter.rate_usage(app.selected))

    def enable_rate(self, msg: LimitsTable.EnableRequested) -> None:
        app = self.app
        if app.adapter.enable_rate(msg.session_id, msg.tool_type):
            app.notify(f"{msg.tool_type} re-enabled for session "
                       f"{app.sessions_list.short_id(msg.session_id)}", timeout=4)
        self.refresh_limits()

    def refresh_prompt(self) -> None:
        app = self.app
        if not app.services_ready:
            return
        model = app.selected_model()
        folder, tree = app.adapter.prompt_tree(model)
        app.main.query_one(PromptPane).show(model, folder, tree, app.adapter.tool_names())

    def reload_prompt(self) -> None:
        app = self.app
        folder = app.adapter.prompt_folder(app.selected_model())
        if folder is not None:
            app.adapter.reload_prompt(folder)
        self.refresh_prompt()
        app.notify("prompt tree re-read", timeout=2)

    def edit_prompt(self, msg: PromptPane.EditRequested) -> None:
        def saved(text: str | None) -> None:
            if text is not None:
                # A partial of a coroutine function, as Textual's @work passes it (run_worker's annotation
                # wants a zero-argument callable; Textual runs a partial's coroutine all the same).
                self.app.run_worker(partial(self._save_section, msg.folder, msg.section, text),  # type: ignore[arg-type]
                                    name="_save_section", group="prompt", exit_on_error=False)

        from aiops.tui.screens.modals import PromptEditScreen  # imported when first needed

        self.app.push_screen(PromptEditScreen(msg.section, msg.body), saved)

    async def _save_section(self, folder: Path, section: str, text: str) -> None:
        app = self.app
        try:
            summary = await app.adapter.save_prompt_section(folder, app.selected, section, text)
        except Exception as e:  # noqa: BLE001 - PromptEditError and I/O errors, said plainly
            app.notify(f"not saved: {e}", severity="error", timeout=10)
            return
        app.notify(summary, timeout=5)
        self.refresh_prompt()
