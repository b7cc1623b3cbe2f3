"""A job's record as the policy's Situation (what the live bot will pass), and what the card shows of the choice."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from handlers.jobs import Attempt, Job, JobState
from handlers.spot.rules import NOTHING, Situation, deadline_aware
from handlers.spot.situation import live_situation, projection

T0 = datetime(2026, 3, 2, 8, 0, tzinfo=UTC)
NOW = T0 + timedelta(hours=2, minutes=7)


def interrupted_job() -> Job:
    """120 of 480 steps at 60 s a step on spot in zone-a, reclaimed at 2:06; the next attempt is being planned."""
    lost = Attempt(
        number=1,
        instance_id="i-1",
        zone="zone-a",
        price_per_hour=1.0,
        on_demand_price_per_hour=3.0,
        launched_at=T0,
        started_at=T0 + timedelta(minutes=6),
        ended_at=T0 + timedelta(hours=2, minutes=6),
        end_reason="interrupted: spot",
    )
    planned = Attempt(number=2, launched_at=T0 + timedelta(hours=2, minutes=6))
    return Job(
        id="ft-ab12",
        recipe="tiny",
        requested_by="console:me",
        state=JobState.RECOVERING,
        attempts=[lost, planned],
        step=120,
        total_steps=480,
        interruptions=1,
        created_at=T0,
    )


def situation(deadline: datetime | None, refused: dict[str, datetime] | None = None) -> Situation:
    s = live_situation(
        interrupted_job(),
        NOW,
        "interrupted",
        deadline=deadline,
        budget=None,
        zones=["zone-a", "zone-b"],
        refused={"zone-b": NOW - timedelta(minutes=1)} if refused is None else refused,
        spot_price=1.0,
        on_demand_price=3.0,
        period=timedelta(minutes=5),
        checkpoint_steps=5,
    )
    assert s is not None
    return s


def test_the_job_record_becomes_the_situation_the_simulator_builds() -> None:
    s = live_situation(
        interrupted_job(),
        NOW,
        "interrupted",
        deadline=NOW + timedelta(hours=6, minutes=10),
        budget=50.0,
        zones=["zone-a", "zone-b", "zone-c"],
        scores={"zone-c": 0.9},
        refused={"zone-b": NOW - timedelta(minutes=1), "zone-c": NOW - timedelta(hours=2)},
        spot_price=1.0,
        on_demand_price=3.0,
        period=timedelta(minutes=5),
        checkpoint_steps=5,
    )
    assert s is not None
    assert s.work_left_s == 360 * 60.0 and s.work_done_s == 120 * 60.0  # steps × the measured 60 s a step
    assert s.time_left_s == (6 * 60 + 10) * 60.0 and s.elapsed_s == 127 * 60.0
    assert s.restart_s == 360.0  # the measured start-up, launch to the runner's start
    assert s.checkpoint_interval_s == 300.0 and s.period_s == 300.0
    assert s.holding == NOTHING and s.spent == pytest.approx(2.1) and s.budget == 50.0
    # zone-a reclaimed a minute ago, zone-b refused a minute ago: no spot; zone-c's refusal has cooled down.
    assert [(z.name, z.available, z.availability) for z in s.zones] == [
        ("zone-a", False, None),
        ("zone-b", False, None),
        ("zone-c", None, 0.9),
    ]


def test_with_the_deadline_close_the_card_says_on_demand_now_and_why() -> None:
    s = situation(NOW + timedelta(hours=6, minutes=10))
    choice = deadline_aware(s)
    assert choice.action == "on-demand"
    assert str(choice.reason) == "on-demand now: 6 h of work left, 6.2 h to the deadline"
    shown = projection(s, choice, NOW)
    assert shown.finish == NOW + timedelta(hours=6, minutes=6)  # one start-up and the work
    assert shown.cost == pytest.approx(2.1 + 6.1 * 3.0)


def test_without_a_deadline_it_goes_to_spot_in_a_zone_that_did_not_just_fail() -> None:
    s = situation(None, refused={})
    choice = deadline_aware(s)
    assert (choice.action, choice.zone) == ("spot", "zone-b")
    assert projection(s, choice, NOW).cost == pytest.approx(2.1 + 6.1 * 1.0)


def test_nothing_to_decide_on_before_a_step_is_measured() -> None:
    fresh = interrupted_job().model_copy(update={"step": None, "attempts": [Attempt(number=1, launched_at=T0)]})
    unmeasured = live_situation(
        fresh, NOW, "launch", deadline=None, budget=None, zones=["a"], spot_price=1, on_demand_price=3, period=NOW - T0
    )
    assert unmeasured is None


def test_the_zone_of_the_jobs_own_spot_instance_has_spot_as_the_simulator_says() -> None:
    """The bot's view of the zones is the simulator's ``live`` one: spot where its spot instance runs (its launch
    found spot there), none where a launch was just refused, nothing known of the others."""
    running = Attempt(
        number=2,
        instance_id="i-2",
        zone="zone-b",
        market="spot",
        launched_at=T0 + timedelta(hours=2, minutes=6),
        started_at=T0 + timedelta(hours=2, minutes=7),
    )
    job = interrupted_job()
    job = job.model_copy(update={"attempts": [job.attempts[0], running], "state": JobState.RUNNING})
    s = live_situation(
        job,
        NOW,
        "tick",
        deadline=NOW + timedelta(hours=12),
        budget=None,
        zones=["zone-a", "zone-b", "zone-c"],
        refused={"zone-c": NOW - timedelta(minutes=1)},
        spot_price=1.0,
        on_demand_price=3.0,
        period=timedelta(minutes=5),
    )
    assert s is not None and s.holding.market == "spot" and s.holding.zone == "zone-b"
    assert [(z.name, z.available) for z in s.zones] == [("zone-a", False), ("zone-b", True), ("zone-c", False)]
