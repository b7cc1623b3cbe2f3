"""The zones without I/O: candidate order, each cloud's error classes, live availability, the one-market plan."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from handlers.spot.zones import (
    Candidate,
    LaunchPlan,
    SpotPrice,
    as_scores,
    classify_aliyun_launch_error,
    classify_launch_error,
    latest_prices,
    order_on_demand_candidates,
    order_spot_candidates,
    score_availability,
    scores_by_zone,
    stock_availability,
    weigh_availability,
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
    candidates = order_spot_candidates(ZONES, TYPES, None, {}) if spot else order_on_demand_candidates(ZONES, TYPES)
    return LaunchPlan(candidates, max_failures=max_failures)


def test_plan_ends_as_a_capacity_refusal_after_max_capacity_failures_and_never_changes_market() -> None:
    launch = plan(max_failures=3)
    for code in ("InsufficientInstanceCapacity", "Unsupported", "SpotMaxPriceTooLow", "InsufficientCapacity"):
        candidate = launch.next()
        assert candidate is not None
        assert candidate.market == "spot"
        launch.failed(candidate, code)
    assert launch.capacity_failures == 3  # "Unsupported" moved on without counting
    assert launch.next() is None  # no on-demand: the spot authority chooses again
    assert launch.refused


def test_plan_ends_when_every_candidate_failed() -> None:
    launch = LaunchPlan(order_spot_candidates(["us-east-1a"], ["g5.2xlarge"], None, {}), max_failures=3)
    first = launch.next()
    assert first is not None
    launch.failed(first, "InsufficientInstanceCapacity")
    assert launch.next() is None
    assert launch.refused
    assert launch.summary() == "every candidate failed: spot g5.2xlarge in us-east-1a: InsufficientInstanceCapacity"


def test_plan_without_a_cap_tries_every_candidate_of_its_market() -> None:
    launch = plan(max_failures=None)
    seen = []
    while (candidate := launch.next()) is not None:
        seen.append(candidate.market)
        launch.failed(candidate, "InsufficientInstanceCapacity")
    assert seen == ["spot"] * 6


def test_an_on_demand_plan_tries_only_on_demand() -> None:
    launch = plan(max_failures=None, spot=False)
    seen = []
    while (candidate := launch.next()) is not None:
        seen.append(candidate.market)
        launch.failed(candidate, "InsufficientInstanceCapacity")
    assert seen == ["on-demand"] * 6


def test_a_fatal_error_ends_the_plan() -> None:
    launch = plan()
    candidate = launch.next()
    assert candidate is not None
    assert launch.failed(candidate, "InvalidAMIID.NotFound", "The image id does not exist") == "fatal"
    assert launch.next() is None
    assert not launch.refused
    assert launch.summary() == (
        "launch refused: spot g5.2xlarge in us-east-1a: InvalidAMIID.NotFound (The image id does not exist)"
    )


def test_a_region_that_refused_max_times_hands_the_launch_to_the_next_region() -> None:
    """Capacity failures count per region: three refusals in us-east-1 skip its last zone and move the launch to
    us-west-2 within the same attempt; the plan ends once every region refused, naming the zones that did."""
    zones = ["us-east-1a", "us-east-1b", "us-east-1c", "us-east-1d", "us-west-2a", "us-west-2b"]
    scores = {"us-east-1a": 9, "us-east-1b": 9, "us-east-1c": 9, "us-east-1d": 9, "us-west-2a": 5, "us-west-2b": 4}
    launch = LaunchPlan(order_spot_candidates(zones, ["g5.xlarge"], scores, {}), max_failures=3)
    tried = []
    while (candidate := launch.next()) is not None:
        tried.append(candidate.zone)
        launch.failed(candidate, "InsufficientInstanceCapacity")
    assert tried == ["us-east-1a", "us-east-1b", "us-east-1c", "us-west-2a", "us-west-2b"]
    assert launch.refused and launch.capacity_failures == 5
    assert launch.refused_zones == tried


def test_a_region_with_room_is_reached_after_the_home_region_refused() -> None:
    zones = ["us-east-1a", "us-east-1b", "us-west-2a"]
    launch = LaunchPlan(order_spot_candidates(zones, TYPES, None, {}), max_failures=2)
    first, second = launch.next(), launch.next()
    assert first is not None and second is not None
    launch.failed(first, "InsufficientInstanceCapacity")
    launch.failed(second, "InsufficientInstanceCapacity")
    third = launch.next()
    assert third is not None and third.zone == "us-west-2a"  # us-east-1's other candidates skipped
    assert launch.refused_zones == ["us-east-1a"]  # both types refused there


def test_an_empty_plan_says_why() -> None:
    launch = LaunchPlan([])
    assert launch.next() is None
    assert "no zone or no instance type" in launch.summary()


@pytest.mark.parametrize(
    ("code", "kind"),
    [
        ("OperationDenied.NoStock", "capacity"),
        ("Zone.NotOnSale", "capacity"),
        ("InvalidResourceType.NotSupported", "skip"),
        ("Throttling.User", "skip"),
        ("InvalidImageId.NotFound", "fatal"),
    ],
)
def test_alibaba_error_classes(code: str, kind: str) -> None:
    assert classify_aliyun_launch_error(code) == kind


# -- live availability ------------------------------------------------------------------------------------


def test_placement_scores_become_availability() -> None:
    assert score_availability({"us-east-1a": 9, "us-east-1b": 3, "us-east-1c": 12}) == {
        "us-east-1a": 0.9,
        "us-east-1b": 0.3,
        "us-east-1c": 1.0,
    }


def test_stock_status_becomes_availability_lowered_where_the_spot_price_nears_on_demand() -> None:
    stock = [("cn-a", "WithStock"), ("cn-b", "ClosedWithStock"), ("cn-c", "WithoutStock"), ("cn-a", "WithoutStock")]
    assert stock_availability(stock) == {"cn-a": 1.0, "cn-b": 0.6, "cn-c": 0.0}
    # cn-a's spot price is 3/4 of the origin price: half the discount is gone, so a quarter of the figure.
    priced = stock_availability(stock, {("cn-a", "gpu"): 3.0, ("cn-b", "gpu"): 1.0}, {"gpu": 4.0})
    assert priced == {"cn-a": 0.75, "cn-b": 0.6, "cn-c": 0.0}
    assert as_scores(priced) == {"cn-a": 8, "cn-b": 6, "cn-c": 0}


def test_the_live_signal_where_there_is_one_the_estimate_where_not() -> None:
    weighed = weigh_availability({"a": 0.9, "b": 0.3}, {"b": 0.9, "c": 0.5})
    assert weighed == {"a": 0.9, "b": 0.5, "c": 0.5}  # b: (2 × 0.3 + 0.9) / 3
    assert weigh_availability({}, {}) == {}
