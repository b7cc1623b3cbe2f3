"""The Alibaba Cloud provider's scaling-group mode: the guide's setup, a multi-zone ESS scaling group
(``deploy/aliyun/finetune.ros.yaml``) per concurrent job. A launch writes the attempt into the group's scaling
configuration (user-data, tags, types, the spot strategy of the chosen market) and sets the desired capacity to 1 over
the chosen zone's vSwitch (else every zone's); ESS replaces a reclaimed instance by itself, in that zone and market.
Completion or stop sets it back to 0. A group belongs to the job named in its configuration's tags while it has
capacity; a group at 0 is free."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import re
from collections.abc import Collection
from typing import Any

from alibabacloud_ess20220222 import models as ess_models

from bot.cloud.aliyun.api import AliyunApi
from bot.cloud.aliyun.instances import AliyunInstances, spot_strategy
from bot.cloud.aliyun.pricing import AliyunPricing
from bot.cloud.aliyun.settings import AliyunSettings, candidate_zones
from bot.cloud.base import Instance, LaunchError
from bot.cloud.launching import (
    JOB_TAG,
    avoided_last,
    instance_name,
    priced,
    tags_of_spec,
    wait_for_group_instance,
)
from bot.errors import CloudRefused, CloudUnavailable
from handlers.jobs import Market
from handlers.spec import JobSpec
from handlers.spot.zones import classify_aliyun_launch_error

log = logging.getLogger(__name__)

_CODES = re.compile(r"[A-Za-z]+(?:\.[A-Za-z]+)+")


def activity_refused(status: str) -> bool:
    """Whether a failed scaling activity's message names an ECS capacity error (``OperationDenied.NoStock`` …)."""
    return any(classify_aliyun_launch_error(code) == "capacity" for code in _CODES.findall(status))


class AliyunGroups:
    """ESS's side of a launch, and of releasing a group's instance."""

    def __init__(
        self, settings: AliyunSettings, api: AliyunApi, pricing: AliyunPricing, instances: AliyunInstances
    ) -> None:
        self.settings = settings
        self.api = api
        self.pricing = pricing
        self.instances = instances
        self._group_lock = asyncio.Lock()

    async def launch(
        self,
        spec: JobSpec,
        script: str,
        instance_types: list[str],
        market: Market,
        avoid_zones: Collection[str],
        zone: str | None = None,
    ) -> Instance:
        """Write the attempt into a free (or this job's) group's configuration (the chosen market's spot strategy
        only), then desired capacity 1 over the chosen zone's vSwitch (else every zone's, zones to avoid last). A
        group that starts nothing because the zone had no stock reports a capacity refusal to the spot authority.

        A relaunch first sets the group to 0, so a replacement ESS started by itself from the older attempt's
        configuration is not left running next to the new attempt.
        """
        async with self._group_lock:  # two launches must not claim the same free group
            group = await self._claim_group(spec.job_id)
            group_id = str(group["ScalingGroupId"])
            config_id = group.get("ActiveScalingConfigurationId")
            if not config_id:
                raise LaunchError(f"scaling group {group_id} has no active scaling configuration: enable it first")
            try:
                before = {str(item["InstanceId"]) for item in await self._group_instances(group_id)}
                if before or group.get("DesiredCapacity"):
                    await self.set_desired(group_id, 0)
                await self.api.ess(
                    "modify_scaling_configuration",
                    self._configuration(spec, script, instance_types, market, str(config_id)),
                )
                ordered = avoided_last(candidate_zones(self.settings), avoid_zones)
                if zone:  # pinned by the spot authority: there or nowhere
                    if zone not in self.settings.vswitches:
                        raise LaunchError(f"no vSwitch configured in {zone} for scaling group {group_id}", zone=zone)
                    ordered = [zone]
                vswitches = [self.settings.vswitches[z] for z in ordered] or None
                await self.api.ess(
                    "modify_scaling_group",
                    ess_models.ModifyScalingGroupRequest(
                        scaling_group_id=group_id,
                        min_size=0,
                        max_size=max(1, int(group.get("MaxSize") or 1)),
                        desired_capacity=1,
                        v_switch_ids=vswitches,
                    ),
                )
            except (CloudRefused, CloudUnavailable) as exc:
                raise LaunchError(f"could not set up scaling group {group_id}: {exc}") from exc
        instance_id = await self._wait_for_group_instance(group_id, before, zone)
        described = await self.instances.describe(instance_id) or {}
        instance_type = str(described.get("InstanceType") or instance_types[0])
        zone = str(described.get("ZoneId") or "")
        log.info(
            "%s attempt %d: group %s launched %s (%s in %s)",
            spec.job_id,
            spec.attempt,
            group_id,
            instance_id,
            instance_type,
            zone,
        )
        return await priced(self.pricing, instance_id, instance_type, zone, market)

    def _configuration(
        self, spec: JobSpec, script: str, instance_types: list[str], market: Market, config_id: str
    ) -> Any:
        limit = self.settings.spot_price_limit if market == "spot" else None
        return ess_models.ModifyScalingConfigurationRequest(
            scaling_configuration_id=config_id,
            user_data=base64.b64encode(script.encode()).decode(),
            http_endpoint="enabled",
            http_tokens="required",  # hardened metadata mode, as in RunInstances
            tags=json.dumps(tags_of_spec(spec)),
            instance_types=list(instance_types),
            instance_name=instance_name(spec),
            spot_strategy=spot_strategy(self.settings, market),
            spot_price_limits=[
                ess_models.ModifyScalingConfigurationRequestSpotPriceLimits(instance_type=t, price_limit=limit)
                for t in instance_types
            ]
            if limit
            else None,
            spot_duration=self.settings.spot_duration if market == "spot" else None,
        )

    async def _claim_group(self, job_id: str) -> dict[str, Any]:
        """This job's group (its configuration is tagged with the job), else a free one (desired 0, no instances);
        LaunchError saying who holds them when every group is busy."""
        try:
            reply = await self.api.ess(
                "describe_scaling_groups",
                ess_models.DescribeScalingGroupsRequest(
                    region_id=self.settings.region, scaling_group_ids=list(self.settings.scaling_groups)
                ),
            )
            groups = {str(g["ScalingGroupId"]): g for g in reply.get("ScalingGroups", [])}
            free: list[dict[str, Any]] = []
            busy: list[str] = []
            for group_id in self.settings.scaling_groups:
                group = groups.get(group_id)
                if group is None:
                    busy.append(f"{group_id} does not exist")
                    continue
                if group.get("LifecycleState") not in (None, "Active"):
                    busy.append(f"{group_id} is {group.get('LifecycleState')}")
                    continue
                owner = await self._group_owner(group_id, group.get("ActiveScalingConfigurationId"))
                if owner == job_id:
                    return dict(group)
                if not group.get("DesiredCapacity") and not group.get("TotalCapacity"):
                    free.append(dict(group))
                else:
                    busy.append(f"{group_id} runs {owner or 'something else'}")
        except (CloudRefused, CloudUnavailable) as exc:
            raise LaunchError(f"could not read the scaling groups: {exc}") from exc
        if free:
            return free[0]
        raise LaunchError("every scaling group is busy: " + "; ".join(busy))

    async def _group_owner(self, group_id: str, config_id: object) -> str | None:
        if not config_id:
            return None
        reply = await self.api.ess(
            "describe_scaling_configurations",
            ess_models.DescribeScalingConfigurationsRequest(
                region_id=self.settings.region, scaling_group_id=group_id, scaling_configuration_ids=[str(config_id)]
            ),
        )
        for config in reply.get("ScalingConfigurations", []):
            for tag in config.get("Tags") or []:
                if tag.get("Key") == JOB_TAG:
                    return str(tag.get("Value"))
        return None

    async def _group_instances(self, group_id: str, instance_ids: list[str] | None = None) -> list[dict[str, Any]]:
        reply = await self.api.ess(
            "describe_scaling_instances",
            ess_models.DescribeScalingInstancesRequest(
                region_id=self.settings.region, scaling_group_id=group_id, instance_ids=instance_ids, page_size=50
            ),
        )
        return list(reply.get("ScalingInstances", []))

    async def set_desired(self, group_id: str, desired: int) -> None:
        await self.api.ess(
            "modify_scaling_group",
            ess_models.ModifyScalingGroupRequest(scaling_group_id=group_id, min_size=0, desired_capacity=desired),
        )

    async def _wait_for_group_instance(self, group_id: str, before: set[str], zone: str | None = None) -> str:
        async def new_instance() -> str | None:
            for item in await self._group_instances(group_id):
                instance_id = str(item.get("InstanceId") or "")
                if instance_id and instance_id not in before and item.get("LifecycleState") != "Removing":
                    return instance_id
            return None

        return await wait_for_group_instance(
            f"scaling group {group_id}",
            new_instance,
            failures=(CloudRefused, CloudUnavailable),
            last_activity=lambda: self._last_activity(group_id),
            set_to_zero=lambda: self.set_desired(group_id, 0),
            refused=activity_refused,
            zone=zone,
            wait_seconds=self.settings.group_wait_seconds,
            poll_seconds=self.settings.group_poll_seconds,
        )

    async def _last_activity(self, group_id: str) -> str:
        try:
            reply = await self.api.ess(
                "describe_scaling_activities",
                ess_models.DescribeScalingActivitiesRequest(
                    region_id=self.settings.region, scaling_group_id=group_id, page_size=10
                ),
            )
        except (CloudRefused, CloudUnavailable):
            return ""
        activities = reply.get("ScalingActivities", [])
        if not activities:
            return ""
        latest = activities[0]
        return str(latest.get("StatusMessage") or latest.get("Description") or latest.get("StatusCode") or "")

    async def group_of(self, instance_id: str) -> str | None:
        """The configured scaling group holding the instance, if any."""
        for group_id in self.settings.scaling_groups:
            if await self._group_instances(group_id, [instance_id]):
                return group_id
        return None
