"""The `[slack]` table of plugins.toml."""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import Field

from aiops.engine.plugins import PluginSettings, PluginUnavailable


class SlackSettings(PluginSettings):
    # Names of environment variables, never the tokens: plugins.toml is not a secret store.
    app_token_env: str = "SLACK_APP_TOKEN"  # xapp-…: Socket Mode
    bot_token_env: str = "SLACK_BOT_TOKEN"  # xoxb-…: Web API
    api_url: str = "https://slack.com/api/"
    # Empty: everyone in the workspace / every channel the bot is in (and DMs).
    allowed_users: list[str] = Field(default_factory=list)
    allowed_channels: list[str] = Field(default_factory=list)
    # Slack user ids who may answer gates with the thread's buttons (none: the console only).
    approvers: list[str] = Field(default_factory=list)
    # Answer every message in channels the bot is in, not only mentions and its own threads.
    channel_messages: bool = False

    def tokens(self, env: Mapping[str, str]) -> tuple[str, str]:
        """(app token, bot token) from the environment; PluginUnavailable names what is missing
        or malformed (never any part of a value)."""
        found: list[str] = []
        for var, prefix, what in ((self.app_token_env, "xapp-", "app-level token, Socket Mode"),
                                  (self.bot_token_env, "xoxb-", "bot token, Web API")):
            value = (env.get(var) or "").strip()
            if not value:
                raise PluginUnavailable(f"secret {var} is not set ({what})")
            if not value.startswith(prefix):
                raise PluginUnavailable(f"secret {var} is not a {prefix}… token ({what})")
            found.append(value)
        return found[0], found[1]

    def user_allowed(self, user: str) -> bool:
        return not self.allowed_users or user in self.allowed_users

    def channel_allowed(self, channel: str) -> bool:
        return not self.allowed_channels or channel in self.allowed_channels
