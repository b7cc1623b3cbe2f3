"""The checks in their order: the configuration, Redis, the cloud (its own probes, behind
:class:`~bot.cloud.base.ChecksSetup`), the event sources, the chat adapters and their tokens.

A configuration that does not parse (a bad variable, the config file, the cloud's section) is no check: it is the
same :class:`~bot.errors.ConfigError` ``serve`` stops with (one line, exit 2), raised before anything is asked.
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from bot.checks.intake import chat_adapter, event_source
from bot.checks.redis import check_redis
from bot.checks.result import Check, passed
from bot.cloud.base import ChecksSetup, SetupScope
from bot.cloud.local.probe import LocalSetup
from bot.settings import FileConfig, Settings, all_recipes, load_config
from handlers.report_keys import ReportKeys


async def check_all(settings: Settings) -> list[Check]:
    """Everything ``finetune-bot check`` looks at; ConfigError when the configuration does not parse."""
    config = load_config(settings)
    async with setup_of(settings, config) as cloud:
        found = [_configuration(settings)]
        found.append(await check_redis(settings))
        found.extend(await cloud.check_setup(scope_of(settings, config)))
    found.extend(intake_checks(settings))
    found.extend(await chat_checks(settings, config))
    return found


async def start_checks(settings: Settings) -> list[Check]:
    """What ``serve`` checks before it starts: the cloud and the event sources (its own Redis and chat adapters it
    checks as it opens them); ConfigError when the configuration does not parse."""
    config = load_config(settings)
    async with setup_of(settings, config) as cloud:
        found = await cloud.check_setup(scope_of(settings, config))
    return [*found, *intake_checks(settings)]


def intake_checks(settings: Settings) -> list[Check]:
    return [event_source(settings), chat_adapter(settings)]


async def chat_checks(settings: Settings, config: FileConfig) -> list[Check]:
    """The chat platforms' tokens, each asked of the platform (loaded only when configured, as the bot does)."""
    found: list[Check] = []
    slack_set = any(settings.secret(name) for name in ("slack_bot_token", "slack_signing_secret", "slack_app_token"))
    if slack_set:
        from bot.chat.slack.probe import check_slack

        found.extend(
            await check_slack(
                settings.secret("slack_bot_token"),
                settings.secret("slack_signing_secret"),
                settings.secret("slack_app_token"),
                config.slack,
                settings.slack_api_url,
            )
        )
    if settings.dingtalk_client_id:
        from bot.chat.dingtalk.probe import check_dingtalk

        found.extend(
            await check_dingtalk(
                settings.dingtalk_client_id, settings.dingtalk_client_secret, settings.dingtalk_openapi_endpoint
            )
        )
    return found


@asynccontextmanager
async def setup_of(settings: Settings, config: FileConfig) -> AsyncIterator[ChecksSetup]:
    """The cloud's checks: the AWS or Alibaba cloud built as ``serve`` builds it (the same ConfigErrors), or the
    local cloud's; closed on the way out."""
    from bot.service import remote_cloud  # the service's imports (aiohttp, the SDKs) only for the commands using it

    keys = ReportKeys(settings.finetune_report_secret or secrets.token_urlsafe(32))  # none is handed out here
    cloud = remote_cloud(settings, config, keys)
    if cloud is None:
        zones = tuple(settings.finetune_local_zones.split(","))
        local = LocalSetup(settings.finetune_state_dir, zones, settings.finetune_local_checkpoints)
        yield local
        return
    try:
        assert isinstance(cloud, ChecksSetup), f"{cloud.name} says nothing of its set-up"
        yield cloud
    finally:
        await cloud.close()


def scope_of(settings: Settings, config: FileConfig) -> SetupScope:
    """What the cloud's probes look at: the recipes' instance types for this cloud, the queues and topics."""
    types: list[str] = []
    for recipe in all_recipes(config).values():
        types.extend(kind for kind in recipe.instance_types.get(settings.finetune_cloud, []) if kind not in types)
    topics = [*settings.events_topics, *settings.report_topics]
    if config.aws is not None and config.aws.report_topic_arn:
        topics.append(config.aws.report_topic_arn)
    return SetupScope(
        instance_types=tuple(types),
        queues=tuple(settings.finetune_sqs_queue_url),
        queue_topics=tuple(dict.fromkeys(topics)),
        https_topics=tuple(settings.sns_topics),
    )


def _configuration(settings: Settings) -> Check:
    if settings.finetune_config is not None:
        source = f"FINETUNE_CONFIG={settings.finetune_config}"
    elif settings.finetune_config_yaml:
        source = "FINETUNE_CONFIG_YAML"
    else:
        source = "the environment (no FINETUNE_CONFIG)"
    return passed("configuration", f"{source} parses; cloud {settings.finetune_cloud}")
