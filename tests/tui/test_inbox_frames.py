"""The gates inbox paints again only the rows that changed (aiops/tui/widgets/gates.py,
`_repaint_changed`), and what the terminal shows stays what a full redraw shows: through gates
coming, leaving from the middle, the last one leaving, the cursor moving, a second ticking off."""

from __future__ import annotations

import dataclasses
import time

from textual.app import App, ComposeResult
from textual.containers import Horizontal
from textual.widgets import Static

from aiops.engine.events import GateInfo
from aiops.tui.widgets.gates import GatesInbox
from tests.support.terminal import Terminal, full


def gate(n: int, *, sql: bool = False) -> GateInfo:
    """A gate without a time limit: the inbox's one-second tick draws every row with a time left
    again, and on a loaded machine it fell inside the frames whose line counts are asserted below.
    The times left come in later ("a minute passed"), where what the terminal shows is checked."""
    args = {"sql": f"DELETE FROM t{n} WHERE id = {n}"} if sql else {"section": f"part {n}"}
    return GateInfo(id=f"g{n}", session_id=f"s{n}", client_id="c", client_kind="api",
                    tool="db_query" if sql else "update_system_prompt", tool_type="db" if sql else "builtin",
                    args=args, operation="write", tables=(f"test.t{n}",) if sql else (),
                    summary=f"change {n}", created_at=float(n), expires_at=None)


class Desk(App[None]):
    CSS = """
    #left { width: 30; }
    #gates { height: 1fr; border: none; background: transparent; }
    #gates > .option-list--option { padding: 0 1; }
    """

    def compose(self) -> ComposeResult:
        with Horizontal():
            yield Static("sessions\n" * 20, id="left")
            yield GatesInbox(id="gates")


async def test_the_inbox_draws_only_changed_rows_and_the_terminal_stays_right(terminal: Terminal) -> None:
    app = Desk()
    async with app.run_test(size=(110, 30)) as pilot:
        inbox = app.query_one(GatesInbox)
        await pilot.pause()
        terminal.start(app)

        async def step(what: str) -> int:
            drawn = len(terminal.drawn_lines)
            await pilot.pause()
            await pilot.pause()
            assert terminal.grid == full(app), what
            return sum(terminal.drawn_lines[drawn:])

        inbox.add(gate(1))
        first = await step("the first gate replaces the placeholder")
        inbox.add(gate(2, sql=True))
        second = await step("a second gate comes after it")
        inbox.add(gate(3))
        await step("a third")
        inbox.highlighted = 2
        await step("the cursor moves to the third")
        inbox.drop("g3")
        await step("the cursor's gate leaves: the cursor moves up to the second, whose row stays")
        inbox.add(gate(3))
        await step("the third again")
        inbox.drop("g2")
        await step("the middle one leaves")
        inbox.drop("g1")
        await step("the first leaves: the cursor's row moves up")
        inbox.add(gate(4, sql=True))
        await step("another comes")
        for gid, g in inbox.gates.items():  # every row's time left changes (a minute passed)
            inbox.gates[gid] = dataclasses.replace(g, expires_at=time.time() + 20)
        inbox.add(gate(5))
        await step("a gate comes while the others' times changed")
        for gid in list(inbox.gates):
            inbox.drop(gid)
        await step("all gone: the placeholder again")
    # A new gate's frame draws its own rows (four lines at most), not the inbox's 30.
    assert 0 < first <= 4, terminal.drawn_lines
    assert 0 < second <= 4, terminal.drawn_lines
