"""Where an AWS launch may go: the configured zones and subnets, else the region's available zones."""

from __future__ import annotations

from bot.cloud.aws.clients import AwsClients
from bot.cloud.aws.settings import AwsSettings
from bot.cloud.base import LaunchError
from bot.errors import CloudRefused, CloudUnavailable


class AwsZones:
    """Zone names, subnets per zone and the candidate zones in preference order, each looked up once."""

    def __init__(self, settings: AwsSettings, clients: AwsClients) -> None:
        self.settings = settings
        self.clients = clients
        self._zone_names: dict[str, str] | None = None  # zone id -> zone name
        self._subnets: dict[str, str] | None = dict(settings.subnets) if isinstance(settings.subnets, dict) else None
        self._available_zones: list[str] | None = None

    async def zone_info(self) -> tuple[dict[str, str], list[str]]:
        """Zone id -> zone name, and the names of the region's available zones."""
        if self._zone_names is None or self._available_zones is None:
            ec2 = await self.clients.get("ec2")
            reply = await ec2.describe_availability_zones(
                Filters=[{"Name": "zone-type", "Values": ["availability-zone"]}]
            )
            zones = reply.get("AvailabilityZones", [])
            self._zone_names = {str(zone["ZoneId"]): str(zone["ZoneName"]) for zone in zones}
            self._available_zones = [str(zone["ZoneName"]) for zone in zones if zone.get("State") == "available"]
        return self._zone_names, self._available_zones

    async def subnet_map(self) -> dict[str, str]:
        """Zone name -> subnet id: as configured, or looked up once for a configured list of subnet ids."""
        if self._subnets is None:
            ids = list(self.settings.subnets)
            ec2 = await self.clients.get("ec2")
            try:
                reply = await ec2.describe_subnets(SubnetIds=ids)
            except (CloudRefused, CloudUnavailable) as exc:
                raise LaunchError(f"could not look up subnets {', '.join(ids)}: {exc}") from exc
            zone_of = {str(item["SubnetId"]): str(item["AvailabilityZone"]) for item in reply.get("Subnets", [])}
            found: dict[str, str] = {}
            for subnet in ids:
                zone = zone_of.get(subnet)
                if zone is None:
                    raise LaunchError(f"subnet {subnet} does not exist in {self.clients.region or 'this region'}")
                if zone in found:
                    raise LaunchError(f"subnets {found[zone]} and {subnet} are both in {zone}: give one per zone")
                found[zone] = subnet
            self._subnets = found
        return self._subnets

    async def zones(self) -> list[str]:
        """Candidate zones in preference order: ``zones`` first, then other zones with a subnet."""
        settings = self.settings
        subnets = await self.subnet_map()
        if subnets:
            return [z for z in settings.zones if z in subnets] + [z for z in subnets if z not in settings.zones]
        if settings.zones:
            return list(settings.zones)
        try:
            _, available = await self.zone_info()
        except (CloudRefused, CloudUnavailable) as exc:
            raise LaunchError(f"could not list availability zones: {exc}") from exc
        return available
