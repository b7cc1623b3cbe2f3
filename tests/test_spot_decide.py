"""The spot policy as the bot's live behaviour, decided without I/O: each path from an input to its effects."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from bot.chat.catalog import text
from bot.chat.render import card, card_text
from bot.settings import ConfigError, load_settings, parse_file_config
from fakes.notes import note_type
from handlers.change import Change
from handlers.decide import decide, new_job, resume_command, stop_command
from handlers.failures import Failure
from handlers.jobs import Attempt, Job, JobState
from handlers.messages import CloudEvent, Launched, LaunchFailed, PolicyTick, ReportReceived, StartDeadline
from handlers.reports import Completed, Failed, Interrupted, Standby, Started
from handlers.spot import SpotView, choose, estimated_availability, managed
from handlers.spot.rules import Situation
from handlers.spot.situation import live_situation
from tests.outboxes import dumped

NOW = datetime(2026, 3, 2, 8, 30, tzinfo=UTC)
VIEW = SpotView(zones=("zone-a", "zone-b"), spot_price=0.3, on_demand_price=1.0, period=timedelta(minutes=5))
ONE_ZONE = SpotView(zones=("zone-a",), spot_price=0.3, on_demand_price=1.0, period=timedelta(minutes=5))


CRASHED = Failure.of("trainer-exited-silent", exit_code=1, restarts=0)


def effect_types(change: Change) -> list[str]:
    return [effect["type"] for effect in dumped(change)]


def effect(change: Change, type_: str) -> dict[str, Any]:
    found = [item for item in dumped(change) if item["type"] == type_]
    assert len(found) == 1, (type_, dumped(change))
    return found[0]


def created(**options: Any) -> Change:
    return new_job("ft-ab12", "tiny", {}, "console:ana", None, NOW, 200, spot_policy="deadline-aware", **options)


def measured(market: str = "spot", deadline: timedelta | None = timedelta(hours=1), **changes: Any) -> Job:
    """A job half done: 100 of 200 steps in 49 minutes (so 49 minutes of work left), on ``market`` in zone-a."""
    attempt = Attempt(
        number=1,
        market=market,  # type: ignore[arg-type]
        instance_id="i-1",
        zone="zone-a",
        price_per_hour=0.3 if market == "spot" else 1.0,
        on_demand_price_per_hour=1.0,
        launched_at=NOW - timedelta(minutes=50),
        started_at=NOW - timedelta(minutes=49),
        from_step=0,
    )
    values: dict[str, Any] = {
        "id": "ft-ab12",
        "recipe": "tiny",
        "requested_by": "console:ana",
        "state": JobState.RUNNING,
        "attempts": [attempt],
        "step": 100,
        "total_steps": 200,
        "spot_policy": "deadline-aware",
        "deadline": NOW + deadline if deadline is not None else None,
        "created_at": NOW - timedelta(minutes=50),
        "tick": 1,
    }
    values.update(changes)
    return Job(**values)


def interrupted(job: Job) -> ReportReceived:
    report = Interrupted(
        job_id=job.id, attempt=job.attempt, reason="spot-interruption", step=100, uri="file:///c/100", time=NOW
    )
    return ReportReceived(report=report)


def test_a_job_without_deadline_or_budget_launches_as_it_always_did() -> None:
    change = created(spot=VIEW)
    assert not managed(change.job) and change.job.plan is None
    launch = effect(change, "launch")
    assert (launch["market"], launch["zone"]) == ("spot", None)  # spot-first: spot, the cloud orders the zones
    assert "fallback" not in launch  # no second authority: the cloud never moves to on-demand by itself
    assert change.history["policy"] == "spot" and change.history["why"].startswith("spot in -")
    assert "policy-tick" not in effect_types(change)


def test_spot_first_a_capacity_refusal_goes_back_to_the_decision_which_chooses_on_demand() -> None:
    job = created().job
    refused = LaunchFailed(job_id=job.id, attempt=1, reason="InsufficientInstanceCapacity", capacity=True)
    change = decide(job, refused, NOW)  # no view: the bot reads the cloud only for steered jobs
    launch = effect(change, "launch")
    assert (launch["market"], launch["zone"], launch["attempt"]) == ("on-demand", None, 2)
    assert change.job.state is JobState.PENDING and change.job.plan is None  # the card stays as it always was
    assert change.history["policy"] == "on-demand"
    # An on-demand launch refused in turn fails the attempt as it always did: no loop back to spot.
    again = decide(change.job, refused.model_copy(update={"attempt": 2}), NOW)
    assert "launch" not in effect_types(again)
    assert again.job.state is not JobState.PENDING


def test_spot_first_an_interrupted_job_goes_back_to_spot_and_one_on_on_demand_stays_there() -> None:
    job = measured(deadline=None, spot_policy=None)
    change = decide(job, interrupted(job), NOW)
    assert (effect(change, "launch")["market"], effect(change, "launch")["zone"]) == ("spot", None)
    on_demand = measured(market="on-demand", deadline=None, spot_policy=None)
    gone = decide(on_demand, CloudEvent(kind="instance-gone", instance_id="i-1", source="test"), NOW)
    assert effect(gone, "launch")["market"] == "on-demand"
    assert gone.history["why"] == "staying on on-demand: the job has no deadline to plan a return to spot by"


def test_a_job_with_a_deadline_launches_where_the_policy_says_and_starts_its_ticks() -> None:
    change = created(deadline=NOW + timedelta(hours=2), spot=VIEW)
    launch = effect(change, "launch")
    assert (launch["market"], launch["zone"]) == ("spot", "zone-a")
    tick = effect(change, "policy-tick")
    assert tick["tick"] == change.job.tick == 1
    assert datetime.fromisoformat(tick["due"]) == NOW + VIEW.period
    assert change.job.plan is not None and change.job.plan.reason == "spot-policy.unmeasured"


def test_a_capacity_refusal_moves_to_the_next_zone_then_to_on_demand_never_twice_in_a_zone() -> None:
    job = created(deadline=NOW + timedelta(hours=2), spot=VIEW).job
    first = decide(
        job, LaunchFailed(job_id=job.id, attempt=1, reason="no room", capacity=True, zone="zone-a"), NOW, spot=VIEW
    )
    assert first.job.state is JobState.PENDING and first.job.attempt == 2
    assert "zone-a" in first.job.refused_zones
    assert first.job.attempts[0].end_reason == Failure.of("capacity", error="no room").english
    assert effect(first, "launch")["zone"] == "zone-b"
    second = decide(
        first.job,
        LaunchFailed(job_id=job.id, attempt=2, reason="no room", capacity=True, zone="zone-b"),
        NOW,
        spot=VIEW,
    )
    launch = effect(second, "launch")
    assert (launch["market"], launch["zone"]) == ("on-demand", None)
    assert second.job.plan is not None and second.job.plan.action == "on-demand"
    # The refusal of an attempt no longer current (a replay, a late answer) changes nothing.
    stale = decide(second.job, LaunchFailed(job_id=job.id, attempt=2, reason="again", capacity=True), NOW, spot=VIEW)
    assert dumped(stale) == [] and stale.job == second.job


def test_an_interruption_close_to_the_deadline_relaunches_on_demand_and_says_why() -> None:
    job = measured(deadline=timedelta(hours=1))
    change = decide(job, interrupted(job), NOW, spot=ONE_ZONE)
    assert change.job.state is JobState.RECOVERING
    launch = effect(change, "launch")
    assert launch["market"] == "on-demand"
    plan = change.job.plan
    assert plan is not None and plan.action == "on-demand" and plan.reason.startswith("spot-policy.on-demand")
    assert plan.finish is not None and plan.finish <= job.deadline  # type: ignore[operator]
    assert plan.cost is not None and plan.cost > 0


def test_with_slack_left_the_job_waits_for_spot_and_a_tick_launches_it_once_a_zone_has_room() -> None:
    job = measured(deadline=timedelta(hours=10))
    waiting = decide(job, interrupted(job), NOW, spot=ONE_ZONE)
    assert "launch" not in effect_types(waiting)
    assert waiting.job.plan is not None and waiting.job.plan.action == "wait"
    assert waiting.job.current is not None and waiting.job.current.instance_id is None
    later = NOW + timedelta(minutes=31)  # zone-a's reclaim is past its cool-down: spot may be had there again
    tick = PolicyTick(job_id=job.id, tick=waiting.job.tick, due=later)
    launched = decide(waiting.job, tick, later, spot=ONE_ZONE)
    launch = effect(launched, "launch")
    assert (launch["market"], launch["zone"], launch["attempt"]) == ("spot", "zone-a", 2)
    assert effect(launched, "policy-tick")["tick"] == launched.job.tick == waiting.job.tick + 1
    # The same tick again (a redelivery the dedup missed) is stale: no second launch.
    again = decide(launched.job, tick, later, spot=ONE_ZONE)
    assert dumped(again) == [] and again.history["event"] == "ignored"


def launched_ahead(job: Job, view: SpotView = ONE_ZONE) -> Change:
    """The policy's tick sends ``job`` (on on-demand, slack to spare) back to spot: launched ahead, instance i-2."""
    tick = decide(job, PolicyTick(job_id=job.id, tick=job.tick, due=NOW), NOW, spot=view)
    standby = tick.job.standby
    assert standby is not None, tick.history
    up = Launched(job_id=job.id, attempt=standby.number, instance_id="i-2", zone=standby.zone, market="spot", at=NOW)
    return decide(tick.job, up, NOW, spot=view)


def stood_by(job: Job) -> ReportReceived:
    assert job.standby is not None
    return ReportReceived(report=Standby(job_id=job.id, attempt=job.standby.number, cause="handover", time=NOW))


def test_on_demand_with_slack_goes_back_to_spot_launching_ahead_and_handing_over_at_the_checkpoint() -> None:
    job = measured(market="on-demand", deadline=timedelta(hours=10))
    tick = decide(job, PolicyTick(job_id=job.id, tick=1, due=NOW), NOW, spot=ONE_ZONE)
    # The spot instance first; the on-demand one trains on, and nobody is told of a move that may be refused.
    assert tick.job.state is JobState.RUNNING and tick.job.switch_to is None and tick.job.attempt == 1
    assert tick.job.standby is not None and (tick.job.standby.number, tick.job.standby.market) == (2, "spot")
    launch = effect(tick, "launch")
    assert (launch["market"], launch["zone"], launch["attempt"]) == ("spot", "zone-a", 2)
    assert effect(tick, "start-deadline")["attempt"] == 2
    assert "stop-runner" not in effect_types(tick) and not [e for e in dumped(tick) if note_type(e) == "spot-policy"]

    up = launched_ahead(job)
    assert up.job.state is JobState.RUNNING and up.job.standby is not None and up.job.standby.instance_id == "i-2"
    assert dumped(up) == [] and up.job.attempts == job.attempts

    ready = decide(up.job, stood_by(up.job), NOW, spot=ONE_ZONE)  # its runner is up: now the move
    assert ready.job.state is JobState.STOPPING and ready.job.switch_to == "spot"
    assert effect(ready, "stop-runner")["instance_id"] == "i-1"
    said = [item for item in dumped(ready) if note_type(item) == "spot-policy"]
    assert [item["note"]["reason"] for item in said] == ["spot-policy.spot.back"]

    saved = decide(ready.job, interrupted(ready.job), NOW + timedelta(minutes=1), spot=ONE_ZONE)
    assert saved.job.state is JobState.RECOVERING and saved.job.switch_to is None and saved.job.standby is None
    assert "launch" not in effect_types(saved)  # nothing new: the instance launched ahead goes on
    assert effect(saved, "hand-over")["attempt"] == 2 and effect(saved, "terminate")["instance_id"] == "i-1"
    current = saved.job.current
    assert current is not None and (current.number, current.instance_id) == (2, "i-2")
    assert current.handed_over_at == NOW + timedelta(minutes=1) and current.from_step == 100
    assert saved.job.checkpoint is not None and saved.job.checkpoint.step == 100

    # The ahead launch's start deadline (15 minutes after it) is not the handed-over attempt's: it has its own.
    early = StartDeadline(job_id=job.id, attempt=2, due=NOW + timedelta(minutes=15))
    assert decide(saved.job, early, NOW + timedelta(minutes=15), spot=ONE_ZONE).history["event"] == "ignored"
    late = StartDeadline(job_id=job.id, attempt=2, due=effect_due(saved, "start-deadline"))
    assert decide(saved.job, late, NOW + timedelta(minutes=17), spot=ONE_ZONE).job.state is JobState.RESUME_FAILED

    started = Started(job_id=job.id, attempt=2, resumed_from_step=100, time=NOW + timedelta(minutes=2))
    running = decide(saved.job, ReportReceived(report=started), NOW + timedelta(minutes=2), spot=ONE_ZONE)
    assert running.job.state is JobState.RUNNING and running.job.steps_lost == 0
    assert running.history["downtime"] == 120.0  # from the on-demand attempt's checkpoint (its report at NOW)


def test_where_the_cloud_cannot_launch_ahead_a_switch_goes_through_a_checkpoint_first_and_never_back_blind() -> None:
    # A group mode (one Auto Scaling or ESS group per job) would end the current instance to start the next: a switch
    # stops first, so a return to a zone the bot cannot see into would cost a start-up when refused. On-demand with
    # slack to spare, the job stays there (greedy's rule); spot short of time moves to on-demand through a checkpoint.
    groups = replace(ONE_ZONE, launches_ahead=False, checkpoint_steps=20)
    calm = measured(market="on-demand", deadline=timedelta(hours=10))
    stays = decide(calm, PolicyTick(job_id=calm.id, tick=1, due=NOW), NOW, spot=groups)
    assert stays.job.state is JobState.RUNNING and "launch" not in effect_types(stays)
    assert stays.history["policy"] == "on-demand"
    job = measured(market="spot", deadline=timedelta(minutes=55))
    switch = decide(job, PolicyTick(job_id=job.id, tick=1, due=NOW), NOW, spot=groups)
    assert switch.job.state is JobState.STOPPING and switch.job.switch_to == "on-demand" and switch.job.standby is None
    assert effect(switch, "stop-runner")["instance_id"] == "i-1" and "launch" not in effect_types(switch)
    said = [item for item in dumped(switch) if note_type(item) == "spot-policy"]
    assert [item["note"]["reason"] for item in said] == ["spot-policy.on-demand.deadline"]
    saved = decide(switch.job, interrupted(switch.job), NOW, spot=groups)
    assert saved.job.state is JobState.RECOVERING and saved.job.switch_to is None
    launch = effect(saved, "launch")
    assert (launch["market"], launch["attempt"]) == ("on-demand", 2)
    grouped, ahead = live_situation_of(job, groups), live_situation_of(job, ONE_ZONE)
    assert grouped is not None and ahead is not None and not grouped.switch_ahead and ahead.switch_ahead
    assert not grouped.told and not ahead.told  # the live bot learns where spot is by launching there


def live_situation_of(job: Job, view: SpotView) -> Situation | None:
    return live_situation(
        job,
        NOW,
        "tick",
        deadline=job.deadline,
        budget=None,
        zones=view.zones,
        spot_price=0.3,
        on_demand_price=1.0,
        period=view.period,
        launches_ahead=view.launches_ahead,
    )


def effect_due(change: Change, type_: str) -> datetime:
    return datetime.fromisoformat(effect(change, type_)["due"])


def test_a_refused_return_to_spot_costs_nothing_the_job_trains_on_and_the_zone_cools_down() -> None:
    job = measured(market="on-demand", deadline=timedelta(hours=10))
    tick = decide(job, PolicyTick(job_id=job.id, tick=1, due=NOW), NOW, spot=VIEW)
    assert tick.job.standby is not None and tick.job.standby.zone == "zone-a"
    refused = LaunchFailed(job_id=job.id, attempt=2, reason="no capacity", capacity=True, zone="zone-a")
    kept = decide(tick.job, refused, NOW, spot=VIEW)
    assert kept.job.state is JobState.RUNNING and kept.job.standby is None and kept.job.attempts == job.attempts
    assert dumped(kept) == [] and "zone-a" in kept.job.refused_zones
    # The next tick tries the other zone, under a number of its own (2 is never launched again).
    again = decide(kept.job, PolicyTick(job_id=job.id, tick=kept.job.tick, due=NOW), NOW, spot=VIEW)
    assert again.job.standby is not None and (again.job.standby.number, again.job.standby.zone) == (3, "zone-b")
    assert effect(again, "launch")["attempt"] == 3
    # zone-b refused too: no zone is tried again before the policy's next look (its period), and at it, zone-a is.
    both = decide(again.job, refused.model_copy(update={"attempt": 3, "zone": "zone-b"}), NOW, spot=VIEW)
    assert both.job.standby is None and set(both.job.refused_zones) == {"zone-a", "zone-b"}
    four = NOW + timedelta(minutes=4)
    soon = decide(both.job, PolicyTick(job_id=job.id, tick=both.job.tick, due=four), four, spot=VIEW)
    assert soon.job.standby is None and "launch" not in effect_types(soon)
    later = NOW + VIEW.period
    look = decide(soon.job, PolicyTick(job_id=job.id, tick=soon.job.tick, due=later), later, spot=VIEW)
    assert look.job.standby is not None and (look.job.standby.number, look.job.standby.zone) == (4, "zone-a")


def test_a_person_who_stops_during_a_switch_gets_the_stop_and_the_instance_launched_ahead_goes() -> None:
    job = measured(market="on-demand", deadline=timedelta(hours=10))
    up = launched_ahead(job)
    waiting = stop_command(up.job, "console:ana", NOW)  # before the new instance stood by
    assert waiting.job.state is JobState.STOPPING and waiting.job.standby is None
    assert effect(waiting, "stop-runner")["instance_id"] == "i-1"
    assert effect(waiting, "terminate")["instance_id"] == "i-2"

    ready = decide(up.job, stood_by(up.job), NOW, spot=ONE_ZONE)
    stopping = stop_command(ready.job, "console:ana", NOW)  # during the move: the checkpoint ends the job instead
    assert stopping.job.state is JobState.STOPPING and stopping.job.switch_to is None and stopping.job.standby is None
    assert effect(stopping, "terminate")["instance_id"] == "i-2"
    stopped = decide(stopping.job, interrupted(stopping.job), NOW, spot=ONE_ZONE)
    assert stopped.job.state is JobState.STOPPED
    assert "launch" not in effect_types(stopped) and "hand-over" not in effect_types(stopped)


def test_an_instance_launched_ahead_that_is_reclaimed_or_never_stands_by_is_given_up_and_the_job_trains_on() -> None:
    job = measured(market="on-demand", deadline=timedelta(hours=10))
    up = launched_ahead(job)
    gone = CloudEvent(job_id=job.id, kind="spot-interruption", instance_id="i-2", source="eventbridge", at=NOW)
    reclaimed = decide(up.job, gone, NOW, spot=ONE_ZONE)
    assert reclaimed.job.state is JobState.RUNNING and reclaimed.job.standby is None
    assert effect(reclaimed, "terminate")["instance_id"] == "i-2" and reclaimed.job.current == job.current
    # Its zone is out for the cool-down, as after a reclaim of the current attempt: the next look launches nothing
    # there at once (before, it launched ahead into the zone that had just taken its instance).
    assert reclaimed.job.refused_zones == {"zone-a": NOW}
    look = decide(reclaimed.job, PolicyTick(job_id=job.id, tick=reclaimed.job.tick, due=NOW), NOW, spot=ONE_ZONE)
    assert "launch" not in effect_types(look) and look.job.standby is None
    crashed = Failed(job_id=job.id, attempt=2, failure=CRASHED, exit_code=1, time=NOW)
    failed = decide(up.job, ReportReceived(report=crashed), NOW, spot=ONE_ZONE)  # not spot's doing: no cool-down
    assert failed.job.standby is None and failed.job.refused_zones == {}

    silent = decide(up.job, StartDeadline(job_id=job.id, attempt=2, due=NOW), NOW, spot=ONE_ZONE)
    assert silent.job.standby is None and effect(silent, "terminate")["instance_id"] == "i-2"
    assert silent.job.state is JobState.RUNNING and silent.history["standby_released"] == 2

    # Its launch result after it was given up: the instance is released, not left billing.
    late = Launched(job_id=job.id, attempt=2, instance_id="i-2", zone="zone-a", market="spot", at=NOW)
    assert effect(decide(silent.job, late, NOW, spot=ONE_ZONE), "terminate")["instance_id"] == "i-2"

    # Reclaimed after it stood by: the move goes on as it did before launches ahead (a relaunch after the checkpoint).
    ready = decide(up.job, stood_by(up.job), NOW, spot=ONE_ZONE)
    lost = decide(ready.job, gone, NOW, spot=ONE_ZONE)
    assert lost.job.state is JobState.STOPPING and lost.job.standby is None and lost.job.switch_to == "spot"
    saved = decide(lost.job, interrupted(lost.job), NOW, spot=ONE_ZONE)
    assert saved.job.state is JobState.RECOVERING and effect(saved, "launch")["attempt"] == 3


def test_a_job_that_finishes_on_demand_while_its_spot_instance_waits_releases_that_instance() -> None:
    job = measured(market="on-demand", deadline=timedelta(hours=10))
    up = launched_ahead(job)
    done = Completed(job_id=job.id, attempt=1, step=200, total_steps=200, output_uri="file:///c/out", time=NOW)
    finished = decide(up.job, ReportReceived(report=done), NOW, spot=ONE_ZONE)
    assert finished.job.state is JobState.SUCCEEDED and finished.job.standby is None
    assert sorted(e["instance_id"] for e in dumped(finished) if e["type"] == "terminate") == ["i-1", "i-2"]


def test_a_budget_that_would_be_exceeded_stops_the_job_with_a_checkpoint_and_says_so() -> None:
    job = measured(deadline=None, budget=0.4)  # 0.25 spent, at least 0.245 more even all on spot
    change = decide(job, PolicyTick(job_id=job.id, tick=1, due=NOW), NOW, spot=VIEW)
    assert change.job.state is JobState.STOPPING
    assert effect(change, "stop-runner")["instance_id"] == "i-1"
    said = [item for item in dumped(change) if note_type(item) == "spot-policy"]
    assert len(said) == 1 and said[0]["note"]["reason"] == "spot-policy.stop.budget"
    assert said[0]["note"]["values"]["budget"] == 0.4
    assert "policy-tick" in effect_types(change)  # the chain ends at the next tick, once the job is STOPPED
    stopped = decide(change.job, interrupted(change.job), NOW, spot=VIEW)
    assert stopped.job.state is JobState.STOPPED and "launch" not in effect_types(stopped)
    assert stopped.job.checkpoint is not None and stopped.job.checkpoint.step == 100
    ended = decide(stopped.job, PolicyTick(job_id=job.id, tick=stopped.job.tick, due=NOW), NOW, spot=VIEW)
    assert dumped(ended) == [] and ended.history["event"] == "ignored"


def test_a_resume_asks_the_policy_and_starts_a_new_tick_chain() -> None:
    job = measured(deadline=timedelta(hours=1)).model_copy(update={"state": JobState.STOPPED})
    ended = job.model_copy(
        update={"attempts": [job.attempts[0].model_copy(update={"ended_at": NOW, "end_reason": "stopped"})]}
    )
    change = resume_command(ended, "console:ana", False, NOW, spot=ONE_ZONE)
    assert change.job.state is JobState.RECOVERING
    assert effect(change, "policy-tick")["tick"] == change.job.tick == job.tick + 1
    assert effect(change, "launch")["attempt"] == 2
    assert change.job.plan is not None


def test_the_card_words_the_plan_from_its_data_in_each_language() -> None:
    job = measured(deadline=timedelta(hours=1), budget=5.0)
    change = decide(job, interrupted(job), NOW, spot=ONE_ZONE)
    assert change.job.plan is not None
    english = dict(card(change.job, NOW, "en").fields)
    chinese = dict(card(change.job, NOW, "zh-CN").fields)
    reason = change.job.plan.reason
    assert english["Plan"].startswith(text("en", reason, **change.job.plan.values) + " · projected finish ")
    assert english["Deadline"] == "2026-03-02 09:30 UTC" and english["Budget"] == "$5.00"
    assert chinese["计划"].startswith(text("zh-CN", reason, **change.job.plan.values) + " · 预计完成于 ")
    assert set(chinese) >= {"截止时间", "预算"}


def test_a_stop_the_bot_asked_for_does_not_count_as_spot_lost_in_that_zone() -> None:
    for market, reason in (("spot", "interrupted: stop"), ("on-demand", "interrupted: spot-interruption")):
        job = measured(market=market, deadline=timedelta(hours=10), state=JobState.STOPPED)
        ended = job.model_copy(
            update={"attempts": [job.attempts[0].model_copy(update={"ended_at": NOW, "end_reason": reason})]}
        )
        change = resume_command(ended, "console:ana", False, NOW, spot=ONE_ZONE)
        launch = effect(change, "launch")
        assert (launch["market"], launch["zone"]) == ("spot", "zone-a"), (market, reason)
    reclaimed = measured(deadline=timedelta(hours=10), state=JobState.STOPPED)
    taken = reclaimed.attempts[0].model_copy(update={"ended_at": NOW, "end_reason": "interrupted: spot-interruption"})
    change = resume_command(
        reclaimed.model_copy(update={"attempts": [taken]}), "console:ana", False, NOW, spot=ONE_ZONE
    )
    assert "launch" not in effect_types(change) and change.job.plan is not None and change.job.plan.action == "wait"


def test_an_unknown_policy_or_bad_local_zones_are_refused_with_one_line() -> None:
    with pytest.raises(ConfigError) as bad:
        parse_file_config("policy:\n  spot:\n    name: cheapest\n", "bot.yaml")
    assert str(bad.value).startswith("bot.yaml: policy.spot.name: Value error, unknown spot policy 'cheapest'")
    assert "\n" not in str(bad.value)
    assert parse_file_config("policy:\n  spot:\n    name: greedy\n", "bot.yaml").policy.spot.name == "greedy"
    with pytest.raises(ConfigError, match="unknown spot policy 'deadline-aware-plan'"):  # a bench policy only
        parse_file_config("policy:\n  spot:\n    name: deadline-aware-plan\n", "bot.yaml")
    with pytest.raises(ConfigError, match=r"^FINETUNE_LOCAL_ZONES='a,,b': "):
        load_settings(finetune_local_zones="a,,b")


# -- live availability, weighed with the job's own past ------------------------------------------------------


def test_the_live_signal_steers_the_zone_and_the_jobs_own_past_stands_in_where_there_is_none() -> None:
    scored = SpotView(zones=("zone-a", "zone-b"), spot_price=0.3, on_demand_price=1.0, scores={"zone-b": 0.9})
    change = created(deadline=NOW + timedelta(hours=2), spot=scored)
    assert effect(change, "launch")["zone"] == "zone-b"  # zone-a: no signal (½), zone-b: a placement score of 9

    # No signal at all: the job's own trace. zone-a was reclaimed an hour ago (past its cool-down), zone-b ran.
    job = measured(deadline=timedelta(hours=10))
    reclaimed = job.attempts[0].model_copy(
        update={"ended_at": NOW - timedelta(hours=1), "end_reason": "interrupted: spot-interruption"}
    )
    ran = Attempt(
        number=2,
        market="spot",
        instance_id="i-2",
        zone="zone-b",
        launched_at=NOW - timedelta(minutes=50),
        started_at=NOW - timedelta(minutes=49),
        from_step=50,
    )
    history = job.model_copy(update={"attempts": [reclaimed.model_copy(update={"number": 1}), ran]})
    assert estimated_availability(history, NOW) == {"zone-a": 0.0, "zone-b": 1.0}
    choice, _ = choose(history.model_copy(update={"attempts": [reclaimed]}), VIEW, NOW, "launch")
    assert choice.zone == "zone-b"  # zone-a's past: reclaimed; zone-b: unknown (½) ranks above it


def test_a_configured_spot_first_steers_with_the_clouds_view_and_goes_on_demand_once_no_zone_has_spot() -> None:
    job = new_job("ft-ab12", "tiny", {}, "console:ana", None, NOW, 200, spot_policy="spot-first", spot=VIEW).job
    assert managed(job) and job.plan is not None and job.plan.action == "spot"
    for attempt, zone in ((1, "zone-a"), (2, "zone-b")):
        refused = LaunchFailed(job_id=job.id, attempt=attempt, reason="no room", capacity=True, zone=zone)
        job = decide(job, refused, NOW, spot=VIEW).job
    assert job.plan is not None and (job.plan.action, job.plan.reason) == (
        "on-demand",
        "spot-policy.unmeasured.on-demand",
    )


def test_an_instance_launched_ahead_takes_over_when_the_current_one_is_lost_before_the_move() -> None:
    job = measured(market="on-demand", deadline=timedelta(hours=10))
    up = launched_ahead(job)
    gone = CloudEvent(job_id=job.id, kind="instance-gone", instance_id="i-1", source="eventbridge", at=NOW)
    lost = decide(up.job, gone, NOW, spot=ONE_ZONE)
    assert lost.job.state is JobState.RECOVERING and lost.job.standby is None
    assert "launch" not in effect_types(lost) and effect(lost, "hand-over")["attempt"] == 2
    current = lost.job.current
    assert current is not None and (current.number, current.instance_id, current.market) == (2, "i-2", "spot")

    # A spot job moving to on-demand ahead of its deadline, reclaimed first: the notice keeps the instance launched
    # ahead, and the interruption hands over to it instead of launching another.
    spot = measured(market="spot", deadline=timedelta(hours=1))
    ahead = Attempt(number=2, market="on-demand", instance_id="i-2", launched_at=NOW)
    moving = spot.model_copy(update={"standby": ahead, "ahead_number": 2})
    notice = CloudEvent(job_id=job.id, kind="spot-interruption", instance_id="i-1", source="eventbridge", at=NOW)
    warned = decide(moving, notice, NOW, spot=ONE_ZONE)
    assert warned is not None and warned.job.state is JobState.INTERRUPTED and warned.job.standby == ahead
    assert "terminate" not in effect_types(warned)
    up_now = decide(warned.job, stood_by(warned.job), NOW, spot=ONE_ZONE)  # no stop for a runner being taken
    assert up_now.job.state is JobState.INTERRUPTED and dumped(up_now) == [] and up_now.history["event"] == "ignored"
    taken = decide(warned.job, interrupted(warned.job), NOW, spot=ONE_ZONE)
    assert taken.job.state is JobState.RECOVERING and "launch" not in effect_types(taken)
    assert effect(taken, "hand-over")["attempt"] == 2 and taken.job.current is not None
    assert taken.job.current.market == "on-demand" and taken.job.checkpoint is not None


def test_the_card_shows_the_instance_launched_ahead_while_the_switch_waits_for_it() -> None:
    job = measured(market="on-demand", deadline=timedelta(hours=10))
    tick = decide(job, PolicyTick(job_id=job.id, tick=1, due=NOW), NOW, spot=ONE_ZONE)
    assert "Next instance: zone-a (spot), launched ahead" in card_text(tick.job, NOW)
    up = launched_ahead(job)
    english, chinese = card_text(up.job, NOW), card_text(up.job, NOW, "zh-CN")
    assert "Next instance: i-2 · zone-a (spot), launched ahead: the job moves there once it is up" in english
    assert "Instance: i-1 · zone-a (on-demand, attempt 1)" in english
    assert "下一实例" in chinese and "i-2" in chinese
    assert "Next instance" not in card_text(job, NOW)


def test_a_launch_ahead_the_policy_no_longer_wants_is_given_up_at_its_next_look() -> None:
    job = measured(market="on-demand", deadline=timedelta(hours=10))
    up = launched_ahead(job)
    # While the spot instance booted, the deadline came close (a person moved it): on-demand to the end now.
    pressed = up.job.model_copy(update={"deadline": NOW + timedelta(minutes=55)})
    tick = decide(pressed, PolicyTick(job_id=job.id, tick=pressed.tick, due=NOW), NOW, spot=ONE_ZONE)
    assert tick.job.standby is None and tick.job.state is JobState.RUNNING and tick.history["policy"] == "on-demand"
    assert effect(tick, "terminate")["instance_id"] == "i-2" and "stop-runner" not in effect_types(tick)
    # Still wanted: the look changes nothing.
    again = decide(up.job, PolicyTick(job_id=job.id, tick=up.job.tick, due=NOW), NOW, spot=ONE_ZONE)
    assert again.job.standby == up.job.standby and "terminate" not in effect_types(again)


def test_a_runner_that_fails_while_the_switch_stops_it_leaves_the_job_going_on_the_other_market() -> None:
    job = measured(market="on-demand", deadline=timedelta(hours=10))
    up = launched_ahead(job)
    ready = decide(up.job, stood_by(up.job), NOW, spot=ONE_ZONE)
    crashed = Failed(job_id=job.id, attempt=1, failure=CRASHED, exit_code=1, time=NOW)
    handed = decide(ready.job, ReportReceived(report=crashed), NOW, spot=ONE_ZONE)
    assert handed.job.state is JobState.RECOVERING and handed.job.failure is None
    assert effect(handed, "hand-over")["attempt"] == 2 and effect(handed, "terminate")["instance_id"] == "i-1"
    # Where the cloud cannot launch ahead (spot short of time, to on-demand): the relaunch, as after the checkpoint.
    groups = replace(ONE_ZONE, launches_ahead=False, checkpoint_steps=20)
    short = measured(market="spot", deadline=timedelta(minutes=55))
    switch = decide(short, PolicyTick(job_id=short.id, tick=1, due=NOW), NOW, spot=groups)
    assert switch.job.switch_to == "on-demand"
    relaunched = decide(switch.job, ReportReceived(report=crashed), NOW, spot=groups)
    assert relaunched.job.state is JobState.RECOVERING and effect(relaunched, "launch")["market"] == "on-demand"
    # A person's stop that meets a failure still ends the job.
    stopping = stop_command(job, "console:ana", NOW)
    assert decide(stopping.job, ReportReceived(report=crashed), NOW, spot=ONE_ZONE).job.state is JobState.STOPPED


def test_an_unpinned_launch_refused_in_every_zone_of_a_region_records_each_and_the_next_goes_to_another_region() -> (
    None
):
    regions = SpotView(
        zones=("us-east-1a", "us-east-1b", "us-west-2a"),
        spot_price=0.3,
        on_demand_price=1.0,
        period=timedelta(minutes=5),
    )
    job = created(deadline=NOW + timedelta(hours=2), spot=regions).job
    refusal = LaunchFailed(
        job_id=job.id, attempt=1, reason="no room", capacity=True, refused_zones=("us-east-1a", "us-east-1b")
    )
    change = decide(job, refusal, NOW, spot=regions)
    assert {"us-east-1a", "us-east-1b"} <= set(change.job.refused_zones)
    assert effect(change, "launch")["zone"] == "us-west-2a"
