"""ECS instances of the Alibaba Cloud provider: the calls the shared launch loop makes (:mod:`bot.cloud.launching`):
``RunInstances`` with ``SpotStrategy`` ``SpotAsPriceGo`` (or ``SpotWithPriceLimit`` when a price limit is configured;
``NoSpot`` for on-demand) in the hardened metadata mode, and describe / list / delete after launch."""

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
from bot.cloud.aliyun.pricing import AliyunPricing
from bot.cloud.aliyun.settings import AliyunSettings, candidate_zones
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

    def __init__(self, settings: AliyunSettings, api: AliyunApi, pricing: AliyunPricing) -> None:
        self.settings = settings
        self.api = api
        self.pricing = pricing
        self.deployment_sets: dict[str, str] = {}  # job id -> its deployment set's id (a gang's, once found or made)

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
        request = ecs_models.DescribeInstancesRequest(
            region_id=self.settings.region,
            tag=[
                ecs_models.DescribeInstancesRequestTag(key=JOB_TAG, value=job_id),
                ecs_models.DescribeInstancesRequestTag(key=ATTEMPT_TAG, value=str(attempt)),
            ],
        )
        reply = await self.api.ecs("describe_instances", request)
        for found in reply.get("Instances", {}).get("Instance", []):
            if str(found.get("Status", "")) in LIVE_STATUSES:
                return dict(found)
        return None

    async def run_instance(
        self, spec: JobSpec, script: str, candidate: Candidate, gang: GangPlacement | None = None
    ) -> Started:
        """RunInstances for one candidate; a gang node joins its job's deployment set (found or made before the
        launch loop: ``deployment_sets`` holds its id), and its private address is waited for (RunInstances names
        only the id; the gang's other nodes meet node 0 at that address)."""
        request = self.launch_request(candidate.zone, candidate.instance_type, candidate.market, tags_of_spec(spec))
        request.user_data = base64.b64encode(script.encode()).decode()
        request.instance_name = instance_name(spec)
        request.client_token = candidate_token(spec, candidate)
        request.deployment_set_id = self.deployment_sets.get(gang.job_id) if gang is not None else None
        try:
            reply = await self.api.ecs("run_instances", request)
        except CloudUnavailable:
            # No answer: ECS may have started it all the same. The same client token returns that instance
            # instead of starting a second one.
            try:
                reply = await self.api.ecs("run_instances", request)
            except CloudUnavailable as exc:
                raise LaunchError(f"ECS did not answer RunInstances: {exc}") from exc
        ids = reply.get("InstanceIdSets", {}).get("InstanceIdSet", [])
        if not ids:
            raise CloudRefused("RunInstances", "NoInstance", "ECS answered without an instance id")
        instance_id = str(ids[0])
        return Started(instance_id, await self.wait_for_address(instance_id) if gang is not None else None)

    def launch_request(
        self, zone: str, instance_type: str, market: Market, tags: dict[str, str]
    ) -> ecs_models.RunInstancesRequest:
        """What every launch asks of RunInstances (``finetune-bot check`` dry-runs it: bot/cloud/aliyun/probe.py)."""
        settings = self.settings
        spot = market == "spot"
        request = ecs_models.RunInstancesRequest(
            region_id=settings.region,
            zone_id=zone,
            v_switch_id=settings.vswitches.get(zone),
            instance_type=instance_type,
            image_id=settings.image_id,
            security_group_ids=list(settings.security_group_ids) or None,
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
            key_pair_name=settings.key_pair,
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
        """Every instance of the region tagged ``finetune:job`` (ECS lists no released ones), for reconciliation."""
        found: list[CloudInstance] = []
        page = 1
        while True:
            request = ecs_models.DescribeInstancesRequest(
                region_id=self.settings.region,
                tag=[ecs_models.DescribeInstancesRequestTag(key=JOB_TAG)],
                page_number=page,
                page_size=LIST_PAGE_SIZE,
            )
            try:
                reply = await self.api.ecs("describe_instances", request)
            except (CloudRefused, CloudUnavailable) as exc:
                raise CloudError(f"could not list the instances tagged {JOB_TAG}: {exc}") from exc
            items = reply.get("Instances", {}).get("Instance", [])
            found.extend(_listed(item) for item in items)
            if not items or page * LIST_PAGE_SIZE >= int(reply.get("TotalCount") or 0):
                return found
            page += 1

    async def describe(self, instance_id: str) -> dict[str, Any] | None:
        reply = await self.api.ecs(
            "describe_instances",
            ecs_models.DescribeInstancesRequest(region_id=self.settings.region, instance_ids=json.dumps([instance_id])),
        )
        for instance in reply.get("Instances", {}).get("Instance", []):
            if instance.get("InstanceId") == instance_id:
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
        try:
            await self.api.ecs("delete_instance", ecs_models.DeleteInstanceRequest(instance_id=instance_id, force=True))
        except CloudRefused as exc:
            if exc.code not in _NOT_FOUND:
                raise

