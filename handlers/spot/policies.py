"""The named policies the decision may run: the simulator's (:mod:`handlers.spot.rules`) and ``spot-first``.

``spot-first`` is what the bot always did, now as a policy like the others: spot in the best zone that has it
(the job's own zone while it holds one there), on-demand once no zone has spot (every zone refused the launch for
capacity, or reclaimed the job, within the cool-down), and a job on on-demand stays there. It runs every job that
no other policy steers (:func:`policy_for`): one without a deadline or a budget under the default configuration.
"""

from __future__ import annotations

from datetime import datetime

from handlers.policy_reasons import WORDING
from handlers.spot.rules import (
    DEFAULT_POLICY,
    SIMULATED_POLICIES,
    Choice,
    Situation,
    SpotPolicy,
    ZoneView,
    cheapest_zone,
    period_premium,
)

SPOT_FIRST = "spot-first"


def spot_first(s: Situation) -> Choice:
    """Spot in the held zone, else the zone with the best availability (unknown: ½; ties: configured order);
    on-demand when no zone has spot; a job on on-demand stays there."""
    if s.holding.market == "on-demand":
        return Choice("on-demand", None, WORDING("spot-policy.on-demand.kept"))
    held = s.holding.zone if s.holding.market == "spot" else None
    zone = best_zone(s.zones, held, period_premium(s), s.spot_price)
    if zone is None:
        return Choice("on-demand", None, WORDING("spot-policy.on-demand.first"))
    return Choice("spot", zone.name, WORDING("spot-policy.spot.first", zone=zone.name or "-"))


def best_zone(
    zones: tuple[ZoneView, ...] | list[ZoneView],
    held: str | None = None,
    premium: float | None = None,
    spot_price: float = 0.0,
) -> ZoneView | None:
    """The zone to run spot in: the held one while it has spot, else the best known availability weighed against
    what a move to another region costs (:func:`~handlers.spot.rules.cheapest_zone`; ties: order)."""
    open_zones = [zone for zone in zones if zone.available is not False]
    for zone in open_zones:
        if held is not None and zone.name == held:
            return zone
    return cheapest_zone(open_zones, premium, spot_price)


POLICIES: dict[str, SpotPolicy] = {**SIMULATED_POLICIES, SPOT_FIRST: spot_first}


def policy_for(name: str | None, deadline: datetime | None, budget: float | None) -> str:
    """The policy that decides for a job started under ``name`` with this deadline and budget: the configured one
    when it steers the job (a deadline, a budget, or a policy other than the default: :func:`~handlers.spot.steers`),
    else ``spot-first``."""
    if name is None or name not in POLICIES:
        return SPOT_FIRST
    if deadline is not None or budget is not None or name != DEFAULT_POLICY:
        return name
    return SPOT_FIRST
