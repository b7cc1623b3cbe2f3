"""The spot authority's choice when a gang loses a node: replace that node alone, or restart the whole gang, from
the job's measured launch and restore times (handlers/decide/gang_recovery.py, handlers/spot/gang.py).

The launches are the local cloud's own under a profile (bot/cloud/local/profile_clock.py, on a wall clock the test
moves): what its instances report on ``Launched`` (``launch_seconds``) and when their runners start. Under
``aws-p5`` a gang waits minutes for its slowest boot, so replace-one is sooner training again for 2, 4 and 8 nodes;
under the instant profile a launch costs less than the survivors' regroup, so the whole gang restarts.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from bot.cloud.local.profile import AWS_P5, INSTANT, LocalProfile
from bot.cloud.local.profile_clock import ProfileClock
from handlers.decide import decide, gang_recovery, new_job
from handlers.jobs import ChatRef, Job, JobState
from handlers.messages import CloudEvent, Launch, Launched, Message, ReportReceived, Terminate
from handlers.notes import SpotPolicyNote
from handlers.reports import Standby, Started
from handlers.spot.gang import RecoveryTimes, replace_or_restart

NOW = datetime(2026, 3, 2, 8, 30, tzinfo=UTC)
RUNNER_START = 1.0  # an instance's runner up after its boot (what this machine spends; the same either way)
RESTORE = 0.2  # the tiny checkpoint's restore


class Wall:
    def __init__(self) -> None:
        self.t = NOW.timestamp()

    def __call__(self) -> float:
        return self.t


def of(outbox: list[Message], kind: type) -> list[Any]:
    return [message for message in outbox if isinstance(message, kind)]


def step(job: Job, message: Any) -> tuple[Job, list[Message]]:
    change = decide(job, message, NOW)
    assert change is not None
    return change.job, change.outbox


def gang_launched_on(profile: LocalProfile, nodes: int) -> Job:
    """A running gang of ``nodes`` whose launches were the local cloud's under ``profile``: node 0 first, the
    others once its launch returned (a second later, into its zone), each runner started after its boot."""
    wall = Wall()
    clock = ProfileClock(profile, wall=wall)
    created = new_job("ft-prof1", "tiny", {}, "console:ana", ChatRef(platform="console", channel="c"), NOW, nodes=nodes)
    job, outbox = created.job, created.outbox
    boots: dict[int, float] = {}
    while launches := of(outbox, Launch):
        outbox = []
        for order in launches:
            boots[order.attempt] = clock.boot("za")
            up = datetime.fromtimestamp(wall(), UTC)
            launched = Launched(
                job_id=job.id,
                attempt=order.attempt,
                instance_id=f"i-{order.attempt}",
                zone="za",
                private_ip="10.0.0.7",
                launch_seconds=boots[order.attempt],
                at=up,
            )
            job, more = step(job, launched)
            outbox += more
            wall.t += 1.0  # the next launch call
    for attempt in job.attempts:
        rank = attempt.node_rank
        started = attempt.launched_at + timedelta(seconds=RUNNER_START + RESTORE)
        report = Started(
            job_id=job.id,
            attempt=attempt.number,
            node_rank=rank,
            generation=1,
            instance_id=attempt.instance_id,
            restore_seconds=RESTORE,
            time=started,
        )
        job, _ = step(job, ReportReceived(report=report))
    assert job.state is JobState.RUNNING
    return job


def lose_last_node(job: Job) -> tuple[Job, list[Message], dict[str, Any]]:
    last = job.gang_attempts[job.nodes - 1]
    change = decide(job, CloudEvent(kind="instance-gone", instance_id=last.instance_id or "", source="local"), NOW)
    assert change is not None
    return change.job, change.outbox, change.history


@pytest.mark.parametrize("nodes", [2, 4, 8])
def test_under_aws_p5_the_authority_replaces_the_lost_node_alone(nodes: int) -> None:
    job = gang_launched_on(AWS_P5, nodes)
    times = gang_recovery.recovery_times(job)
    assert times.measured and times.launch_seconds >= AWS_P5.launch_seconds  # the profile's boot, measured
    assert times.replace_one() < times.whole_gang()  # one boot against the gang's slowest
    lost, outbox, history = lose_last_node(job)
    assert history["recovery"] == "replace-one" and history["measured"] is True
    assert lost.generation == 2 and not lost.restart_whole
    [note] = [m.note for m in outbox if isinstance(getattr(m, "note", None), SpotPolicyNote)]
    assert note.reason == "gang.replace-one" and note.values["nodes"] == nodes
    # The replacement up and the survivors regrouped into its world: the figures are still the whole gang's launch.
    [replacement] = [a for a in lost.attempts if a.number == lost.attempt]
    assert replacement.launched_with == 1
    for attempt in lost.gang_attempts.values():
        started = Started(
            job_id=job.id,
            attempt=attempt.number,
            node_rank=attempt.next_rank if attempt.next_rank is not None else attempt.node_rank,
            generation=2,
            instance_id=attempt.instance_id or "i-new",
            restore_seconds=RESTORE,
            time=NOW + timedelta(seconds=5),
        )
        if attempt.instance_id is None:
            up = Launched(job_id=job.id, attempt=attempt.number, instance_id="i-new", zone="za", at=NOW)
            lost, _ = step(lost, up)
        lost, _ = step(lost, ReportReceived(report=started))
    assert lost.state is JobState.RUNNING and gang_recovery.recovery_times(lost) == times


@pytest.mark.parametrize("nodes", [2, 4])
def test_under_the_instant_profile_the_whole_gang_restarts_once_the_survivors_stand_by(nodes: int) -> None:
    job = gang_launched_on(INSTANT, nodes)
    times = gang_recovery.recovery_times(job)
    assert times.measured and times.whole_gang() < times.replace_one()
    lost, outbox, history = lose_last_node(job)
    assert history["recovery"] == "whole-gang" and lost.restart_whole
    assert not of(outbox, Launch)  # nothing launched before the survivors committed the step they hold
    [note] = [m.note for m in outbox if isinstance(getattr(m, "note", None), SpotPolicyNote)]
    assert note.reason == "gang.whole-gang"
    survivors = [a for a in lost.gang_attempts.values() if a.instance_id]
    assert len(survivors) == nodes - 1
    for survivor in survivors:
        stood = Standby(
            job_id=job.id,
            attempt=survivor.number,
            node_rank=survivor.node_rank,
            generation=1,
            step=9,
            cause="trainer-exited",
        )
        lost, outbox = step(lost, ReportReceived(report=stood))
    # The last survivor's standby: every survivor released, every node planned again, node 0 launched first.
    assert sorted(t.instance_id for t in of(outbox, Terminate)) == sorted(a.instance_id for a in survivors)
    [first] = of(outbox, Launch)
    assert lost.generation == 2 and not lost.restart_whole and len(lost.gang_attempts) == nodes
    assert lost.gang_attempts[0].number == first.attempt and first.zone == "za"
    assert all(a.instance_id is None for a in lost.gang_attempts.values())


def test_without_measured_launches_the_defaults_are_a_clouds_and_replace_one() -> None:
    times = gang_recovery.recovery_times(new_job("ft-prof2", "tiny", {}, "console:ana", None, NOW, nodes=4).job)
    assert not times.measured and replace_or_restart(times) == "replace-one"


def test_whole_gang_is_chosen_only_where_it_is_clearly_faster() -> None:
    # Launches as fast as the regroup: whole-gang saves too little to give up the survivors' instances.
    even = RecoveryTimes(2, launch_seconds=300, restore_seconds=0, gang_launch_seconds=300, measured=True)
    assert even.whole_gang() < even.replace_one() and replace_or_restart(even) == "replace-one"
    instant = RecoveryTimes(2, launch_seconds=1.2, restore_seconds=0.2, gang_launch_seconds=1.3, measured=True)
    assert replace_or_restart(instant) == "whole-gang"
    # A zone that starts fewer nodes at once than the gang has: the waves add up.
    waves = RecoveryTimes(8, launch_seconds=120, restore_seconds=60, zone_capacity=4)
    assert waves.whole_gang() > 2 * 120 + 60 and replace_or_restart(waves) == "replace-one"
