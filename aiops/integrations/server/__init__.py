"""The embedded HTTP server: the aiops API (`/api/v1`), the OpenAI- and Ollama-compatible proxy.

One aiohttp application on the engine's event loop. `create_app` builds it, `start_server` runs it
for an engine already started (the console), `serve` is `aiops serve`.
"""

from aiops.integrations.server.app import create_app
from aiops.integrations.server.context import CONFIG_KEY, ENGINE_KEY
from aiops.integrations.server.run import ServerHandle, ServerStartError, serve, start_server

__all__ = ["CONFIG_KEY", "ENGINE_KEY", "ServerHandle", "ServerStartError", "create_app", "serve",
           "start_server"]
