"""The logger slack-sdk's clients write to, with the tokens cut out of every record.

slack-sdk already redacts the Authorization header in its debug logs; this is the second line:
whatever it (or a future version) writes, a token never reaches aiops.log, not even a prefix.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

SDK_LOGGER = "aiops.integrations.slack.sdk"
REDACTED = "[redacted]"


class _Redact(logging.Filter):
    def __init__(self) -> None:
        super().__init__()
        self.secrets: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if any(s in message for s in self.secrets):
            for s in sorted(self.secrets, key=len, reverse=True):
                message = message.replace(s, REDACTED)
            record.msg, record.args = message, None
        if record.exc_info and record.exc_info[1] is not None:
            text = str(record.exc_info[1])
            if any(s in text for s in self.secrets):
                record.exc_info = None  # its text would carry the token into the log
                record.exc_text = None
        return True


_FILTER = _Redact()


def sdk_logger(secrets: Iterable[str]) -> logging.Logger:
    """The SDK clients' logger, redacting `secrets` (added to those of earlier calls)."""
    logger = logging.getLogger(SDK_LOGGER)
    _FILTER.secrets.update(s for s in secrets if s)
    if _FILTER not in logger.filters:
        logger.addFilter(_FILTER)
    return logger
