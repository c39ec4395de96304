"""The backend interface every provider adapter implements."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Literal, Protocol

from aiops.config import ModelConfig
from aiops.engine.types import Message, StreamItem, ToolSpec

# What a failed model call says about the model, for advice that fits it (the console's banner):
# "key" — no API key, or the server refused it (401/403): set or fix the key;
# "connection" — no connection, or it broke or fell silent: the server is down or base_url is wrong;
# "server" — the server answered, with an error (5xx, 429, a bad or cut-off answer): it is reachable.
FailureCause = Literal["key", "connection", "server"]


def cause_of_status(status: int) -> FailureCause:
    return "key" if status in (401, 403) else "server"


class ModelError(Exception):
    """A model call failed. The message names the model, the URL and what failed; `cause` says
    which kind of failure it is (an HTTP status decides it when there is one, else the backend)."""

    def __init__(self, model_key: str, url: str, reason: str, *, status: int | None = None,
                 retryable: bool = False, discard_partial: bool = False,
                 cause: FailureCause | None = None) -> None:
        self.model_key = model_key
        self.url = url
        self.reason = reason
        self.status = status
        # Without a status the server may still have answered (a stream error, a cut-off answer):
        # "server" unless the backend says otherwise, so no failure is called unreachable unseen.
        self.cause: FailureCause = cause or (cause_of_status(status) if status is not None else "server")
        self.retryable = retryable
        # What streamed before the failure must not be kept (a runaway answer past its cap).
        self.discard_partial = discard_partial
        super().__init__(f"model {model_key!r} at {url}: {reason}")


def exception_chain(exc: BaseException) -> Iterator[BaseException]:
    """The exception and its causes/contexts, once each: backends read the root cause of a failure
    (a refused connection under an SDK error) to say what failed in plain words."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        yield e
        e = e.__cause__ or e.__context__


class Backend(Protocol):
    key: str
    config: ModelConfig

    def stream(self, messages: list[Message], tools: list[ToolSpec], *,
               system: str | None = None) -> AsyncIterator[StreamItem]:
        """Stream one model call.

        Yields TextDelta / ThinkingDelta as they arrive and exactly one Completion last.
        `messages` holds only model roles (user, assistant, tool). Raises ModelError.
        """
        ...

    async def aclose(self) -> None: ...
