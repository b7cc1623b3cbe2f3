"""AWS: EC2 Spot instances (or one Auto Scaling group per job) that run the runner from a prebuilt image.

A launch uploads the attempt's spec to S3 first, then starts an instance whose user-data only points the
runner's systemd unit at that object (the image carries the runner; nothing is installed at boot); once the
instance id is known, the attempt's report key goes to the one object that instance may read
(:mod:`handlers.attempt_keys`), deleted again when the instance is released. With a runner storage role that
object also carries the attempt's storage session, limited to the job's own prefix (:mod:`handlers.storage_sessions`)
and rewritten before it expires (:meth:`AwsCloud.renew_storage_credentials`, driven by bot/storage_renewal.py). The zone
and the market come from the spot authority (:mod:`handlers.spot`); within a launch the (zone, type) order comes
from the pure :mod:`handlers.spot.zones` over spot placement scores and spot prices, and capacity errors move on
to the next candidate of the same market until ``max_launch_failures`` of them: the launch then reports a capacity
refusal and the authority chooses again (another zone, on-demand, or waiting). The market never changes here.
Drills are AWS FIS experiments (``aws:ec2:send-spot-instance-interruptions``); a stop is a control object the
runner polls. Every call is aioboto3, so nothing blocks the bot's event loop.

Client config comes from the standard AWS variables: ``AWS_ENDPOINT_URL`` (botocore honours it, and
``AWS_ENDPOINT_URL_<SERVICE>`` per service), ``AWS_REGION`` / ``AWS_DEFAULT_REGION``, the credential chain.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import logging
import os
import re
import time
import uuid
from collections.abc import Collection, Mapping
from contextlib import AsyncExitStack
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import urlencode

import aioboto3  # type: ignore[import-untyped]
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError
from botocore.parsers import ResponseParserError
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from bot.cloud.base import CloudError, CloudProvider, ForeignInstance, Instance, LaunchError, log_once
from bot.cloud.user_data import plain_path, runner_boot_script
from bot.errors import ConfigError
from handlers.attempt_keys import (
    READER_TAG,
    ROLE_ID_PATTERN,
    StorageCredentials,
    dump_attempt_key,
    key_object,
    reader,
)
from handlers.jobs import Market
from handlers.notes import InterruptTestResult
from handlers.reconcile import CloudGroup, CloudInstance
from handlers.report_keys import ReportKeys
from handlers.spec import (
    ATTEMPT_KEYS_PREFIX,
    JobSpec,
    StopControl,
    check_report_target,
    control_key,
    dump_control,
)
from handlers.spot.zones import (
    Candidate,
    LaunchPlan,
    SpotPrice,
    classify_launch_error,
    latest_prices,
    order_on_demand_candidates,
    order_spot_candidates,
    score_availability,
    scores_by_zone,
)
from handlers.storage_sessions import (
    ROLE_ARN_PATTERN,
    SESSION_SECONDS,
    dump_session_policy,
    partition_of,
    session_name,
    session_policy,
)

log = logging.getLogger(__name__)

# us-east-1 Linux on-demand list prices in $/h, for the cost report's "saved against on-demand". The Pricing
# API is not worth a call per launch (and moto has none); these are list prices: override them per region or
# for your discounts with ``AwsSettings.on_demand_prices``.
ON_DEMAND_PRICES: dict[str, float] = {
    "g5.xlarge": 1.006,
    "g5.2xlarge": 1.212,
    "g5.4xlarge": 1.624,
    "g6.xlarge": 0.805,
    "g6.2xlarge": 0.978,
    "p5.48xlarge": 98.32,
    "p4d.24xlarge": 32.77,
}

MANAGED_TAG = "finetune:managed"
JOB_TAG = "finetune:job"
ATTEMPT_TAG = "finetune:attempt"
GROUP_TAG = "aws:autoscaling:groupName"  # set by Auto Scaling on the instances it launches
_NOT_FOUND_INSTANCE = frozenset({"InvalidInstanceID.NotFound"})
_NOT_FOUND_TEMPLATE = frozenset({"InvalidLaunchTemplateName.NotFoundException", "InvalidLaunchTemplateId.NotFound"})
_DENIED = frozenset(
    {"AccessDenied", "AccessDeniedException", "UnauthorizedOperation", "UnauthorizedException", "OptInRequired"}
)
_REGION = re.compile(r"^[a-z]{2}(-[a-z]+)+-\d$")
_SCORES_RETRY_SECONDS = 3600.0  # after a refusal, ask for placement scores again only this much later
SCORES_TTL_SECONDS = 600.0  # placement scores per (instance types, region) are asked again only this much later


class AwsError(CloudError):
    """A terminate, a drill, a stop or a listing AWS did not do; the message says what to fix."""


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
    # None: runners use their instance profile for storage (a stack from before the role).
    runner_storage_role_arn: str | None = Field(default=None, pattern=ROLE_ARN_PATTERN)
    # capacity failures within one launch before it reports a refusal to the spot authority; None: every candidate
    max_launch_failures: int | None = Field(default=3, ge=1)
    mode: Literal["instances", "autoscaling"] = "instances"
    template_name: str = "finetune-runner"  # autoscaling mode: the launch template we keep versions in
    group_wait_seconds: float = Field(default=60.0, gt=0)
    group_poll_seconds: float = Field(default=2.0, gt=0)
    fis_role_arn: str | None = None
    fis_template_tag: str = "finetune:drill"  # tag (value "true") marking the experiment templates we own
    drill_notice: str = Field(default="PT2M", pattern=r"^PT\d+[MS]$")
    runner_path: str = "/opt/finetune"
    work_dir: str = "/opt/dlami/nvme/finetune"
    on_demand_prices: dict[str, float] = Field(default_factory=dict)

    _plain_path = field_validator("runner_path", "work_dir")(plain_path)

    @field_validator("region")
    @classmethod
    def _region(cls, value: str | None) -> str | None:
        if value is not None and not _REGION.fullmatch(value):
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


def group_name(job_id: str) -> str:
    return f"finetune-{job_id}"


def user_data_script(spec_uri: str, settings: AwsSettings, region: str | None, key_from: str | None = None) -> str:
    """The instance's user-data: point the runner's unit at this attempt's spec object and start it. ``key_from``
    (where key objects lie, no key in it): the runner reads its key object first, since with a storage role the spec
    itself is readable only with the storage credentials that object holds."""
    env = {"FINETUNE_SPEC": spec_uri, "FINETUNE_WORK_DIR": settings.work_dir}
    if key_from is not None:
        env["FINETUNE_KEY_FROM"] = key_from
    if region and _REGION.fullmatch(region):  # the runner's S3 / SNS clients need it; IMDS would do, more slowly
        env |= {"AWS_REGION": region, "AWS_DEFAULT_REGION": region}
    return runner_boot_script(env, settings.runner_path)


def group_distribution(market: Market) -> dict[str, Any]:
    """The group's instances distribution for the market the spot authority chose: all of it on that market
    (an on-demand base of one for on-demand), so Auto Scaling never buys the other market by itself."""
    on_demand = market == "on-demand"
    return {
        "OnDemandBaseCapacity": 1 if on_demand else 0,
        "OnDemandPercentageAboveBaseCapacity": 100 if on_demand else 0,
        "SpotAllocationStrategy": "price-capacity-optimized",
    }


_WORDS = re.compile(r"[A-Za-z][A-Za-z.]+")


def activity_refused(status: str) -> bool:
    """Whether a failed scaling activity's message names an EC2 capacity error (``… InsufficientInstanceCapacity
    …``, ``… MaxSpotInstanceCountExceeded …``): the market had no room, and the spot authority chooses again."""
    return any(classify_launch_error(word.rstrip(".")) == "capacity" for word in _WORDS.findall(status))


def _error(exc: ClientError) -> tuple[str, str]:
    error = exc.response.get("Error", {})
    return str(error.get("Code", "")), str(error.get("Message", ""))


def _reason(exc: ClientError) -> str:
    code, message = _error(exc)
    return f"{code}: {message}" if message else code or str(exc)


def _client_token(*parts: object) -> str:
    """EC2's idempotency token: the same request sent again (after a crash or no answer) starts nothing new."""
    return hashlib.sha256("/".join(map(str, parts)).encode()).hexdigest()[:32]


# IMDSv2 only, and a hop limit of 1: a token's PUT answer dies at the first hop, so a container on the host (one
# more hop) never gets a token, hence never the instance role's credentials.
METADATA_OPTIONS: Mapping[str, Any] = {
    "HttpTokens": "required",
    "HttpPutResponseHopLimit": 1,
    "HttpEndpoint": "enabled",
}


def _tags(resource: Mapping[str, Any]) -> dict[str, str]:
    return {str(tag["Key"]): str(tag["Value"]) for tag in resource.get("Tags") or []}


def _listed(instance: Mapping[str, Any]) -> CloudInstance:
    tags = _tags(instance)
    attempt = tags.get(ATTEMPT_TAG, "")
    launched = instance.get("LaunchTime")
    return CloudInstance(
        instance_id=str(instance["InstanceId"]),
        state=str((instance.get("State") or {}).get("Name", "unknown")),
        job_id=tags.get(JOB_TAG),
        attempt=int(attempt) if attempt.isdigit() else None,
        launched_at=launched if isinstance(launched, datetime) else None,
    )


class AwsCloud:
    name = "aws"
    notice: Literal["aws", "aliyun", "none"] = "aws"

    def __init__(self, settings: AwsSettings, *, report_keys: ReportKeys | None = None) -> None:
        self.settings = settings  # (cloud events arrive through EventBridge -> SQS / SNS, not from here)
        # Each attempt's own report key goes into a key object only its instance may read (written once the
        # instance id is known), never into the spec (every runner reads every spec) nor user data (every process on
        # the instance reads that from IMDS).
        if report_keys is not None and settings.runner_role_id is None:
            raise ConfigError(
                "aws.runner_role_id is not set: the runner stack's output RunnerRoleId (each attempt's report key is "
                "readable only by its instance, named <role id>:<instance id>)"
            )
        if settings.runner_storage_role_arn is not None and (report_keys is None or settings.runner_role_id is None):
            raise ConfigError(
                "aws.runner_storage_role_arn needs report keys and aws.runner_role_id: the storage credentials travel "
                "in each attempt's key object"
            )
        self.report_keys = report_keys
        self.region: str | None = (
            settings.region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
        )
        self._session = aioboto3.Session(region_name=self.region)
        self._stack = AsyncExitStack()
        self._clients: dict[str, Any] = {}
        self._clients_lock = asyncio.Lock()
        self._zone_names: dict[str, str] | None = None  # zone id -> zone name
        self._subnets: dict[str, str] | None = dict(settings.subnets) if isinstance(settings.subnets, dict) else None
        self._available_zones: list[str] | None = None
        self._scores_retry_at = 0.0
        self._scores: dict[tuple[tuple[str, ...], str | None], tuple[float, dict[str, int]]] = {}

    # -- where things live --------------------------------------------------------------------------------

    def checkpoint_uri(self, job_id: str) -> str:
        return f"s3://{self.settings.bucket}/{self.settings.prefix}{job_id}/"

    def spec_key(self, job_id: str, attempt: int) -> str:
        return f"{self.settings.prefix}{job_id}/spec-attempt-{attempt}.json"

    def control_key(self, job_id: str, attempt: int) -> str:
        """The runner's control object, relative to the bucket (the runner reads it relative to its checkpoints)."""
        return f"{self.settings.prefix}{job_id}/{control_key(attempt)}"

    def on_demand_price(self, instance_type: str) -> float | None:
        return self.settings.on_demand_prices.get(instance_type, ON_DEMAND_PRICES.get(instance_type))

    def key_prefix_uri(self) -> str | None:
        """Where the runners find their keys (the spec's ``report_key_from``): the runner appends its instance id."""
        role_id = self.settings.runner_role_id
        if self.report_keys is None or role_id is None:
            return None
        return f"s3://{self.settings.bucket}/{ATTEMPT_KEYS_PREFIX}{role_id}:"

    # -- launch ---------------------------------------------------------------------------------------------

    async def launch(
        self,
        spec: JobSpec,
        instance_types: list[str],
        market: Market,
        *,
        avoid_zones: Collection[str] = (),
        zone: str | None = None,
    ) -> Instance:
        """Start the attempt's instance on ``market``; LaunchError naming every failed candidate when none would
        start (``capacity`` True when the market had no room: the spot authority chooses again).

        ``avoid_zones``: zones where this job was just reclaimed or failed (the bot passes the zones of the
        job's previous attempts); they are tried last. ``zone``: there only.
        """
        if not instance_types:
            raise LaunchError("the recipe lists no instance types for aws")
        spec = self._complete_spec(spec)
        spec_uri = await self._upload_spec(spec)
        script = user_data_script(spec_uri, self.settings, self.region, self.key_prefix_uri())
        if self.settings.mode == "autoscaling":
            return await self._launch_group(spec, script, instance_types, market, avoid_zones, zone)
        existing = await self._attempt_instance(spec)
        if existing is not None:  # a launch retried after a crash: the instance the first try started
            log.info("%s attempt %d: %s is up already", spec.job_id, spec.attempt, existing.instance_id)
            return await self._with_key(spec, existing)
        zones = await self._zones()
        if zone:  # pinned by the spot policy: there or nowhere
            zones = [zone]
        if market == "spot":
            prices = await self._spot_prices(instance_types)
            scores = await self._placement_scores(instance_types)
            candidates = order_spot_candidates(zones, instance_types, scores, prices, avoid_zones)
        else:
            candidates = order_on_demand_candidates(zones, instance_types, avoid_zones)
        plan = LaunchPlan(candidates, max_failures=self.settings.max_launch_failures)
        while (candidate := plan.next()) is not None:
            where = f"{candidate.market} {candidate.instance_type} in {candidate.zone}"
            try:
                instance_id = await self._run_instance(spec, script, candidate)
            except ClientError as exc:
                code, message = _error(exc)
                kind = plan.failed(candidate, code, message)
                log.info("%s attempt %d: %s failed: %s (%s)", spec.job_id, spec.attempt, where, code, kind)
                continue
            except (BotoCoreError, ResponseParserError) as exc:
                raise LaunchError(f"EC2 did not answer RunInstances: {exc}") from exc
            log.info("%s attempt %d: launched %s (%s)", spec.job_id, spec.attempt, instance_id, where)
            on_demand = self.on_demand_price(candidate.instance_type)
            price = candidate.spot_price if candidate.market == "spot" else on_demand
            launched = Instance(
                instance_id, candidate.instance_type, candidate.zone, candidate.market, price, on_demand
            )
            return await self._with_key(spec, launched)
        raise LaunchError(plan.summary(), capacity=plan.refused, zone=zone)

    # -- the attempt's report key -----------------------------------------------------------------------------

    async def _with_key(self, spec: JobSpec, instance: Instance) -> Instance:
        """``instance``, once its key object is written; a key that cannot be written releases the instance (its
        runner could never report) and fails the launch."""
        try:
            await self._put_key(spec, instance.instance_id)
        except (ClientError, BotoCoreError, ResponseParserError, ValueError) as exc:
            log.warning("%s attempt %d: no key object for %s: %s", spec.job_id, spec.attempt, instance.instance_id, exc)
            try:
                await self.terminate(instance.instance_id, spec.job_id)
            except CloudError as again:
                log.warning("could not release %s after that: %s", instance.instance_id, again)
            raise LaunchError(
                f"could not write the report key of {spec.job_id} attempt {spec.attempt} for {instance.instance_id} "
                f"(s3://{self.settings.bucket}/attempt-keys/…): {exc}; the instance was released"
            ) from exc
        return instance

    async def _put_key(self, spec: JobSpec, instance_id: str) -> None:
        await self._write_key(spec.job_id, spec.attempt, instance_id)

    async def _write_key(self, job_id: str, attempt: int, instance_id: str) -> None:
        """Write the attempt's key (and a fresh storage session, with a storage role) where only ``instance_id``'s
        runner may read it; nothing without report keys."""
        role_id = self.settings.runner_role_id
        if self.report_keys is None or role_id is None:
            return
        storage = await self._storage_session(job_id, attempt) if self.renews_storage else None
        s3 = await self._client("s3")
        await s3.put_object(
            Bucket=self.settings.bucket,
            Key=key_object(role_id, instance_id),
            Body=dump_attempt_key(job_id, attempt, self.report_keys.of(job_id, attempt), storage),
            ContentType="application/json",
            # the runner role's Deny refuses a key object whose tag does not name the session reading it
            Tagging=urlencode({READER_TAG: reader(role_id, instance_id)}),
        )

    @property
    def renews_storage(self) -> bool:
        """Whether runners get per-attempt storage sessions (which then need rewriting before they expire)."""
        return self.settings.runner_storage_role_arn is not None

    async def _storage_session(self, job_id: str, attempt: int) -> StorageCredentials:
        """An STS session of the runner storage role limited to the job's prefix, for one hour (role chaining's cap),
        named after the job and attempt so CloudTrail says whose each request was."""
        role = self.settings.runner_storage_role_arn
        if role is None:
            raise ValueError("no aws.runner_storage_role_arn")
        policy = session_policy(self.settings.bucket, self.settings.prefix, job_id, partition_of(role))
        sts = await self._client("sts")
        reply = await sts.assume_role(
            RoleArn=role,
            RoleSessionName=session_name(job_id, attempt),
            Policy=dump_session_policy(policy),
            DurationSeconds=SESSION_SECONDS,
        )
        found = reply["Credentials"]
        expiration = found["Expiration"]
        if isinstance(expiration, datetime) and expiration.tzinfo is None:
            expiration = expiration.replace(tzinfo=UTC)
        return StorageCredentials(
            access_key_id=found["AccessKeyId"],
            secret_access_key=found["SecretAccessKey"],
            session_token=found["SessionToken"],
            expiration=expiration,
        )

    async def renew_storage_credentials(self, job_id: str, attempt: int, instance_id: str) -> None:
        """Rewrite the attempt's key object with a fresh storage session (bot/storage_renewal.py calls this for every
        live attempt well before the last one expires). AwsError when STS or S3 would not."""
        if not self.renews_storage:
            return
        try:
            await self._write_key(job_id, attempt, instance_id)
        except (ClientError, BotoCoreError, ResponseParserError, ValueError) as exc:
            raise AwsError(
                f"could not renew the storage credentials of {job_id} attempt {attempt} on {instance_id}: {exc}"
            ) from exc
        log.info("%s attempt %d: storage credentials renewed for %s", job_id, attempt, instance_id)

    async def drop_storage_credentials(self, instance_id: str) -> None:
        """The key object of an attempt that ended while its credentials were being renewed goes again."""
        await self._delete_key(instance_id)

    async def _delete_key(self, instance_id: str) -> None:
        """Best effort, idempotent: the key object of a released instance goes (the bucket expires strays)."""
        role_id = self.settings.runner_role_id
        if self.report_keys is None or role_id is None:
            return
        try:
            name = key_object(role_id, instance_id)
            s3 = await self._client("s3")
            await s3.delete_object(Bucket=self.settings.bucket, Key=name)
        except (ClientError, BotoCoreError, ResponseParserError, ValueError) as exc:
            log.warning("could not delete the key object of %s: %s", instance_id, exc)

    async def _attempt_instance(self, spec: JobSpec) -> Instance | None:
        """The live instance already tagged with this (job, attempt), if any."""
        ec2 = await self._client("ec2")
        try:
            reply = await ec2.describe_instances(
                Filters=[
                    {"Name": f"tag:{JOB_TAG}", "Values": [spec.job_id]},
                    {"Name": f"tag:{ATTEMPT_TAG}", "Values": [str(spec.attempt)]},
                    {"Name": "instance-state-name", "Values": ["pending", "running"]},
                ]
            )
        except (ClientError, BotoCoreError, ResponseParserError) as exc:
            raise LaunchError(f"EC2 did not answer DescribeInstances: {exc}") from exc
        for reservation in reply.get("Reservations", []):
            for found in reservation.get("Instances", []):
                instance_type = str(found.get("InstanceType", ""))
                zone = str(found.get("Placement", {}).get("AvailabilityZone", ""))
                market: Market = "spot" if found.get("InstanceLifecycle") == "spot" else "on-demand"
                on_demand = self.on_demand_price(instance_type)
                price = on_demand
                if market == "spot":
                    price = (await self._spot_prices([instance_type])).get((zone, instance_type))
                return Instance(str(found["InstanceId"]), instance_type, zone, market, price, on_demand)
        return None

    def _complete_spec(self, spec: JobSpec) -> JobSpec:
        """What only the AWS side knows: the SNS report topic, and where the runner finds the report key it signs
        those reports with (not the key itself). The spec asks the runner for no release of its own: the bot ends
        the instance (or empties the group) on completion, and a runner's role may end or scale nothing, since an
        instance role cannot be limited to its own instance and would reach every other job's."""
        update: dict[str, Any] = {}
        topic = self.settings.report_topic_arn
        if topic and f"sns:{topic}" not in spec.report:
            update["report"] = [*spec.report, f"sns:{topic}"]
        where = self.key_prefix_uri()
        if where is not None and spec.report_key_from is None:
            update["report_key_from"] = where
        return spec.model_copy(update=update) if update else spec

    async def _upload_spec(self, spec: JobSpec) -> str:
        key = self.spec_key(spec.job_id, spec.attempt)
        s3 = await self._client("s3")
        try:
            await s3.put_object(
                Bucket=self.settings.bucket,
                Key=key,
                Body=spec.model_dump_json().encode(),
                ContentType="application/json",
            )
        except (ClientError, BotoCoreError, ResponseParserError) as exc:
            raise LaunchError(f"could not upload the spec to s3://{self.settings.bucket}/{key}: {exc}") from exc
        return f"s3://{self.settings.bucket}/{key}"

    def _tag_list(self, spec: JobSpec) -> list[dict[str, str]]:
        return [
            {"Key": MANAGED_TAG, "Value": "true"},  # the bot's policy terminates, and FIS interrupts, only these
            {"Key": JOB_TAG, "Value": spec.job_id},
            {"Key": ATTEMPT_TAG, "Value": str(spec.attempt)},
            {"Key": "Name", "Value": f"finetune-{spec.job_id}-{spec.attempt}"},
        ]

    def _instance_settings(self) -> dict[str, Any]:
        """What every instance gets, in RunInstances / LaunchTemplateData spelling."""
        params: dict[str, Any] = {"MetadataOptions": dict(METADATA_OPTIONS)}
        if self.settings.image_id:
            params["ImageId"] = self.settings.image_id
        if self.settings.security_group_ids:
            params["SecurityGroupIds"] = list(self.settings.security_group_ids)
        profile = self.settings.instance_profile
        if profile:
            params["IamInstanceProfile"] = {"Arn": profile} if profile.startswith("arn:") else {"Name": profile}
        if self.settings.key_name:
            params["KeyName"] = self.settings.key_name
        return params

    async def _run_instance(self, spec: JobSpec, script: str, candidate: Candidate) -> str:
        tags = self._tag_list(spec)
        params: dict[str, Any] = {
            **self._instance_settings(),
            "InstanceType": candidate.instance_type,
            "MinCount": 1,
            "MaxCount": 1,
            "UserData": script,  # botocore base64-encodes RunInstances user-data itself
            "Placement": {"AvailabilityZone": candidate.zone},
            "TagSpecifications": [{"ResourceType": kind, "Tags": tags} for kind in ("instance", "volume")],
            "ClientToken": _client_token(
                spec.job_id, spec.attempt, candidate.zone, candidate.instance_type, candidate.market
            ),
        }
        subnet = (await self._subnet_map()).get(candidate.zone)
        if subnet:
            params["SubnetId"] = subnet
        if self.settings.launch_template:
            params["LaunchTemplate"] = {"LaunchTemplateName": self.settings.launch_template, "Version": "$Default"}
        if candidate.market == "spot":
            params["InstanceMarketOptions"] = {
                "MarketType": "spot",
                "SpotOptions": {"SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate"},
            }
        # No botocore retries here: a capacity error answers HTTP 500, and retrying the same zone only burns
        # the RunInstances rate limit; the plan moves on to the next candidate instead.
        ec2 = await self._client("ec2", retries=False)
        reply = await ec2.run_instances(**params)
        return str(reply["Instances"][0]["InstanceId"])

    # -- what to launch where ------------------------------------------------------------------------------

    async def _zone_info(self) -> tuple[dict[str, str], list[str]]:
        if self._zone_names is None or self._available_zones is None:
            ec2 = await self._client("ec2")
            reply = await ec2.describe_availability_zones(
                Filters=[{"Name": "zone-type", "Values": ["availability-zone"]}]
            )
            zones = reply.get("AvailabilityZones", [])
            self._zone_names = {str(zone["ZoneId"]): str(zone["ZoneName"]) for zone in zones}
            self._available_zones = [str(zone["ZoneName"]) for zone in zones if zone.get("State") == "available"]
        return self._zone_names, self._available_zones

    async def _subnet_map(self) -> dict[str, str]:
        """Zone name -> subnet id: as configured, or looked up once for a configured list of subnet ids."""
        if self._subnets is None:
            ids = list(self.settings.subnets)
            ec2 = await self._client("ec2")
            try:
                reply = await ec2.describe_subnets(SubnetIds=ids)
            except (ClientError, BotoCoreError, ResponseParserError) as exc:
                raise LaunchError(f"could not look up subnets {', '.join(ids)}: {exc}") from exc
            zone_of = {str(item["SubnetId"]): str(item["AvailabilityZone"]) for item in reply.get("Subnets", [])}
            found: dict[str, str] = {}
            for subnet in ids:
                zone = zone_of.get(subnet)
                if zone is None:
                    raise LaunchError(f"subnet {subnet} does not exist in {self.region or 'this region'}")
                if zone in found:
                    raise LaunchError(f"subnets {found[zone]} and {subnet} are both in {zone}: give one per zone")
                found[zone] = subnet
            self._subnets = found
        return self._subnets

    async def _zones(self) -> list[str]:
        """Candidate zones in preference order: ``zones`` first, then other zones with a subnet."""
        settings = self.settings
        subnets = await self._subnet_map()
        if subnets:
            return [z for z in settings.zones if z in subnets] + [z for z in subnets if z not in settings.zones]
        if settings.zones:
            return list(settings.zones)
        try:
            _, available = await self._zone_info()
        except (ClientError, BotoCoreError, ResponseParserError) as exc:
            raise LaunchError(f"could not list availability zones: {exc}") from exc
        return available

    async def _spot_prices(self, instance_types: list[str]) -> dict[tuple[str, str], float]:
        """The current spot price per (zone, type); empty (ordering by configuration) when EC2 will not say."""
        ec2 = await self._client("ec2")
        points: list[SpotPrice] = []
        try:
            paginator = ec2.get_paginator("describe_spot_price_history")
            pages = paginator.paginate(
                InstanceTypes=instance_types,
                ProductDescriptions=["Linux/UNIX", "Linux/UNIX (Amazon VPC)"],
                StartTime=datetime.now(UTC),  # "from now": the price in effect now, per zone and type
                PaginationConfig={"MaxItems": 1000},
            )
            async for page in pages:
                for item in page.get("SpotPriceHistory", []):
                    points.append(
                        SpotPrice(
                            str(item["AvailabilityZone"]),
                            str(item["InstanceType"]),
                            float(item["SpotPrice"]),
                            item["Timestamp"],
                        )
                    )
        except (ClientError, BotoCoreError, ResponseParserError, KeyError, ValueError) as exc:
            log.warning("spot price history unavailable (%s); zones ordered without prices", exc)
            return {}
        return latest_prices(points)

    async def zone_availability(self, instance_types: list[str]) -> dict[str, float]:
        """The live signal the spot authority weighs: each zone's spot placement score / 10 (empty: no signal)."""
        return score_availability(await self._placement_scores(instance_types) or {})

    async def _placement_scores(self, instance_types: list[str]) -> dict[str, int] | None:
        """Spot placement scores per zone name, cached ``SCORES_TTL_SECONDS`` per (instance types, region); None
        where the API is refused or missing (moto has none: it answers HTTP 500). Then ordering falls back to price
        and configuration, logged once per process, and the scores are asked again only an hour later."""
        key = (tuple(sorted(instance_types)), self.region)
        cached = self._scores.get(key)
        if cached is not None and time.monotonic() - cached[0] < SCORES_TTL_SECONDS:
            return cached[1]
        if time.monotonic() < self._scores_retry_at:
            return None
        ec2 = await self._client("ec2", retries=False)
        try:
            reply = await ec2.get_spot_placement_scores(
                InstanceTypes=instance_types,
                TargetCapacity=1,
                TargetCapacityUnitType="units",
                SingleAvailabilityZone=True,
                RegionNames=[ec2.meta.region_name],
            )
            names, _ = await self._zone_info()
        except (ClientError, BotoCoreError, ResponseParserError) as exc:  # moto: HTTP 500, not XML
            reason = _error(exc)[0] if isinstance(exc, ClientError) else type(exc).__name__
            self._scores_retry_at = time.monotonic() + _SCORES_RETRY_SECONDS
            log_once(
                log,
                "placement-scores",
                "spot placement scores unavailable (%s); choosing zones by spot price and the configured order",
                reason,
            )
            return None
        scores = ((str(s["AvailabilityZoneId"]), int(s["Score"])) for s in reply.get("SpotPlacementScores", []))
        by_zone = scores_by_zone(scores, names)
        self._scores[key] = (time.monotonic(), by_zone)
        return by_zone

    # -- Auto Scaling mode ----------------------------------------------------------------------------------

    async def _launch_group(
        self,
        spec: JobSpec,
        script: str,
        instance_types: list[str],
        market: Market,
        avoid_zones: Collection[str],
        zone: str | None = None,
    ) -> Instance:
        """One group per job (``finetune-<job>``), min 0 / max 1 / desired 1, on the market the spot authority
        chose only (:func:`group_distribution`: no mix, so the group never buys the other market by itself), over
        the subnet of the chosen zone (else every configured subnet, zones to avoid last); Auto Scaling picks the
        type (price-capacity-optimized). A group that starts nothing because the market had no room reports a
        capacity refusal, and the authority chooses again.

        A relaunch first sets the group to 0, so a replacement the group started by itself from an older
        attempt's template version is not left running next to the new attempt.
        """
        group = group_name(spec.job_id)
        version = await self._template_version(spec, script)
        subnet_of = await self._subnet_map()
        if zone:  # pinned by the spot authority: there or nowhere
            if zone not in subnet_of:
                raise LaunchError(f"no subnet configured in {zone} for Auto Scaling group {group}", zone=zone)
            ordered = [zone]
        else:
            zones = await self._zones()
            ordered = [z for z in zones if z not in avoid_zones] + [z for z in zones if z in avoid_zones]
        subnets = ",".join(subnet_of[z] for z in ordered)
        policy = {
            "LaunchTemplate": {
                "LaunchTemplateSpecification": {"LaunchTemplateName": self.settings.template_name, "Version": version},
                "Overrides": [{"InstanceType": instance_type} for instance_type in instance_types],
            },
            "InstancesDistribution": group_distribution(market),
        }
        tags = [
            {**tag, "ResourceId": group, "ResourceType": "auto-scaling-group", "PropagateAtLaunch": True}
            for tag in self._tag_list(spec)
        ]
        asg = await self._client("autoscaling")
        try:
            existing = await self._group(group)
            before: set[str] = set()
            if existing is None:
                await asg.create_auto_scaling_group(
                    AutoScalingGroupName=group,
                    MinSize=0,
                    MaxSize=1,
                    DesiredCapacity=1,
                    VPCZoneIdentifier=subnets,
                    MixedInstancesPolicy=policy,
                    Tags=tags,
                )
            else:
                before = {str(i["InstanceId"]) for i in existing.get("Instances", [])}
                if before or existing.get("DesiredCapacity"):
                    await asg.update_auto_scaling_group(AutoScalingGroupName=group, MinSize=0, DesiredCapacity=0)
                await asg.create_or_update_tags(Tags=tags)
                await asg.update_auto_scaling_group(
                    AutoScalingGroupName=group,
                    MinSize=0,
                    MaxSize=1,
                    DesiredCapacity=1,
                    VPCZoneIdentifier=subnets,
                    MixedInstancesPolicy=policy,
                )
        except (ClientError, BotoCoreError, ResponseParserError) as exc:
            raise LaunchError(f"could not set up Auto Scaling group {group}: {exc}") from exc
        found = await self._wait_for_group_instance(group, before, zone)
        instance_type = str(found.get("InstanceType") or instance_types[0])
        zone = str(found.get("AvailabilityZone", ""))
        on_demand = self.on_demand_price(instance_type)
        price = on_demand
        if market == "spot":
            price = (await self._spot_prices([instance_type])).get((zone, instance_type))
        instance_id = str(found["InstanceId"])
        log.info(
            "%s attempt %d: group %s launched %s (%s in %s)",
            spec.job_id,
            spec.attempt,
            group,
            instance_id,
            instance_type,
            zone,
        )
        # The market is what the group was told to buy (spot only, or on-demand only). The key object is written as
        # soon as the group names its instance, before its runner can have booted; a replacement the group starts by
        # itself later gets none (its runner cannot report, and the bot relaunches the attempt in any case).
        return await self._with_key(spec, Instance(instance_id, instance_type, zone, market, price, on_demand))

    async def _group(self, group: str) -> dict[str, Any] | None:
        asg = await self._client("autoscaling")
        reply = await asg.describe_auto_scaling_groups(AutoScalingGroupNames=[group])
        groups = reply.get("AutoScalingGroups", [])
        return dict(groups[0]) if groups else None

    async def _wait_for_group_instance(self, group: str, before: set[str], zone: str | None) -> dict[str, Any]:
        deadline = time.monotonic() + self.settings.group_wait_seconds
        while True:
            try:
                found = await self._group(group)
            except (ClientError, BotoCoreError, ResponseParserError) as exc:
                log.warning("describing group %s failed: %s", group, exc)
                found = None
            for item in (found or {}).get("Instances", []):
                if str(item["InstanceId"]) not in before and not str(item.get("LifecycleState", "")).startswith(
                    "Terminat"
                ):
                    return dict(item)
            if time.monotonic() >= deadline:
                break
            await asyncio.sleep(self.settings.group_poll_seconds)
        why = await self._last_activity(group)
        asg = await self._client("autoscaling")
        try:  # no instance nobody tracks may turn up later
            await asg.update_auto_scaling_group(AutoScalingGroupName=group, MinSize=0, DesiredCapacity=0)
        except (ClientError, BotoCoreError, ResponseParserError) as exc:
            log.warning("could not set group %s back to 0: %s", group, exc)
        raise LaunchError(
            f"Auto Scaling group {group} launched no instance within {self.settings.group_wait_seconds:g} s"
            + (f" (last activity: {why})" if why else ""),
            capacity=activity_refused(why),
            zone=zone,
        )

    async def _last_activity(self, group: str) -> str:
        asg = await self._client("autoscaling")
        try:
            reply = await asg.describe_scaling_activities(AutoScalingGroupName=group, MaxRecords=1)
        except (ClientError, BotoCoreError, ResponseParserError):
            return ""
        activities = reply.get("Activities", [])
        if not activities:
            return ""
        return str(activities[0].get("StatusMessage") or activities[0].get("Description") or "")

    async def _template_version(self, spec: JobSpec, script: str) -> str:
        """A new version of the shared launch template carrying this attempt's user-data; creates the
        template on first use. Returns the version number."""
        data: dict[str, Any] = {**self._instance_settings(), "UserData": base64.b64encode(script.encode()).decode()}
        name = self.settings.template_name
        description = f"{spec.job_id} attempt {spec.attempt}"
        ec2 = await self._client("ec2")
        for _ in range(2):
            try:
                reply = await ec2.create_launch_template_version(
                    LaunchTemplateName=name,
                    SourceVersion="$Latest",
                    LaunchTemplateData=data,
                    VersionDescription=description,
                )
                return str(reply["LaunchTemplateVersion"]["VersionNumber"])
            except ClientError as exc:
                code, message = _error(exc)
                if code not in _NOT_FOUND_TEMPLATE:
                    raise LaunchError(f"could not add a version to launch template {name}: {code}: {message}") from exc
            if "ImageId" not in data:
                raise LaunchError(f"launch template {name} does not exist: set image_id so the bot can create it")
            try:
                reply = await ec2.create_launch_template(
                    LaunchTemplateName=name,
                    LaunchTemplateData=data,
                    VersionDescription=description,
                    # the bot's policy creates only templates tagged ours, and tags only at such a creation
                    TagSpecifications=[
                        {"ResourceType": "launch-template", "Tags": [{"Key": MANAGED_TAG, "Value": "true"}]}
                    ],
                )
                return str(reply["LaunchTemplate"]["LatestVersionNumber"])
            except ClientError as exc:
                code, message = _error(exc)
                if code != "InvalidLaunchTemplateName.AlreadyExistsException":  # else: created meanwhile, retry
                    raise LaunchError(f"could not create launch template {name}: {code}: {message}") from exc
        raise LaunchError(f"launch template {name} could not be created or versioned")

    # -- instances after launch -----------------------------------------------------------------------------

    async def _describe(self, instance_id: str) -> dict[str, Any] | None:
        ec2 = await self._client("ec2")
        try:
            reply = await ec2.describe_instances(InstanceIds=[instance_id])
        except ClientError as exc:
            if _error(exc)[0] in _NOT_FOUND_INSTANCE:
                return None
            raise AwsError(f"could not look up instance {instance_id}: {_reason(exc)}") from exc
        except (BotoCoreError, ResponseParserError) as exc:
            raise AwsError(f"EC2 did not answer DescribeInstances for {instance_id}: {exc}") from exc
        for reservation in reply.get("Reservations", []):
            for instance in reservation.get("Instances", []):
                return dict(instance)
        return None

    async def _job_of(self, instance_id: str) -> tuple[dict[str, Any], str, int]:
        """The instance, its job id and attempt number, from the tags the launch put on it."""
        instance = await self._describe(instance_id)
        if instance is None:
            raise AwsError(f"instance {instance_id} does not exist")
        tags = _tags(instance)
        job_id, attempt = tags.get(JOB_TAG), tags.get(ATTEMPT_TAG, "")
        if not job_id or not attempt.isdigit():
            raise AwsError(f"instance {instance_id} has no {JOB_TAG} / {ATTEMPT_TAG} tags: not launched by this bot")
        return instance, job_id, int(attempt)

    async def list_instances(self) -> list[CloudInstance]:
        """Every instance tagged ``finetune:job`` in the region, whatever its state, for reconciliation."""
        ec2 = await self._client("ec2")
        found: list[CloudInstance] = []
        try:
            pages = ec2.get_paginator("describe_instances").paginate(
                Filters=[{"Name": "tag-key", "Values": [JOB_TAG]}], PaginationConfig={"PageSize": 500}
            )
            async for page in pages:
                for reservation in page.get("Reservations", []):
                    found.extend(_listed(instance) for instance in reservation.get("Instances", []))
        except (ClientError, BotoCoreError, ResponseParserError) as exc:
            raise AwsError(f"could not list the instances tagged {JOB_TAG}: {exc}") from exc
        return found

    async def spot_zones(self, instance_types: list[str]) -> list[str]:
        """The zones a launch may be pinned to (the spot policy's choice), in preference order."""
        return await self._zones()

    async def list_groups(self) -> list[CloudGroup]:
        """Every Auto Scaling group tagged ``finetune:job`` (Auto Scaling mode makes one per job), for
        reconciliation: a group of a job that is over would otherwise replace its instance for ever."""
        asg = await self._client("autoscaling")
        found: list[CloudGroup] = []
        try:
            pages = asg.get_paginator("describe_auto_scaling_groups").paginate(
                Filters=[{"Name": "tag-key", "Values": [JOB_TAG]}]
            )
            async for page in pages:
                for group in page.get("AutoScalingGroups", []):
                    tags = {str(tag["Key"]): str(tag["Value"]) for tag in group.get("Tags", [])}
                    name, desired = str(group["AutoScalingGroupName"]), int(group.get("DesiredCapacity") or 0)
                    found.append(CloudGroup(name, tags.get(JOB_TAG), desired))
        except (ClientError, BotoCoreError, ResponseParserError) as exc:
            raise AwsError(f"could not list the Auto Scaling groups tagged {JOB_TAG}: {exc}") from exc
        return found

    async def release_group(self, name: str) -> None:
        """Set the group to 0: Auto Scaling terminates its instance and launches no other (gone already: fine)."""
        asg = await self._client("autoscaling")
        try:
            await asg.update_auto_scaling_group(AutoScalingGroupName=name, MinSize=0, DesiredCapacity=0)
        except ClientError as exc:
            if "not found" not in str(exc).lower():
                raise AwsError(f"could not set Auto Scaling group {name} to 0: {_error(exc)[1]}") from exc
        except (BotoCoreError, ResponseParserError) as exc:
            raise AwsError(f"Auto Scaling did not answer for group {name}: {exc}") from exc

    async def hourly_price(self, instance_types: list[str], market: Market) -> float | None:
        """Spot: the lowest current price of these types in our zones; on-demand: the lowest list price."""
        if market == "spot":
            prices = await self._spot_prices(instance_types)
            if prices:
                return min(prices.values())
        listed = [price for price in map(self.on_demand_price, instance_types) if price is not None]
        return min(listed) if listed else None

    async def terminate(self, instance_id: str, job_id: str) -> None:
        """Terminate the instance (a missing one is fine); an Auto Scaling instance's group goes to 0 first,
        so the group does not replace it. One not tagged ``finetune:job=<job_id>`` is never touched
        (ForeignInstance)."""
        instance = await self._describe(instance_id)
        if instance is None:
            await self._delete_key(instance_id)
            return
        tags = _tags(instance)
        if tags.get(JOB_TAG) != job_id:
            owner = tags.get(JOB_TAG) or "no job"
            raise ForeignInstance(f"instance {instance_id} is tagged for {owner}, not {job_id}: left alone")
        await self._delete_key(instance_id)  # first: an instance that ends here needs it no more
        group = tags.get(GROUP_TAG)
        if group:
            asg = await self._client("autoscaling")
            try:
                await asg.update_auto_scaling_group(AutoScalingGroupName=group, MinSize=0, DesiredCapacity=0)
            except (ClientError, BotoCoreError, ResponseParserError) as exc:
                log.warning("could not set group %s to 0: %s", group, exc)
        ec2 = await self._client("ec2")
        try:
            await ec2.terminate_instances(InstanceIds=[instance_id])
        except ClientError as exc:
            if _error(exc)[0] not in _NOT_FOUND_INSTANCE:
                raise AwsError(f"could not terminate {instance_id}: {_reason(exc)}") from exc
        except (BotoCoreError, ResponseParserError) as exc:
            raise AwsError(f"EC2 did not answer TerminateInstances for {instance_id}: {exc}") from exc

    async def stop_runner(self, instance_id: str) -> None:
        """Ask the runner to checkpoint and stop by writing :class:`~handlers.spec.StopControl` to
        ``<prefix><job>/control/attempt-<n>.json``, the control object the runner polls.

        Not SSM Run Command: that needs the SSM agent and the AmazonSSMManagedInstanceCore role on the
        instance, and has no effect in moto. The control object needs only the S3 access the runner already
        has for checkpoints, and works the same on Alibaba OSS.
        """
        _, job_id, attempt = await self._job_of(instance_id)
        key = self.control_key(job_id, attempt)
        s3 = await self._client("s3")
        try:
            await s3.put_object(
                Bucket=self.settings.bucket,
                Key=key,
                Body=dump_control(StopControl()),
                ContentType="application/json",
            )
        except (ClientError, BotoCoreError, ResponseParserError) as exc:
            raise AwsError(f"could not write the stop request s3://{self.settings.bucket}/{key}: {exc}") from exc

    async def interrupt_test(self, instance_id: str) -> InterruptTestResult:
        """A real spot interruption through AWS FIS: an experiment template per job (tagged
        ``<fis_template_tag>=true``, reused), targeting the job's running spot instances by their
        ``finetune:job`` tag, then a started experiment. The interruption itself comes from EC2."""
        role = self.settings.fis_role_arn
        if not role:
            raise AwsError(
                "FIS is not set up: set fis_role_arn to a role FIS may assume (with the "
                "AWSFaultInjectionSimulatorEC2Access policy) to run interruption drills"
            )
        instance, job_id, _ = await self._job_of(instance_id)
        state = str(instance.get("State", {}).get("Name", ""))
        if state not in ("pending", "running"):
            raise AwsError(f"instance {instance_id} is {state or 'gone'}: nothing to interrupt")
        if instance.get("InstanceLifecycle") != "spot":
            raise AwsError(f"instance {instance_id} is on-demand: FIS interrupts only spot instances")
        fis = await self._client("fis")
        try:
            template_id = await self._drill_template(fis, job_id, role)
            reply = await fis.start_experiment(
                experimentTemplateId=template_id,
                clientToken=_client_token("drill", instance_id),  # one drill per instance, however often asked
                tags={JOB_TAG: job_id, "finetune:instance": instance_id},
            )
        except ClientError as exc:
            code, message = _error(exc)
            if code in _DENIED:
                raise AwsError(
                    f"not permitted: FIS said {code} ({message}); the bot needs fis:CreateExperimentTemplate, "
                    f"fis:StartExperiment, fis:ListExperimentTemplates, fis:TagResource and iam:PassRole on {role}"
                ) from exc
            raise AwsError(f"FIS could not start the drill: {code}: {message}") from exc
        except (BotoCoreError, ResponseParserError) as exc:
            raise AwsError(f"FIS is not available here ({self.region or 'default region'}): {exc}") from exc
        experiment_id = str(reply["experiment"]["id"])
        log.info("FIS experiment %s (template %s) started on %s (%s)", experiment_id, template_id, instance_id, job_id)
        lead = self.settings.drill_notice  # PT<n>M or PT<n>S
        after = int(lead[2:-1]) * (60 if lead.endswith("M") else 1)
        return InterruptTestResult(instance_id=instance_id, way="fis", reference=experiment_id, after_seconds=after)

    async def _drill_template(self, fis: Any, job_id: str, role: str) -> str:
        marker = self.settings.fis_template_tag
        paginator = fis.get_paginator("list_experiment_templates")
        async for page in paginator.paginate():
            for summary in page.get("experimentTemplates", []):
                tags = summary.get("tags") or {}
                if tags.get(marker) == "true" and tags.get(JOB_TAG) == job_id:
                    return str(summary["id"])
        reply = await fis.create_experiment_template(
            clientToken=uuid.uuid4().hex,
            description=f"finetune-chatops drill: spot interruption of {job_id}",
            roleArn=role,
            stopConditions=[{"source": "none"}],
            targets={
                "SpotInstances": {
                    "resourceType": "aws:ec2:spot-instance",
                    "resourceTags": {JOB_TAG: job_id},
                    "filters": [{"path": "State.Name", "values": ["running"]}],
                    "selectionMode": "ALL",
                }
            },
            actions={
                "interrupt": {
                    "actionId": "aws:ec2:send-spot-instance-interruptions",
                    "parameters": {"durationBeforeInterruption": self.settings.drill_notice},
                    "targets": {"SpotInstances": "SpotInstances"},
                }
            },
            tags={marker: "true", JOB_TAG: job_id},
        )
        return str(reply["experimentTemplate"]["id"])

    # -- clients --------------------------------------------------------------------------------------------

    async def _client(self, service: str, *, retries: bool = True) -> Any:
        """One client per (service, retry policy), opened on first use and closed by ``close``."""
        key = f"{service}:{'retry' if retries else 'once'}"
        async with self._clients_lock:
            client = self._clients.get(key)
            if client is None:
                attempts = {"mode": "standard", "max_attempts": 3} if retries else {"total_max_attempts": 1}
                config = Config(retries=attempts, connect_timeout=10, read_timeout=60)
                client = await self._stack.enter_async_context(self._session.client(service, config=config))
                self._clients[key] = client
            return client

    async def close(self) -> None:
        async with self._clients_lock:
            self._clients.clear()
            await self._stack.aclose()
            self._stack = AsyncExitStack()


if TYPE_CHECKING:  # AwsCloud must stay a CloudProvider (mypy checks this line)

    def _is_provider(cloud: AwsCloud) -> CloudProvider:
        return cloud
