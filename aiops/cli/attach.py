"""`aiops attach [URL]`: the console on a running aiops. `aiops attach SESSION` (an argument that is
no URL) is the older read-only watch of one session, kept working: `aiops watch SESSION`."""

from __future__ import annotations

import argparse
import re

from aiops.cli.common import CliError, load, setup_file_logging

# http(s)://…, or host:port ([::1]:8765, localhost:8765): a session id is neither.
_URL = re.compile(r"^(https?://.+|(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+):\d{1,5})$")


def looks_like_url(text: str) -> bool:
    return bool(_URL.match(text))


def resolve_token(name: str | None) -> str | None:
    from aiops.integrations.remote.find import token_from_env

    try:
        return token_from_env(name)
    except KeyError:
        raise CliError(f"--token-env {name}: the variable {name} is not set") from None


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
    return run_attached(cfg, url.rstrip("/"), resolve_token(args.token_env))


def cmd_watch(args: argparse.Namespace) -> int:
    if args.url is None:
        cfg = load(args)
        args.url = default_url(cfg)
    from aiops.cli.server import cmd_attach

    return cmd_attach(args)
