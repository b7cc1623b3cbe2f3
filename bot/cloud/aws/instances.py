"""EC2 instances of the AWS provider: what each gets (image, profile, hardened metadata, tags, user-data), the
calls the shared launch loop makes (:mod:`bot.cloud.launching`), and describe / list / terminate after launch."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from bot.cloud.aws.clients import AwsClients, not_done, reason, tags_of
from bot.cloud.aws.placement import AwsPlacement, efa_interface, placement_group_name
from bot.cloud.aws.pricing import AwsPricing
from bot.cloud.aws.settings import REGION, AwsSettings
from bot.cloud.aws.zones import AwsZones
from bot.cloud.base import GangPlacement, Instance, LaunchError
from bot.cloud.launching import (
    ATTEMPT_TAG,
    JOB_TAG,
    Started,
    attempt_of,
    candidate_token,
    instance_name,
    priced,
    tags_of_spec,
)
from bot.cloud.user_data import runner_boot_script
from bot.errors import CloudError, CloudRefused, CloudUnavailable
from handlers.jobs import Market
from handlers.reconcile import CloudInstance
from handlers.spec import JobSpec
from handlers.spot.zones import Candidate

NOT_FOUND_INSTANCE = frozenset({"InvalidInstanceID.NotFound"})


def user_data_script(
    spec_uri: str, settings: AwsSettings, storage_region: str | None, key_from: str | None = None
) -> str:
    """The instance's user-data: point the runner's unit at this attempt's spec object and start it. ``key_from``
    (where key objects lie, no key in it): the runner reads its key object first, since with a storage role the spec
    itself is readable only with the storage credentials that object holds. ``storage_region``: the bucket's (the home
    region), never the instance's own: a runner launched in another region reaches the bucket at its regional
    endpoint (its S3 client takes the region from ``AWS_REGION``)."""
    env = {"FINETUNE_SPEC": spec_uri, "FINETUNE_WORK_DIR": settings.work_dir}
    if key_from is not None:
        env["FINETUNE_KEY_FROM"] = key_from
    if storage_region and REGION.fullmatch(storage_region):  # the runner's S3 client needs it; IMDS would say the
        env |= {"AWS_REGION": storage_region, "AWS_DEFAULT_REGION": storage_region}  # instance's, not the bucket's
        # The bucket stays in the home region: a runner anywhere reaches it at the bucket's regional endpoint.
        env["FINETUNE_STORAGE_REGION"] = storage_region
    return runner_boot_script(env, settings.runner_path)


# IMDSv2 only, and a hop limit of 1: a token's PUT answer dies at the first hop, so a container on the host (one
# more hop) never gets a token, hence never the instance role's credentials.
METADATA_OPTIONS: Mapping[str, Any] = {
    "HttpTokens": "required",
    "HttpPutResponseHopLimit": 1,
    "HttpEndpoint": "enabled",
}


def _listed(instance: Mapping[str, Any]) -> CloudInstance:
    tags = tags_of(instance)
    attempt = tags.get(ATTEMPT_TAG, "")
    launched = instance.get("LaunchTime")
    return CloudInstance(
        instance_id=str(instance["InstanceId"]),
        state=str((instance.get("State") or {}).get("Name", "unknown")),
        job_id=tags.get(JOB_TAG),
        attempt=int(attempt) if attempt.isdigit() else None,
        launched_at=launched if isinstance(launched, datetime) else None,
    )


class AwsInstances:
    """EC2's side of a launch in one region (the calls :class:`bot.cloud.aws.regions.AcrossRegions` makes there) and
    of an instance's life after."""

    def __init__(
        self,
        settings: AwsSettings,
        clients: AwsClients,
        zones: AwsZones,
        pricing: AwsPricing,
        gangs: AwsPlacement | None = None,
    ) -> None:
        self.settings = settings
        self.clients = clients
        self.placement = zones
        self.pricing = pricing
        self.gangs = gangs or AwsPlacement(clients)

    async def attempt_instance(self, spec: JobSpec) -> Instance | None:
        """The live instance already tagged with this (job, attempt), if any."""
        try:
            found = await self.live_instance(spec.job_id, spec.attempt)
        except (CloudRefused, CloudUnavailable) as exc:
            raise LaunchError(f"EC2 did not answer DescribeInstances: {exc}") from exc
        if found is None:
            return None
        instance_type = str(found.get("InstanceType", ""))
        zone = str(found.get("Placement", {}).get("AvailabilityZone", ""))
        market: Market = "spot" if found.get("InstanceLifecycle") == "spot" else "on-demand"
        address = str(found.get("PrivateIpAddress") or "") or None
        return await priced(self.pricing, str(found["InstanceId"]), instance_type, zone, market, address)

    async def live_instance(self, job_id: str, attempt: int) -> dict[str, Any] | None:
        """The pending or running instance tagged with this (job, attempt), if any; botocore's errors raised."""
        ec2 = await self.clients.get("ec2")
        reply = await ec2.describe_instances(
            Filters=[
                {"Name": f"tag:{JOB_TAG}", "Values": [job_id]},
                {"Name": f"tag:{ATTEMPT_TAG}", "Values": [str(attempt)]},
                {"Name": "instance-state-name", "Values": ["pending", "running"]},
            ]
        )
        for reservation in reply.get("Reservations", []):
            for found in reservation.get("Instances", []):
                return dict(found)
        return None

    def tag_list(self, spec: JobSpec) -> list[dict[str, str]]:
        """The attempt's tags in EC2's spelling (the bot's policy terminates, and FIS interrupts, only these)."""
        tags = [{"Key": key, "Value": value} for key, value in tags_of_spec(spec).items()]
        return [*tags, {"Key": "Name", "Value": instance_name(spec)}]

    def instance_settings(self) -> dict[str, Any]:
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

    async def run_instance(
        self, spec: JobSpec, script: str, candidate: Candidate, gang: GangPlacement | None = None
    ) -> Started:
        """RunInstances for one candidate (its reply names the instance's private address: a gang's node 0 is met
        there); a gang node goes into its job's cluster placement group (made before the
        launch loop), with an EFA primary interface where asked for and the type has one."""
        tags = self.tag_list(spec)
        params: dict[str, Any] = {
            **self.instance_settings(),
            "InstanceType": candidate.instance_type,
            "MinCount": 1,
            "MaxCount": 1,
            "UserData": script,  # botocore base64-encodes RunInstances user-data itself
            "Placement": {"AvailabilityZone": candidate.zone},
            "TagSpecifications": [{"ResourceType": kind, "Tags": tags} for kind in ("instance", "volume")],
            "ClientToken": candidate_token(spec, candidate),
        }
        subnet = (await self.placement.subnet_map()).get(candidate.zone)
        if subnet:
            params["SubnetId"] = subnet
        if gang is not None:
            params["Placement"]["GroupName"] = placement_group_name(gang.job_id)
            if gang.efa and await self.gangs.has_efa(candidate.instance_type):
                groups = list(params.pop("SecurityGroupIds", []))
                params.pop("SubnetId", None)
                params["NetworkInterfaces"] = [efa_interface(subnet, groups)]
        if self.settings.launch_template:
            params["LaunchTemplate"] = {"LaunchTemplateName": self.settings.launch_template, "Version": "$Default"}
        if candidate.market == "spot":
            params["InstanceMarketOptions"] = {
                "MarketType": "spot",
                "SpotOptions": {"SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate"},
            }
        # No botocore retries here: a capacity error answers HTTP 500, and retrying the same zone only burns
        # the RunInstances rate limit; the plan moves on to the next candidate instead.
        ec2 = await self.clients.get("ec2", retries=False)
        try:
            reply = await ec2.run_instances(**params)
        except CloudUnavailable as exc:
            raise LaunchError(f"EC2 did not answer RunInstances: {exc}") from exc
        started = reply["Instances"][0]
        return Started(str(started["InstanceId"]), str(started.get("PrivateIpAddress") or "") or None)

    async def describe(self, instance_id: str) -> dict[str, Any] | None:
        ec2 = await self.clients.get("ec2")
        try:
            reply = await ec2.describe_instances(InstanceIds=[instance_id])
        except CloudRefused as exc:
            if exc.code in NOT_FOUND_INSTANCE:
                return None
            raise CloudError(f"could not look up instance {instance_id}: {reason(exc)}") from exc
        except CloudUnavailable as exc:
            raise CloudUnavailable(f"EC2 did not answer DescribeInstances for {instance_id}: {exc}") from exc
        for reservation in reply.get("Reservations", []):
            for instance in reservation.get("Instances", []):
                return dict(instance)
        return None

    async def job_of(self, instance_id: str) -> tuple[dict[str, Any], str, int]:
        """The instance, its job id and attempt number, from the tags the launch put on it."""
        instance = await self.describe(instance_id)
        if instance is None:
            raise CloudError(f"instance {instance_id} does not exist")
        job_id, attempt = attempt_of(tags_of(instance), instance_id, CloudError)
        return instance, job_id, attempt

    async def list_instances(self) -> list[CloudInstance]:
        """Every instance tagged ``finetune:job`` in the region, whatever its state, for reconciliation."""
        return [_listed(instance) for instance in await self.tagged_instances()]

    async def tagged_instances(self) -> list[dict[str, Any]]:
        """Every instance tagged ``finetune:job`` in the region, as EC2 describes it."""
        ec2 = await self.clients.get("ec2")
        found: list[dict[str, Any]] = []
        try:
            pages = ec2.get_paginator("describe_instances").paginate(
                Filters=[{"Name": "tag-key", "Values": [JOB_TAG]}], PaginationConfig={"PageSize": 500}
            )
            async for page in pages:
                for reservation in page.get("Reservations", []):
                    found.extend(dict(instance) for instance in reservation.get("Instances", []))
        except (CloudRefused, CloudUnavailable) as exc:
            raise not_done(exc, f"could not list the instances tagged {JOB_TAG}: {exc}") from exc
        return found

    async def terminate(self, instance_id: str) -> None:
        """TerminateInstances (an instance already gone is fine)."""
        ec2 = await self.clients.get("ec2")
        try:
            await ec2.terminate_instances(InstanceIds=[instance_id])
        except CloudRefused as exc:
            if exc.code not in NOT_FOUND_INSTANCE:
                raise CloudError(f"could not terminate {instance_id}: {reason(exc)}") from exc
        except CloudUnavailable as exc:
            raise CloudUnavailable(f"EC2 did not answer TerminateInstances for {instance_id}: {exc}") from exc
