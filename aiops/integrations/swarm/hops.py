"""What a swarm call carries across instances, and who this instance is.

Every `agent_call` sends `X-Aiops-Agent-Hops: depth=N; via=ID,ID,…`: the depth the call runs at
(1 for a call from a person's turn) and the ids of the instances it came through, first caller
first. Each instance refuses a call deeper than its own `max_agent_call_depth`, and a call whose
hop list already holds its own id (a loop, A → B → A). The depth is counted across processes: a
turn started by a call runs its tools at that depth, so its own calls go one deeper.

The instance id is made once and kept in the data dir (`instance_id`), so it survives restarts
and two instances never share one (one aiops per data dir).
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import uuid
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

HOPS_HEADER = "X-Aiops-Agent-Hops"
INSTANCE_FILE = "instance_id"
MAX_HOPS = 32  # a header beyond this is malformed, whatever the depth limits say
_ID = re.compile(r"[0-9a-f]{32}")
_HEADER = re.compile(r"\s*depth\s*=\s*(\d{1,4})\s*;\s*via\s*=\s*([0-9a-f,\s]*)")


class HopsError(ValueError):
    """The header is not one this format reads (the message says what is wrong)."""


@dataclass(frozen=True, slots=True)
class Hops:
    depth: int  # the depth the called turn runs at: 1 for a call made by a person's turn
    via: tuple[str, ...]  # instance ids, the first caller first

    def header(self) -> str:
        return f"depth={self.depth}; via={','.join(self.via)}"

    def chain(self, own_id: str) -> str:
        """The call's path in short ids, ending here: `3f2a9c1e → 77b0d4aa → 3f2a9c1e`."""
        return " → ".join(short(i) for i in (*self.via, own_id))


def short(instance: str) -> str:
    return instance[:8]


def parse_hops(value: str) -> Hops:
    m = _HEADER.fullmatch(value)
    if m is None:
        raise HopsError(f"{HOPS_HEADER}: expected 'depth=N; via=ID,ID' (instance ids: 32 hex digits), "
                        f"not {value[:80]!r}")
    via = tuple(p.strip() for p in m.group(2).split(",") if p.strip())
    if not via or len(via) > MAX_HOPS or not all(_ID.fullmatch(i) for i in via):
        raise HopsError(f"{HOPS_HEADER}: via must list 1 to {MAX_HOPS} instance ids of 32 hex digits")
    depth = int(m.group(1))
    if depth < 1:
        raise HopsError(f"{HOPS_HEADER}: depth must be at least 1")
    return Hops(depth, via)


def refusal(hops: Hops, own_id: str, max_depth: int) -> str | None:
    """Why this instance refuses the call, or None when it takes it."""
    if own_id in hops.via:
        return (f"agent_call refused: the call came back to an aiops already in its chain, a loop "
                f"({hops.chain(own_id)}); ask the peer for what it knows instead of sending it on")
    if hops.depth > max_depth:
        return (f"agent_call refused: this call would run at depth {hops.depth}, deeper than this "
                f"aiops allows (max_agent_call_depth = {max_depth} in its limits.toml)")
    return None


def instance_id(data_dir: Path) -> str:
    """This instance's id: read from the data dir, made there (32 hex digits) the first time."""
    path = data_dir / INSTANCE_FILE
    try:
        text = path.read_text().strip()
    except FileNotFoundError:
        text = ""
    if _ID.fullmatch(text):
        return text
    if text:
        log.warning("%s does not hold an instance id (32 hex digits); making a new one", path)
    new = uuid.uuid4().hex
    data_dir.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{INSTANCE_FILE}.{os.getpid()}")
    tmp.write_text(new + "\n")
    os.replace(tmp, path)
    return new


def remote_session_id(instance: str, session_id: str, peer: str) -> str:
    """The peer's session for calls from one session of this instance to that peer: the same one
    every time (one remote conversation), never a name the model chose. A full sha256, so no
    other caller's session can be hit by chance or by trying."""
    digest = hashlib.sha256(f"{instance}\0{session_id}\0{peer}".encode()).hexdigest()
    return f"swarm-{digest}"
