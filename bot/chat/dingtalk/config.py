"""The ``dingtalk:`` section of the config file: where alerts go, the card template, and each group's language.

```yaml
dingtalk:
  robot_webhook: https://oapi.dingtalk.com/robot/send?access_token=…   # the group's custom robot (alerts, pages)
  robot_secret: SEC…                                                   # its 加签 secret
  card_template_id: 8f2c…schema                                        # job cards with buttons (see docs/dingtalk.md)
  language: zh-CN                                                      # the default for every group
  corp_id: dingxxxxxxxxxxxx                                            # the organisation served (else the robot's)
  channels:
    cidXXXX==: {language: en}                                          # this group reads English
    cidYYYY==: {robot_webhook: https://…, robot_secret: SEC…}          # this group's own robot
```

The app credentials are not here but in the environment (``DINGTALK_CLIENT_ID``, ``DINGTALK_CLIENT_SECRET``).
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field, model_validator

from bot.chat.catalog import Lang


@dataclass(frozen=True, slots=True)
class Robot:
    """A group's custom robot: its webhook URL, and the secret that signs each call (None: unsigned robot)."""

    webhook: str
    secret: str | None


class DingTalkChannel(BaseModel):
    """What one group (by its openConversationId) does differently from the defaults."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    language: Lang | None = None
    robot_webhook: str | None = Field(default=None, pattern=r"^https?://")
    robot_secret: str | None = None

    @model_validator(mode="after")
    def _secret_needs_webhook(self) -> DingTalkChannel:
        if self.robot_secret and not self.robot_webhook:
            raise ValueError("robot_secret is set but robot_webhook is not")
        return self


class DingTalkConfig(DingTalkChannel):
    language: Lang = "zh-CN"
    card_template_id: str | None = None  # without one, the card is a markdown message on each state change
    robot_code: str | None = None  # the app robot's code; DingTalk's default is the app's client id
    # The organisation the bot serves (a message's senderCorpId, a click's corpId); unset: the robot's own
    # (a message's chatbotCorpId), and clicks are checked once a message has said it.
    corp_id: str | None = Field(default=None, pattern=r"^ding[0-9a-zA-Z]{2,64}$")
    channels: dict[str, DingTalkChannel] = Field(default_factory=dict)

    def language_for(self, conversation: str | None) -> Lang:
        channel = self.channels.get(conversation or "")
        return channel.language if channel is not None and channel.language else self.language

    def robot_for(self, conversation: str | None) -> Robot | None:
        """The custom robot that speaks in ``conversation``: the group's own, else the default (alert) one."""
        channel = self.channels.get(conversation or "")
        if channel is not None and channel.robot_webhook:
            return Robot(channel.robot_webhook, channel.robot_secret)
        if self.robot_webhook:
            return Robot(self.robot_webhook, self.robot_secret)
        return None
