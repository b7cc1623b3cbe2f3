"""The AWS provider's regions: one set of region-bound parts per launch region (clients, zones, prices, instances,
placement groups, Auto Scaling groups, FIS, and the key objects its runners read in the home region's bucket), and
the launch loop's calls across them (:class:`AcrossRegions`).

Zone names carry their region (:func:`handlers.regions.region_of`), so a candidate's zone says which region's parts
launch it; an instance id does not, so the region of each instance is remembered from its launch or listing and
otherwise asked of each region in turn.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from bot.cloud.aws.autoscaling import AwsGroups
from bot.cloud.aws.clients import AwsClients
from bot.cloud.aws.fis import AwsFis
from bot.cloud.aws.instances import AwsInstances
from bot.cloud.aws.objects import AwsObjects
from bot.cloud.aws.placement import AwsPlacement
from bot.cloud.aws.pricing import AwsPricing
from bot.cloud.aws.scores import AwsScores
from bot.cloud.aws.settings import AwsSettings
from bot.cloud.aws.zones import AwsZones
from bot.cloud.base import GangPlacement, Instance, LaunchError
from bot.cloud.launching import Started
from bot.errors import CloudRefused
from handlers.regions import region_of
from handlers.report_keys import ReportKeys
from handlers.spec import JobSpec
from handlers.spot.zones import Candidate, ErrorKind, classify_launch_error

log = logging.getLogger(__name__)


@dataclass
class AwsRegion:
    """One launch region's parts, each reading ``settings``: the provider's settings bound to this region (its launch
    keys at the top, :meth:`~bot.cloud.aws.settings.AwsSettings.bound_to`)."""

    name: str
    settings: AwsSettings
    clients: AwsClients
    zones: AwsZones
    pricing: AwsPricing
    gangs: AwsPlacement
    instances: AwsInstances
    groups: AwsGroups
    interrupt_tests: AwsFis
    objects: AwsObjects  # the home region's bucket, this region's runner role (its key objects' names)


def open_region(
    name: str, settings: AwsSettings, home_clients: AwsClients, report_keys: ReportKeys | None
) -> AwsRegion:
    """The parts of one region (``settings`` bound to it); its objects go through the home region's S3 client, since
    the bucket is there."""
    clients = home_clients if name == (home_clients.region or "") else AwsClients(settings)
    zones = AwsZones(settings, clients)
    pricing = AwsPricing(settings, clients, zones)
    gangs = AwsPlacement(clients)
    instances = AwsInstances(settings, clients, zones, pricing, gangs)
    return AwsRegion(
        name=name,
        settings=settings,
        clients=clients,
        zones=zones,
        pricing=pricing,
        gangs=gangs,
        instances=instances,
        groups=AwsGroups(settings, clients, zones, pricing, instances),
        interrupt_tests=AwsFis(settings, clients),
        objects=AwsObjects(settings, home_clients, report_keys),
    )


class AcrossRegions:
    """The launch loop's calls (:class:`bot.cloud.launching.InstanceCalls`) over every launch region: the zones of
    all of them (the home region's first, then the configured order), their spot prices, one placement score call for
    all, and each try made by its zone's region. ``boot_script`` gives the user data of an attempt in a region (its
    key objects are named after that region's runner role)."""

    refusals: tuple[type[Exception], ...] = (CloudRefused,)

    def __init__(
        self,
        regions: Mapping[str, AwsRegion],
        scores: AwsScores,
        boot_script: Callable[[JobSpec, AwsRegion], str],
        remember: Callable[[str, AwsRegion], None],
    ) -> None:
        self.regions = regions
        self.scores = scores
        self.boot_script = boot_script
        self.remember = remember

    def region(self, zone: str) -> AwsRegion:
        """The parts of ``zone``'s region (the one region where there is one); LaunchError for a zone of no launch
        region."""
        if len(self.regions) == 1:
            return first(self.regions)
        found = self.regions.get(region_of(zone))
        if found is None:
            raise LaunchError(f"{zone} is in none of the launch regions ({', '.join(self.regions)})", zone=zone)
        return found

    def classify(self, code: str) -> ErrorKind:
        return classify_launch_error(code)

    def refusal(self, exc: Exception) -> tuple[str, str]:
        return (exc.code, exc.message) if isinstance(exc, CloudRefused) else ("", str(exc))

    async def attempt_instance(self, spec: JobSpec) -> Instance | None:
        for region in self.regions.values():
            found = await region.instances.attempt_instance(spec)
            if found is not None:
                self.remember(found.instance_id, region)
                return found
        return None

    async def zones(self) -> list[str]:
        """Every region's zones in preference order; a region whose zones cannot be listed now is left out (said),
        unless no region's can: then the launch fails saying why."""
        found: list[str] = []
        failures: list[LaunchError] = []
        for region in self.regions.values():
            try:
                found.extend(await region.zones.zones())
            except LaunchError as exc:
                log.warning("%s is left out of this launch: %s", region.name, exc)
                failures.append(exc)
        if not found and failures:
            raise failures[0]
        return found

    async def spot_prices(self, instance_types: list[str]) -> dict[tuple[str, str], float]:
        """The current spot price per (zone, type) in every region (a region that will not say adds none)."""
        asked = [region.pricing.spot_prices(instance_types) for region in self.regions.values()]
        prices: dict[tuple[str, str], float] = {}
        for found in await asyncio.gather(*asked):
            prices |= found
        return prices

    async def spot_signals(
        self, instance_types: list[str], nodes: int = 1
    ) -> tuple[dict[tuple[str, str], float], dict[str, int] | None]:
        return await self.spot_prices(instance_types), await self.scores.placement_scores(instance_types, nodes)

    async def run_instance(
        self, spec: JobSpec, script: str, candidate: Candidate, gang: GangPlacement | None = None
    ) -> Started:
        """The try, in the candidate's region, with that region's boot script (``script`` is the first region's)."""
        region = self.region(candidate.zone)
        if gang is not None:  # the job's placement group, in the region this node goes to
            await region.gangs.ensure_group(gang.job_id)
        started = await region.instances.run_instance(spec, self.boot_script(spec, region), candidate, gang)
        self.remember(started.instance_id, region)
        return started

    async def on_demand_price(self, instance_type: str) -> float | None:
        return await next(iter(self.regions.values())).pricing.on_demand_price(instance_type)


def first(regions: Mapping[str, AwsRegion]) -> AwsRegion:
    """The preferred launch region (the home region where it is one)."""
    return next(iter(regions.values()))
