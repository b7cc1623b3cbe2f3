"""What AWS capacity costs, and how likely spot is: spot prices, spot placement scores, on-demand list prices."""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime

from bot.cloud.aws.clients import AwsClients
from bot.cloud.aws.settings import AwsSettings
from bot.cloud.aws.zones import AwsZones
from bot.cloud.base import log_once
from bot.errors import CloudRefused, CloudUnavailable
from handlers.jobs import Market
from handlers.spot.zones import SpotPrice, latest_prices, score_availability, scores_by_zone

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

_SCORES_RETRY_SECONDS = 3600.0  # after a refusal, ask for placement scores again only this much later
SCORES_TTL_SECONDS = 600.0  # placement scores per (instance types, region, nodes) are asked again only this much later


class AwsPricing:
    """Prices and placement scores, cached where AWS would otherwise be asked on every launch."""

    def __init__(self, settings: AwsSettings, clients: AwsClients, zones: AwsZones) -> None:
        self.settings = settings
        self.clients = clients
        self.zones = zones
        self._scores_retry_at = 0.0
        self._scores: dict[tuple[tuple[str, ...], str | None, int], tuple[float, dict[str, int]]] = {}

    async def on_demand_price(self, instance_type: str) -> float | None:
        """The configured price of the type, else its us-east-1 list price; None when neither says."""
        return self.settings.on_demand_prices.get(instance_type, ON_DEMAND_PRICES.get(instance_type))

    async def spot_price(self, zone: str, instance_type: str) -> float | None:
        """The current spot price of the type in the zone; None when EC2 will not say."""
        return (await self.spot_prices([instance_type])).get((zone, instance_type))

    async def hourly_price(self, instance_types: list[str], market: Market) -> float | None:
        """Spot: the lowest current price of these types in our zones; on-demand: the lowest list price."""
        if market == "spot":
            prices = await self.spot_prices(instance_types)
            if prices:
                return min(prices.values())
        listed = [price for price in [await self.on_demand_price(t) for t in instance_types] if price is not None]
        return min(listed) if listed else None

    async def spot_prices(self, instance_types: list[str]) -> dict[tuple[str, str], float]:
        """The current spot price per (zone, type); empty (ordering by configuration) when EC2 will not say."""
        ec2 = await self.clients.get("ec2")
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
        except (CloudRefused, CloudUnavailable, KeyError, ValueError) as exc:
            log.warning("spot price history unavailable (%s); zones ordered without prices", exc)
            return {}
        return latest_prices(points)

    async def zone_availability(self, instance_types: list[str], nodes: int = 1) -> dict[str, float]:
        """The live signal the spot authority weighs: each zone's spot placement score / 10 (empty: no signal)."""
        return score_availability(await self.placement_scores(instance_types, nodes) or {})

    async def placement_scores(self, instance_types: list[str], nodes: int = 1) -> dict[str, int] | None:
        """Spot placement scores per zone name for ``nodes`` instances in one zone (a gang's every node: EC2
        scores the chance of the whole target capacity, and one instance's score says little of sixteen), cached
        ``SCORES_TTL_SECONDS`` per (instance types, region, nodes); None where the API is refused or missing (moto
        has none: it answers HTTP 500). Then ordering falls back to price and configuration, logged once per
        process, and the scores are asked again only an hour later."""
        key = (tuple(sorted(instance_types)), self.clients.region, max(nodes, 1))
        cached = self._scores.get(key)
        if cached is not None and time.monotonic() - cached[0] < SCORES_TTL_SECONDS:
            return cached[1]
        if time.monotonic() < self._scores_retry_at:
            return None
        ec2 = await self.clients.get("ec2", retries=False)
        try:
            reply = await ec2.get_spot_placement_scores(
                InstanceTypes=instance_types,
                TargetCapacity=max(nodes, 1),
                TargetCapacityUnitType="units",
                SingleAvailabilityZone=True,
                RegionNames=[ec2.meta.region_name],
            )
            names, _ = await self.zones.zone_info()
        except (CloudRefused, CloudUnavailable) as exc:  # moto: HTTP 500, not XML
            reason = exc.code if isinstance(exc, CloudRefused) else type(exc.__cause__ or exc).__name__
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
