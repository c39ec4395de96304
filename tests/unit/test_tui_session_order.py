"""The sessions list's order kept incrementally is the order a full sort gives, after any changes."""

from __future__ import annotations

import random
from typing import Any

from aiops.tui.widgets.session_order import KIND_ORDER, SessionOrder


def sorted_order(sessions: dict[str, dict[str, Any]], arrived: list[str]) -> list[tuple[str, list[str]]]:
    """The list's order as the pane showed it before: kinds in KIND_ORDER (others by name), last active
    first, ties in the order the sessions arrived."""
    by_kind: dict[str, list[str]] = {}
    for sid in arrived:
        if sid in sessions:
            by_kind.setdefault(sessions[sid].get("kind") or "api", []).append(sid)
    kinds = [k for k in KIND_ORDER if k in by_kind] + sorted(set(by_kind) - set(KIND_ORDER))
    return [(k, sorted(by_kind[k], key=lambda sid: -(sessions[sid].get("updated_at") or 0))) for k in kinds]


def shown(order: SessionOrder) -> list[tuple[str, list[str]]]:
    return [(k, list(order.group(k))) for k in order.kinds()]


def test_changes_placed_one_by_one_give_the_order_of_a_full_sort():
    rng = random.Random(7)
    kinds = [*KIND_ORDER, "zeta", "alpha"]
    sessions = {f"s{i}": {"kind": rng.choice(kinds), "updated_at": float(rng.randrange(50))} for i in range(300)}
    arrived = list(sessions)
    order = SessionOrder()
    order.reset(sessions)
    assert shown(order) == sorted_order(sessions, arrived)
    n = len(sessions)
    for _ in range(200):
        changed: set[str] = set()
        for _ in range(rng.randrange(1, 12)):
            what = rng.random()
            sid = rng.choice(list(sessions)) if sessions else f"s{n}"
            if what < 0.6:  # it spoke (ties on purpose: few distinct times)
                sessions[sid]["updated_at"] = float(rng.randrange(60))
            elif what < 0.7:  # its kind changed (a session read again from another source)
                sessions[sid]["kind"] = rng.choice(kinds)
            elif what < 0.85:  # deleted
                sessions.pop(sid)
            else:  # a new one
                sid = f"s{n}"
                n += 1
                sessions[sid] = {"kind": rng.choice(kinds), "updated_at": float(rng.randrange(60))}
                arrived.append(sid)
            changed.add(sid)
        order.update(sessions, changed)
        assert shown(order) == sorted_order(sessions, arrived)
