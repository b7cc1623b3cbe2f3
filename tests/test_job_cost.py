"""Honest savings: what was paid against the on-demand cost of the useful work, on a worked example."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from bot.chat.render import card_text, message_text
from fakes.notes import notify
from handlers.job_cost import job_cost
from handlers.jobs import Attempt, Job, JobState

T0 = datetime(2026, 3, 2, 8, 0, tzinfo=UTC)


def at(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


def worked_example(**changes: object) -> Job:
    """Two spot attempts at 1 min a step: 0-120 (lost at 2:06, checkpoint 110), then 110-200.

    Attempt 1: $1.00/h, launched 0:00, trains from 0:06, lost at 2:06 at step 120 (10 steps after the last
    checkpoint). Attempt 2: $1.20/h, launched 2:10, trains from 2:16 at step 110, done at 3:46 at step 200.
    """
    first = Attempt(
        number=1,
        instance_id="i-1",
        price_per_hour=1.00,
        on_demand_price_per_hour=3.00,
        launched_at=at(0),
        started_at=at(6),
        ended_at=at(126),
    )
    second = Attempt(
        number=2,
        instance_id="i-2",
        price_per_hour=1.20,
        on_demand_price_per_hour=3.00,
        launched_at=at(130),
        started_at=at(136),
        ended_at=at(226),
        resumed_from_step=110,
    )
    values: dict[str, object] = {
        "id": "ft-ab12",
        "recipe": "tiny",
        "requested_by": "console:me",
        "state": JobState.SUCCEEDED,
        "attempts": [first, second],
        "step": 200,
        "total_steps": 200,
        "interruptions": 1,
        "steps_lost": 10,
        "downtime_seconds": 600.0,
    }
    values.update(changes)
    return Job.model_validate(values)


def test_the_worked_example() -> None:
    cost = job_cost(worked_example(), at(300))
    # Paid: 2.1 h at $1.00 + 1.6 h at $1.20 = $4.02 for 3.7 billed hours.
    assert cost.paid == pytest.approx(4.02) and cost.hours == pytest.approx(3.7)
    # 210 steps trained (200 kept + 10 redone) in 3.5 h of training: 60 s a step.
    assert cost.seconds_per_step == pytest.approx(60.0)
    # On-demand would have billed the 200 useful steps (3 h 20 min) plus one 6 min start-up: 3.4333 h × $3.
    assert cost.useful_hours == pytest.approx(200 / 60) and cost.startup_hours == pytest.approx(0.1)
    assert cost.on_demand == pytest.approx(10.30)
    assert cost.savings == pytest.approx(1 - 4.02 / 10.30)  # 61%, not the 64% of "the same 3.7 h on demand"
    assert cost.savings < 1 - 4.02 / (3.7 * 3.00)
    # Beside it: 10 steps (10 min) redone, one restart, 10 min without a running trainer.
    assert cost.lost_hours == pytest.approx(10 / 60) and cost.restarts == 1
    assert cost.downtime_hours == pytest.approx(10 / 60)


def test_a_price_that_changed_during_an_attempt_is_billed_piece_by_piece() -> None:
    # Attempt 2's spot price went to $1.50 at 3:16: 1.1 h at $1.20 + 0.5 h at $1.50 = $2.07 instead of $1.92.
    changes = {2: [(at(196), 1.50)], 1: [(at(500), 9.0)]}  # a change after the attempt ended bills nothing
    assert job_cost(worked_example(), at(300), changes).paid == pytest.approx(2.10 + 2.07)


def test_no_savings_are_claimed_before_useful_work_or_without_an_on_demand_price() -> None:
    starting = worked_example(state=JobState.PROVISIONING, step=None, steps_lost=0, downtime_seconds=0.0)
    starting = starting.model_copy(update={"attempts": [starting.attempts[0].model_copy(update={"ended_at": None})]})
    assert job_cost(starting, at(3)).savings is None and job_cost(starting, at(3)).paid == pytest.approx(0.05)
    unpriced = worked_example()
    unpriced = unpriced.model_copy(
        update={"attempts": [a.model_copy(update={"on_demand_price_per_hour": None}) for a in unpriced.attempts]}
    )
    assert job_cost(unpriced, at(300)).savings is None and job_cost(unpriced, at(300)).on_demand == 0.0


def test_an_instance_launched_ahead_of_a_switch_bills_while_it_waits_and_is_no_restart_until_it_takes_over() -> None:
    # Attempt 2 still training at 2:30; attempt 3 launched ahead at 2:20 at $2.00/h, waiting for its hand-over.
    running = worked_example(state=JobState.RUNNING)
    second = running.attempts[1].model_copy(update={"ended_at": None})
    ahead = Attempt(number=3, instance_id="i-3", price_per_hour=2.00, launched_at=at(140))
    waiting = running.model_copy(update={"attempts": [running.attempts[0], second], "standby": ahead})
    without = job_cost(waiting.model_copy(update={"standby": None}), at(150))
    cost = job_cost(waiting, at(150))
    assert cost.paid == pytest.approx(without.paid + 2.00 / 6) and cost.hours == pytest.approx(without.hours + 1 / 6)
    assert cost.restarts == without.restarts == 1 and cost.seconds_per_step == without.seconds_per_step
    # Not yet launched (no instance): nothing bills.
    unlaunched = waiting.model_copy(update={"standby": ahead.model_copy(update={"instance_id": None})})
    assert job_cost(unlaunched, at(150)).paid == pytest.approx(without.paid)


def test_the_card_and_the_completion_note_show_the_honest_saving() -> None:
    shown = card_text(worked_example(), at(300))
    assert "Cost: $4.0200 · saving 61% vs on-demand" in shown
    note = notify("ft-ab12", "thread", "completed", **{"output_uri": "file:///out/"})
    assert "cost $4.0200, saved 61% against on-demand" in message_text(worked_example(), note, at(300))
