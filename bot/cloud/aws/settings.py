"""The ``aws:`` section of ``FINETUNE_CONFIG``: where and how the AWS provider launches (kept apart from the
provider so reading the configuration opens no AWS client)."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from bot.cloud.user_data import plain_path
from handlers.attempt_keys import ROLE_ID_PATTERN
from handlers.regions import AWS_TRANSFER_PRICE_PER_GB
from handlers.spec import check_report_target
from handlers.storage_sessions import ROLE_ARN_PATTERN

REGION = re.compile(r"^[a-z]{2}(-[a-z]+)+-\d$")


class AwsSettings(BaseModel):
    """Where and how the AWS provider launches. Only ``bucket`` and an image (or a template) are required."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    bucket: str = Field(pattern=r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
    prefix: str = Field(default="jobs/", pattern=r"^([A-Za-z0-9._-]+/)*$")
    region: str | None = None  # default: AWS_REGION, then AWS_DEFAULT_REGION, then botocore's own chain
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

    _plain_path = field_validator("runner_path", "work_dir")(plain_path)

    @field_validator("region")
    @classmethod
    def _region(cls, value: str | None) -> str | None:
        if value is not None and not REGION.fullmatch(value):
            raise ValueError(f"{value!r} is not an AWS region name")
        return value

    @field_validator("report_topic_arn")
    @classmethod
    def _topic(cls, value: str | None) -> str | None:
        if value is not None:
            check_report_target(f"sns:{value}")
        return value

    @model_validator(mode="after")
    def _image_or_template(self) -> AwsSettings:
        if self.mode == "instances" and not (self.image_id or self.launch_template):
            raise ValueError("set image_id (an AMI with the runner installed) or launch_template")
        if self.mode == "autoscaling" and not self.subnets:
            raise ValueError("autoscaling mode needs subnets (zone name -> subnet id, or a list of subnet ids)")
        return self
