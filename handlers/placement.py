"""Where to launch the next attempt: which (zone, instance type) first, which errors mean "try elsewhere", and
when to give up on spot and pay for on-demand.

Pure decisions over what the cloud adapter read (placement scores, spot prices, the zones of the job's earlier
attempts) and the error codes it got back; the adapter only does the I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

from handlers.jobs import Market

ErrorKind = Literal["capacity", "skip", "fatal"]

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
    """``capacity`` and ``skip``: try the next candidate; ``fatal`` (bad AMI, no permission, …): stop now."""
    bare = code.removeprefix("Server.").removeprefix("Client.")
    if bare in CAPACITY_ERRORS:
        return "capacity"
    if bare in SKIP_ERRORS:
        return "skip"
    return "fatal"


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
    """The sequence of launch tries for one attempt, driven by the outcome of each try.

    Spot candidates go first (none when on-demand was asked for). The plan switches to on-demand once
    ``max_failures`` spot tries failed for capacity, or once every spot candidate failed; with
    ``max_failures`` None it never switches by itself (the on-call person chooses on-demand instead).
    A ``fatal`` error ends the plan at once. ``classify`` reads the cloud's error codes (EC2's by default).
    """

    spot: list[Candidate]
    on_demand: list[Candidate]
    max_failures: int | None = 3
    classify: Callable[[str], ErrorKind] = classify_launch_error
    capacity_failures: int = 0
    failures: list[str] = field(default_factory=list)
    fatal: str | None = None
    _spot_next: int = 0
    _on_demand_next: int = 0
    _spot_done: bool = False

    def next(self) -> Candidate | None:
        """The candidate to try now, or None when nothing is left to try."""
        if self.fatal is not None:
            return None
        if not self._spot_done:
            out_of_budget = self.max_failures is not None and self.capacity_failures >= self.max_failures
            if not out_of_budget and self._spot_next < len(self.spot):
                self._spot_next += 1
                return self.spot[self._spot_next - 1]
            self._spot_done = True
        if self.spot and self.max_failures is None:
            return None  # spot was asked for and automatic fallback is off
        if self._on_demand_next < len(self.on_demand):
            self._on_demand_next += 1
            return self.on_demand[self._on_demand_next - 1]
        return None

    @property
    def fell_back(self) -> bool:
        """Whether the plan has moved on to on-demand after spot was asked for."""
        return bool(self.spot) and self._on_demand_next > 0

    def failed(self, candidate: Candidate, code: str, message: str = "") -> ErrorKind:
        """Record a failed try; returns how the error was classified."""
        kind = self.classify(code)
        note = f"{candidate.market} {candidate.instance_type} in {candidate.zone}: {code}"
        self.failures.append(f"{note} ({message})" if message else note)
        if kind == "capacity" and candidate.market == "spot":
            self.capacity_failures += 1
        if kind == "fatal":
            self.fatal = note + (f" ({message})" if message else "")
        return kind

    def summary(self) -> str:
        if self.fatal is not None:
            return f"launch refused: {self.fatal}"
        if not self.failures:
            return "no candidate to launch: no zone or no instance type configured"
        return "every candidate failed: " + "; ".join(self.failures)
