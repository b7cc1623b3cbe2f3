"""Spot placement scores across the launch regions: one ``GetSpotPlacementScores`` call naming every region
(``RegionNames``, ``SingleAvailabilityZone``), as the AWS P5 guide asks before it picks a zone, cached; its zone ids
keyed by zone name through each region's own zone list."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping

from bot.cloud.aws.clients import AwsClients
from bot.cloud.aws.zones import AwsZones
from bot.cloud.base import log_once
from bot.errors import CloudRefused, CloudUnavailable
from handlers.spot.zones import scores_by_zone

log = logging.getLogger(__name__)

_SCORES_RETRY_SECONDS = 3600.0  # after a refusal, ask for placement scores again only this much later
SCORES_TTL_SECONDS = 600.0  # placement scores per (instance types, nodes) are asked again only this much later


class AwsScores:
    """The scores of every launch region's zones, asked through the home region's EC2 (the API answers for any
    region named)."""

    def __init__(self, clients: AwsClients, zones: Mapping[str, AwsZones]) -> None:
        self.clients = clients
        self.zones = dict(zones)  # region -> its zones, in the regions' preference order
        self._retry_at = 0.0
        self._scores: dict[tuple[tuple[str, ...], int], tuple[float, dict[str, int]]] = {}

    async def placement_scores(self, instance_types: list[str], nodes: int = 1) -> dict[str, int] | None:
        """Spot placement scores per zone name for ``nodes`` instances in one zone (a gang's every node: EC2 scores
        the chance of the whole target capacity), cached ``SCORES_TTL_SECONDS`` per (instance types, nodes); None
        where the API is refused or missing (moto has none: it answers HTTP 500). Then ordering falls back to price
        and configuration, logged once per process, and the scores are asked again only an hour later."""
        key = (tuple(sorted(instance_types)), max(nodes, 1))
        cached = self._scores.get(key)
        if cached is not None and time.monotonic() - cached[0] < SCORES_TTL_SECONDS:
            return cached[1]
        if time.monotonic() < self._retry_at:
            return None
        ec2 = await self.clients.get("ec2", retries=False)
        try:
            reply = await ec2.get_spot_placement_scores(
                InstanceTypes=instance_types,
                TargetCapacity=max(nodes, 1),
                TargetCapacityUnitType="units",
                SingleAvailabilityZone=True,
                RegionNames=list(self.zones),
            )
        except (CloudRefused, CloudUnavailable) as exc:  # moto: HTTP 500, not XML
            reason = exc.code if isinstance(exc, CloudRefused) else type(exc.__cause__ or exc).__name__
            self._retry_at = time.monotonic() + _SCORES_RETRY_SECONDS
            log_once(
                log,
                "placement-scores",
                "spot placement scores unavailable (%s); choosing zones by spot price and the configured order",
                reason,
            )
            return None
        names = await self._zone_names()
        scores = (
            (f"{item.get('Region', '')} {item['AvailabilityZoneId']}", int(item["Score"]))
            for item in reply.get("SpotPlacementScores", [])
        )
        by_zone = scores_by_zone(scores, names)
        self._scores[key] = (time.monotonic(), by_zone)
        return by_zone

    async def _zone_names(self) -> dict[str, str]:
        """``"<region> <zone id>"`` -> zone name, over every region that says (one that does not is left out: its
        zones go unscored, ranked below the scored ones)."""
        names: dict[str, str] = {}
        for region, zones in self.zones.items():
            try:
                ids, _ = await zones.zone_info()
            except (CloudRefused, CloudUnavailable) as exc:
                log.warning("the zones of %s are unknown (%s): its placement scores are left out", region, exc)
                continue
            names |= {f"{region} {zone_id}": name for zone_id, name in ids.items()}
        return names
