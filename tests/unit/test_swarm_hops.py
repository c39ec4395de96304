"""The swarm call's identity: this instance's id in the data dir, and the remote session's name."""

from __future__ import annotations

import re
from pathlib import Path

from aiops.integrations.swarm.hops import Hops, instance_id, parse_hops, remote_session_id


def test_the_instance_id_is_made_once_and_kept_in_the_data_dir(tmp_path: Path) -> None:
    data = tmp_path / "data"
    first = instance_id(data)
    assert re.fullmatch(r"[0-9a-f]{32}", first)
    assert (data / "instance_id").read_text().strip() == first
    assert instance_id(data) == first                       # a restart reads it back
    assert instance_id(tmp_path / "other") != first         # another data dir, another instance


def test_an_unreadable_instance_file_is_replaced_by_a_new_id(tmp_path: Path) -> None:
    (tmp_path / "instance_id").write_text("not an id\n")
    new = instance_id(tmp_path)
    assert re.fullmatch(r"[0-9a-f]{32}", new) and instance_id(tmp_path) == new


def test_the_remote_session_is_a_full_hash_of_instance_session_and_peer() -> None:
    a, b = "a" * 32, "b" * 32
    sid = remote_session_id(a, "console-1", "billing")
    assert re.fullmatch(r"swarm-[0-9a-f]{64}", sid)
    assert remote_session_id(a, "console-1", "billing") == sid  # every call of that session to that peer
    assert len({sid, remote_session_id(b, "console-1", "billing"), remote_session_id(a, "console-2", "billing"),
                remote_session_id(a, "console-1", "ops")}) == 4


def test_the_header_reads_back_what_a_caller_writes() -> None:
    hops = Hops(2, ("a" * 32, "b" * 32))
    assert hops.header() == f"depth=2; via={'a' * 32},{'b' * 32}"
    assert parse_hops(hops.header()) == hops
    assert hops.chain("c" * 32) == "aaaaaaaa → bbbbbbbb → cccccccc"
