"""Splitting SQL into statements (routine bodies kept whole) and what a read may not run, for the
runner in aiops.integrations.mysql."""

from __future__ import annotations

import re
from dataclasses import dataclass

import sqlglot
from sqlglot.errors import TokenError
from sqlglot.tokens import Token, TokenType


@dataclass(frozen=True, slots=True)
class Statement:
    """One statement of the caller's SQL, as written."""

    text: str
    # Upper-cased token texts; empty when the tokenizer could not read the SQL.
    words: tuple[str, ...]


# After END, these words close an IF/LOOP/… that the splitter does not track.
_END_SUFFIXES = frozenset({"IF", "LOOP", "WHILE", "REPEAT", "FOR"})


def parse_statements(sql: str) -> list[Statement]:
    """`sql` split on top-level semicolons, each statement with its tokens (see split_statements)."""
    try:
        tokens = sqlglot.tokenize(sql, read="mysql")
    except TokenError:
        # The server will judge it; with multi-statements off it cannot run as several.
        text = sql.strip()
        return [Statement(text, ())] if text else []

    statements: list[Statement] = []
    start = 0
    current: list[Token] = []
    # Open BEGIN…END blocks and CASE…END, so semicolons inside a routine body do not split it.
    stack: list[str] = []
    skip_next_case = False

    def flush(end: int) -> None:
        if current:
            statements.append(Statement(sql[start:end].strip(), tuple(t.text.upper() for t in current)))

    for i, tok in enumerate(tokens):
        if tok.token_type == TokenType.SEMICOLON and "BEGIN" not in stack:
            flush(tok.start)
            start, current, stack = tok.end + 1, [], []
            continue
        nxt = tokens[i + 1].text.upper() if i + 1 < len(tokens) else ""
        if tok.token_type == TokenType.BEGIN and tok.text.upper() == "BEGIN":
            # `BEGIN;` / `BEGIN WORK` open a transaction; `BEGIN NOT ATOMIC` or a BEGIN later in a
            # statement (routine body, label) opens a compound block.
            if current or nxt == "NOT":
                stack.append("BEGIN")
        elif tok.token_type == TokenType.CASE:
            if skip_next_case:
                skip_next_case = False
            else:
                stack.append("CASE")
        elif tok.token_type == TokenType.END:
            if nxt == "CASE":
                skip_next_case = True
                if "CASE" in stack:
                    del stack[len(stack) - 1 - stack[::-1].index("CASE")]
            elif nxt not in _END_SUFFIXES and stack:
                stack.pop()
        current.append(tok)
    flush(len(sql))
    return statements


def split_statements(sql: str) -> list[str]:
    """Split on top-level semicolons, keeping each statement's original text (comments included)."""
    return [s.text for s in parse_statements(sql)]


# Statements a read may not run: they would end or replace the runner's read-only transaction.
_TRANSACTION_WORDS = frozenset({"BEGIN", "START", "COMMIT", "ROLLBACK", "SAVEPOINT", "RELEASE", "XA",
                                "LOCK", "UNLOCK"})
# Session variables a read may not SET: they switch the read-only protection or autocommit off.
_GUARDED_VARIABLES = frozenset({"TX_READ_ONLY", "TRANSACTION_READ_ONLY", "AUTOCOMMIT", "COMPLETION_TYPE"})
_GUARDED_RE = re.compile(r"\b(tx_read_only|transaction_read_only|autocommit|completion_type)\b|"
                         r"^\s*(begin|start|commit|rollback|savepoint|release|xa|lock|unlock)\b", re.I)


def read_refusal(stmt: Statement) -> str | None:
    """Why a read may not run `stmt` (it would leave or unlock the read-only transaction), or None."""
    if not stmt.words:
        return "it could not be tokenized" if _GUARDED_RE.search(stmt.text) else None
    first = stmt.words[0].split()[0]
    if first in _TRANSACTION_WORDS:
        return f"{first} controls the transaction"
    if first == "SET" and ("TRANSACTION" in stmt.words or _GUARDED_VARIABLES.intersection(stmt.words)):
        return "it changes the transaction mode"
    return None
