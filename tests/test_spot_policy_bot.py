"""The spot policy live, through the console chat on the real bot (embedded Valkey, the local cloud's instances,
the synthetic trainer: what it trains does not matter here, only that it keeps the trainer contract): a deadline
job moved to on-demand when spot capacity goes, a budget that stops a job with a checkpoint, bad options refused
with nothing changed, and a plain job launched as it always was."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from bot.chat.render import card_text
from bot.cloud.local.provider import LocalCloud
from bot.timers import Timers
from fakes.bot_harness import CHANNEL, SteppedClock, running_bot, start_job, wait_job, write_config
from handlers.jobs import JobState
from handlers.messages import PolicyTick
from tests.test_bot_scenarios import wait_for_text
from tests.trainers import synthetic

# The policy is asked again every 10 minutes: a job 10 minutes from its deadline cannot wait for spot.
TICK = {"spot": {"tick_seconds": 600}}
RECIPES = [synthetic.recipe()]
# Long enough (0.2 s a step: 10 s or more after the step the test acts at) that the job is still training when the
# capacity goes or the policy moves it; every step after the last move is only waited for, so no more than that.
STEPS = 60


def local_cloud(cloud: object) -> LocalCloud:
    assert isinstance(cloud, LocalCloud)
    return cloud


async def test_capacity_loss_moves_a_deadline_job_to_on_demand_and_it_finishes_in_time(tmp_path: Path) -> None:
    clock = SteppedClock()
    config = write_config(tmp_path / "bot.yaml", policy=TICK, recipes=RECIPES)
    async with running_bot(tmp_path / "state", config, clock=clock) as (service, chat):
        cloud = local_cloud(service.bot.cloud)
        job_id = await start_job(service, "console:ana", f"start synthetic steps={STEPS} step_seconds=0.2 deadline=15m")
        job = await wait_job(service, job_id, lambda job: job.state is JobState.RUNNING and (job.step or 0) >= 10)
        first = job.attempts[0]
        assert (first.market, first.zone, first.price_per_hour) == ("spot", "local-a", cloud.spot_price)
        assert job.plan is not None and job.plan.reason == "spot-policy.unmeasured"
        assert job.deadline is not None and job.deadline - job.created_at == timedelta(minutes=15)

        clock.advance(5)  # ten minutes left: less than the policy's period plus the work
        reclaimed = await cloud.take_spot_capacity("local-a")
        assert reclaimed == [first.instance_id]
        moved = await wait_job(service, job_id, lambda job: job.attempt >= 2 and job.current.instance_id is not None)
        assert moved.current is not None and moved.current.market == "on-demand"
        assert moved.current.price_per_hour == cloud.on_demand_price
        assert moved.plan is not None and moved.plan.action == "on-demand"
        assert moved.plan.reason.startswith("spot-policy.on-demand"), moved.plan.reason
        await wait_for_text(chat, "thread", "🧭 on-demand now:")

        done = await wait_job(service, job_id, lambda job: job.state in (JobState.SUCCEEDED, JobState.FAILED))
        assert done.state is JobState.SUCCEEDED, done.failure
        assert done.step == done.total_steps == STEPS
        assert done.updated_at < done.deadline  # type: ignore[operator]  # finished before the deadline
        assert [attempt.market for attempt in done.attempts] == ["spot", "on-demand"]
        launches = [entry for entry in await service.bot.store.history(job_id) if entry.get("event") == "launched"]
        assert len(launches) == 2  # nothing launched again in the zone without capacity

        card = await service.bot.command("console:ana", CHANNEL, f"status {job_id}")
        assert card == card_text(done, clock())
        assert "Plan: on-demand now:" in card and "h to the deadline" in card
        assert "Deadline: " in card
        await cloud.give_spot_capacity("local-a")


async def test_bad_options_change_nothing_and_a_plain_job_is_launched_as_always(tmp_path: Path) -> None:
    config = write_config(tmp_path / "bot.yaml", policy=TICK, recipes=RECIPES)
    async with running_bot(tmp_path / "state", config) as (service, _chat):
        for words, said in (
            ("deadline=soon", "deadline must be a duration like 36h"),
            ("deadline=1m", "deadline must be between 10 minutes and 90 days"),
            ("budget=lots", "budget must be an amount"),
            ("budget=0", "budget must be more than 0"),
        ):
            reply = await service.bot.command("console:ana", CHANNEL, f"start synthetic {words}")
            assert reply.startswith("⛔ ") and said in reply, reply
        assert await service.bot.store.list_jobs() == []
        assert await Timers(service.bot.store.redis).pending() == []

        job_id = await start_job(service, "console:ana", "start synthetic steps=5 step_seconds=0")
        done = await wait_job(service, job_id, lambda job: job.state is JobState.SUCCEEDED)
        assert done.deadline is None and done.budget is None and done.plan is None and done.tick == 0
        launch = [entry for entry in await service.bot.store.history(job_id) if entry.get("event") == "created"]
        assert launch[0]["policy"] == "spot" and "deadline" not in launch[0]  # spot-first chose; nothing steers it
        pending = await Timers(service.bot.store.redis).pending()
        assert not any(isinstance(timer, PolicyTick) for timer in pending)
        card = await service.bot.command("console:ana", CHANNEL, f"status {job_id}")
        assert "Plan:" not in card and "Deadline:" not in card


async def test_a_budget_that_would_be_exceeded_stops_the_job_with_a_checkpoint(tmp_path: Path) -> None:
    clock = SteppedClock()
    config = write_config(tmp_path / "bot.yaml", policy=TICK, recipes=RECIPES)
    async with running_bot(tmp_path / "state", config, clock=clock) as (service, chat):
        job_id = await start_job(service, "console:ana", "start synthetic steps=5000 step_seconds=0.2 budget=0.05")
        await wait_job(service, job_id, lambda job: job.state is JobState.RUNNING and (job.step or 0) >= 5)
        clock.advance(11)  # eleven minutes billed at $0.30/h: $0.055, over the budget; the policy's tick is due
        stopped = await wait_job(service, job_id, lambda job: job.state in (JobState.STOPPED, JobState.FAILED))
        assert stopped.state is JobState.STOPPED, stopped.failure
        assert stopped.checkpoint is not None and stopped.checkpoint.step >= 5
        assert stopped.plan is not None and stopped.plan.action == "stop"
        await wait_for_text(chat, "thread", "🧭 stopping with a checkpoint: the job would cost at least")
        await wait_for_text(chat, "thread", "over the budget of 0.05")
        card = await service.bot.command("console:ana", CHANNEL, f"status {job_id}")
        assert "Budget: $0.05" in card and "Plan: stopping with a checkpoint" in card


async def test_a_zone_without_spot_refuses_the_launch_and_the_policy_moves_to_the_next(tmp_path: Path) -> None:
    config = write_config(tmp_path / "bot.yaml", policy=TICK, recipes=RECIPES)
    async with running_bot(tmp_path / "state", config, finetune_local_zones="local-a,local-b") as (service, _chat):
        cloud = local_cloud(service.bot.cloud)
        assert await cloud.take_spot_capacity("local-a") == []  # nothing held there yet
        job_id = await start_job(service, "console:ana", "start synthetic steps=5 step_seconds=0 deadline=1h")
        done = await wait_job(service, job_id, lambda job: job.state in (JobState.SUCCEEDED, JobState.FAILED))
        assert done.state is JobState.SUCCEEDED, done.failure
        refused, ran = done.attempts
        assert refused.instance_id is None and (refused.end_reason or "").startswith("capacity: ")
        assert "InsufficientInstanceCapacity" in (refused.end_reason or "")
        assert (ran.market, ran.zone) == ("spot", "local-b")
        assert set(done.refused_zones) == {"local-a"}
        history = await service.bot.store.history(job_id)
        assert [entry.get("zone") for entry in history if entry.get("event") == "launched"] == ["local-b"]
        await cloud.give_spot_capacity("local-a")
        assert await cloud.zones_without_spot() == set()


async def test_a_job_on_on_demand_goes_back_to_spot_through_a_checkpoint_when_that_is_safe(tmp_path: Path) -> None:
    config = write_config(tmp_path / "bot.yaml", policy={"spot": {"tick_seconds": 2}}, recipes=RECIPES)
    async with running_bot(tmp_path / "state", config) as (service, chat):
        job_id = await start_job(service, "console:ana", f"start synthetic steps={STEPS} step_seconds=0.2 deadline=30m")
        await wait_job(service, job_id, lambda job: job.state is JobState.RUNNING and (job.step or 0) >= 5)
        assert (await service.bot.command("console:ana", CHANNEL, f"stop {job_id}")).startswith("OK: stop")
        await wait_job(service, job_id, lambda job: job.state is JobState.STOPPED)
        reply = await service.bot.command("console:ana", CHANNEL, f"resume {job_id} on-demand")
        assert reply.startswith("OK: resume"), reply
        done = await wait_job(service, job_id, lambda job: job.state in (JobState.SUCCEEDED, JobState.FAILED))
        assert done.state is JobState.SUCCEEDED, done.failure
        assert [attempt.market for attempt in done.attempts] == ["spot", "on-demand", "spot"]
        on_demand, back = done.attempts[1:]
        assert (on_demand.end_reason or "").startswith("interrupted")  # it checkpointed before it went
        assert back.resumed_from_step is not None and back.resumed_from_step > 0
        await wait_for_text(chat, "thread", "🧭 back to spot in local-a:")
        history = await service.bot.store.history(job_id)
        switches = [entry for entry in history if entry.get("switch")]
        # Once, not back and forth: the tick launched spot ahead, and its runner stood by before anything stopped.
        said = [(entry["event"], entry["switch"]) for entry in switches]
        assert said == [("policy-tick", "spot"), ("standby", "spot")]
        order = [entry["event"] for entry in history if entry.get("event") in ("launched", "standby", "interrupted")]
        assert order[-3:] == ["launched", "standby", "interrupted"]  # the spot instance up, then on-demand's commit
        assert back.handed_over_at is not None and back.started_at is not None
        assert back.handed_over_at <= back.started_at
        committed = [entry["step"] for entry in history if entry.get("event") == "interrupted"][-1]
        assert back.resumed_from_step == committed  # it waited for that checkpoint, and restored it


async def test_a_return_to_spot_that_is_refused_costs_the_on_demand_job_nothing(tmp_path: Path) -> None:
    """The spot instance is launched ahead of the move: with no spot anywhere, each look's launch is refused and
    the on-demand instance is never stopped: it trains on to the end."""
    config = write_config(tmp_path / "bot.yaml", policy={"spot": {"tick_seconds": 2}}, recipes=RECIPES)
    async with running_bot(tmp_path / "state", config) as (service, _chat):
        cloud = local_cloud(service.bot.cloud)
        job_id = await start_job(service, "console:ana", f"start synthetic steps={STEPS} step_seconds=0.2 deadline=30m")
        await wait_job(service, job_id, lambda job: job.state is JobState.RUNNING and (job.step or 0) >= 5)
        assert (await service.bot.command("console:ana", CHANNEL, f"stop {job_id}")).startswith("OK: stop")
        await wait_job(service, job_id, lambda job: job.state is JobState.STOPPED)
        for zone in cloud.zones:
            await cloud.take_spot_capacity(zone, reclaim=False)
        assert (await service.bot.command("console:ana", CHANNEL, f"resume {job_id} on-demand")).startswith("OK")
        done = await wait_job(service, job_id, lambda job: job.state in (JobState.SUCCEEDED, JobState.FAILED))
        assert done.state is JobState.SUCCEEDED, done.failure
        assert [attempt.market for attempt in done.attempts] == ["spot", "on-demand"]  # never stopped for spot
        history = await service.bot.store.history(job_id)
        refusals = [entry for entry in history if entry.get("event") == "launch-failed" and entry.get("ahead")]
        ticks = [entry for entry in history if entry.get("event") == "policy-tick"]
        # Tried again at the policy's looks (the cool-down is one period), each under a number of its own: never
        # more than one launch ahead a look, never in a loop.
        assert refusals and {entry["zone"] for entry in refusals} <= set(cloud.zones)
        assert len(refusals) <= len(ticks) and len({entry["attempt"] for entry in refusals}) == len(refusals)
        assert done.ahead_number == 2 + len(refusals) and done.standby is None
        assert not [entry for entry in history if entry.get("event") == "standby"]  # nothing stood by, nothing moved
        for zone in cloud.zones:
            await cloud.give_spot_capacity(zone)
