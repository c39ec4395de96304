"""The `slack` plugin: the agent in Slack threads, a view of the engine like the console.

Events come in over Socket Mode (slack-sdk's aiohttp client), replies go out through the async Web
API client. The plugin calls only the engine's facade (submit, stop_turn, resolve_gate, subscribe,
...) and reads typed events. Modules: `settings` (the plugins.toml table), `markup` (Slack markup
to text, Markdown to mrkdwn), `splitting` (long answers in parts), `intake` (which Slack events
are user messages, once each), `poster` (Web API calls with retries), `gate_blocks` (what a thread
shows of a gate), `threads` (one message's turn, followed in its thread) and `plugin`.
"""
