"""Placement decisions without I/O: candidate order, error classes, the spot → on-demand plan."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from handlers.placement import (
    Candidate,
    LaunchPlan,
    SpotPrice,
    classify_launch_error,
    latest_prices,
    order_on_demand_candidates,
    order_spot_candidates,
    scores_by_zone,
)

ZONES = ["us-east-1a", "us-east-1b", "us-east-1c"]
TYPES = ["g5.2xlarge", "g6.2xlarge"]


def pairs(candidates: list[Candidate]) -> list[tuple[str, str]]:
    return [(c.zone, c.instance_type) for c in candidates]


@pytest.mark.parametrize(
    ("code", "kind"),
    [
        ("InsufficientInstanceCapacity", "capacity"),
        ("Server.InsufficientInstanceCapacity", "capacity"),
        ("InsufficientCapacity", "capacity"),
        ("SpotMaxPriceTooLow", "capacity"),
        ("MaxSpotInstanceCountExceeded", "capacity"),
        ("VcpuLimitExceeded", "capacity"),
        ("Unsupported", "skip"),
        ("InsufficientFreeAddressesInSubnet", "skip"),
        ("RequestLimitExceeded", "skip"),
        ("InvalidAMIID.NotFound", "fatal"),
        ("UnauthorizedOperation", "fatal"),
        ("InvalidParameterValue", "fatal"),
        ("", "fatal"),
    ],
)
def test_error_classes(code: str, kind: str) -> None:
    assert classify_launch_error(code) == kind


def test_latest_price_wins_per_zone_and_type() -> None:
    now = datetime(2025, 1, 1, tzinfo=UTC)
    history = [
        SpotPrice("us-east-1a", "g5.2xlarge", 0.50, now - timedelta(hours=2)),
        SpotPrice("us-east-1a", "g5.2xlarge", 0.42, now),
        SpotPrice("us-east-1a", "g5.2xlarge", 0.61, now - timedelta(hours=1)),
        SpotPrice("us-east-1b", "g5.2xlarge", 0.30, now - timedelta(days=1)),
    ]
    assert latest_prices(history) == {("us-east-1a", "g5.2xlarge"): 0.42, ("us-east-1b", "g5.2xlarge"): 0.30}


def test_scores_are_keyed_by_zone_name() -> None:
    names = {"use1-az6": "us-east-1a", "use1-az1": "us-east-1b"}
    scores = [("use1-az6", 3), ("use1-az1", 9), ("usw2-az1", 10), ("use1-az6", 5)]
    assert scores_by_zone(scores, names) == {"us-east-1a": 5, "us-east-1b": 9}


def test_score_first_then_price_then_zone_order() -> None:
    scores = {"us-east-1a": 3, "us-east-1b": 9, "us-east-1c": 9}
    prices = {
        ("us-east-1a", "g5.2xlarge"): 0.10,  # cheapest, but a low score
        ("us-east-1b", "g5.2xlarge"): 0.50,
        ("us-east-1b", "g6.2xlarge"): 0.40,
        ("us-east-1c", "g5.2xlarge"): 0.40,
        ("us-east-1c", "g6.2xlarge"): 0.60,
    }
    ordered = order_spot_candidates(ZONES, TYPES, scores, prices)
    assert pairs(ordered) == [
        ("us-east-1b", "g6.2xlarge"),  # score 9, 0.40, zone b before zone c
        ("us-east-1c", "g5.2xlarge"),  # score 9, 0.40
        ("us-east-1b", "g5.2xlarge"),
        ("us-east-1c", "g6.2xlarge"),
        ("us-east-1a", "g5.2xlarge"),  # score 3, priced
        ("us-east-1a", "g6.2xlarge"),  # score 3, no price
    ]
    assert ordered[0] == Candidate("us-east-1b", "g6.2xlarge", "spot", 9, 0.40)


def test_without_scores_price_then_configuration() -> None:
    prices = {("us-east-1c", "g5.2xlarge"): 0.2, ("us-east-1a", "g6.2xlarge"): 0.3}
    ordered = order_spot_candidates(ZONES, TYPES, None, prices)
    assert pairs(ordered)[:3] == [
        ("us-east-1c", "g5.2xlarge"),
        ("us-east-1a", "g6.2xlarge"),
        ("us-east-1a", "g5.2xlarge"),
    ]
    # With no price either, the configured zone order, then the recipe's type order.
    assert pairs(order_spot_candidates(ZONES, TYPES, None, {})) == [(z, t) for z in ZONES for t in TYPES]


def test_avoided_zones_go_last_but_stay() -> None:
    scores = {"us-east-1a": 9, "us-east-1b": 5, "us-east-1c": 1}
    ordered = order_spot_candidates(ZONES, ["g5.2xlarge"], scores, {}, avoid_zones={"us-east-1a"})
    assert [c.zone for c in ordered] == ["us-east-1b", "us-east-1c", "us-east-1a"]
    only = order_spot_candidates(["us-east-1a"], ["g5.2xlarge"], None, {}, avoid_zones={"us-east-1a"})
    assert [c.zone for c in only] == ["us-east-1a"]


def test_on_demand_order_prefers_the_recipes_first_type() -> None:
    ordered = order_on_demand_candidates(ZONES, TYPES, avoid_zones={"us-east-1a"})
    assert pairs(ordered) == [
        ("us-east-1b", "g5.2xlarge"),
        ("us-east-1c", "g5.2xlarge"),
        ("us-east-1a", "g5.2xlarge"),
        ("us-east-1b", "g6.2xlarge"),
        ("us-east-1c", "g6.2xlarge"),
        ("us-east-1a", "g6.2xlarge"),
    ]
    assert all(c.market == "on-demand" for c in ordered)


def plan(max_failures: int | None = 3, spot: bool = True) -> LaunchPlan:
    return LaunchPlan(
        spot=order_spot_candidates(ZONES, TYPES, None, {}) if spot else [],
        on_demand=order_on_demand_candidates(ZONES, TYPES),
        max_failures=max_failures,
    )


def test_plan_falls_back_to_on_demand_after_max_capacity_failures() -> None:
    launch = plan(max_failures=3)
    tried = []
    for code in ("InsufficientInstanceCapacity", "Unsupported", "SpotMaxPriceTooLow", "InsufficientCapacity"):
        candidate = launch.next()
        assert candidate is not None
        assert candidate.market == "spot"
        tried.append(candidate)
        launch.failed(candidate, code)
    assert launch.capacity_failures == 3  # "Unsupported" moved on without counting
    assert not launch.fell_back
    fallback = launch.next()
    assert fallback == Candidate("us-east-1a", "g5.2xlarge", "on-demand")
    assert launch.fell_back


def test_plan_falls_back_when_spot_is_exhausted_early() -> None:
    launch = LaunchPlan(
        spot=order_spot_candidates(["us-east-1a"], ["g5.2xlarge"], None, {}),
        on_demand=order_on_demand_candidates(["us-east-1a"], ["g5.2xlarge"]),
        max_failures=3,
    )
    first = launch.next()
    assert first is not None
    launch.failed(first, "InsufficientInstanceCapacity")
    second = launch.next()
    assert second is not None
    assert second.market == "on-demand"
    launch.failed(second, "InsufficientInstanceCapacity")
    assert launch.next() is None
    assert launch.summary() == (
        "every candidate failed: spot g5.2xlarge in us-east-1a: InsufficientInstanceCapacity; "
        "on-demand g5.2xlarge in us-east-1a: InsufficientInstanceCapacity"
    )


def test_plan_without_automatic_fallback_stays_on_spot() -> None:
    launch = plan(max_failures=None)
    seen = []
    while (candidate := launch.next()) is not None:
        seen.append(candidate.market)
        launch.failed(candidate, "InsufficientInstanceCapacity")
    assert seen == ["spot"] * 6


def test_on_demand_market_goes_straight_to_on_demand() -> None:
    launch = plan(max_failures=None, spot=False)
    candidate = launch.next()
    assert candidate is not None
    assert candidate.market == "on-demand"
    assert not launch.fell_back


def test_a_fatal_error_ends_the_plan() -> None:
    launch = plan()
    candidate = launch.next()
    assert candidate is not None
    assert launch.failed(candidate, "InvalidAMIID.NotFound", "The image id does not exist") == "fatal"
    assert launch.next() is None
    assert launch.summary() == (
        "launch refused: spot g5.2xlarge in us-east-1a: InvalidAMIID.NotFound (The image id does not exist)"
    )


def test_an_empty_plan_says_why() -> None:
    launch = LaunchPlan(spot=[], on_demand=[])
    assert launch.next() is None
    assert "no zone or no instance type" in launch.summary()
