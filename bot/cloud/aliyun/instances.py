"""ECS instances of the Alibaba Cloud provider: the calls the shared launch loop makes (:mod:`bot.cloud.launching`):
``RunInstances`` with ``SpotStrategy`` ``SpotAsPriceGo`` (or ``SpotWithPriceLimit`` when a price limit is configured;
``NoSpot`` for on-demand) in the hardened metadata mode, and describe / list / delete after launch.

Across regions (``aliyun.regions``): a launch goes to its zone's region (that region's ECS client, vSwitch, image,
security groups, key pair); the instances are listed in every region, and an instance id is looked up in each
region until one has it (home first), then remembered."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import time
from datetime import datetime
from typing import Any

from alibabacloud_ecs20140526 import models as ecs_models

from bot.cloud.aliyun.api import AliyunApi
from bot.cloud.aliyun.placement import AliyunPlacement
from bot.cloud.aliyun.pricing import AliyunPricing
from bot.cloud.aliyun.settings import AliyunSettings, LaunchRegion, candidate_zones, launch_regions
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
from bot.errors import CloudError, CloudRefused, CloudUnavailable
from handlers.jobs import Market
from handlers.reconcile import CloudInstance
from handlers.regions import region_of
from handlers.spec import JobSpec
from handlers.spot.zones import Candidate, ErrorKind, as_scores, classify_aliyun_launch_error

log = logging.getLogger(__name__)

LIST_PAGE_SIZE = 100  # DescribeInstances' largest page
LIVE_STATUSES = frozenset({"Pending", "Starting", "Running"})
_NOT_FOUND = frozenset({"InvalidInstanceId.NotFound", "InvalidInstanceIds.NotFound", "InvalidInstance.NotFound"})


def spot_strategy(settings: AliyunSettings, market: Market) -> str:
    """ECS's ``SpotStrategy`` for the market the spot authority chose."""
    if market != "spot":
        return "NoSpot"
    return "SpotWithPriceLimit" if settings.spot_price_limit else "SpotAsPriceGo"


def tags_of(instance: dict[str, Any]) -> dict[str, str]:
    return {str(tag.get("TagKey")): str(tag.get("TagValue")) for tag in instance.get("Tags", {}).get("Tag", [])}


def private_ip_of(instance: dict[str, Any]) -> str | None:
    """The instance's first private address in its VPC (DescribeInstances' ``VpcAttributes``); None: not yet."""
    addresses = ((instance.get("VpcAttributes") or {}).get("PrivateIpAddress") or {}).get("IpAddress") or []
    return str(addresses[0]) if addresses and addresses[0] else None


def _listed(instance: dict[str, Any]) -> CloudInstance:
    tags = tags_of(instance)
    attempt = tags.get(ATTEMPT_TAG, "")
    created = str(instance.get("CreationTime") or "")
    try:
        launched: datetime | None = datetime.fromisoformat(created.replace("Z", "+00:00")) if created else None
    except ValueError:
        launched = None
    return CloudInstance(
        instance_id=str(instance.get("InstanceId")),
        state=str(instance.get("Status") or "unknown"),
        job_id=tags.get(JOB_TAG),
        attempt=int(attempt) if attempt.isdigit() else None,
        launched_at=launched,
    )


class AliyunInstances:
    """ECS's side of a launch (one :class:`~bot.cloud.launching.InstanceCalls`) and of an instance's life after."""

    refusals: tuple[type[Exception], ...] = (CloudRefused,)

    def __init__(
        self, settings: AliyunSettings, api: AliyunApi, pricing: AliyunPricing, gangs: AliyunPlacement
    ) -> None:
        self.settings = settings
        self.api = api
        self.pricing = pricing
        self.gangs = gangs
        self.regions = launch_regions(settings)
        self._launch_region = {zone: launch for launch in self.regions for zone in launch.vswitches}
        self.where: dict[str, str] = {}  # instance id -> its region, once launched, listed or found
        # (job id, region) -> the job's deployment set there (a gang's, once found or made)
        self.deployment_sets: dict[tuple[str, str], str] = {}

    def launch_region(self, zone: str) -> LaunchRegion:
        """The configured region ``zone`` is in (the home region's keys for a zone no region names)."""
        return self._launch_region.get(zone) or next(
            (launch for launch in self.regions if launch.region == region_of(zone)), self.regions[0]
        )

    def region_names(self) -> list[str]:
        """Every region instances may be in, home first (the home region even where it launches nothing)."""
        names = [launch.region for launch in self.regions]
        return names if self.settings.region in names else [self.settings.region, *names]

    def classify(self, code: str) -> ErrorKind:
        return classify_aliyun_launch_error(code)

    def refusal(self, exc: Exception) -> tuple[str, str]:
        return (exc.code, exc.message) if isinstance(exc, CloudRefused) else ("", str(exc))

    async def zones(self) -> list[str]:
        return candidate_zones(self.settings)

    async def spot_signals(
        self, instance_types: list[str], nodes: int = 1
    ) -> tuple[dict[tuple[str, str], float], dict[str, int] | None]:
        """Prices and stock per zone (the stock status is a type's, whatever ``nodes``: ECS says no count)."""
        prices, _ = await self.pricing.spot_prices(instance_types)
        stock = await self.pricing.zone_availability(instance_types)
        return prices, as_scores(stock) if stock else None

    async def on_demand_price(self, instance_type: str) -> float | None:
        return await self.pricing.on_demand_price(instance_type)

    async def attempt_instance(self, spec: JobSpec) -> Instance | None:
        """The live instance already tagged with this (job, attempt), if any (a retry may try another zone first,
        where the client token of the first try would not help)."""
        try:
            found = await self.live_instance(spec.job_id, spec.attempt)
        except (CloudRefused, CloudUnavailable) as exc:
            raise LaunchError(f"ECS did not answer DescribeInstances: {exc}") from exc
        if found is None:
            return None
        instance_type, zone = str(found.get("InstanceType", "")), str(found.get("ZoneId", ""))
        market: Market = "spot" if found.get("SpotStrategy", "NoSpot") != "NoSpot" else "on-demand"
        instance_id = str(found["InstanceId"])
        return await priced(self.pricing, instance_id, instance_type, zone, market, private_ip_of(found))

    async def live_instance(self, job_id: str, attempt: int) -> dict[str, Any] | None:
        """The live instance tagged with this (job, attempt), if any; the API's errors raised."""
        for region in self.region_names():
            request = ecs_models.DescribeInstancesRequest(
                region_id=region,
                tag=[
                    ecs_models.DescribeInstancesRequestTag(key=JOB_TAG, value=job_id),
                    ecs_models.DescribeInstancesRequestTag(key=ATTEMPT_TAG, value=str(attempt)),
                ],
            )
            reply = await self.api.ecs("describe_instances", request, region)
            for found in reply.get("Instances", {}).get("Instance", []):
                if str(found.get("Status", "")) in LIVE_STATUSES:
                    self.where[str(found.get("InstanceId"))] = region
                    return dict(found)
        return None

    async def run_instance(
        self, spec: JobSpec, script: str, candidate: Candidate, gang: GangPlacement | None = None
    ) -> Started:
        """RunInstances for one candidate, in its zone's region; a gang node joins its job's deployment set of that
        region (found or made here before the first node there: LaunchError when ECS will not), and its private
        address is waited for (RunInstances names only the id; the gang's other nodes meet node 0 at that address)."""
        region = self.launch_region(candidate.zone).region
        request = self.launch_request(candidate.zone, candidate.instance_type, candidate.market, tags_of_spec(spec))
        request.user_data = base64.b64encode(self.script_in(script, region).encode()).decode()
        request.instance_name = instance_name(spec)
        request.client_token = candidate_token(spec, candidate)
        if gang is not None:
            request.deployment_set_id = await self.deployment_set(gang.job_id, spec.attempt, region)
        try:
            reply = await self.api.ecs("run_instances", request, region)
        except CloudUnavailable:
            # No answer: ECS may have started it all the same. The same client token returns that instance
            # instead of starting a second one.
            try:
                reply = await self.api.ecs("run_instances", request, region)
            except CloudUnavailable as exc:
                raise LaunchError(f"ECS did not answer RunInstances: {exc}") from exc
        ids = reply.get("InstanceIdSets", {}).get("InstanceIdSet", [])
        if not ids:
            raise CloudRefused("RunInstances", "NoInstance", "ECS answered without an instance id")
        instance_id = str(ids[0])
        self.where[instance_id] = region
        return Started(instance_id, await self.wait_for_address(instance_id) if gang is not None else None)

    def script_in(self, script: str, region: str) -> str:
        """The boot script for a runner in ``region``: the launch's names the bucket's internal endpoint, which
        answers within the home region only; a runner elsewhere gets the public one."""
        home = f"\nOSS_ENDPOINT={self.settings.runner_oss_endpoint}\n"
        return script.replace(home, f"\nOSS_ENDPOINT={self.settings.runner_oss_endpoint_in(region)}\n", 1)

    async def deployment_set(self, job_id: str, attempt: int, region: str) -> str:
        """The job's deployment set in ``region`` (sets are regional), found or made once per region."""
        key = (job_id, region)
        if key not in self.deployment_sets:
            self.deployment_sets[key] = await self.gangs.ensure_set(job_id, attempt, region)
        return self.deployment_sets[key]

    def launch_request(
        self, zone: str, instance_type: str, market: Market, tags: dict[str, str]
    ) -> ecs_models.RunInstancesRequest:
        """What every launch asks of RunInstances in ``zone``'s region (``finetune-bot check`` dry-runs it in each:
        bot/cloud/aliyun/probe.py)."""
        settings = self.settings
        launch = self.launch_region(zone)
        spot = market == "spot"
        request = ecs_models.RunInstancesRequest(
            region_id=launch.region,
            zone_id=zone,
            v_switch_id=launch.vswitches.get(zone),
            instance_type=instance_type,
            image_id=launch.image_id,
            security_group_ids=list(launch.security_group_ids) or None,
            instance_charge_type="PostPaid",
            spot_strategy=spot_strategy(settings, market),
            spot_price_limit=settings.spot_price_limit if spot else None,
            spot_duration=settings.spot_duration if spot else None,
            spot_interruption_behavior="Terminate" if spot else None,
            internet_max_bandwidth_out=0,
            ram_role_name=settings.ram_role,
            # Hardened metadata mode: every read needs a session token from a PUT (runner.notices.http).
            http_endpoint="enabled",
            http_tokens="required",
            key_pair_name=launch.key_pair,
            tag=[ecs_models.RunInstancesRequestTag(key=key, value=value) for key, value in tags.items()],
            amount=1,
        )
        if settings.system_disk_category or settings.system_disk_size:
            request.system_disk = ecs_models.RunInstancesRequestSystemDisk(
                category=settings.system_disk_category, size=settings.system_disk_size
            )
        return request

    async def wait_for_address(self, instance_id: str) -> str | None:
        """The new instance's private address, polled as a scaling group's new instance is (``group_poll_seconds``
        until ``group_wait_seconds``); None when ECS names none by then (the launch stands: the instance runs, and
        a node that needs to meet it is refused with that reason, handlers/gang.py)."""
        deadline = time.monotonic() + self.settings.group_wait_seconds
        while True:
            try:
                found = await self.describe(instance_id)
            except (CloudRefused, CloudUnavailable) as exc:
                log.warning("describing %s for its address failed: %s", instance_id, exc)
                found = None
            address = private_ip_of(found) if found is not None else None
            if address is not None:
                return address
            if time.monotonic() >= deadline:
                waited = self.settings.group_wait_seconds
                log.warning("ECS named no private address of %s within %g s", instance_id, waited)
                return None
            await asyncio.sleep(self.settings.group_poll_seconds)

    async def list_instances(self) -> list[CloudInstance]:
        """Every instance tagged ``finetune:job`` in every region (ECS lists no released ones), for reconciliation;
        CloudError when one region will not say (a partial list would look like orphans gone)."""
        found: list[CloudInstance] = []
        for region in self.region_names():
            found.extend(await self._listed_in(region))
        return found

    async def _listed_in(self, region: str) -> list[CloudInstance]:
        found: list[CloudInstance] = []
        page = 1
        while True:
            request = ecs_models.DescribeInstancesRequest(
                region_id=region,
                tag=[ecs_models.DescribeInstancesRequestTag(key=JOB_TAG)],
                page_number=page,
                page_size=LIST_PAGE_SIZE,
            )
            try:
                reply = await self.api.ecs("describe_instances", request, region)
            except (CloudRefused, CloudUnavailable) as exc:
                raise CloudError(f"could not list the instances tagged {JOB_TAG} in {region}: {exc}") from exc
            items = reply.get("Instances", {}).get("Instance", [])
            for item in items:
                self.where[str(item.get("InstanceId"))] = region
            found.extend(_listed(item) for item in items)
            if not items or page * LIST_PAGE_SIZE >= int(reply.get("TotalCount") or 0):
                return found
            page += 1

    async def describe(self, instance_id: str) -> dict[str, Any] | None:
        """The instance as ECS describes it, from the region it is in (remembered, else each region in turn); None
        when no region has it."""
        known = self.where.get(instance_id)
        for region in [known] if known else self.region_names():
            request = ecs_models.DescribeInstancesRequest(region_id=region, instance_ids=json.dumps([instance_id]))
            reply = await self.api.ecs("describe_instances", request, region)
            for instance in reply.get("Instances", {}).get("Instance", []):
                if instance.get("InstanceId") == instance_id:
                    self.where[instance_id] = region
                    return dict(instance)
        return None

    async def job_of(self, instance_id: str) -> tuple[dict[str, Any], str, int]:
        """The instance, its job id and attempt number, from the tags the launch put on it."""
        try:
            instance = await self.describe(instance_id)
        except (CloudRefused, CloudUnavailable) as exc:
            raise CloudError(f"could not look up instance {instance_id}: {exc}") from exc
        if instance is None:
            raise CloudError(f"instance {instance_id} does not exist")
        job_id, attempt = attempt_of(tags_of(instance), instance_id, CloudError)
        return instance, job_id, attempt

    async def delete(self, instance_id: str) -> None:
        """Release the instance in its region (one no region has: nothing to do)."""
        region = self.where.get(instance_id)
        if region is None:
            if len(self.region_names()) > 1 and await self.describe(instance_id) is None:
                return
            region = self.where.get(instance_id, self.settings.region)
        request = ecs_models.DeleteInstanceRequest(instance_id=instance_id, force=True)
        try:
            await self.api.ecs("delete_instance", request, region)
        except CloudRefused as exc:
            if exc.code not in _NOT_FOUND:
                raise
