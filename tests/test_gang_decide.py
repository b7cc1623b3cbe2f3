"""A gang's decisions as pure functions: the launch order, RUNNING once every node started, losing one node (the
replacement launched at once waits for the survivors' standby, the survivors' regroup for the replacement's start;
a survivor's broken world looked at in seconds, the step it held committed), the hold and the
move, and reconciliation keeping every live node."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from handlers.decide import decide, new_job, stop_command
from handlers.failures import Failure
from handlers.gang import master_port, place_in
from handlers.job_cost import job_cost
from handlers.jobs import ChatRef, CheckpointRef, Job, JobState, Page
from handlers.messages import (
    CheckNodes,
    CloudEvent,
    GangHoldDue,
    HandOver,
    Launch,
    Launched,
    LaunchFailed,
    Message,
    Notify,
    PolicyTick,
    Regroup,
    ReleaseGang,
    ReportReceived,
    StopRunner,
    Terminate,
)
from handlers.reconcile import CloudInstance, reconcile
from handlers.reports import CheckpointSaved, Completed, Failed, Interrupted, Progress, Standby, Started
from handlers.spot import SpotView

NOW = datetime(2026, 3, 2, 8, 30, tzinfo=UTC)
ZA = SpotView(zones=("za",), spot_price=0.3, on_demand_price=1.0, period=timedelta(minutes=5))


def of(outbox: list[Message], kind: type) -> list[Any]:
    return [message for message in outbox if isinstance(message, kind)]


def step(job: Job, message: Any, minutes: float = 0) -> tuple[Job, list[Message]]:
    change = decide(job, message, NOW + timedelta(minutes=minutes))
    assert change is not None
    return change.job, change.outbox


def report(job: Job, attempt: int, kind: type, **fields: Any) -> ReportReceived:
    return ReportReceived(report=kind(job_id=job.id, attempt=attempt, time=NOW, **fields))


def running_gang() -> Job:
    """A two-node gang: node 0 launched first, node 1 into its zone, both started."""
    created = new_job("ft-gang1", "tiny", {}, "console:ana", ChatRef(platform="console", channel="c"), NOW, nodes=2)
    job = created.job
    [first] = of(created.outbox, Launch)
    assert (first.attempt, first.zone) == (1, None) and len(job.attempts) == 2  # one Launch: node 0's
    job, outbox = step(job, Launched(job_id=job.id, attempt=1, instance_id="i-0", zone="za", private_ip="10.0.0.7"))
    [second] = of(outbox, Launch)
    assert (second.attempt, second.zone) == (2, "za")  # the others into node 0's zone
    job, _ = step(job, Launched(job_id=job.id, attempt=2, instance_id="i-1", zone="za", private_ip="10.0.0.8"))
    job, _ = step(job, report(job, 1, Started, node_rank=0, generation=1, instance_id="i-0"))
    assert job.state is JobState.PROVISIONING  # one node started is not the gang
    job, _ = step(job, report(job, 2, Started, node_rank=1, generation=1, instance_id="i-1"))
    assert job.state is JobState.RUNNING
    return job


def test_the_world_meets_at_node_0_on_a_port_of_its_generation() -> None:
    job = running_gang()
    assert place_in(job, 0).master_addr == "127.0.0.1"  # node 0 is the world's meeting point itself
    assert place_in(job, 1).master_addr == "10.0.0.7"
    ports = {master_port(job.id, generation) for generation in range(1, 50)}
    assert len(ports) > 40 and all(10_000 <= port < 20_000 for port in ports)
    # Every node's spec names the same meeting port, and the next generation (a regroup) meets on another.
    assert place_in(job, 0).master_port == place_in(job, 1).master_port == master_port(job.id, job.generation)
    assert master_port(job.id, job.generation + 1) != master_port(job.id, job.generation)
    # Each node computes the port in its own process: the same there (no per-process salted hash), not just here.
    code = f"from handlers.gang import master_port; print(master_port({job.id!r}, {job.generation}))"
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        command = [sys.executable, "-c", code]
        out = subprocess.run(command, env=env, capture_output=True, text=True, check=True, timeout=120)
        assert int(out.stdout) == place_in(job, 1).master_port


def test_losing_node_0_replaces_it_alone_and_node_1_takes_rank_0() -> None:
    job = running_gang()
    told = report(job, 1, Interrupted, node_rank=0, generation=1, reason="spot-interruption", step=9, uri="f:/9/")
    job, outbox = step(job, told)
    assert job.state is JobState.RECOVERING and job.generation == 2
    assert not of(outbox, Terminate)  # node 0 still completes its marker
    [replace] = of(outbox, Launch)  # the moment the node is lost: the replacement's launch overlaps the commit
    assert (replace.attempt, replace.zone) == (3, "za")
    assert place_in(job, job.attempts[-1].node_rank or 0).master_addr == "10.0.0.8"  # the survivor's address
    job, _ = step(job, Launched(job_id=job.id, attempt=3, instance_id="i-2", zone="za", private_ip="10.0.0.9"))
    job, outbox = step(job, report(job, 3, Standby, node_rank=1, generation=2, cause="handover"))
    assert not of(outbox, HandOver)  # up, but the survivor has not committed: it waits before it restores
    job, outbox = step(job, report(job, 2, Standby, node_rank=1, generation=1, step=9, cause="stopped"))
    [go] = of(outbox, HandOver)
    assert go.attempt == 3
    job, outbox = step(job, report(job, 3, Started, node_rank=1, generation=2, resumed_from_step=9))
    [regroup] = of(outbox, Regroup)
    assert (regroup.attempt, regroup.generation, regroup.node_rank) == (2, 1, 1)  # where node 1 polls now
    assert (regroup.gang.node_rank, regroup.gang.generation, regroup.gang.master_addr) == (0, 2, "127.0.0.1")
    assert job.state is JobState.RECOVERING  # the survivor has not started in generation 2 yet
    job, _ = step(job, report(job, 2, Started, node_rank=0, generation=2, resumed_from_step=9))
    assert job.state is JobState.RUNNING and sorted(job.gang_attempts) == [0, 1]
    assert [a.number for a in job.gang_attempts.values()] == [2, 3] and job.steps_lost == 0


def test_a_gang_restored_from_a_checkpoint_newer_than_the_jobs_moves_its_checkpoint_and_step() -> None:
    """Node 0 committed step 12 and nobody heard it (the bot was down): the gang's restore says so when it trains
    again, and the job's checkpoint and step follow (its card never shows step 9 under "resumed from step 12")."""
    job = running_gang()
    told = report(job, 1, Interrupted, node_rank=0, generation=1, reason="spot-interruption", step=9, uri="f:/9/")
    job, _ = step(job, told)
    job, _ = step(job, report(job, 2, Standby, node_rank=1, generation=1, step=9, cause="stopped"))
    job, _ = step(job, Launched(job_id=job.id, attempt=3, instance_id="i-2", zone="za", private_ip="10.0.0.9"))
    job, _ = step(job, report(job, 3, Started, node_rank=1, generation=2, resumed_from_step=12, restored_uri="f:/12/"))
    assert job.checkpoint is not None and job.checkpoint.step == 9  # one node started is not the gang's restore
    job, _ = step(job, report(job, 2, Started, node_rank=0, generation=2, resumed_from_step=12, restored_uri="f:/12/"))
    assert job.state is JobState.RUNNING
    assert job.checkpoint is not None and (job.checkpoint.step, job.checkpoint.uri) == (12, "f:/12/")
    assert job.step == 12


def test_a_replacement_refused_for_capacity_holds_then_the_gang_moves_whole() -> None:
    job = running_gang()
    job, _ = step(job, report(job, 1, Standby, node_rank=0, generation=1, step=5, cause="trainer-exited"))
    gone = CloudEvent(kind="instance-gone", instance_id="i-1", source="local", detail='{"exit_code": -9}')
    job, outbox = step(job, gone)  # no notice: the instance is gone
    assert [t.instance_id for t in of(outbox, Terminate)] == ["i-1"]
    [replace] = of(outbox, Launch)  # the survivor stood by first: the replacement launches at once
    assert (replace.attempt, replace.zone) == (3, "za")
    job, outbox = step(job, LaunchFailed(job_id=job.id, attempt=3, reason="no room", capacity=True, zone="za"))
    [hold] = of(outbox, GangHoldDue)
    assert job.held_since == NOW and job.gang_attempts[0].ended_at is None and hold.due == NOW + timedelta(minutes=10)
    job, outbox = step(job, hold, minutes=10)
    assert [t.instance_id for t in of(outbox, Terminate)] == ["i-0"] and of(outbox, ReleaseGang)
    [again] = of(outbox, Launch)
    assert again.attempt == 4 and again.zone is None and "za" in job.refused_zones
    assert job.generation == 3 and sorted(job.gang_attempts) == [0, 1] and job.state is JobState.RECOVERING


def test_reconciliation_keeps_every_live_node_and_releases_an_ended_ones() -> None:
    job = running_gang()
    listed = [CloudInstance(f"i-{n}", "running", job.id, n + 1, NOW) for n in (0, 1)]
    assert reconcile([job], listed, NOW + timedelta(minutes=1)) == []
    told = report(job, 2, Interrupted, node_rank=1, generation=1, reason="spot-interruption", step=9, uri="f:/9/")
    lost, _ = step(job, told)
    [release] = reconcile([lost], listed, NOW + timedelta(minutes=1))
    assert (release.action, release.instance_id) == ("release", "i-1")


def test_a_gang_pays_every_node_and_its_counterfactual_is_as_many_on_demand_instances() -> None:
    job = running_gang()
    prices = {"price_per_hour": 0.3, "on_demand_price_per_hour": 1.0, "launched_at": NOW, "started_at": NOW}
    priced = [a.model_copy(update=prices) for a in job.attempts]
    job = job.model_copy(update={"attempts": priced, "step": 100})
    cost = job_cost(job, NOW + timedelta(hours=1))
    assert cost.paid == 0.6 and cost.hours == 2.0 and cost.restarts == 0  # two nodes, an hour each
    assert cost.seconds_per_step == 36.0  # 100 steps in the hour both nodes trained
    assert cost.on_demand == 2.0 and cost.savings is not None and round(cost.savings, 2) == 0.7


def new_gang_job() -> Job:
    return new_job("ft-gang2", "tiny", {}, "console:ana", ChatRef(platform="console", channel="c"), NOW, nodes=2).job


def test_node_0_refused_for_capacity_places_the_whole_gang_again_and_a_zone_refused_twice_goes_on_demand() -> None:
    job = new_gang_job()
    job, outbox = step(job, LaunchFailed(job_id=job.id, attempt=1, reason="no room", capacity=True, zone="za"))
    assert job.state is JobState.PENDING and job.generation == 2 and "za" in job.refused_zones
    assert not of(outbox, Terminate) and of(outbox, ReleaseGang)  # nothing was launched; the placement goes
    [again] = of(outbox, Launch)
    assert (again.attempt, again.market) == (3, "spot") and sorted(job.gang_attempts) == [0, 1]
    job, outbox = step(job, LaunchFailed(job_id=job.id, attempt=3, reason="no room", capacity=True, zone="za"), 1)
    [third] = of(outbox, Launch)  # refused there again within its cool-down: spot is not asked there in a loop
    assert (third.attempt, third.market) == (5, "on-demand")
    assert {a.market for a in job.gang_attempts.values()} == {"on-demand"} and job.generation == 3


def test_a_later_node_refused_for_capacity_releases_the_nodes_up_and_places_the_gang_again() -> None:
    job = new_gang_job()
    job, _ = step(job, Launched(job_id=job.id, attempt=1, instance_id="i-0", zone="za", private_ip="10.0.0.7"))
    job, outbox = step(job, LaunchFailed(job_id=job.id, attempt=2, reason="no room", capacity=True, zone="za"))
    assert [t.instance_id for t in of(outbox, Terminate)] == ["i-0"] and of(outbox, ReleaseGang)
    [again] = of(outbox, Launch)
    assert again.attempt == 3 and "za" in job.refused_zones
    assert all(a.ended_at is not None for a in job.attempts[:2])


def test_a_node_refused_for_any_other_reason_fails_the_gang_and_releases_its_nodes_and_placement() -> None:
    job = new_gang_job()
    job, _ = step(job, Launched(job_id=job.id, attempt=1, instance_id="i-0", zone="za", private_ip="10.0.0.7"))
    job, outbox = step(job, LaunchFailed(job_id=job.id, attempt=2, reason="InvalidAMIID.NotFound", capacity=False))
    assert job.state is JobState.FAILED and not of(outbox, Launch)
    assert [t.instance_id for t in of(outbox, Terminate)] == ["i-0"] and of(outbox, ReleaseGang)


def test_node_0s_step_gives_each_node_of_its_generation_its_first_step_once_and_the_job_its_restart() -> None:
    job = running_gang()
    job = job.model_copy(update={"attempts": [a.model_copy(update={"launched_at": NOW}) for a in job.attempts]})
    assert all(a.first_step_at is None for a in job.attempts) and job.restart_seconds is None
    assert decide(job, report(job, 2, Progress, step=1), NOW + timedelta(minutes=3)) is None  # node 0's stand
    first = ReportReceived(report=Progress(job_id=job.id, attempt=1, time=NOW + timedelta(minutes=4), step=1))
    job, _ = step(job, first, minutes=4)
    assert [a.first_step_at for a in job.attempts] == [NOW + timedelta(minutes=4)] * 2
    assert job.restart_seconds == 240.0  # launch to node 0's first step, each node
    later = ReportReceived(report=Progress(job_id=job.id, attempt=1, time=NOW + timedelta(minutes=9), step=2))
    again, _ = step(job, later, minutes=9)
    assert again.attempts == job.attempts and again.restart_seconds == job.restart_seconds  # once
    # Node 0's step at minute 3 delivered after its minute-4 one: every node's first step moves back to it.
    retried = ReportReceived(report=Progress(job_id=job.id, attempt=1, time=NOW + timedelta(minutes=3), step=1))
    earlier, _ = step(job, retried, minutes=10)
    assert [a.first_step_at for a in earlier.attempts] == [NOW + timedelta(minutes=3)] * 2
    assert earlier.restart_seconds == 180.0 and earlier.step == job.step  # the step never goes back


def test_node_0s_completion_after_the_gang_was_judged_failed_succeeds_and_resolves_the_page() -> None:
    # Node 0's completion delayed past the bot's verdict (a replica died with it in flight): the output is committed.
    job = running_gang()
    page = Page(attempt=1, opened_at=NOW, reason=Failure.of("start-timeout"), tools=["opsgenie"])
    failure = Failure.of("start-timeout")
    judged = job.model_copy(update={"state": JobState.RESUME_FAILED, "failure": failure, "page": page})
    done, outbox = step(judged, report(judged, 1, Completed, step=16, output_uri="s3://b/out/"))
    assert done.state is JobState.SUCCEEDED and done.output_uri == "s3://b/out/"
    assert done.failure is None and done.page is None
    [resolve] = [m for m in outbox if isinstance(m, Notify) and getattr(m.note, "action", None) == "resolve"]
    assert resolve.note.tool == "opsgenie"  # type: ignore[union-attr]
    assert of(outbox, ReleaseGang)  # and the gang is released as after any completion


def test_node_0s_completion_after_its_instance_was_judged_gone_succeeds_and_releases_the_gang() -> None:
    # Node 0 finished and exited; the cloud's word came first (a replica died holding the report): node 0 was
    # replaced for nothing. Its completion still ends the job, and every node up is released.
    job = running_gang()
    job, outbox = step(job, CloudEvent(kind="instance-gone", instance_id="i-0", source="local"))
    assert job.state is JobState.RECOVERING and job.attempts[0].ended_at is not None
    done, outbox = step(job, report(job, 1, Completed, node_rank=0, generation=1, step=16, output_uri="s3://b/out/"))
    assert done.state is JobState.SUCCEEDED and done.output_uri == "s3://b/out/"
    assert {m.instance_id for m in of(outbox, Terminate)} == {"i-1"} and of(outbox, ReleaseGang)
    # Node 1, due to take rank 0 in the next world, finishing as rank 1 of the old one completes only itself.
    assert job.attempts[1].next_rank == 0
    node_1, _ = step(job, report(job, 2, Completed, node_rank=1, generation=1, step=16, output_uri="s3://b/out/"))
    assert node_1.state is JobState.RECOVERING and node_1.attempts[1].end_reason == "completed"


def test_a_node_that_finds_the_output_stored_completes_the_gang_whatever_its_rank() -> None:
    job = running_gang()
    only_itself, _ = step(job, report(job, 2, Completed, node_rank=1, generation=1, step=16, output_uri="s3://b/o/"))
    assert only_itself.state is JobState.RUNNING  # rank 1 finishing: node 0 stores the output
    found = report(job, 2, Completed, node_rank=1, generation=1, step=16, output_uri="s3://b/o/", already_complete=True)
    done, outbox = step(job, found)
    assert done.state is JobState.SUCCEEDED and done.output_uri == "s3://b/o/" and of(outbox, ReleaseGang)


def test_node_0s_checkpoint_told_after_its_completion_is_the_jobs_and_an_older_worlds_is_not() -> None:
    # The runner reports in the background (SNS to SQS keeps no order): checkpoint-6's word after the completion.
    job = running_gang()
    done, _ = step(job, report(job, 1, Completed, node_rank=0, generation=1, step=6, output_uri="s3://b/out/"))
    assert done.state is JobState.SUCCEEDED and done.checkpoint is None
    saved = report(done, 1, CheckpointSaved, step=6, uri="s3://b/ckpt-6/", bytes=1, seconds=1.0)
    late, _ = step(done, saved)
    assert late.checkpoint is not None and (late.checkpoint.step, late.checkpoint.uri) == (6, "s3://b/ckpt-6/")
    # A world the gang has left (it regrouped since): its node's late word is fenced.
    moved = done.model_copy(update={"generation": 2})
    fenced, _ = step(moved, saved)
    assert fenced.checkpoint is None


def spot_gang_short_of_time() -> tuple[Job, SpotView]:
    """A running two-node gang on spot, halfway (49 minutes of work left), whose 55-minute deadline now needs
    on-demand at the policy's next look (a loss without notice would take 20 steps, ~10 minutes, with it); the one
    zone it knows."""
    job = running_gang()
    times = {"launched_at": NOW - timedelta(minutes=50), "started_at": NOW - timedelta(minutes=49)}
    attempts = [a.model_copy(update=times) for a in job.attempts]
    job = job.model_copy(
        update={
            "attempts": attempts,
            "spot_policy": "deadline-aware",
            "deadline": NOW + timedelta(minutes=55),
            "step": 100,
            "total_steps": 200,
            "tick": 1,
        }
    )
    return job, replace(ZA, checkpoint_steps=20)


def test_the_policys_switch_of_market_stops_every_node_and_relaunches_the_gang_from_their_checkpoint() -> None:
    # Before: the tick stopped only the last node, and once every node had stopped the gang ended STOPPED.
    job, view = spot_gang_short_of_time()
    switch = decide(job, PolicyTick(job_id=job.id, tick=1, due=NOW), NOW, spot=view)
    assert switch is not None and switch.job.state is JobState.STOPPING and switch.job.switch_to == "on-demand"
    assert sorted(m.instance_id for m in of(switch.outbox, StopRunner)) == ["i-0", "i-1"]
    stopped = report(job, 2, Interrupted, node_rank=1, generation=1, reason="stop", step=100, uri="f:/100/")
    one = decide(switch.job, stopped, NOW, spot=view)
    assert one is not None and one.job.state is JobState.STOPPING and not of(one.outbox, Launch)
    last = report(job, 1, Interrupted, node_rank=0, generation=1, reason="stop", step=100, uri="f:/100/")
    both = decide(one.job, last, NOW, spot=view)
    assert both is not None and both.job.state is JobState.RECOVERING and both.job.switch_to is None
    [launch] = of(both.outbox, Launch)
    assert (launch.market, launch.attempt) == ("on-demand", 3) and both.job.checkpoint is not None
    assert both.job.checkpoint.step == 100


def test_a_node_that_fails_while_the_switch_stops_the_gang_relaunches_it_on_the_other_market_not_stopped() -> None:
    # Before: the failure ended the gang STOPPED (and gave up its placement group), so the move never happened.
    job, view = spot_gang_short_of_time()
    job = job.model_copy(update={"checkpoint": CheckpointRef(step=90, uri="f:/90/", at=NOW)})
    switch = decide(job, PolicyTick(job_id=job.id, tick=1, due=NOW), NOW, spot=view)
    assert switch is not None and switch.job.switch_to == "on-demand"
    crashed = report(job, 2, Failed, failure=Failure.of("trainer-exited-silent", exit_code=1, restarts=0), exit_code=1)
    moved = decide(switch.job, crashed, NOW, spot=view)
    assert moved is not None and moved.job.state is JobState.RECOVERING and moved.job.failure is None
    assert sorted(m.instance_id for m in of(moved.outbox, Terminate)) == ["i-0", "i-1"]  # node 0's part is moot
    assert not of(moved.outbox, ReleaseGang)  # the gang goes on
    [launch] = of(moved.outbox, Launch)
    assert (launch.market, launch.attempt) == ("on-demand", 3)
    assert moved.job.checkpoint is not None and moved.job.checkpoint.step == 90  # restored from what was committed
    # A person's stop that meets a failure still ends the gang, placement group and all.
    stopping = stop_command(job, "console:ana", NOW)
    ended = decide(stopping.job, crashed, NOW, spot=view)
    assert ended is not None and ended.job.state is JobState.STOPPED and of(ended.outbox, ReleaseGang)


def test_the_policy_prices_a_gang_at_every_node() -> None:
    # Before: the policy priced the rest at one instance's price against what every node had spent, so the card of a
    # gang steered by a configured policy projected 0.6 spent + 0.3 for the last hour on spot, where the two nodes
    # pay 0.6 (and a budget, were a gang given one, would have been overrun as far).
    job = running_gang()
    prices = {"price_per_hour": 0.3, "on_demand_price_per_hour": 1.0, "launched_at": NOW, "started_at": NOW}
    attempts = [a.model_copy(update=prices) for a in job.attempts]
    job = job.model_copy(update={"attempts": attempts, "step": 100, "total_steps": 200, "spot_policy": "greedy"})
    later = NOW + timedelta(hours=1)
    tick = decide(job.model_copy(update={"tick": 1}), PolicyTick(job_id=job.id, tick=1, due=later), later, spot=ZA)
    assert tick is not None and tick.job.plan is not None and tick.job.plan.action == "spot"
    assert tick.job.plan.cost == 1.2 and job_cost(job, later).paid == 0.6
    budgeted = job.model_copy(update={"budget": 1.0, "spot_policy": "deadline-aware", "tick": 1})
    stop = decide(budgeted, PolicyTick(job_id=job.id, tick=1, due=later), later, spot=ZA)
    assert stop is not None and stop.job.state is JobState.STOPPING
    assert sorted(m.instance_id for m in of(stop.outbox, StopRunner)) == ["i-0", "i-1"]


def test_a_gang_that_waited_for_spot_launches_node_0_first_at_the_policys_tick() -> None:
    # Before: the tick launched the gang's last planned attempt (node 1), which cannot be placed before node 0 has an
    # address, so the launch failed and the gang with it.
    chat = ChatRef(platform="console", channel="c")
    job = new_job("ft-gang3", "tiny", {}, "console:ana", chat, NOW, nodes=2, spot_policy="spot-only", spot=ZA).job
    refused = LaunchFailed(job_id=job.id, attempt=1, reason="no room", capacity=True, zone="za")
    waiting = decide(job, refused, NOW, spot=ZA)
    assert waiting is not None and waiting.job.plan is not None and waiting.job.plan.action == "wait"
    assert not of(waiting.outbox, Launch) and [a.number for a in waiting.job.gang_attempts.values()] == [3, 4]
    later = NOW + timedelta(minutes=6)  # past the zone's cool-down: spot-only tries it again
    tick = decide(waiting.job, PolicyTick(job_id=job.id, tick=waiting.job.tick, due=later), later, spot=ZA)
    assert tick is not None
    [launch] = of(tick.outbox, Launch)
    assert (launch.attempt, launch.market, launch.zone) == (3, "spot", "za")
    assert all(a.launched_at == later and a.market == "spot" for a in tick.job.gang_attempts.values())


def deadline_gang(deadline: timedelta) -> Job:
    """A running two-node gang on spot in za, halfway (100 of 200 steps in the hour since its 5-minute start-up), with
    a deadline."""
    job = running_gang()
    times = {"launched_at": NOW - timedelta(minutes=65), "started_at": NOW - timedelta(minutes=60), "zone": "za"}
    attempts = [a.model_copy(update=times) for a in job.attempts]
    updates = {"attempts": attempts, "step": 100, "total_steps": 200, "spot_policy": "deadline-aware"}
    return job.model_copy(update={**updates, "deadline": NOW + deadline})


def test_a_gang_with_a_deadline_moves_where_its_policy_says_when_a_node_cannot_be_replaced() -> None:
    job = deadline_gang(timedelta(minutes=78))
    job, _ = step(job, report(job, 1, Standby, node_rank=0, generation=1, step=100, cause="trainer-exited"))
    gone = CloudEvent(kind="instance-gone", instance_id="i-1", source="local", detail="spot reclaimed")
    lost = decide(job, gone, NOW, spot=ZA)
    assert lost is not None and [m.attempt for m in of(lost.outbox, Launch)] == [3]  # the replacement, in za
    held = decide(lost.job, LaunchFailed(job_id=job.id, attempt=3, reason="no room", capacity=True, zone="za"), NOW)
    assert held is not None
    [hold] = of(held.outbox, GangHoldDue)
    later = NOW + timedelta(minutes=10)  # 68 minutes left for an hour of work: no spot in za, so on-demand
    moved = decide(held.job, hold, later, spot=ZA)
    assert moved is not None and [t.instance_id for t in of(moved.outbox, Terminate)] == ["i-0"]
    [launch] = of(moved.outbox, Launch)
    assert (launch.attempt, launch.market) == (4, "on-demand") and moved.job.plan is not None
    assert moved.job.plan.action == "on-demand" and moved.history["choice"] == "move"
    # Not steered (no view of the cloud): the gang moves on its market, as it always did.
    same = decide(held.job, hold, later)
    assert same is not None and [m.market for m in of(same.outbox, Launch)] == ["spot"]


def test_a_gang_whose_slack_would_not_cover_a_hold_and_a_move_moves_at_once() -> None:
    # 68 minutes left for an hour of work: 8 minutes of slack, under a 10-minute hold and a 5-minute move.
    job = deadline_gang(timedelta(minutes=68))
    job, _ = step(job, report(job, 1, Standby, node_rank=0, generation=1, step=100, cause="trainer-exited"))
    gone = CloudEvent(kind="instance-gone", instance_id="i-1", source="local", detail="spot reclaimed")
    lost = decide(job, gone, NOW, spot=ZA)
    assert lost is not None
    refused = LaunchFailed(job_id=job.id, attempt=3, reason="no room", capacity=True, zone="za")
    moved = decide(lost.job, refused, NOW, spot=ZA)
    assert moved is not None and not of(moved.outbox, GangHoldDue) and moved.job.held_since is None
    assert [t.instance_id for t in of(moved.outbox, Terminate)] == ["i-0"] and of(moved.outbox, ReleaseGang)
    assert [(m.attempt, m.market) for m in of(moved.outbox, Launch)] == [(4, "on-demand")]
    assert moved.history["choice"] == "move" and moved.history["slack"] == 480.0


def test_a_gang_with_a_deadline_that_loses_its_last_node_goes_where_its_policy_says() -> None:
    job = deadline_gang(timedelta(minutes=68))
    one_left = job.model_copy(
        update={"attempts": [job.attempts[0], job.attempts[1].model_copy(update={"ended_at": NOW, "end_reason": "x"})]}
    )
    gone = CloudEvent(kind="instance-gone", instance_id="i-0", source="local", detail="spot reclaimed")
    lost = decide(one_left, gone, NOW, spot=ZA)
    assert lost is not None and lost.job.plan is not None and lost.job.plan.action == "on-demand"
    assert [(m.attempt, m.market) for m in of(lost.outbox, Launch)] == [(3, "on-demand")]


def test_a_survivors_broken_world_is_a_loss_as_of_its_word_and_the_step_it_held_is_said_with_its_rule() -> None:
    """Node 1 vanished with its whole instance (no cloud event): node 0's runner says ``peer-lost`` at once, the bot
    looks at the peer's instance (``CheckNodes``); the cloud's answer makes node 1 lost as of that word, not of the
    answer, the replacement launches then, and node 0's standby at the step it held says how node 1's part was
    rebuilt."""
    job = running_gang()
    job, _ = step(job, report(job, 1, Progress, node_rank=0, generation=1, step=7, total_steps=16))
    broke = NOW + timedelta(seconds=3)
    said = ReportReceived(
        report=Standby(job_id=job.id, attempt=1, time=broke, node_rank=0, generation=1, cause="peer-lost", exit_code=75)
    )
    job, outbox = step(job, said)
    [check] = of(outbox, CheckNodes)
    assert check.instance_ids == ["i-1"] and check.lost_at == broke
    assert job.state is JobState.RUNNING and job.gang_attempts[0].standby_step is None  # nothing committed yet
    gone = CloudEvent(kind="instance-gone", instance_id="i-1", source="peer-lost", at=broke)
    job, outbox = step(job, gone, minutes=2)  # however late the cloud's answer is handled
    lost = job.attempt_numbered(2)
    assert lost is not None and lost.ended_at == broke
    [replace] = of(outbox, Launch)
    assert replace.attempt == 3
    rebuilt = {"node-1": "seed-step-rank"}
    held = report(job, 1, Standby, node_rank=0, generation=1, step=7, cause="trainer-exited", rebuilt=rebuilt)
    job, outbox = step(job, held, minutes=2)
    [note] = [n.note for n in of(outbox, Notify) if n.channel == "thread"]
    assert (note.type, note.node, note.step, note.rebuilt) == ("held-step", 0, 7, {"node-1": "seed-step-rank"})
    job, _ = step(job, Launched(job_id=job.id, attempt=3, instance_id="i-2", zone="za", private_ip="10.0.0.9"))
    job, outbox = step(job, report(job, 3, Standby, node_rank=1, generation=2, cause="handover"))
    assert [go.attempt for go in of(outbox, HandOver)] == [3]
    restarted = NOW + timedelta(seconds=33)
    for attempt, rank in ((3, 1), (1, 0)):
        started_report = Started(
            job_id=job.id, attempt=attempt, time=restarted, node_rank=rank, generation=2, resumed_from_step=7
        )
        job, outbox = step(job, ReportReceived(report=started_report), minutes=2)
    [resumed] = [n.note for n in of(outbox, Notify) if n.channel == "thread"]
    assert job.state is JobState.RUNNING and job.steps_lost == 0
    assert (resumed.step, resumed.lost, resumed.downtime) == (7, 0, 30.0)  # from the loss, not from the relaunch
