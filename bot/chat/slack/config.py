"""Slack options that do not fit an environment variable: the ``slack:`` section of the config file.

Tokens and the signing secret stay in the environment (``SLACK_BOT_TOKEN``, ``SLACK_SIGNING_SECRET``,
``SLACK_APP_TOKEN``); this holds where things go.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from bot.chat.catalog import Lang

CHANNEL_ID = r"^[CGD][A-Z0-9]{2,}$"
SLASH_COMMAND = r"^/[a-z0-9_-]{1,31}$"


class SlackChannel(BaseModel):
    """What one channel does differently: today, the language its cards and messages are in."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    language: Lang


class SlackConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    # Interruption warnings also go here (a channel id such as C0123ABCD); unset: the job's own channel.
    alert_channel: str | None = Field(default=None, pattern=CHANNEL_ID)
    # The slash command as named in the app's manifest (a staging app might use /finetune-dev).
    command: str = Field(default="/finetune", pattern=SLASH_COMMAND)
    language: Lang = "en"  # the default of every channel; e.g. channels: {C0123ABCD: {language: zh-CN}}
    channels: dict[str, SlackChannel] = Field(default_factory=dict)
    # The workspace and app the bot serves (requests of any other are refused); unset: what auth.test says.
    team_id: str | None = Field(default=None, pattern=r"^[TE][A-Z0-9]{2,}$")
    app_id: str | None = Field(default=None, pattern=r"^A[A-Z0-9]{2,}$")

    def language_for(self, channel: str | None) -> Lang:
        chosen = self.channels.get(channel or "")
        return chosen.language if chosen is not None else self.language
