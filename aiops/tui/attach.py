"""Running the console attached to an aiops that runs elsewhere (another terminal, a service, a
host reached through `ssh -L`): `run_attached`, which `aiops attach URL` and `aiops` on a data dir
whose engine already runs both use. The App is the same; its adapter is `RemoteAdapter`.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from aiops.config import Config

log = logging.getLogger(__name__)


async def _check(url: str, token: str | None, timeout: float = 10.0) -> str:
    """Reach the server once before the screen is taken: a wrong URL or token is a plain error."""
    from aiops.integrations.remote import RemoteEngine

    remote = RemoteEngine(url, token, timeout=timeout)
    await remote.start(follow=False)
    try:
        return f"{remote.principal} ({remote.info.get('role')})"
    finally:
        await remote.close()


def attach_to_holder(cfg: Config, url: str) -> int | None:
    """`aiops` on a data dir whose aiops serves at `url`: the console attached to it (with the token
    in AIOPS_TOKEN, if any). None when it does not answer at all: the caller says who holds the data
    dir (a stuck process, how to end it) instead."""
    import os

    from aiops.integrations.remote import RemoteError
    from aiops.integrations.remote.find import client_url

    url, token = client_url(url), os.environ.get("AIOPS_TOKEN") or None
    if token is None:  # the operator token aiops.toml names (see aiops.cli.attach.resolve_token)
        from aiops.integrations.remote.find import operator_token

        token, _ = operator_token(cfg.paths.config_file("aiops.toml"))
    try:
        asyncio.run(_check(url, token, timeout=2.0))
    except RemoteError as e:
        if e.status == 0:
            return None
    return run_attached(cfg, url, token)


def run_attached(cfg: Config, url: str, token: str | None) -> int:
    """The console on the aiops at `url` until quit. Exit status 2 when it cannot be reached or
    refuses the token (said on stderr, before the screen is taken)."""
    from aiops.integrations.remote import RemoteEngine, RemoteError
    from aiops.tui.app import AiopsApp
    from aiops.tui.running import run_until_quit

    try:
        who = asyncio.run(_check(url, token))
    except RemoteError as e:
        from aiops.integrations.remote.find import operator_token_hint

        also = operator_token_hint(cfg.paths.config_file("aiops.toml"))
        hint = (f" (give an operator token: --token-env NAME, or AIOPS_TOKEN{also})" if e.status in (401, 403) else "")
        print(f"aiops: cannot attach to {url}: {e.message}{hint}", file=sys.stderr)
        return 2
    log.info("attaching to %s as %s", url, who)
    return run_until_quit(cfg, lambda: AiopsApp(cfg, remote=RemoteEngine(url, token), server=False),
                          "attached console")
