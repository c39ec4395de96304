"""`aiops attach [URL]`: the console on a running aiops. `aiops attach SESSION` (an argument that is
no URL) is the older read-only watch of one session, kept working: `aiops watch SESSION`."""

from __future__ import annotations

import argparse
import re
from typing import TYPE_CHECKING

from aiops.cli.common import CliError, load, setup_file_logging

if TYPE_CHECKING:
    from aiops.paths import Paths

# http(s)://…, or host:port ([::1]:8765, localhost:8765): a session id is neither.
_URL = re.compile(r"^(https?://.+|(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+):\d{1,5})$")


def looks_like_url(text: str) -> bool:
    return bool(_URL.match(text))


def resolve_token(name: str | None, paths: Paths | None = None) -> str | None:
    """`--token-env NAME`, else AIOPS_TOKEN, else (the aiops of this configuration) the operator
    token aiops.toml names, when its variable is set: the operator at the machine where aiops runs
    has it in the environment already, and a second variable for the same token was friction."""
    from aiops.integrations.remote.find import operator_token, token_from_env

    try:
        token = token_from_env(name)
    except KeyError:
        raise CliError(f"--token-env {name}: the variable {name} is not set") from None
    if token is None and name is None and paths is not None:
        token, _ = operator_token(paths.config_file("aiops.toml"))
    return token


def token_hint(paths: Paths | None) -> str:
    """What to set when a server asked for a token and none (or a wrong one) was given."""
    from aiops.integrations.remote.find import operator_token_hint

    also = operator_token_hint(paths.config_file("aiops.toml")) if paths is not None else ""
    return f" (give a token: --token-env NAME, or AIOPS_TOKEN{also})"


def default_url(cfg: object) -> str:
    """The aiops running on this data dir (its run file), else the server aiops.toml configures."""
    from aiops.cli.server import _local_url
    from aiops.integrations.remote.find import client_url, running_url

    paths = cfg.paths  # type: ignore[attr-defined]
    url = running_url(paths.data_dir, paths.lock_path)
    if url is not None:
        return client_url(url)
    server = cfg.app.server  # type: ignore[attr-defined]
    return _local_url(server.host, server.port)


def cmd_attach_any(args: argparse.Namespace) -> int:
    target = args.session
    if target is not None and not looks_like_url(target):
        from aiops.cli.server import cmd_attach

        return cmd_attach(args)  # `aiops attach SESSION`: the watch
    cfg = load(args)
    setup_file_logging(cfg, args.verbose)
    url = target or args.url or default_url(cfg)
    if "://" not in url:
        url = f"http://{url}"
    try:
        from aiops.tui.attach import run_attached
    except ImportError as e:
        raise CliError(f"the console is not available: {e}") from None
    return run_attached(cfg, url.rstrip("/"), resolve_token(args.token_env, cfg.paths))


def cmd_watch(args: argparse.Namespace) -> int:
    if args.url is None:
        cfg = load(args)
        args.url = default_url(cfg)
    from aiops.cli.server import cmd_attach

    return cmd_attach(args)
