"""The zones: which (zone, instance type) a launch tries first, which of each cloud's error codes mean "try
elsewhere", and how live availability (AWS spot placement scores, Alibaba's stock status) becomes the 0..1 signal
the policy weighs.

Pure decisions over what the cloud adapter read (placement scores, stock, spot prices, the zones of the job's
earlier attempts) and the error codes it got back; the adapter only does the I/O. The market is never chosen
here: a launch tries one market, and a refusal goes back to the decision (:mod:`handlers.spot.situation`).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Literal

from handlers.jobs import Market
from handlers.regions import region_of, transfer_cost

ErrorKind = Literal["capacity", "skip", "fatal"]

# -- AWS EC2 ----------------------------------------------------------------------------------------------

# No room for this (zone, type) right now, or no room for more spot: another zone / type / market may have it.
CAPACITY_ERRORS = frozenset(
    {
        "InsufficientInstanceCapacity",
        "InsufficientCapacity",
        "InsufficientHostCapacity",
        "InsufficientReservedInstanceCapacity",
        "InsufficientCapacityOnHost",
        "SpotMaxPriceTooLow",
        "MaxSpotInstanceCountExceeded",
        "MaxSpotFleetRequestCountExceeded",
        "VcpuLimitExceeded",
        "InstanceLimitExceeded",
    }
)
# This candidate cannot work (the type is not offered in that zone, the subnet is full, the API is busy),
# but the next one may: move on without counting it as a capacity failure.
SKIP_ERRORS = frozenset(
    {
        "Unsupported",
        "UnsupportedOperation",
        "InsufficientFreeAddressesInSubnet",
        "InvalidAvailabilityZone",
        "RequestLimitExceeded",
        "Unavailable",
        "ServiceUnavailable",
        "InternalError",
    }
)


def classify_launch_error(code: str) -> ErrorKind:
    """EC2's codes. ``capacity`` and ``skip``: try the next candidate; ``fatal`` (bad AMI, no permission, …): stop
    now."""
    bare = code.removeprefix("Server.").removeprefix("Client.")
    if bare in CAPACITY_ERRORS:
        return "capacity"
    if bare in SKIP_ERRORS:
        return "skip"
    return "fatal"


# -- Alibaba Cloud ECS ------------------------------------------------------------------------------------
# ECS answers ``RunInstances`` with a ``Code`` such as ``OperationDenied.NoStock``.

# Nothing left of this (zone, type) right now, or no room for more: another zone / type / market may have it.
# These end the launch with a capacity refusal (the decision chooses again).
ALIYUN_CAPACITY_ERRORS = frozenset(
    {
        "OperationDenied.NoStock",  # sold out in this zone
        "Zone.NotOnSale",  # the zone sells none of this now
        "OperationDenied.ZoneNotAllowed",
        "QuotaExceed.ElasticQuota",  # vCPU quota of the zone used up
        "QuotaExceed.PostPaidInstance",
        "InvalidSpotPriceLimit.LowerThanPublicPrice",  # our price limit is below the market price
        "OperationDenied.SpotPriceLimitTooLow",
    }
)
# This candidate cannot work (the type is not offered in that zone, the vSwitch is full, the API is busy), but the
# next one may: move on without counting it as a capacity failure.
ALIYUN_SKIP_ERRORS = frozenset(
    {
        "InvalidResourceType.NotSupported",  # this type is not offered in this zone
        "InvalidInstanceType.ValueNotSupported",
        "InvalidInstanceType.NotSupported",
        "Zone.NotOpen",
        "InvalidZoneId.NotFound",
        "InvalidVSwitchId.IpNotEnough",
        "OperationDenied.ZoneSystemCategoryNotMatch",  # the system disk category is not sold in this zone
        "InvalidSystemDiskCategory.ValueNotSupported",
        "OperationDenied.CloudSSDNotSupported",
        "Throttling",
        "Throttling.User",
        "Throttling.Api",
        "ServiceUnavailable",
        "InternalError",
        "UnknownError",
    }
)


def classify_aliyun_launch_error(code: str) -> ErrorKind:
    """``capacity`` and ``skip``: try the next candidate; anything else (bad image, no permission, unpaid
    account, a vSwitch that does not exist) is ``fatal``: every other candidate would fail the same way."""
    if code in ALIYUN_CAPACITY_ERRORS:
        return "capacity"
    if code in ALIYUN_SKIP_ERRORS:
        return "skip"
    return "fatal"


# -- live availability --------------------------------------------------------------------------------------

# Alibaba's ``DescribeAvailableResource`` says a zone's stock of a type as a status: how likely a launch is now.
STOCK_AVAILABILITY: dict[str, float] = {
    "WithStock": 1.0,
    "ClosedWithStock": 0.6,  # in stock, but the zone sells no more new ones of it for a while
    "WithoutStock": 0.0,
    "ClosedWithoutStock": 0.0,
}


def score_availability(scores: Mapping[str, int]) -> dict[str, float]:
    """AWS spot placement scores (1..10 per zone) as the policy's 0..1 availability."""
    return {zone: min(max(score, 0), 10) / 10 for zone, score in scores.items()}


def stock_availability(
    stock: Iterable[tuple[str, str]],
    spot_prices: Mapping[tuple[str, str], float] | None = None,
    origin_prices: Mapping[str, float] | None = None,
) -> dict[str, float]:
    """Alibaba's stock status per (zone, status) as 0..1 availability, the best status per zone. Where the spot
    price history says a price close to the on-demand ("origin") price, spot is scarce there: the zone's figure is
    lowered by how much of the discount is gone (a spot price at half the origin price keeps it whole)."""
    by_zone: dict[str, float] = {}
    for zone, status in stock:
        value = STOCK_AVAILABILITY.get(status)
        if value is not None:
            by_zone[zone] = max(value, by_zone.get(zone, value))
    for (zone, instance_type), price in (spot_prices or {}).items():
        origin = (origin_prices or {}).get(instance_type)
        if zone in by_zone and origin:
            squeeze = min(max((price / origin - 0.5) / 0.5, 0.0), 1.0)  # 0 at half the origin price, 1 at it
            by_zone[zone] = round(by_zone[zone] * (1 - 0.5 * squeeze), 4)
    return by_zone


def as_scores(availability: Mapping[str, float]) -> dict[str, int]:
    """0..1 availability back as 1..10 scores, for :func:`order_spot_candidates` (Alibaba's stock signal)."""
    return {zone: round(value * 10) for zone, value in availability.items()}


def weigh_availability(signal: Mapping[str, float], estimate: Mapping[str, float]) -> dict[str, float]:
    """The availability the policy plans by, per zone: the cloud's live signal where it gives one, the estimate
    from the job's own past (:func:`handlers.spot.situation.estimated_availability`) where it does not; where both
    speak, the live signal weighs twice the estimate (it is about now; the estimate about the last hours)."""
    weighed: dict[str, float] = {}
    for zone in {*signal, *estimate}:
        live, past = signal.get(zone), estimate.get(zone)
        if live is not None and past is not None:
            weighed[zone] = round((2 * live + past) / 3, 4)
        else:
            weighed[zone] = live if live is not None else past if past is not None else 0.0
    return weighed


# -- the order of the candidates -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SpotPrice:
    zone: str
    instance_type: str
    price: float
    at: datetime


def latest_prices(history: Iterable[SpotPrice]) -> dict[tuple[str, str], float]:
    """The newest price of every (zone, instance type) in a price history."""
    newest: dict[tuple[str, str], SpotPrice] = {}
    for point in history:
        key = (point.zone, point.instance_type)
        seen = newest.get(key)
        if seen is None or point.at > seen.at:
            newest[key] = point
    return {key: point.price for key, point in newest.items()}


def scores_by_zone(scores: Iterable[tuple[str, int]], zone_names: Mapping[str, str]) -> dict[str, int]:
    """Placement scores come per zone *id* (``use1-az4``); key them by zone name, the best score per zone."""
    by_name: dict[str, int] = {}
    for zone_id, score in scores:
        name = zone_names.get(zone_id)
        if name is not None:
            by_name[name] = max(score, by_name.get(name, score))
    return by_name


@dataclass(frozen=True, slots=True)
class Candidate:
    zone: str
    instance_type: str
    market: Market
    score: int | None = None
    spot_price: float | None = None


def order_spot_candidates(
    zones: Sequence[str],
    instance_types: Sequence[str],
    scores: Mapping[str, int] | None,
    prices: Mapping[tuple[str, str], float],
    avoid_zones: Collection[str] = (),
) -> list[Candidate]:
    """Every (zone, type), best first: highest placement score, then lowest spot price, then the configured
    zone order, then the recipe's type order.

    Zones in ``avoid_zones`` (where this job was just reclaimed or failed) go last rather than away, so a
    single-zone setup still gets its launch. A zone without a score ranks below every scored zone; a pair
    without a price ranks below the priced pairs of its score. ``scores`` None means no scores at all
    (the API is not permitted or not available): the order is then price, then configuration.
    """
    candidates: list[tuple[tuple[int, int, float, int, int], Candidate]] = []
    for zone_index, zone in enumerate(zones):
        score = scores.get(zone) if scores is not None else None
        for type_index, instance_type in enumerate(instance_types):
            price = prices.get((zone, instance_type))
            key = (
                1 if zone in avoid_zones else 0,
                -(score or 0),
                price if price is not None else float("inf"),
                zone_index,
                type_index,
            )
            candidates.append((key, Candidate(zone, instance_type, "spot", score, price)))
    candidates.sort(key=lambda item: item[0])
    return [candidate for _, candidate in candidates]


def order_on_demand_candidates(
    zones: Sequence[str], instance_types: Sequence[str], avoid_zones: Collection[str] = ()
) -> list[Candidate]:
    """On-demand costs the same in every zone: the recipe's preferred type first, zones in configured order
    (avoided zones last)."""
    ordered_zones = [zone for zone in zones if zone not in avoid_zones] + [
        zone for zone in zones if zone in avoid_zones
    ]
    return [Candidate(zone, instance_type, "on-demand") for instance_type in instance_types for zone in ordered_zones]


@dataclass
class LaunchPlan:
    """The sequence of launch tries for one attempt, all on the market the decision chose, driven by the outcome
    of each try.

    The plan never changes market. ``max_failures`` capacity failures in one region end that region's tries: the
    plan moves on to the next candidate in another region (spot is scarce per region, so the region's other zones
    would most likely refuse too), and ends once every region did so, or every candidate was tried (None: every
    candidate is tried). The launch then reports a capacity refusal naming the zones that refused
    (:attr:`refused_zones`), which goes back to the decision (another zone or region, on-demand, or waiting). A
    ``fatal`` error ends the plan at once. ``classify`` reads the cloud's error codes (EC2's by default).
    """

    candidates: list[Candidate]
    max_failures: int | None = 3
    classify: Callable[[str], ErrorKind] = classify_launch_error
    capacity_failures: int = 0
    failures: list[str] = field(default_factory=list)
    fatal: str | None = None
    refused_zones: list[str] = field(default_factory=list)  # zones that refused for capacity, in the order tried
    _region_failures: dict[str, int] = field(default_factory=dict)
    _next: int = 0

    def next(self) -> Candidate | None:
        """The candidate to try now, or None when nothing is left to try."""
        if self.fatal is not None:
            return None
        while self._next < len(self.candidates):
            candidate = self.candidates[self._next]
            self._next += 1
            if not self._region_done(region_of(candidate.zone)):
                return candidate
        return None

    def _region_done(self, region: str) -> bool:
        return self.max_failures is not None and self._region_failures.get(region, 0) >= self.max_failures

    @property
    def refused(self) -> bool:
        """Whether the plan ended on capacity (the decision is asked again), not on a fatal error."""
        return self.fatal is None and self.capacity_failures > 0

    def failed(self, candidate: Candidate, code: str, message: str = "") -> ErrorKind:
        """Record a failed try; returns how the error was classified."""
        kind = self.classify(code)
        note = f"{candidate.market} {candidate.instance_type} in {candidate.zone}: {code}"
        self.failures.append(f"{note} ({message})" if message else note)
        if kind == "capacity":
            self.capacity_failures += 1
            region = region_of(candidate.zone)
            self._region_failures[region] = self._region_failures.get(region, 0) + 1
            if candidate.zone not in self.refused_zones:
                self.refused_zones.append(candidate.zone)
        if kind == "fatal":
            self.fatal = note + (f" ({message})" if message else "")
        return kind

    def summary(self) -> str:
        if self.fatal is not None:
            return f"launch refused: {self.fatal}"
        if not self.failures:
            return "no candidate to launch: no zone or no instance type configured"
        return "every candidate failed: " + "; ".join(self.failures)


# -- regions --------------------------------------------------------------------------------------------------

# A restore's rate when nothing was measured, in bytes per second. Within the bucket's region: 10 Gb/s, what
# s3transfer's CRT manager targets when it cannot tell the instance's own (the local cloud's ``aws-p5`` profile).
# From another region: 5 Gb/s, the cap AWS puts on an instance's flows to another region below 32 vCPUs (half its
# bandwidth above: a GPU instance gets at least that), "Maximizing Amazon S3 transfer throughput to Amazon EC2
# instances", AWS re:Post.
IN_REGION_BYTES_PER_S = 1.25e9
CROSS_REGION_BYTES_PER_S = 0.625e9


@dataclass(frozen=True, slots=True)
class Move:
    """What a stretch in a zone outside the home region costs beyond one in it: dollars (the checkpoint restored
    from the home bucket and committed back to it) and seconds of start-up (the slower restore)."""

    cost: float = 0.0
    extra_s: float = 0.0


STAY = Move()


def move_to(
    zone: str,
    home_region: str | None,
    checkpoint_bytes: int | None,
    price_per_gb: float,
    cross_bytes_per_s: float = CROSS_REGION_BYTES_PER_S,
    in_bytes_per_s: float = IN_REGION_BYTES_PER_S,
) -> Move:
    """The move to ``zone`` for a job whose checkpoint (``checkpoint_bytes``; None: none yet) is in
    ``home_region``'s bucket (None: the cloud spans one region, nothing moves). The restore's time is counted beyond
    the in-region restore the measured restart already holds."""
    if home_region is None or not zone or not checkpoint_bytes or region_of(zone) == home_region:
        return STAY
    cost = 2 * transfer_cost(checkpoint_bytes, price_per_gb)  # restored in, committed out
    extra = max(checkpoint_bytes / cross_bytes_per_s - checkpoint_bytes / in_bytes_per_s, 0.0)
    return Move(cost, extra)


def refused_regions(
    lost_at: Mapping[str, datetime], zones: Iterable[str], now: datetime, cooldown: timedelta
) -> set[str]:
    """Regions whose every zone (of ``zones``, the candidates) refused spot for capacity, or took the job's spot
    instance, within one cool-down of the region's last such loss, while that last one is within the cool-down: the
    whole region is avoided until the cool-down after its last refusal, even where an earlier zone's own is over.
    ``lost_at``: when each zone last refused or reclaimed."""
    by_region: dict[str, list[str]] = {}
    for zone in zones:
        if zone:
            by_region.setdefault(region_of(zone), []).append(zone)
    out = set()
    for region, members in by_region.items():
        times = [lost_at.get(zone) for zone in members]
        if any(at is None for at in times):
            continue
        known = [at for at in times if at is not None]
        last = max(known)
        if now - last < cooldown and all(last - at < cooldown for at in known):
            out.add(region)
    return out
