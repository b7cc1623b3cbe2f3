"""The bot's error roots, one per port family, so callers catch a family and never a platform's SDK type.

Each adapter maps what its SDK raises at its own edge (``bot/chat/slack/errors.py:classify`` for Slack,
``bot/cloud/aws.py`` for botocore, ``bot/cloud/aliyun.py`` for the Tea SDK, ``bot/cloud/local.py`` for aiohttp);
past that edge only these travel. The runner's storage errors have their own root, ``runner.storage.base.StorageError``
(the runner never imports the bot).

Nothing here imports another bot module, so every module may import it (settings and chat adapters alike).
"""

from __future__ import annotations


class ConfigError(ValueError):
    """A setting or the config file is unusable: one line saying which and why (the CLI exits 2, no traceback)."""


class CloudError(RuntimeError):
    """A cloud did not do what the bot asked (launch, terminate, interrupt-test, stop, list); the message says
    why and what to fix. Every provider raises these, and only these, from the cloud port's methods."""


class LaunchError(CloudError):
    """No capacity, no permission, a bad template: the attempt did not start.

    ``capacity``: every try was refused for capacity (the spot policy may try another zone, on-demand, or later);
    ``zone``: the zone the launch was pinned to, if it was."""

    def __init__(self, message: str, *, capacity: bool = False, zone: str | None = None) -> None:
        super().__init__(message)
        self.capacity = capacity
        self.zone = zone


class ChatError(Exception):
    """A chat platform did not take a message (see ``bot/chat/delivery.py`` for the transient / permanent split)."""


class ForeignInstance(CloudError):
    """The instance does not carry the tags of the job the action is for: the provider left it untouched. Not
    retried: no later try can make it that job's."""
