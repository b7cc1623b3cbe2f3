"""The spot authority across regions: a region whose every zone refused is avoided for the cool-down, a move out of
the home region is weighed against what its availability is worth, and the held zone is kept."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from bot.cloud.local.provider import LocalCloud
from bot.core import spans_regions
from handlers.jobs import Attempt, Job, JobState
from handlers.spot import Regions, SpotView, choose
from handlers.spot.rules import Holding, ZoneView, deadline_aware, greedy
from handlers.spot.situation import live_situation
from handlers.spot.zones import move_to, refused_regions
from tests.spot_cases import HOUR, OWN_RULES, situation

T0 = datetime(2026, 3, 2, 8, 0, tzinfo=UTC)
NOW = T0 + timedelta(hours=2)
PERIOD = timedelta(minutes=5)
HOME = Regions("us-east-1", 0.02)
GB = 10**9


def running_job(checkpoint_bytes: int | None = 20 * GB, attempts: list[Attempt] | None = None) -> Job:
    """120 of 480 steps at 60 s a step, its spot instance reclaimed in us-east-1a; a deadline far enough for spot."""
    lost = Attempt(
        number=1,
        instance_id="i-1",
        zone="us-east-1a",
        launched_at=T0,
        started_at=T0 + timedelta(minutes=6),
        ended_at=T0 + timedelta(minutes=30),
        end_reason="interrupted: spot",
    )
    planned = Attempt(number=2, launched_at=NOW)
    return Job(
        id="ft-ab12",
        recipe="tiny",
        requested_by="console:me",
        state=JobState.RECOVERING,
        attempts=attempts or [lost, planned],
        step=120,
        total_steps=480,
        checkpoint_bytes=checkpoint_bytes,
        deadline=NOW + timedelta(hours=12),
        spot_policy="deadline-aware",
        created_at=T0,
    )


# -- a region whose every zone refused ---------------------------------------------------------------------------


def test_a_region_whose_every_zone_refused_is_avoided_until_the_cool_down_after_its_last_refusal() -> None:
    zones = ["us-east-1a", "us-east-1b", "us-west-2a"]
    refused = {"us-east-1a": NOW - timedelta(minutes=4), "us-east-1b": NOW - timedelta(minutes=1)}
    later = NOW + timedelta(minutes=2)  # us-east-1a's own cool-down is over; the region's (from 1b's) is not
    assert refused_regions(refused, zones, later, PERIOD) == {"us-east-1"}
    assert refused_regions(refused, zones, NOW + timedelta(minutes=4), PERIOD) == set()  # over for the region too
    # One zone of the region not refused: the region is not out, only the refused zone.
    assert refused_regions({"us-east-1a": NOW}, zones, later, PERIOD) == set()
    # Refusals further apart than a cool-down are not one round: the region had room between them.
    apart = {"us-east-1a": NOW - timedelta(minutes=6), "us-east-1b": NOW - timedelta(minutes=1)}
    assert refused_regions(apart, zones, NOW, PERIOD) == set()

    # Placement scores favour us-east-1 (its zones refused minutes ago, scores lag): the region is avoided anyway.
    scores = {"us-east-1a": 1.0, "us-east-1b": 1.0, "us-west-2a": 0.5}
    view = SpotView(zones=tuple(zones), spot_price=1.0, on_demand_price=3.0, period=PERIOD, scores=scores, regions=HOME)
    fresh = running_job(attempts=[Attempt(number=1, launched_at=NOW)])  # nothing measured yet
    for job in (fresh, running_job()):
        choice, _ = choose(job.model_copy(update={"refused_zones": refused}), view, later, "capacity")
        assert (choice.action, choice.zone) == ("spot", "us-west-2a")
        # Refusals a cool-down apart: us-east-1a, out for its own cool-down no more, is tried again first.
        choice, _ = choose(
            job.model_copy(update={"refused_zones": apart}), view, NOW + timedelta(minutes=1), "capacity"
        )
        assert (choice.action, choice.zone) == ("spot", "us-east-1a")


# -- what a move costs --------------------------------------------------------------------------------------------


def test_a_move_out_of_the_home_region_costs_the_checkpoint_both_ways_and_the_slower_restore() -> None:
    move = move_to("us-west-2b", "us-east-1", 20 * GB, 0.02)
    assert move.cost == pytest.approx(0.80)  # 20 GB restored in and committed out at $0.02
    assert move.extra_s == pytest.approx(16.0)  # 32 s at 5 Gb/s against 16 s at 10 Gb/s
    assert move_to("us-east-1c", "us-east-1", 20 * GB, 0.02).cost == 0.0  # the home region moves nothing
    assert move_to("us-west-2b", None, 20 * GB, 0.02).cost == 0.0  # one region: nothing moves
    assert move_to("us-west-2b", "us-east-1", None, 0.02).cost == 0.0  # no checkpoint yet


def test_the_situation_prices_each_zone_s_move_at_the_restore_rates_the_job_measured() -> None:
    reclaimed = Attempt(
        number=1,
        instance_id="i-1",
        zone="us-west-2b",
        launched_at=T0,
        started_at=T0 + timedelta(minutes=6),
        ended_at=T0 + timedelta(minutes=30),
        end_reason="interrupted: spot",
        restore_seconds=100.0,  # 20 GB from the home bucket: 0.2 GB/s measured
    )
    job = running_job(attempts=[reclaimed, Attempt(number=2, launched_at=NOW)])
    s = live_situation(
        job,
        NOW,
        "interrupted",
        deadline=job.deadline,
        budget=None,
        zones=["us-east-1a", "us-west-2a"],
        spot_price=1.0,
        on_demand_price=3.0,
        period=PERIOD,
        regions=HOME,
    )
    assert s is not None
    home, far = s.zones
    assert (home.move_cost, home.restart_extra_s) == (0.0, 0.0)
    assert far.move_cost == pytest.approx(0.80)
    assert far.restart_extra_s == pytest.approx(100.0 - 16.0)  # the measured 100 s, less the in-region default


def zone(name: str, availability: float, move: float = 0.0, extra: float = 0.0, up: bool = True) -> ZoneView:
    return ZoneView(name, up, availability, move_cost=move, restart_extra_s=extra)


def test_a_same_region_zone_is_preferred_unless_the_other_region_s_availability_is_worth_the_move() -> None:
    # $1 spot / $3 on-demand, one-hour periods: a period off spot costs $2 more; a point of availability, $0.02.
    def pick(*zones: ZoneView) -> str | None:
        # its own rules (one-hour restarts are past the switch to greedy's, whose zone is the configured order's)
        return OWN_RULES(situation(zones=zones, work_left_s=24 * HOUR, time_left_s=36 * HOUR)).zone

    near = zone("us-east-1a", 0.80)  # $0.40 expected off spot until the next look
    assert pick(near, zone("us-west-2a", 0.99, move=8.0, extra=160.0)) == "us-east-1a"  # 200 GB: $8 + $0.02
    assert pick(near, zone("us-west-2a", 0.85, move=0.2)) == "us-east-1a"  # $0.20 + $0.30
    assert pick(near, zone("us-west-2a", 0.95, move=0.1)) == "us-west-2a"  # $0.10 + $0.10: worth the move
    assert pick(near, zone("us-west-2a", 0.95, move=0.1, extra=900.0)) == "us-east-1a"  # + 15 min at $1: $0.25
    # Nothing moves: the best availability, as before regions; equal availability: the zone that moves nothing.
    assert pick(near, zone("us-east-1b", 0.9)) == "us-east-1b"
    assert pick(zone("us-west-2a", 0.8, move=0.01), near) == "us-east-1a"
    # Greedy stays the baseline: the first zone with spot in the configured order (home region first).
    far = zone("us-west-2a", 0.95, move=0.1)
    assert greedy(situation(zones=(near, far), work_left_s=24 * HOUR, time_left_s=36 * HOUR)).zone == "us-east-1a"


def test_the_zone_of_the_job_s_spot_instance_is_kept_whatever_a_move_would_cost() -> None:
    held = zone("us-west-2a", 0.3, move=8.0, extra=160.0)
    home = zone("us-east-1a", 1.0)
    s = situation(zones=(home, held), holding=Holding("spot", "us-west-2a", 0.0), work_left_s=2 * HOUR)
    assert deadline_aware(s).zone == "us-west-2a"


# -- the bot's side -----------------------------------------------------------------------------------------------


def test_the_bot_reads_the_home_region_and_price_from_a_cloud_that_spans_regions(tmp_path: Path) -> None:
    local = spans_regions(LocalCloud(tmp_path), 0.625)  # zones of one region: its home, so no move costs anything
    assert local == Regions("local", 0.02, 0.625e9)
    assert move_to("local-a", local.home, 20 * 10**9, local.price_per_gb) == move_to("local-a", None, None, 0.02)
    spanning = LocalCloud(tmp_path, zones=("us-east-1a", "us-west-2a"))  # the first zone's region is its home
    spanning.transfer_price_per_gb = 0.01
    assert spans_regions(spanning, 0.5) == Regions("us-east-1", 0.01, 0.5e9)


def test_a_zone_whose_longer_start_up_the_deadline_cannot_cover_is_not_chosen() -> None:
    # 4 h of work, 6 h left, one-hour restarts and periods: 1 h of slack, one restart's worth.
    tight = {"work_left_s": 4 * HOUR, "time_left_s": 6 * HOUR}
    home = zone("us-east-1a", 0.9, up=False)
    slow = zone("us-west-2a", 0.9, move=0.1, extra=HOUR)  # a restore from another region that takes an hour more
    quick = zone("us-west-2a", 0.9, move=0.1, extra=0.0)
    assert deadline_aware(situation(zones=(home, quick), **tight)).zone == "us-west-2a"
    # The slow zone is no candidate: as with no spot anywhere, the slack allows one more period of waiting.
    assert deadline_aware(situation(zones=(home, slow), **tight)).action == "wait"
    assert greedy(situation(zones=(home, slow), **tight)).action == "wait"
    assert (
        deadline_aware(situation(zones=(home, slow), work_left_s=4 * HOUR, time_left_s=12 * HOUR)).zone == "us-west-2a"
    )
