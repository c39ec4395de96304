"""The header line: server address, clients, the selected session's model, gates, warnings."""

from __future__ import annotations

from typing import Any

from textual.content import Content
from textual.reactive import reactive
from textual.widget import Widget


class StatusBar(Widget):
    """One line; the gate badge lights up while anything waits for an operator."""

    DEFAULT_CSS = """
    StatusBar { height: 1; width: 1fr; }
    """

    server: reactive[str] = reactive("starting…")
    clients: reactive[int | None] = reactive(None)
    session: reactive[str] = reactive("")
    model: reactive[str] = reactive("")
    gates: reactive[int] = reactive(0)
    warning: reactive[str] = reactive("")
    running: reactive[int] = reactive(0)

    def render(self) -> Content:
        full = self._line(address=True)
        # On 80 columns our server's address and the warning do not fit together: the warning
        # matters now, the address is in `aiops.run` and the log. A state in that field (attached,
        # DISCONNECTED, server failed) stays.
        if self.warning and self.server.startswith("http") and full.cell_length > self.size.width > 0:
            return self._line(address=False)
        return full

    def _line(self, *, address: bool) -> Content:
        parts: list[Any] = [("aiops", "bold")]

        def sep() -> None:
            parts.append((" │ ", "dim"))

        if address:
            sep()
            parts.append(self.server)
            if self.clients is not None:
                sep()
                parts.append(f"{self.clients} client{'s' if self.clients != 1 else ''}")
        if self.session:
            sep()
            parts.append((self.session, "bold"))
            if self.model:
                parts.append(f" {self.model}")
        if self.running:
            sep()
            parts.append(f"▶ {self.running}")
        sep()
        if self.gates:
            parts.append((f" ⚑ {self.gates} gate{'s' if self.gates != 1 else ''} ", "bold reverse"))
        else:
            parts.append(("⚑ 0", "dim"))
        if self.warning:
            sep()
            parts.append((f"⚠ {self.warning}", "bold yellow"))
        return Content.assemble(*parts)
