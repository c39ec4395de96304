"""The audit log keeps the newest entries when asked for a limited number."""

from __future__ import annotations

from pathlib import Path

from aiops.engine.store import Store


async def test_audit_limit_returns_the_newest_rows_oldest_first(tmp_path: Path) -> None:
    store = Store(tmp_path / "aiops.db")
    await store.open()
    try:
        for i in range(12):
            await store.add_audit("gate_opened", session_id="s" if i % 2 else "other", tool=f"t{i}")
        newest = await store.audit(limit=5)
        assert [r.tool for r in newest] == ["t7", "t8", "t9", "t10", "t11"]
        assert [r.tool for r in await store.audit("s", limit=2)] == ["t9", "t11"]
        assert len(await store.audit()) == 12
    finally:
        await store.close()
