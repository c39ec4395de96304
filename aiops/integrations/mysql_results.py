"""What a statement run by aiops.integrations.mysql returns: `QueryResult`, as a table for the model
and as JSON-safe data."""

from __future__ import annotations

import datetime as dt
import decimal
from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class QueryResult:
    """The outcome of one statement.

    Statements that return a result set have `columns` and `rows` (at most max_rows of them; all of
    `total_rows` were read from the server) and `affected_rows` None. Other statements have no
    columns and `affected_rows` set.
    """

    columns: list[str]
    rows: list[tuple[Any, ...]]
    total_rows: int
    truncated: bool
    affected_rows: int | None
    elapsed_ms: float
    statement: str = ""
    warnings: list[str] = field(default_factory=list)

    @property
    def has_result_set(self) -> bool:
        return self.affected_rows is None

    def to_text(self, max_cell_chars: int = 80) -> str:
        """A compact table for the model: header, separator, rows, then what was left out."""
        lines: list[str] = []
        if not self.has_result_set:
            n = self.affected_rows or 0
            lines.append(f"{n} row{'' if n == 1 else 's'} affected")
        else:
            header = [_clip(c, max_cell_chars) for c in self.columns]
            body = [[_clip(_cell_text(v), max_cell_chars) for v in row] for row in self.rows]
            widths = [max([len(h)] + [len(r[i]) for r in body]) for i, h in enumerate(header)]
            lines.append(" | ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)).rstrip())
            lines.append("-+-".join("-" * w for w in widths))
            for r in body:
                lines.append(" | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
            hidden = self.total_rows - len(self.rows)
            if hidden > 0:
                lines.append(f"{hidden} more row{'' if hidden == 1 else 's'} not shown")
            elif not self.rows:
                lines.append("(0 rows)")
        lines.extend(f"warning: {w}" for w in self.warnings)
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """Structured and JSON-safe: rows are lists aligned with `columns` (names may repeat)."""
        return {
            "statement": self.statement,
            "columns": list(self.columns),
            "rows": [[_json_value(v) for v in row] for row in self.rows],
            "total_rows": self.total_rows,
            "truncated": self.truncated,
            "affected_rows": self.affected_rows,
            "elapsed_ms": round(self.elapsed_ms, 3),
            "warnings": list(self.warnings),
        }


def _time_text(td: dt.timedelta) -> str:
    # MySQL TIME values arrive as timedelta; show them the way the server does ([-]HH:MM:SS[.ffffff]).
    sign = "-" if td < dt.timedelta(0) else ""
    td = abs(td)
    total_us = (td.days * 86400 + td.seconds) * 1_000_000 + td.microseconds
    secs, us = divmod(total_us, 1_000_000)
    hours, rem = divmod(secs, 3600)
    minutes, seconds = divmod(rem, 60)
    text = f"{sign}{hours:02d}:{minutes:02d}:{seconds:02d}"
    return f"{text}.{us:06d}" if us else text


def _bytes_text(b: bytes) -> str:
    try:
        return b.decode("utf-8")
    except UnicodeDecodeError:
        return "0x" + b.hex()


def _cell_text(v: Any) -> str:
    if v is None:
        return "NULL"
    if isinstance(v, bytes | bytearray | memoryview):
        text = _bytes_text(bytes(v))
    elif isinstance(v, dt.datetime):
        text = v.isoformat(sep=" ")
    elif isinstance(v, dt.timedelta):
        text = _time_text(v)
    elif isinstance(v, set | frozenset):
        text = ",".join(sorted(str(x) for x in v))
    else:
        text = str(v)
    # One table row per result row: control characters would break the layout.
    return text.replace("\r", "\\r").replace("\n", "\\n").replace("\t", "\\t")


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: max(limit - 1, 0)] + "…"


def _json_value(v: Any) -> Any:
    if v is None or isinstance(v, bool | int | str):
        return v
    if isinstance(v, float):
        return v if v == v and v not in (float("inf"), float("-inf")) else str(v)
    if isinstance(v, decimal.Decimal):
        # A string keeps the exact value; a float would round money.
        return str(v)
    if isinstance(v, dt.datetime | dt.date | dt.time):
        return v.isoformat()
    if isinstance(v, dt.timedelta):
        return _time_text(v)
    if isinstance(v, bytes | bytearray | memoryview):
        return _bytes_text(bytes(v))
    if isinstance(v, set | frozenset):
        return sorted(str(x) for x in v)
    return str(v)
