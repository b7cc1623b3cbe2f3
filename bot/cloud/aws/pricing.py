"""What AWS capacity costs in one region: spot prices and on-demand list prices (placement scores span regions:
:mod:`bot.cloud.aws.scores`)."""

from __future__ import annotations

import logging
from datetime import UTC, datetime

from bot.cloud.aws.clients import AwsClients
from bot.cloud.aws.settings import AwsSettings
from bot.cloud.aws.zones import AwsZones
from bot.errors import CloudRefused, CloudUnavailable
from handlers.jobs import Market
from handlers.spot.zones import SpotPrice, latest_prices

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


class AwsPricing:
    """One region's prices."""

    def __init__(self, settings: AwsSettings, clients: AwsClients, zones: AwsZones) -> None:
        self.settings = settings
        self.clients = clients
        self.zones = zones

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
