"""What the spot authority's decision means for the job, without I/O (handlers/spot/steer.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from handlers.jobs import Attempt, Job, JobState
from handlers.spot import SpotView
from handlers.spot.steer import next_stretch, refused

NOW = datetime(2026, 3, 2, 8, 30, tzinfo=UTC)
VIEW = SpotView(zones=("zone-a", "zone-b"), spot_price=0.3, on_demand_price=1.0)


def job(**changes: object) -> Job:
    values: dict[str, object] = {
        "id": "ft-ab12",
        "recipe": "tiny",
        "requested_by": "console:ana",
        "state": JobState.PENDING,
        "attempts": [Attempt(number=1, market="spot", launched_at=NOW, from_step=0)],
        "created_at": NOW,
    }
    values.update(changes)
    return Job.model_validate(values)


def test_an_unsteered_job_gets_spot_first_without_a_plan_on_its_card_or_a_word_in_its_thread() -> None:
    plain = job()
    stretch = next_stretch(plain, plain, SpotView(), NOW, "launch")
    assert (stretch.market, stretch.zone, stretch.plan, stretch.tell) == ("spot", None, None, False)
    gone = refused(plain, "", NOW)  # the whole launch was refused for capacity
    stretch = next_stretch(plain, gone, SpotView(), NOW, "capacity")
    assert (stretch.market, stretch.zone, stretch.plan, stretch.tell) == ("on-demand", None, None, False)
    assert stretch.history() == {"policy": "on-demand", "policy_zone": None, "why": str(stretch.choice.reason)}


def test_a_steered_job_keeps_its_plan_and_the_thread_hears_why_it_leaves_spot() -> None:
    steered = job(spot_policy="spot-first")
    stretch = next_stretch(steered, steered, VIEW, NOW, "launch")
    assert (stretch.market, stretch.zone, stretch.tell) == ("spot", "zone-a", False)
    assert stretch.plan is not None and stretch.plan.zone == "zone-a"
    both = refused(refused(steered, "zone-a", NOW), "zone-b", NOW)
    stretch = next_stretch(steered, both, VIEW, NOW, "capacity")
    assert (stretch.market, stretch.zone, stretch.tell) == ("on-demand", None, True)
    # The refusals count for the cool-down only.
    later = NOW + timedelta(minutes=31)
    stretch = next_stretch(steered, both, VIEW, later, "capacity")
    assert (stretch.market, stretch.zone) == ("spot", "zone-a")
