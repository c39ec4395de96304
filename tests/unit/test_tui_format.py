"""Words the console uses for what happened, where no Pilot is needed to read them."""

from __future__ import annotations

import pytest

from aiops.tui.format import gate_outcome


@pytest.mark.parametrize(("info", "words"), [
    ({"decision": "approved", "scope": "once", "by": "console"}, "approved by console"),
    ({"decision": "approved", "scope": "session", "by": "api:ops"}, "approved for the session by api:ops"),
    ({"decision": "denied", "scope": "once", "by": "console"}, "denied by console"),
    ({"decision": "timeout", "scope": "once", "by": "timeout"}, "timed out"),
    ({"decision": "cancelled", "scope": "once", "by": "session deleted"}, "cancelled (session deleted)"),
])
def test_a_gates_outcome_reads_as_one_plain_phrase(info: dict[str, str], words: str) -> None:
    assert gate_outcome(info) == words
