"""The aiohttp application: every HTTP surface on one app, assembled here and nowhere else.

Below the surfaces, what they share: `errors` (HttpError, each surface's error shape), `context`
(the app's keys and ServerState, the engine, the caller's role), `bodies` (bounded reads, strict
JSON, validation), `middlewares` (errors, then authentication), `cors`, `owners`, `addresses`.
The surfaces: `api` (`/api/v1`), `openai_proxy` (`/v1`) and `ollama_proxy` (`/api/*`), the last two
over the proxy core (`proxy/`), whose state is built as the app starts.
"""

from __future__ import annotations

from collections.abc import Mapping

from aiohttp import web
from aiohttp.typedefs import Middleware

from aiops.config import Config
from aiops.engine.engine import Engine
from aiops.integrations.server import api, cors, ollama_proxy, openai_proxy, operator_api, proxy
from aiops.integrations.server.auth import Authenticator, FailedAuthThrottle, Token, load_tokens
from aiops.integrations.server.context import AUTH_KEY, CONFIG_KEY, ENGINE_KEY, STATE_KEY, ServerState
from aiops.integrations.server.middlewares import auth_middleware, error_middleware


def create_app(engine: Engine, cfg: Config | None = None, *, env: Mapping[str, str] | None = None,
               tokens: list[Token] | None = None) -> web.Application:
    """The application with every surface mounted.

    Tokens are `tokens` when given, else loaded from `env` (default: the engine's environment).
    """
    cfg = cfg or engine.config
    # Last, so that only an authenticated request learns where a path would lead: a client whose
    # base URL ends in "/" (".../v1//chat/completions") or one that adds a trailing slash is
    # sent to the route with a 308, which keeps the method and the body.
    middlewares: list[Middleware] = [error_middleware, auth_middleware,
                                     web.normalize_path_middleware(append_slash=False, remove_slash=True)]
    if cfg.app.server.cors_origins:
        # First: a browser's preflight carries no token, so it is answered before authentication.
        middlewares.insert(0, cors.cors_middleware)
    app = web.Application(client_max_size=cfg.app.server.max_body_bytes, middlewares=middlewares)
    cors.setup(app, cfg.app.server.cors_origins)
    app[ENGINE_KEY] = engine
    app[CONFIG_KEY] = cfg
    if tokens is None:
        tokens = load_tokens(cfg.app.auth, env if env is not None else engine.env)
    app[AUTH_KEY] = Authenticator(tokens, FailedAuthThrottle(cfg.app.auth.failed_auth_limit,
                                                             cfg.app.auth.failed_auth_window_seconds))
    app[STATE_KEY] = ServerState(public={("GET", "/"), ("HEAD", "/")})
    operator_api.setup_feed(app, engine)  # before any route: every event is numbered from the start
    proxy.setup(app)
    api.setup(app)
    openai_proxy.setup(app)
    ollama_proxy.setup(app)
    return app
