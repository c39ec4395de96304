"""The proxy core: what the OpenAI- and Ollama-compatible dialects share.

A chat request's path, top to bottom:

1. the dialect (`openai_proxy`, `ollama_proxy`) parses the body into `ClientMessage`s (messages)
   and finds the published model (models);
2. an Open WebUI background prompt (openwebui) is answered by one model call (`driver.answer_task`);
   anything else is an agent turn (`driver.answer_turn`): the conversation is named (identity),
   matched to a session or forked (sessions, matching), its missing history imported, the new
   message submitted;
3. the turn's typed events become chat text (output, status) and the dialect's `Framer` writes
   them, streamed through a `Channel` (channel) or as one body.

`state` holds the proxy's settings and its sessions index, built when the app starts.
"""

from aiops.integrations.server.proxy.state import setup

__all__ = ["setup"]
