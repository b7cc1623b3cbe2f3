"""The ``aws:`` section of ``FINETUNE_CONFIG``: where and how the AWS provider launches (kept apart from the
provider so reading the configuration opens no AWS client)."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from bot.cloud.user_data import plain_path
from handlers.attempt_keys import ROLE_ID_PATTERN
from handlers.regions import AWS_TRANSFER_PRICE_PER_GB
from handlers.spec import check_report_target
from handlers.storage_sessions import ROLE_ARN_PATTERN

REGION = re.compile(r"^[a-z]{2}(-[a-z]+)+-\d$")

# What a launch needs in one region (the keys of today's single region, which stay valid at the top as the home region).
REGION_KEYS = (
    "subnets",
    "zones",
    "security_group_ids",
    "image_id",
    "launch_template",
    "instance_profile",
    "runner_role_id",
    "key_name",
)


def region_name(value: str) -> str:
    """An AWS region name (``us-west-2``), else ValueError saying so."""
    if not REGION.fullmatch(value):
        raise ValueError(f"{value!r} is not an AWS region name")
    return value


class AwsRegionSettings(BaseModel):
    """What a launch needs in one region (``aws.regions.<region>``): AMIs, subnets, security groups and key pairs are
    regional, so each region names its own."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # zone name -> subnet id, or a list of subnet ids (one per zone, in preference order) whose zones the bot looks
    # up once (the runner stack exports such a list); without subnets the default VPC is used with ``zones``.
    subnets: dict[str, str] | list[str] = Field(default_factory=dict)
    zones: list[str] = Field(default_factory=list)  # preference order when scores and prices tie
    security_group_ids: list[str] = Field(default_factory=list)  # the runners' groups, of the subnets' VPC
    image_id: str | None = None  # an AMI with the runner under runner_path and its systemd unit
    launch_template: str | None = None  # instances mode: a template of yours holding image, groups, volumes
    instance_profile: str | None = None  # a name, or an ARN (arn:aws:iam::…:instance-profile/…)
    # The runner role's unique id (the runner stack's output RunnerRoleId in this region): its sessions on an
    # instance are ``<role id>:<instance id>``, the name of the one key object that instance may read.
    runner_role_id: str | None = Field(default=None, pattern=ROLE_ID_PATTERN)
    key_name: str | None = None  # an EC2 key pair of this region for SSH, or none

    @model_validator(mode="after")
    def _image_or_template(self) -> AwsRegionSettings:
        if not (self.image_id or self.launch_template):
            raise ValueError("set image_id (an AMI with the runner installed, in this region) or launch_template")
        return self


class AwsSettings(BaseModel):
    """Where and how the AWS provider launches. Only ``bucket`` and an image (or a template) are required."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    bucket: str = Field(pattern=r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
    prefix: str = Field(default="jobs/", pattern=r"^([A-Za-z0-9._-]+/)*$")
    # The home region: the bucket's, the report topic's and the bot's. Default: AWS_REGION, then AWS_DEFAULT_REGION,
    # then botocore's own chain. Without ``regions`` it is also the one region launches go to.
    region: str | None = None
    # zone name -> subnet id, or a list of subnet ids (one per zone, in preference order) whose zones the bot looks
    # up once (the runner stack exports such a list); without subnets the default VPC is used with ``zones``.
    subnets: dict[str, str] | list[str] = Field(default_factory=dict)
    zones: list[str] = Field(default_factory=list)  # preference order when scores and prices tie
    security_group_ids: list[str] = Field(default_factory=list)
    instance_profile: str | None = None  # a name, or an ARN (arn:aws:iam::…:instance-profile/…)
    image_id: str | None = None  # an AMI with the runner under runner_path and its systemd unit
    launch_template: str | None = None  # instances mode: a template of yours holding image, groups, volumes
    key_name: str | None = None
    report_topic_arn: str | None = None  # added to every spec as an ``sns:`` report target
    # The runner role's unique id (the runner stack's output RunnerRoleId): its sessions on an instance are
    # ``<role id>:<instance id>``, the name of the one key object that instance may read (handlers/attempt_keys.py).
    runner_role_id: str | None = Field(default=None, pattern=ROLE_ID_PATTERN)
    # The runner stack's output RunnerStorageRoleArn: per attempt the bot assumes it with a session policy naming only
    # the job's prefix and hands those credentials to the runner in its key object (handlers/storage_sessions.py).
    # None: runners use their instance profile for storage (a stack without the role).
    runner_storage_role_arn: str | None = Field(default=None, pattern=ROLE_ARN_PATTERN)
    # capacity failures within one launch before it reports a refusal to the spot authority; None: every candidate
    max_launch_failures: int | None = Field(default=3, ge=1)
    mode: Literal["instances", "autoscaling"] = "instances"
    template_name: str = "finetune-runner"  # autoscaling mode: the launch template we keep versions in
    group_wait_seconds: float = Field(default=60.0, gt=0)
    group_poll_seconds: float = Field(default=2.0, gt=0)
    fis_role_arn: str | None = None
    fis_template_tag: str = "finetune:interrupt-test"  # tag (value "true") marking the experiment templates we own
    interrupt_test_notice: str = Field(default="PT2M", pattern=r"^PT\d+[MS]$")
    runner_path: str = "/opt/finetune"
    work_dir: str = "/opt/dlami/nvme/finetune"
    on_demand_prices: dict[str, float] = Field(default_factory=dict)
    # $ per GB of checkpoint a runner outside the home region (the bucket's) restores or commits: AWS's inter-region
    # price, part of the job's cost (the card's egress)
    transfer_price_per_gb: float = Field(default=AWS_TRANSFER_PRICE_PER_GB, ge=0)
    # botocore's retries of a call that may be retried (after the first try, with its backoff); a test passes fewer
    api_retries: int = Field(default=3, ge=0, le=10)
    # Where launches may go when more than one region: region name -> what a launch needs there, in preference order
    # after the home region. Without it the keys above (subnets, zones, image_id, …) are the home region's.
    regions: dict[str, AwsRegionSettings] = Field(default_factory=dict)

    _plain_path = field_validator("runner_path", "work_dir")(plain_path)

    @field_validator("region")
    @classmethod
    def _region(cls, value: str | None) -> str | None:
        return region_name(value) if value is not None else None

    @field_validator("regions")
    @classmethod
    def _regions(cls, value: dict[str, AwsRegionSettings], info: ValidationInfo) -> dict[str, AwsRegionSettings]:
        for name, region in value.items():
            region_name(name)
            if info.data.get("mode") == "autoscaling" and not region.subnets:
                raise ValueError(f"{name}: autoscaling mode needs subnets (zone name -> subnet id, or a list)")
        return value

    @field_validator("report_topic_arn")
    @classmethod
    def _topic(cls, value: str | None) -> str | None:
        if value is not None:
            check_report_target(f"sns:{value}")
        return value

    @model_validator(mode="after")
    def _image_or_template(self) -> AwsSettings:
        if self.regions:
            top = [key for key in REGION_KEYS if key in self.model_fields_set]
            if top:
                raise ValueError(
                    f"with regions, set {', '.join(top)} per region (regions.<region>.{top[0]}), not at the top"
                )
            if self.region is None:
                raise ValueError("regions needs region: the home region (the bucket's)")
            return self
        if self.mode == "instances" and not (self.image_id or self.launch_template):
            raise ValueError("set image_id (an AMI with the runner installed) or launch_template")
        if self.mode == "autoscaling" and not self.subnets:
            raise ValueError("autoscaling mode needs subnets (zone name -> subnet id, or a list of subnet ids)")
        return self

    def launch_regions(self, home: str) -> dict[str, AwsRegionSettings]:
        """Where launches may go, in preference order: the home region first where it is one, then ``regions`` in
        their order; without ``regions``, the keys at the top as the home region (``home``: the region found)."""
        if not self.regions:
            return {home: AwsRegionSettings.model_construct(**{key: getattr(self, key) for key in REGION_KEYS})}
        ordered = sorted(self.regions.items(), key=lambda item: item[0] != home)
        return dict(ordered)

    def bound_to(self, region: str, launch: AwsRegionSettings) -> AwsSettings:
        """These settings as one region's parts read them: that region, and its launch keys at the top."""
        update = {key: getattr(launch, key) for key in REGION_KEYS}
        return self.model_copy(update={**update, "region": region, "regions": {}})
