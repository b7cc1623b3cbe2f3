"""The ``aliyun:`` section of ``FINETUNE_CONFIG``: where and how the Alibaba Cloud provider launches.

Kept apart from the provider so reading the configuration does not import Alibaba's SDKs (about a second of
start-up); only ``FINETUNE_CLOUD=aliyun`` pays for those.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Literal
from urllib.parse import urlparse

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from bot.cloud.user_data import plain_path
from handlers.regions import AWS_TRANSFER_PRICE_PER_GB
from handlers.spec import check_report_target
from handlers.storage_sessions import ALIYUN_ROLE_ARN_PATTERN

_REGION = re.compile(r"^[a-z]{2}-[a-z0-9]+(-[a-z0-9]+)*$")


def endpoint_parts(endpoint: str) -> tuple[str, str]:
    """``http://127.0.0.1:8080`` → (``http``, ``127.0.0.1:8080``); a bare host means https."""
    parsed = urlparse(endpoint if "//" in endpoint else "https://" + endpoint)
    if parsed.scheme not in ("http", "https") or not parsed.netloc or parsed.path not in ("", "/"):
        raise ValueError(f"{endpoint!r} is not an endpoint (host[:port], optionally with http:// or https://)")
    return parsed.scheme, parsed.netloc


STATIC_KEYS_REFUSED = (
    "a long-lived access key is for a local test only (allow_static_keys: true); deployed, the bot uses its "
    "instance RAM role's STS credentials (ALIBABA_CLOUD_ECS_METADATA)"
)


def static_key_refusal(settings: AliyunSettings, environ: Mapping[str, str]) -> str | None:
    """Why the bot may not start with the key in its environment: a key pair without an STS token is long-lived
    (it never expires, and leaks for good), accepted only where ``allow_static_keys`` says this is a local test."""
    if settings.allow_static_keys or not environ.get("ALIBABA_CLOUD_ACCESS_KEY_ID"):
        return None
    if environ.get("ALIBABA_CLOUD_SECURITY_TOKEN"):
        return None  # STS credentials (short-lived) handed over by whoever runs the bot
    return f"ALIBABA_CLOUD_ACCESS_KEY_ID without ALIBABA_CLOUD_SECURITY_TOKEN: {STATIC_KEYS_REFUSED}"


class AliyunSettings(BaseModel):
    """Where and how the Alibaba Cloud provider launches (the ``aliyun:`` section of ``FINETUNE_CONFIG``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    region: str  # e.g. cn-hangzhou
    bucket: str = Field(pattern=r"^[a-z0-9][a-z0-9-]{1,61}[a-z0-9]$")  # the OSS bucket for specs and checkpoints
    prefix: str = Field(default="jobs/", pattern=r"^([A-Za-z0-9._-]+/)*$")
    endpoint: str | None = None  # ECS OpenAPI; default the SDK's for the region; http://127.0.0.1:PORT in tests
    ess_endpoint: str | None = None  # Auto Scaling OpenAPI, likewise
    sts_endpoint: str | None = None  # STS (runner storage tokens); default https://sts.<region>.aliyuncs.com
    access_key_id: str | None = None  # a long-lived key pair: local tests only (allow_static_keys), see below
    access_key_secret: SecretStr | None = None
    allow_static_keys: bool = False  # a local test's stand-in key pair; deployed: the instance RAM role's STS key
    oss_endpoint: str | None = None  # the bot's way to OSS; default https://oss-<region>.aliyuncs.com
    oss_internal_endpoint: str | None = None  # the runners'; default https://oss-<region>-internal.aliyuncs.com
    oss_addressing: Literal["virtual", "path"] = "virtual"  # OSS wants virtual; path only for S3 stand-ins
    vswitches: dict[str, str] = Field(default_factory=dict)  # zone id -> vSwitch id
    zones: list[str] = Field(default_factory=list)  # preference order when prices tie (default: vswitches order)
    security_group_ids: list[str] = Field(default_factory=list)
    image_id: str | None = None  # a custom image with the runner under runner_path and its systemd unit
    ram_role: str | None = None  # the instance RAM role: reads the attempt's sealed key object (and, without a
    # runner storage role, the bucket's jobs/ itself)
    # The runner stack's RunnerStorageRoleArn: per attempt the bot assumes it with an inline policy naming only the
    # job's prefix and hands the token to the runner sealed with its report key (handlers/attempt_keys.py). None: the
    # runner uses its instance role for job objects (a stack without the role).
    runner_storage_role_arn: str | None = Field(default=None, pattern=ALIYUN_ROLE_ARN_PATTERN)
    key_pair: str | None = None
    system_disk_category: str | None = None  # e.g. cloud_essd; default ECS's
    system_disk_size: int | None = Field(default=None, ge=20, le=2048)
    spot_price_limit: float | None = Field(default=None, gt=0)  # per hour; set: SpotWithPriceLimit
    spot_duration: Literal[0, 1] | None = None  # hours of guaranteed run time (1), or none (0, cheaper)
    # capacity failures within one launch before it reports a refusal to the spot authority; None: every candidate
    max_launch_failures: int | None = Field(default=3, ge=1)
    mode: Literal["instances", "scaling-group"] = "instances"
    scaling_groups: list[str] = Field(default_factory=list)  # scaling-group mode: ESS group ids, one job each
    group_wait_seconds: float = Field(default=300.0, gt=0)
    group_poll_seconds: float = Field(default=5.0, gt=0)
    interrupt_test_grace_seconds: float = Field(default=120.0, gt=0)  # notice to release in an interrupt test
    report_url: str | None = None  # the bot's public /runner/reports URL, added to every spec
    runner_path: str = "/opt/finetune"
    work_dir: str = "/var/lib/finetune"
    on_demand_prices: dict[str, float] = Field(default_factory=dict)  # per type; overrides DescribePrice
    # $ per GB of checkpoint a runner outside the home region (the bucket's) restores or commits: part of the job's
    # cost (the card's egress)
    transfer_price_per_gb: float = Field(default=AWS_TRANSFER_PRICE_PER_GB, ge=0)

    @field_validator("region")
    @classmethod
    def _region(cls, value: str) -> str:
        if not _REGION.fullmatch(value):
            raise ValueError(f"{value!r} is not an Alibaba Cloud region id (e.g. cn-hangzhou)")
        return value

    @field_validator("endpoint", "ess_endpoint", "sts_endpoint", "oss_endpoint", "oss_internal_endpoint")
    @classmethod
    def _endpoint(cls, value: str | None) -> str | None:
        if value is not None:
            endpoint_parts(value)
        return value

    _plain_path = field_validator("runner_path", "work_dir")(plain_path)

    @field_validator("report_url")
    @classmethod
    def _report_url(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("http://", "https://")):
            raise ValueError("must be the bot's http(s)://…/runner/reports URL")
        return check_report_target(value) if value is not None else None

    @model_validator(mode="after")
    def _complete(self) -> AliyunSettings:
        if (self.access_key_id is None) != (self.access_key_secret is None):
            raise ValueError("set both access_key_id and access_key_secret, or neither (the SDK's chain is used)")
        if self.access_key_id is not None and not self.allow_static_keys:
            raise ValueError(f"access_key_id: {STATIC_KEYS_REFUSED}")
        if self.mode == "instances":
            if not self.image_id:
                raise ValueError("instances mode needs image_id (a custom image with the runner installed)")
            if not self.vswitches:
                raise ValueError("instances mode needs vswitches (zone id -> vSwitch id)")
        if self.runner_storage_role_arn is not None and not (self.ram_role and self.report_url):
            raise ValueError(
                "runner_storage_role_arn needs ram_role (it reads the sealed key object) and report_url (the report "
                "key in the user data is what opens it)"
            )
        if self.mode == "scaling-group" and not self.scaling_groups:
            raise ValueError("scaling-group mode needs scaling_groups (ESS scaling group ids)")
        unknown = [zone for zone in self.zones if self.vswitches and zone not in self.vswitches]
        if unknown:
            raise ValueError(f"zones {unknown} have no vSwitch in vswitches")
        return self

    @property
    def bot_oss_endpoint(self) -> str:
        return self.oss_endpoint or f"https://oss-{self.region}.aliyuncs.com"

    @property
    def runner_oss_endpoint(self) -> str:
        return self.oss_internal_endpoint or f"https://oss-{self.region}-internal.aliyuncs.com"


def candidate_zones(settings: AliyunSettings) -> list[str]:
    """Candidate zones in preference order: ``zones`` first, then the other zones with a vSwitch."""
    return list(settings.zones) + [zone for zone in settings.vswitches if zone not in settings.zones]
