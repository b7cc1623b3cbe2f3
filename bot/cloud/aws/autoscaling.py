"""The AWS provider's Auto Scaling mode: one group per job (``finetune-<job>``), min 0 / max 1 / desired 1, on the
market the spot authority chose, from a version of the shared launch template carrying the attempt's user-data;
reconciliation lists the groups and sets those of jobs that are over to 0."""

from __future__ import annotations

import base64
import logging
import re
from collections.abc import Collection
from typing import Any

from bot.cloud.aws.clients import AwsClients, not_done
from bot.cloud.aws.instances import AwsInstances
from bot.cloud.aws.pricing import AwsPricing
from bot.cloud.aws.settings import AwsSettings
from bot.cloud.aws.zones import AwsZones
from bot.cloud.base import Instance, LaunchError
from bot.cloud.launching import JOB_TAG, MANAGED_TAG, avoided_last, priced, wait_for_group_instance
from bot.errors import CloudError, CloudRefused, CloudUnavailable
from handlers.jobs import Market
from handlers.reconcile import CloudGroup
from handlers.spec import JobSpec
from handlers.spot.zones import classify_launch_error

log = logging.getLogger(__name__)

GROUP_TAG = "aws:autoscaling:groupName"  # set by Auto Scaling on the instances it launches
_NOT_FOUND_TEMPLATE = frozenset({"InvalidLaunchTemplateName.NotFoundException", "InvalidLaunchTemplateId.NotFound"})


def group_name(job_id: str) -> str:
    return f"finetune-{job_id}"


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


class AwsGroups:
    """Auto Scaling's side of a launch, and the groups reconciliation sees."""

    def __init__(
        self,
        settings: AwsSettings,
        clients: AwsClients,
        zones: AwsZones,
        pricing: AwsPricing,
        instances: AwsInstances,
    ) -> None:
        self.settings = settings
        self.clients = clients
        self.placement = zones
        self.pricing = pricing
        self.instances = instances

    async def launch(
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
        subnet_of = await self.placement.subnet_map()
        if zone:  # pinned by the spot authority: there or nowhere
            if zone not in subnet_of:
                raise LaunchError(f"no subnet configured in {zone} for Auto Scaling group {group}", zone=zone)
            ordered = [zone]
        else:
            zones = await self.placement.zones()
            ordered = avoided_last(zones, avoid_zones)
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
            for tag in self.instances.tag_list(spec)
        ]
        # What the group is told, the same whether it is created or updated: one instance at most, on these subnets.
        shape: dict[str, Any] = {
            "AutoScalingGroupName": group,
            "MinSize": 0,
            "MaxSize": 1,
            "DesiredCapacity": 1,
            "VPCZoneIdentifier": subnets,
            "MixedInstancesPolicy": policy,
        }
        asg = await self.clients.get("autoscaling")
        try:
            existing = await self._group(group)
            before: set[str] = set()
            if existing is None:
                await asg.create_auto_scaling_group(**shape, Tags=tags)
            else:
                before = {str(i["InstanceId"]) for i in existing.get("Instances", [])}
                if before or existing.get("DesiredCapacity"):
                    await asg.update_auto_scaling_group(AutoScalingGroupName=group, MinSize=0, DesiredCapacity=0)
                await asg.create_or_update_tags(Tags=tags)
                await asg.update_auto_scaling_group(**shape)
        except (CloudRefused, CloudUnavailable) as exc:
            raise LaunchError(f"could not set up Auto Scaling group {group}: {exc}") from exc
        found = await self._wait_for_group_instance(group, before, zone)
        instance_type = str(found.get("InstanceType") or instance_types[0])
        zone = str(found.get("AvailabilityZone", ""))
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
        # The market is what the group was told to buy (spot only, or on-demand only).
        return await priced(self.pricing, instance_id, instance_type, zone, market)

    async def _group(self, group: str) -> dict[str, Any] | None:
        asg = await self.clients.get("autoscaling")
        reply = await asg.describe_auto_scaling_groups(AutoScalingGroupNames=[group])
        groups = reply.get("AutoScalingGroups", [])
        return dict(groups[0]) if groups else None

    async def _wait_for_group_instance(self, group: str, before: set[str], zone: str | None) -> dict[str, Any]:
        async def new_instance() -> dict[str, Any] | None:
            for item in (await self._group(group) or {}).get("Instances", []):
                if str(item["InstanceId"]) not in before and not str(item.get("LifecycleState", "")).startswith(
                    "Terminat"
                ):
                    return dict(item)
            return None

        async def set_to_zero() -> None:
            asg = await self.clients.get("autoscaling")
            await asg.update_auto_scaling_group(AutoScalingGroupName=group, MinSize=0, DesiredCapacity=0)

        return await wait_for_group_instance(
            f"Auto Scaling group {group}",
            new_instance,
            failures=(CloudRefused, CloudUnavailable),
            last_activity=lambda: self._last_activity(group),
            set_to_zero=set_to_zero,
            refused=activity_refused,
            zone=zone,
            wait_seconds=self.settings.group_wait_seconds,
            poll_seconds=self.settings.group_poll_seconds,
        )

    async def _last_activity(self, group: str) -> str:
        asg = await self.clients.get("autoscaling")
        try:
            reply = await asg.describe_scaling_activities(AutoScalingGroupName=group, MaxRecords=1)
        except (CloudRefused, CloudUnavailable):
            return ""
        activities = reply.get("Activities", [])
        if not activities:
            return ""
        return str(activities[0].get("StatusMessage") or activities[0].get("Description") or "")

    async def _template_version(self, spec: JobSpec, script: str) -> str:
        """A new version of the shared launch template carrying this attempt's user-data; creates the
        template on first use. Returns the version number."""
        user_data = base64.b64encode(script.encode()).decode()
        data: dict[str, Any] = {**self.instances.instance_settings(), "UserData": user_data}
        name = self.settings.template_name
        description = f"{spec.job_id} attempt {spec.attempt}"
        ec2 = await self.clients.get("ec2")
        for _ in range(2):
            try:
                reply = await ec2.create_launch_template_version(
                    LaunchTemplateName=name,
                    SourceVersion="$Latest",
                    LaunchTemplateData=data,
                    VersionDescription=description,
                )
                return str(reply["LaunchTemplateVersion"]["VersionNumber"])
            except CloudRefused as exc:
                code, message = exc.code, exc.message
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
            except CloudRefused as exc:
                code, message = exc.code, exc.message
                if code != "InvalidLaunchTemplateName.AlreadyExistsException":  # else: created meanwhile, retry
                    raise LaunchError(f"could not create launch template {name}: {code}: {message}") from exc
        raise LaunchError(f"launch template {name} could not be created or versioned")

    async def list_groups(self) -> list[CloudGroup]:
        """Every Auto Scaling group tagged ``finetune:job`` (Auto Scaling mode makes one per job), for
        reconciliation: a group of a job that is over would otherwise replace its instance for ever."""
        asg = await self.clients.get("autoscaling")
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
        except (CloudRefused, CloudUnavailable) as exc:
            raise not_done(exc, f"could not list the Auto Scaling groups tagged {JOB_TAG}: {exc}") from exc
        return found

    async def release_group(self, name: str) -> None:
        """Set the group to 0: Auto Scaling terminates its instance and launches no other (gone already: fine)."""
        asg = await self.clients.get("autoscaling")
        try:
            await asg.update_auto_scaling_group(AutoScalingGroupName=name, MinSize=0, DesiredCapacity=0)
        except CloudRefused as exc:
            if "not found" not in str(exc).lower():
                raise CloudError(f"could not set Auto Scaling group {name} to 0: {exc.message}") from exc
        except CloudUnavailable as exc:
            raise CloudUnavailable(f"Auto Scaling did not answer for group {name}: {exc}") from exc


    async def set_to_zero(self, group: str) -> None:
        """Best effort, before its instance is terminated: the group must not replace it."""
        asg = await self.clients.get("autoscaling")
        try:
            await asg.update_auto_scaling_group(AutoScalingGroupName=group, MinSize=0, DesiredCapacity=0)
        except (CloudRefused, CloudUnavailable) as exc:
            log.warning("could not set group %s to 0: %s", group, exc)
