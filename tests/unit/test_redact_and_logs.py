"""Credentials in SQL masked, and log records that cannot forge others (issue 20, item 5)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from aiops.gates.redact import mask_sql_secrets
from aiops.logs import log_file_handler


@pytest.mark.parametrize(("sql", "shown"), [
    ("CREATE USER u@'%' IDENTIFIED BY 'pw'", "CREATE USER u@'%' IDENTIFIED BY '***'"),
    ("create user u identified by \"pw\"", "create user u identified by '***'"),
    ("ALTER USER u IDENTIFIED BY PASSWORD '*ABCDEF'", "ALTER USER u IDENTIFIED BY PASSWORD '***'"),
    ("GRANT ALL ON *.* TO u IDENTIFIED/**/BY\n 'p''w'", "GRANT ALL ON *.* TO u IDENTIFIED/**/BY\n '***'"),
    ("CREATE USER u IDENTIFIED VIA ed25519 USING PASSWORD('pw') OR unix_socket",
     "CREATE USER u IDENTIFIED VIA ed25519 USING PASSWORD('***') OR unix_socket"),
    ("CREATE USER u IDENTIFIED WITH mysql_native_password AS '*HASH'",
     "CREATE USER u IDENTIFIED WITH mysql_native_password AS '***'"),
    ("SET PASSWORD FOR 'u'@'h' = PASSWORD('pw'); SELECT 1", "SET PASSWORD FOR 'u'@'h' = '***'; SELECT 1"),
    ("SET PASSWORD = 'pw'", "SET PASSWORD = '***'"),
    ("CHANGE MASTER TO MASTER_USER='r', MASTER_PASSWORD='pw'", "CHANGE MASTER TO MASTER_USER='r', MASTER_PASSWORD='***'"),
    ("CREATE SERVER s FOREIGN DATA WRAPPER mysql OPTIONS (USER 'r', PASSWORD 'pw')",
     "CREATE SERVER s FOREIGN DATA WRAPPER mysql OPTIONS (USER 'r', PASSWORD '***')"),
    ("SELECT AES_ENCRYPT(card, 'key') FROM t", "SELECT AES_ENCRYPT(card, '***') FROM t"),
    ("CREATE USER u IDENTIFIED BY 'never closed", "CREATE USER u IDENTIFIED BY '***'"),
    # Nothing to mask: left exactly as written.
    ("SELECT * FROM t WHERE name = 'IDENTIFIED BY'", "SELECT * FROM t WHERE name = 'IDENTIFIED BY'"),
    ("SELECT password FROM accounts ORDER BY 1", "SELECT password FROM accounts ORDER BY 1"),
])
def test_credentials_in_sql_are_masked(sql: str, shown: str) -> None:
    assert mask_sql_secrets(sql) == shown


def test_log_lines_escape_what_callers_pass_and_mask_passwords(tmp_path: Path) -> None:
    path = tmp_path / "aiops.log"
    handler = log_file_handler(path)
    log = logging.getLogger("aiops.test_logs")
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False
    try:
        forged = "2030-01-01 00:00:00,000 ERROR aiops: forged"
        log.warning("tool said %s", f"x\n{forged}\r\x1b[2Jy\u2028z")
        log.info("ran %s", "CREATE USER u IDENTIFIED BY 'hunter2'")
        try:
            raise ValueError(f"bad\n{forged}")
        except ValueError:
            log.exception("failed")
    finally:
        log.removeHandler(handler)
        handler.close()
    lines = path.read_text(encoding="utf-8").splitlines()
    assert "tool said x\\n2030-01-01 00:00:00,000 ERROR aiops: forged\\r\\x1b[2Jy\\u2028z" in lines[0]
    assert lines[1].endswith("ran CREATE USER u IDENTIFIED BY '***'")
    assert lines[2].endswith("ERROR aiops.test_logs: failed")
    # The traceback stays readable, every line of it marked as part of the record above.
    assert all(line.startswith("    | ") for line in lines[3:]) and len(lines) > 4
    assert not any(line.startswith(forged) for line in lines)
    assert "hunter2" not in path.read_text()
