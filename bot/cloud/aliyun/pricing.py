"""What Alibaba Cloud capacity costs, and how likely spot is: ``DescribeSpotPriceHistory``, ``DescribePrice`` and
``DescribeAvailableResource`` (stock), each cached where ECS would otherwise be asked on every launch. Prices are in
the currency of the account's site (CNY on the China site, USD on the international one), per hour.

Across regions (``aliyun.regions``) each is asked for its own zones (ECS answers per ``RegionId``), and the answers
are merged by zone name (zone names carry their region); pay-as-you-go prices are the home region's."""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import datetime
from typing import Any

from alibabacloud_ecs20140526 import models as ecs_models

from bot.cloud.aliyun.api import AliyunApi
from bot.cloud.aliyun.settings import AliyunSettings, launch_regions
from bot.cloud.base import log_once
from bot.errors import CloudRefused, CloudUnavailable
from handlers.jobs import Market
from handlers.spot.zones import SpotPrice, latest_prices, stock_availability

log = logging.getLogger(__name__)

_PRICE_TTL_SECONDS = 3600.0
STOCK_TTL_SECONDS = 600.0  # DescribeAvailableResource per instance type is asked again only this much later


class AliyunPricing:
    """Spot prices, pay-as-you-go prices and spot stock per zone."""

    def __init__(self, settings: AliyunSettings, api: AliyunApi) -> None:
        self.settings = settings
        self.api = api
        # region -> its candidate zones, home first
        self.zones = {launch.region: set(launch.zones) for launch in launch_regions(settings)}
        self._on_demand: dict[str, tuple[float, float]] = {}  # type -> (price, monotonic time read)
        # (region, type) -> (time read, [(zone, status)])
        self._stock: dict[tuple[str, str], tuple[float, list[tuple[str, str]]]] = {}

    async def spot_prices(self, instance_types: list[str]) -> tuple[dict[tuple[str, str], float], dict[str, float]]:
        """The current spot price per (zone, type) in our zones of every region, and the on-demand ("origin") price
        per type (the home region's where it says one), from ``DescribeSpotPriceHistory`` (one call per type and
        region, concurrently). A region that will not say adds nothing: its zones are then tried in the configured
        order."""
        answers = await asyncio.gather(*(self._spot_prices_in(region, instance_types) for region in self.zones))
        prices: dict[tuple[str, str], float] = {}
        origins: dict[str, float] = {}
        for region_prices, region_origins in answers:  # home first: its origin prices win
            prices.update(region_prices)
            for instance_type, price in region_origins.items():
                origins.setdefault(instance_type, price)
        now = time.monotonic()
        for instance_type, price in origins.items():
            self._on_demand.setdefault(instance_type, (price, now))
        return prices, origins

    async def _spot_prices_in(
        self, region: str, instance_types: list[str]
    ) -> tuple[dict[tuple[str, str], float], dict[str, float]]:
        """One region's spot prices in its candidate zones and origin prices; empty when ECS will not say."""
        zones = self.zones[region]

        async def history(instance_type: str) -> list[dict[str, Any]]:
            request = ecs_models.DescribeSpotPriceHistoryRequest(
                region_id=region, instance_type=instance_type, network_type="vpc", ostype="linux"
            )
            reply = await self.api.ecs("describe_spot_price_history", request, region)
            return list(reply.get("SpotPrices", {}).get("SpotPriceType", []))

        try:
            replies = await asyncio.gather(*(history(instance_type) for instance_type in instance_types))
            points: list[SpotPrice] = []
            origin: dict[str, tuple[datetime, float]] = {}
            for item in (item for reply in replies for item in reply):
                zone, instance_type = str(item["ZoneId"]), str(item["InstanceType"])
                at = datetime.fromisoformat(str(item["Timestamp"]).replace("Z", "+00:00"))
                if zone in zones:
                    points.append(SpotPrice(zone, instance_type, float(item["SpotPrice"]), at))
                if item.get("OriginPrice") is not None and (
                    instance_type not in origin or at > origin[instance_type][0]
                ):
                    origin[instance_type] = (at, float(item["OriginPrice"]))
        except (CloudRefused, CloudUnavailable, KeyError, TypeError, ValueError) as exc:
            log_once(
                log,
                f"spot-prices:{region}",
                "spot price history of %s unavailable (%s); its zones ordered without prices",
                region,
                exc,
            )
            return {}, {}
        return latest_prices(points), {instance_type: price for instance_type, (_, price) in origin.items()}

    async def spot_price(self, zone: str, instance_type: str) -> float | None:
        """The current spot price of the type in the zone; None when ECS will not say."""
        return (await self.spot_prices([instance_type]))[0].get((zone, instance_type))

    async def on_demand_price(self, instance_type: str) -> float | None:
        """Pay-as-you-go $/h of the type: configured, else ``DescribePrice`` (cached for an hour), else the origin
        price of the spot history; None when nothing says."""
        configured = self.settings.on_demand_prices.get(instance_type)
        if configured is not None:
            return configured
        cached = self._on_demand.get(instance_type)
        if cached is not None and time.monotonic() - cached[1] < _PRICE_TTL_SECONDS:
            return cached[0]
        request = ecs_models.DescribePriceRequest(
            region_id=self.settings.region,
            resource_type="instance",
            instance_type=instance_type,
            instance_network_type="vpc",
            price_unit="Hour",
            amount=1,
        )
        if self.settings.system_disk_category:
            request.system_disk = ecs_models.DescribePriceRequestSystemDisk(category=self.settings.system_disk_category)
        try:
            reply = await self.api.ecs("describe_price", request)
            price_info = reply["PriceInfo"]["Price"]
            price = float(price_info.get("TradePrice", price_info.get("OriginalPrice")))
        except (CloudRefused, CloudUnavailable, KeyError, TypeError, ValueError) as exc:
            log_once(log, f"price:{instance_type}", "no on-demand price for %s (%s)", instance_type, exc)
            return cached[0] if cached is not None else None
        self._on_demand[instance_type] = (price, time.monotonic())
        return price

    async def zone_availability(self, instance_types: list[str]) -> dict[str, float]:
        """The live signal the spot authority weighs, per zone (0..1) of every region: the best spot stock status of
        these types from ``DescribeAvailableResource`` (cached ``STOCK_TTL_SECONDS`` per region and type), lowered
        where that region's spot price history says the price is close to its on-demand one; merged by zone name.
        Empty (no signal) when no region will say."""
        regions = await asyncio.gather(*(self._availability_in(region, instance_types) for region in self.zones))
        return {zone: value for found in regions for zone, value in found.items()}

    async def _availability_in(self, region: str, instance_types: list[str]) -> dict[str, float]:
        stock: list[tuple[str, str]] = []
        for instance_type in instance_types:
            stock.extend(await self.stock_of(instance_type, region))
        if not stock:
            return {}
        zones = self.zones[region]
        prices, origins = await self._spot_prices_in(region, instance_types)
        return stock_availability([item for item in stock if item[0] in zones], prices, origins)

    async def stock_of(self, instance_type: str, region: str | None = None) -> list[tuple[str, str]]:
        """(zone, stock status) of a preemptible ``instance_type`` in ``region`` (default the home region), [] when
        ECS will not say."""
        region = region or self.settings.region
        cached = self._stock.get((region, instance_type))
        if cached is not None and time.monotonic() - cached[0] < STOCK_TTL_SECONDS:
            return cached[1]
        request = ecs_models.DescribeAvailableResourceRequest(
            region_id=region,
            destination_resource="InstanceType",
            instance_charge_type="PostPaid",
            spot_strategy="SpotAsPriceGo",
            resource_type="instance",
            instance_type=instance_type,
        )
        try:
            reply = await self.api.ecs("describe_available_resource", request, region)
            found: list[tuple[str, str]] = []
            for zone in reply.get("AvailableZones", {}).get("AvailableZone", []):
                status = str(zone.get("StatusCategory") or "")
                for resource in zone.get("AvailableResources", {}).get("AvailableResource", []):
                    for supported in resource.get("SupportedResources", {}).get("SupportedResource", []):
                        if supported.get("Value") == instance_type:
                            status = str(supported.get("StatusCategory") or status)
                found.append((str(zone["ZoneId"]), status))
        except (CloudRefused, CloudUnavailable, KeyError, TypeError, AttributeError) as exc:
            log_once(
                log,
                f"stock:{region}",
                "available resources of %s unavailable (%s); zones ordered without stock",
                region,
                exc,
            )
            return []
        self._stock[(region, instance_type)] = (time.monotonic(), found)
        return found

    async def hourly_price(self, instance_types: list[str], market: Market) -> float | None:
        """Spot: the lowest current price of these types in our zones; on-demand: the lowest pay-as-you-go price."""
        if market == "spot":
            prices, _ = await self.spot_prices(instance_types)
            if prices:
                return min(prices.values())
        listed = [price for price in [await self.on_demand_price(t) for t in instance_types] if price is not None]
        return min(listed) if listed else None
