"""The bot's configuration: environment variables, plus an optional YAML file named by ``FINETUNE_CONFIG``.

The file holds what does not fit in a variable: permission rules and guards, and the team's own recipes
(added to the built-in ``tiny`` and ``deepseek-7b``). Where a platform passes environment but mounts no files
(ECS on Fargate: ``deploy/aws/bot.yaml``), ``FINETUNE_CONFIG_YAML`` carries the same YAML as text.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
)
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from bot.chat.dingtalk.config import DingTalkConfig
from bot.chat.slack.config import SlackConfig
from bot.cloud.aliyun.settings import AliyunSettings
from bot.cloud.aws.queue_url import check_queue_urls
from bot.cloud.aws.settings import AwsSettings
from bot.cloud.local.profile import load_profile
from bot.config_keys import closest_key
from bot.durability import RedisOptions
from bot.errors import ConfigError
from bot.redis_server import check_redis_url, plaintext_remote, redacted
from handlers.oncall import OnCall
from handlers.policy_config import PolicyConfig
from handlers.recipes import BUILT_IN, Recipe


class Settings(BaseSettings):
    model_config = SettingsConfigDict(extra="ignore")

    finetune_cloud: Literal["local", "aws", "aliyun"] = "local"
    finetune_report_secret: str | None = None
    # A plain redis:// to another host (the password and the state in the clear) is refused unless this is set:
    # e.g. a server reached only over a private link the operator trusts. rediss://, unix:// and loopback are fine.
    finetune_redis_allow_plaintext: bool = False
    redis_url: str | None = None
    finetune_state_dir: Path = Path(".finetune-state")
    finetune_http_port: int = Field(default=8080, ge=0, le=65535)
    finetune_http_host: str = "127.0.0.1"
    finetune_config: Path | None = None
    finetune_config_yaml: str | None = None  # the config file's content, where no file can be mounted
    finetune_local_grace_seconds: float = Field(default=30.0, gt=0)
    finetune_local_dialect: Literal["aws", "aliyun"] = "aws"  # the local cloud's metadata service (spot notices)
    # The local cloud's zones (comma-separated, in preference order) and its own prices per hour.
    finetune_local_zones: str = Field(default="local-a", pattern=r"^[a-z0-9-]{1,40}(,[a-z0-9-]{1,40}){0,15}$")
    finetune_local_spot_price: float = Field(default=0.30, gt=0, le=10_000)
    finetune_local_on_demand_price: float = Field(default=1.00, gt=0, le=10_000)
    # The real cloud the local one stands in for (launch, restore, per-zone capacity; docs/multi-node.md): a
    # built-in's name (instant, aws-p5) or a .toml / .json / .yaml file of the same keys.
    finetune_local_profile: str = "instant"
    finetune_local_time_scale: float | None = Field(default=None, gt=0, le=1000)
    # Where the local cloud's runners keep checkpoints: a directory under the state dir by default, or an object
    # store URI (s3://bucket/prefix, oss://bucket/prefix with OSS_ENDPOINT) the runners reach with their own env.
    finetune_local_checkpoints: str | None = Field(default=None, pattern=r"^(s3|oss|file)://[^\s]+$")
    # AWS event intake: the SQS queues EventBridge (via SNS or directly) feeds, one per region the jobs launch in,
    # comma-separated; each is read in the region its URL names (https://sqs.us-west-2.amazonaws.com/…), a local
    # endpoint's in aws.region (bot/cloud/aws/queue_url.py). The SNS HTTPS endpoint's topics: FINETUNE_SNS_TOPICS.
    finetune_sqs_queue_url: Annotated[list[str], NoDecode] = Field(default_factory=list)
    finetune_sns_topics: str = ""
    # SNS SignatureVersion 1 (SHA1) is refused unless this is set (the stacks' topics sign with version 2).
    finetune_sns_allow_sha1: bool = False
    # What each topic may carry (bot/sources/aws_intake.py): cloud events only from the events topics (unset: any
    # topic but a report topic), runner reports only from the report topics (besides aws.report_topic_arn).
    finetune_events_topics: str = ""
    finetune_report_topics: str = ""
    # Slack: the bot token turns the adapter on; Socket Mode with an app token, else HTTP mode (signing secret).
    slack_bot_token: SecretStr | None = None
    slack_signing_secret: SecretStr | None = None
    slack_app_token: SecretStr | None = None
    slack_api_url: str | None = None  # the Web API base, e.g. a local fake's; default Slack's own
    # Alibaba Cloud event intake (POST /aliyun/cloudmonitor, /aliyun/eventbridge), mounted when the token is set:
    # the shared secret the pushes carry, and optionally the source networks allowed (comma-separated CIDRs).
    finetune_aliyun_webhook_token: str | None = None
    finetune_aliyun_webhook_sources: str = ""
    # Plain http accepted on those routes: only for a local test (the token would cross the network in the clear).
    finetune_aliyun_webhook_allow_insecure: bool = False
    # GET /costs (bot/costs.py), mounted when set: the bearer token a finance sheet sends (16+ characters).
    finetune_costs_token: SecretStr | None = None
    # -- DingTalk (bot/chat/dingtalk): on when the app's client id is set; the rest is the dingtalk: section --
    dingtalk_client_id: str | None = None
    dingtalk_client_secret: str | None = None
    dingtalk_openapi_endpoint: str = "https://api.dingtalk.com"  # also the Stream gateway's; tests use a fake
    dingtalk_oapi_endpoint: str = "https://oapi.dingtalk.com"  # the older API: media uploads (a job's chart)
    # -- Paging tools (bot/pagers), named on the on-call ladder: the keys are secrets (never logged, never in a URL)
    pagerduty_routing_key: SecretStr | None = None  # an Events API v2 integration's key: opens pages there
    pagerduty_events_url: str = Field(default="https://events.pagerduty.com", pattern=r"^https?://[^\s]+$")
    pagerduty_webhook_secret: SecretStr | None = None  # a v3 webhook subscription's secret: mounts its route
    opsgenie_api_key: SecretStr | None = None  # an API integration's key (GenieKey): opens pages there
    opsgenie_region: Literal["us", "eu"] = "us"  # api.opsgenie.com or api.eu.opsgenie.com
    opsgenie_api_url: str | None = Field(default=None, pattern=r"^https?://[^\s]+$")  # instead of the region's
    opsgenie_webhook_token: SecretStr | None = None  # the custom header a Webhook integration sends: mounts its route

    @field_validator("finetune_local_profile")
    @classmethod
    def _local_profile(cls, value: str) -> str:
        load_profile(value)  # a bad one is refused here, before anything starts (ConfigError: one line)
        return value.strip() or "instant"

    @field_validator("finetune_sqs_queue_url", mode="before")
    @classmethod
    def _queue_urls(cls, value: object) -> list[str]:
        listed = value.split(",") if isinstance(value, str) else value if isinstance(value, list) else None
        if listed is None or not all(isinstance(url, str) for url in listed):
            raise ValueError("a comma-separated list of SQS queue URLs")
        return check_queue_urls(listed)

    @field_validator("redis_url")
    @classmethod
    def _redis_url(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None or not value.strip():
            return None
        check_redis_url(value.strip())
        if plaintext_remote(value.strip()) and not info.data.get("finetune_redis_allow_plaintext"):
            raise ValueError(
                "redis:// to another host sends the password and the state in the clear; use rediss:// (TLS), "
                "or set FINETUNE_REDIS_ALLOW_PLAINTEXT=1 to accept that"
            )
        return value.strip()

    def secret(self, name: str) -> str | None:
        """The value of secret setting ``name``; an empty variable counts as unset."""
        value: SecretStr | None = getattr(self, name)
        text = value.get_secret_value().strip() if value is not None else ""
        return text or None

    @property
    def sns_topics(self) -> list[str]:
        return _arns(self.finetune_sns_topics)

    @property
    def events_topics(self) -> list[str]:
        return _arns(self.finetune_events_topics)

    @property
    def report_topics(self) -> list[str]:
        return _arns(self.finetune_report_topics)

    # The names bot.redis_server reads.
    @property
    def state_dir(self) -> Path:
        return self.finetune_state_dir


def _arns(listed: str) -> list[str]:
    return [topic.strip() for topic in listed.split(",") if topic.strip()]


class FileConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    policy: PolicyConfig = Field(default_factory=PolicyConfig)
    recipes: list[Recipe] = Field(default_factory=list)
    oncall: OnCall = Field(default_factory=OnCall)  # the rota and escalation ladder of failed-resume pages
    aws: AwsSettings | None = None  # where and how to launch when FINETUNE_CLOUD=aws
    slack: SlackConfig = Field(default_factory=SlackConfig)  # alert channel, command name
    aliyun: AliyunSettings | None = None  # where and how to launch when FINETUNE_CLOUD=aliyun
    dingtalk: DingTalkConfig | None = None  # alert robot, card template and languages of the DingTalk groups
    redis: RedisOptions = Field(default_factory=RedisOptions)  # durability: what a state change waits for


def load_settings(**overrides: Any) -> Settings:
    """The settings from the environment; ConfigError with one line per bad variable, naming it (no traceback)."""
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        raise ConfigError("\n".join(_bad_variable(error) for error in exc.errors())) from None


def _bad_variable(error: Mapping[str, Any]) -> str:
    field = str(error["loc"][0]) if error.get("loc") else "?"
    name = field.upper()
    value = str(error.get("input"))
    if field == "redis_url":
        value = redacted(value)  # a URL may carry the server's password
    hidden = any(word in field for word in ("secret", "token", "yaml", "key"))
    shown = "" if hidden else f"={value[:60]!r}"
    return f"{name}{shown}: {error['msg']}"


def load_config(settings: Settings) -> FileConfig:
    """The file ``FINETUNE_CONFIG`` names, or the text of ``FINETUNE_CONFIG_YAML``; ConfigError for both."""
    if settings.finetune_config is not None and settings.finetune_config_yaml:
        raise ConfigError("set FINETUNE_CONFIG (a file) or FINETUNE_CONFIG_YAML (its content), not both")
    if settings.finetune_config_yaml:
        return parse_file_config(settings.finetune_config_yaml, "FINETUNE_CONFIG_YAML")
    return load_file_config(settings.finetune_config)


def load_file_config(path: Path | None) -> FileConfig:
    if path is None:
        return FileConfig()
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read FINETUNE_CONFIG={path}: {exc.strerror}") from None
    return parse_file_config(text, str(path))


def parse_file_config(text: str, source: str) -> FileConfig:
    """The config in ``text``; ConfigError naming ``source`` (a path or a variable) and the field."""
    try:
        raw = yaml.safe_load(text) or {}
        return FileConfig.model_validate(raw)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source} is not valid YAML: {exc}") from None
    except ValidationError as exc:
        problems = "; ".join(_config_problem(error) for error in exc.errors())
        raise ConfigError(f"{source}: {problems}") from None


def _config_problem(error: Mapping[str, Any]) -> str:
    """One problem of the config file, at its place; a key it does not have, with the closest one it has."""
    loc = error.get("loc", ())
    where = ".".join(map(str, loc))
    if error.get("type") != "extra_forbidden":
        return f"{where}: {error['msg']}"
    close = closest_key(FileConfig, loc)
    if close is None:
        return f"{where}: no such key"
    return f"{where}: no such key (did you mean {'.'.join([*map(str, loc[:-1]), close])}?)"


def all_recipes(config: FileConfig) -> dict[str, Recipe]:
    recipes = dict(BUILT_IN)
    recipes.update({recipe.name: recipe for recipe in config.recipes})
    return recipes


Cloud = Literal["local", "aws", "aliyun"]
