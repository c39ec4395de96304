"""Credentials in SQL text, masked for everything that shows or keeps it: log lines, the audit log,
the gate's summary and arguments as operators read them.

`CREATE USER u IDENTIFIED BY 'pw'` is shown as `CREATE USER u IDENTIFIED BY '***'`. The statement
that runs is never changed: only the copies made for people are. The patterns lean towards masking
too much: a string after `PASSWORD =` in an ordinary WHERE clause is masked too, which costs an
operator a `***` where a password-looking literal was, never a password in a file.

Covered: `IDENTIFIED BY [PASSWORD] '…'`, `IDENTIFIED {VIA|WITH} plugin {USING|AS} '…'` (and
`… OR plugin USING '…'`), `PASSWORD('…')` / `OLD_PASSWORD('…')`, `SET PASSWORD … = '…'`,
`PASSWORD '…'` / `PASSWORD = '…'` (CREATE SERVER options, START SLAVE), `MASTER_PASSWORD = '…'`,
and the key argument of `AES_ENCRYPT` / `AES_DECRYPT` / `DES_ENCRYPT` / `DES_DECRYPT` / `ENCRYPT`.
"""

from __future__ import annotations

import re

MASK = "'***'"

# A quoted literal as MySQL reads one (either quote; doubled quotes and backslash escapes inside),
# with an optional charset introducer (_utf8mb4'…') or N'…'; an unterminated one runs to the end.
_STRING = r"""(?:_[a-z0-9]+\s*|n)?(?:'(?:[^'\\]|\\.|'')*(?:'|$)|"(?:[^"\\]|\\.|"")*(?:"|$))"""
# Space between words, comments included: `IDENTIFIED/**/BY` is what the server reads as two words.
_GAP = r"(?:\s|/\*.*?\*/|--[^\n]*\n|#[^\n]*\n)+"
_OPT_GAP = rf"(?:{_GAP})?"

_BEFORE_SECRET = "|".join([
    rf"\bIDENTIFIED{_GAP}BY{_GAP}(?:PASSWORD{_GAP})?",
    rf"\bIDENTIFIED{_GAP}(?:VIA|WITH){_GAP}\w+{_GAP}(?:USING|AS){_GAP}(?:PASSWORD{_OPT_GAP}\({_OPT_GAP})?",
    rf"\bOR{_GAP}\w+{_GAP}(?:USING|AS){_GAP}(?:PASSWORD{_OPT_GAP}\({_OPT_GAP})?",
    rf"\b(?:OLD_)?PASSWORD{_OPT_GAP}\({_OPT_GAP}",
    rf"\b(?:MASTER_|PRIMARY_)?PASSWORD{_OPT_GAP}={_OPT_GAP}",
    rf"\bPASSWORD{_GAP}",
    # The key of the encryption functions: `AES_ENCRYPT(col, 'key')`.
    rf"\b(?:AES|DES)_(?:EN|DE)CRYPT{_OPT_GAP}\((?:[^(),']|'(?:[^'\\]|\\.|'')*')*,{_OPT_GAP}",
    rf"\bENCRYPT{_OPT_GAP}\((?:[^(),']|'(?:[^'\\]|\\.|'')*')*,{_OPT_GAP}",
])
_SECRET = re.compile(rf"((?:{_BEFORE_SECRET})){_STRING}", re.IGNORECASE | re.DOTALL)
# `SET PASSWORD [FOR user] = …`: everything after the `=` is the secret (a string, or PASSWORD(…)).
_SET_PASSWORD = re.compile(rf"(\bSET{_GAP}PASSWORD\b[^=]*={_OPT_GAP}).*?(?=;|$)", re.IGNORECASE | re.DOTALL)


def mask_sql_secrets(text: str) -> str:
    """`text` with the credentials in any SQL it holds replaced by '***'."""
    if not _might_hold_secret(text):
        return text
    text = _SET_PASSWORD.sub(lambda m: m.group(1) + MASK, text)
    return _SECRET.sub(lambda m: m.group(1) + MASK, text)


def _might_hold_secret(text: str) -> bool:
    # Cheap first look: the patterns all need one of these words.
    upper = text.upper()
    return any(word in upper for word in ("IDENTIFIED", "PASSWORD", "CRYPT"))
