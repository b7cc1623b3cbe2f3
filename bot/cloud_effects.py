"""The cloud executor: carries out what job changes ask of the cloud (launch, terminate, interrupt-test, stop the
runner).

Effects reach its stream (``finetune:cloud``) straight from the job store, in the same atomic write as the change
that caused them; a consumer group shares them between replicas, one lane per job (see :mod:`bot.bus`), so any
replica carries out any effect, and a dead replica's effects are taken over within seconds.

Each effect is carried out at least once and its follow-up is committed exactly once:

1. if the effect's record exists, it was carried out and its follow-up committed: nothing to do;
2. the action runs, and it is idempotent at the cloud, so running it again after a crash is harmless:
   - ``launch``: one instance per (job, attempt) — the AWS and Alibaba providers send a ``ClientToken`` made of
     them and look for an instance already tagged with them; the local cloud derives the instance id from them.
     A retry therefore finds the instance the first try started instead of starting a second one;
   - ``terminate``: terminating a terminated instance changes nothing;
   - ``stop-runner``, ``hand-over``: the runner's control request is a state ("stop", "go"), written again;
   - ``interrupt-test``: one interruption per instance (FIS's ``clientToken``, the local instance's own notice);
3. the record and the follow-up (``Launched``, ``LaunchFailed`` or ``StopFailed`` onto the events stream, a note
   onto the chat stream) are written in one atomic step (:meth:`bot.store.JobStore.finish_effect`); only then is
   the message acknowledged. A crash before that step repeats 2 (harmlessly); after it, 1 stops the repeat.

A launch whose job moved on before it ran (stopped, relaunched) starts nothing.

One rule decides what a failure does (a provider raises :class:`~bot.errors.CloudError` for whatever the cloud
did not do, and only that):

- Redis unreachable, at any point: waited out by the bus (the effect stays in hand, nothing is parked);
- a ``CloudError`` of an effect that has someone to tell becomes its follow-up, and the core decides what comes
  next: ``launch`` → ``LaunchFailed`` (another zone, or a page), ``stop-runner`` → ``StopFailed`` (release with
  what was committed), ``interrupt-test`` → its failed note; unless the job moved past the effect meanwhile (carried
  out again after a crash): then it is no failure;
- a ``CloudError`` of ``terminate`` (nobody to tell, and the instance bills): tried again in place, with backoff,
  for ``TERMINATE_PATIENCE_SECONDS``, then a failed delivery as below;
- anything else is a bug, not the cloud's answer: the delivery fails, the bus tries it again once idle and parks
  it after ``max_tries`` (a launch's deadline still ends its job in a page; reconciliation ends a leftover).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
from collections.abc import Mapping
from typing import Any

import redis.asyncio as aioredis
from pydantic import ValidationError

from bot.bus import HandBack, default_consumer_name
from bot.bus_set import bus_for
from bot.cloud.base import (
    AsksSaves,
    CloudError,
    CloudProvider,
    ForeignInstance,
    GangPlacement,
    HandsOver,
    LaunchError,
    RegroupsGangs,
    SpansRegions,
)
from bot.store import JobStore
from handlers.backoff import backoff
from handlers.egress import egress_price
from handlers.gang import place_in, rank_of
from handlers.jobs import ACTIVE_STATES, Job, JobState
from handlers.messages import (
    CheckNodes,
    CloudEvent,
    HandOver,
    InterruptTest,
    Launch,
    Launched,
    LaunchFailed,
    Notify,
    Regroup,
    ReleaseGang,
    SaveRunner,
    StopFailed,
    StopRunner,
    Terminate,
    parse_message,
)
from handlers.notes import InterruptTestDone, InterruptTestFailed, Note
from handlers.recipes import Recipe, find_recipe
from handlers.spec import RegroupControl
from handlers.spec_build import build_spec

log = logging.getLogger(__name__)

CloudEffect = (
    Launch | Terminate | InterruptTest | StopRunner | SaveRunner | HandOver | Regroup | ReleaseGang | CheckNodes
)
FollowUp = Launched | LaunchFailed | StopFailed | Notify | CloudEvent
# A failing terminate is tried again in place (the instance bills meanwhile) for about this long before the bus
# counts it as a failed delivery.
TERMINATE_PATIENCE_SECONDS = 300.0
INSTANCE = "instance:"  # a launch's record: the instance it started


class CloudEffects:
    def __init__(
        self,
        redis: aioredis.Redis,
        store: JobStore,
        cloud: CloudProvider,
        recipes: Mapping[str, Recipe],
        report_targets: list[str],
        *,
        python: str = sys.executable,
        consumer: str | None = None,
    ) -> None:
        self.store = store
        self.cloud = cloud
        self.recipes = dict(recipes)
        self.report_targets = report_targets
        self.python = python
        self.bus = bus_for(redis, store.keys, "cloud", group="cloud", consumer=consumer or default_consumer_name())
        self.launched = 0
        self._stop = asyncio.Event()

    async def run(self, stop: asyncio.Event) -> None:
        self._stop = stop  # the bus makes its group itself, retrying through an outage
        await self.bus.run(self.handle, stop)

    async def handle(self, raw: dict[str, Any]) -> None:
        try:
            effect = parse_message(raw)
        except ValidationError as exc:
            log.error("dropped a malformed cloud effect %s: %s", raw.get("id"), exc.errors()[:3])
            return
        if not isinstance(effect, CloudEffect):
            log.error("dropped %s %s: not a cloud effect", effect.type, effect.id)
            return
        if await self.store.effect_record(effect.id, effect.job_id) is not None:
            return  # carried out, and its follow-up committed with the record
        job = await self.store.get(effect.job_id)
        record, follow_ups = await self._carry_out(effect, job)
        platform = job.chat.platform if job is not None and job.chat is not None else ""
        earlier = await self.store.finish_effect(effect.id, record, follow_ups, platform, job_id=effect.job_id)
        if earlier is not None and record.startswith(INSTANCE) and earlier != record:
            # Another delivery of this launch finished first, with another instance: this one is spare.
            log.warning("launch %s: %s was recorded first; terminating %s", effect.id, earlier, record)
            await self._terminate(record.removeprefix(INSTANCE), effect.job_id)

    async def _carry_out(self, effect: CloudEffect, job: Job | None) -> tuple[str, list[FollowUp]]:
        """Do it; what to record and what follows. Redis errors propagate (the bus waits them out)."""
        if isinstance(effect, Launch):
            return await self._launch(effect, job)
        if isinstance(effect, Terminate):
            try:
                await self._terminate(effect.instance_id, effect.job_id)
            except ForeignInstance as exc:  # not this job's instance: never touched, and no retry changes that
                log.warning("terminate of %s for %s refused: %s", effect.instance_id, effect.job_id, exc)
                return "refused: not this job's instance", []
            return "terminated", []
        if isinstance(effect, ReleaseGang):
            try:
                await self.cloud.release_gang_placement(effect.job_id)
            except CloudError as exc:  # nothing bills for a placement: logged, reconciliation has no say
                log.warning("could not release the placement of %s: %s", effect.job_id, exc)
                return f"failed: {exc}", []
            return "released", []
        if job is None:
            return "no job", []
        if isinstance(effect, CheckNodes):
            return await self._check_nodes(effect)
        if isinstance(effect, Regroup):
            return await self._regroup(effect)
        if isinstance(effect, HandOver):
            return await self._hand_over(effect)
        if isinstance(effect, StopRunner):
            return await self._stop_runner(effect, job)
        if isinstance(effect, SaveRunner):
            return await self._save_runner(effect, job)
        try:
            done = await self.cloud.interrupt_test(effect.instance_id)
        except CloudError as exc:
            if _moved_past(job, effect.instance_id, JobState.RUNNING):
                # Carried out again after a crash, once the instance had gone the way it was sent: not a failure.
                log.info("interrupt-test on %s: the job moved past %s already (%s)", job.id, effect.instance_id, exc)
                return "moved on", []
            log.warning("interrupt-test on %s failed: %s", job.id, exc)
            error = str(exc) or type(exc).__name__
            return f"failed: {error}", [_note(job, InterruptTestFailed(error=error))]
        return "done", [_note(job, InterruptTestDone(result=done))]

    async def _stop_runner(self, effect: StopRunner, job: Job) -> tuple[str, list[FollowUp]]:
        try:
            await self.cloud.stop_runner(effect.instance_id)
        except CloudError as exc:
            if _moved_past(job, effect.instance_id, JobState.STOPPING):
                log.info("stop on %s: the job moved past %s already (%s)", job.id, effect.instance_id, exc)
                return "moved on", []
            # Nobody will save a checkpoint: the decision terminates the instance and stops the job with what was
            # committed (handlers/decide/, StopFailed), rather than leaving it STOPPING until its deadline.
            log.warning("stop on %s failed: %s", job.id, exc)
            reason = str(exc) or type(exc).__name__
            return f"failed: {reason}", [StopFailed(job_id=job.id, instance_id=effect.instance_id, reason=reason)]
        return "done", []

    async def _save_runner(self, effect: SaveRunner, job: Job) -> tuple[str, list[FollowUp]]:
        """Ask the runner for a fresh checkpoint, training on (an early signal only the bot heard). Advice: a cloud
        that cannot ask, or a store that will not take it, costs the early checkpoint, nothing else."""
        if not isinstance(self.cloud, AsksSaves):
            log.info("%s cannot ask a runner to save; %s keeps its periodic checkpoints", self.cloud.name, job.id)
            return "unsupported", []
        try:
            await self.cloud.save_runner(effect.instance_id, effect.at)
        except CloudError as exc:
            log.warning("save request to %s of %s failed: %s", effect.instance_id, job.id, exc)
            return f"failed: {exc}", []
        return "written", []

    async def _regroup(self, effect: Regroup) -> tuple[str, list[FollowUp]]:
        """Tell a gang node standing by its place in the next world; a store that will not take it is raised to
        the bus (tried again, then parked), as the survivor would otherwise wait for nothing."""
        if not isinstance(self.cloud, RegroupsGangs):
            log.error("%s cannot regroup gang nodes; %s waits for its stop deadline", self.cloud.name, effect.job_id)
            return "unsupported", []
        control = RegroupControl(gang=effect.gang)
        await self.cloud.write_node_control(
            effect.job_id, effect.attempt, effect.generation, effect.node_rank, control
        )
        return "written", []

    async def _check_nodes(self, effect: CheckNodes) -> tuple[str, list[FollowUp]]:
        """A survivor's world broke: each peer instance the cloud no longer lists live is gone, as of the survivor's
        word (the event's id fixed per instance, so a reconcile that finds it too, or a retry, changes nothing more).
        A peer still listed live is left to its own runner's word and to reconciliation."""
        try:
            listed = {instance.instance_id: instance for instance in await self.cloud.list_instances()}
        except CloudError as exc:  # reconciliation still finds it; nothing here is worth a retry loop
            log.warning("could not look at the peers of %s: %s", effect.job_id, exc)
            return f"failed: {exc}", []
        gone = [i for i in effect.instance_ids if i not in listed or not listed[i].live]
        events: list[FollowUp] = [
            CloudEvent(
                id=f"peer-gone-{effect.job_id}-{instance_id}",
                at=effect.lost_at,
                kind="instance-gone",
                instance_id=instance_id,
                job_id=effect.job_id,
                source="peer-lost",
                detail="a survivor's collective failed and the cloud no longer lists the instance",
            )
            for instance_id in gone
        ]
        if gone:
            log.warning("%s: %s gone (a survivor's world broke)", effect.job_id, ", ".join(gone))
        return f"gone: {','.join(gone)}", events

    async def _hand_over(self, effect: HandOver) -> tuple[str, list[FollowUp]]:
        """Tell the runner launched ahead of a switch of market to go; a store that will not take it is raised to
        the bus (tried again, then parked: the attempt's start deadline then ends it, as any start that never
        came)."""
        if not isinstance(self.cloud, HandsOver):
            log.error("%s cannot hand over; %s waits for its start deadline", self.cloud.name, effect.job_id)
            return "unsupported", []
        await self.cloud.hand_over(effect.job_id, effect.attempt)
        return "written", []

    async def _launch(self, effect: Launch, job: Job | None) -> tuple[str, list[FollowUp]]:
        planned = job.attempt_numbered(effect.attempt) if job is not None else None
        if job is None or job.nodes <= 1:  # the current attempt, or the one launched ahead of a switch of market
            ahead = job is not None and job.standby is not None and job.standby.number == effect.attempt
            wanted = job is not None and (job.attempt == effect.attempt or ahead)
        else:  # a gang: any of its live nodes' attempts
            wanted = planned is not None and planned.ended_at is None
        if job is None or not wanted or not launching(job):
            log.info(
                "launch %s of %s attempt %d: the job moved on; nothing started",
                effect.id,
                effect.job_id,
                effect.attempt,
            )
            return "skipped", []
        try:
            recipe = find_recipe(job.recipe, self.recipes)
            rank = rank_of(planned) if planned is not None and job.nodes > 1 else None
            spec = build_spec(
                job,
                effect.attempt,
                recipe,
                self.cloud.checkpoint_uri(job.id),
                self.report_targets,
                self.cloud.notice,
                self.python,
                place_in(job, rank) if rank is not None else None,
            )
            # Zones that just failed or reclaimed this job go last (the provider still uses them if nothing else).
            tried = [attempt.zone for attempt in job.attempts if attempt.zone and attempt.number < effect.attempt]
            # The market and zone the spot authority chose (handlers/spot/), and nothing else.
            types = recipe.instance_types.get(self.cloud.name, [])
            if rank is None:
                instance = await self.cloud.launch(spec, types, effect.market, avoid_zones=tried, zone=effect.zone)
            else:  # a gang node: where its node 0 is (the zone pinned), placed with the others; a node 0 anywhere
                placement = GangPlacement(job.id, job.efa)
                instance = await self.cloud.launch(
                    spec, types, effect.market, avoid_zones=tried, zone=effect.zone, gang=placement
                )
        except (CloudError, ValueError) as exc:  # the cloud said no, or the recipe / spec cannot be launched
            log.warning("launch of %s attempt %d failed: %s", job.id, effect.attempt, exc)
            reason = str(exc) or type(exc).__name__
            capacity = isinstance(exc, LaunchError) and exc.capacity
            refused_zones = exc.refused_zones if isinstance(exc, LaunchError) else ()
            failed = LaunchFailed(
                job_id=job.id,
                attempt=effect.attempt,
                reason=reason,
                capacity=capacity,
                zone=effect.zone,
                refused_zones=refused_zones,
            )
            return f"failed: {reason}", [failed]
        self.launched += 1
        launched = Launched(
            job_id=job.id,
            attempt=effect.attempt,
            instance_id=instance.instance_id,
            instance_type=instance.instance_type,
            zone=instance.zone,
            market=instance.market,
            price_per_hour=instance.price_per_hour,
            on_demand_price_per_hour=instance.on_demand_price_per_hour,
            egress_price_per_gb=self._egress_price(instance.zone),
            private_ip=instance.private_ip,
            launch_seconds=instance.launch_seconds,
            notice_seconds=self.cloud.notice_seconds,
        )
        return INSTANCE + instance.instance_id, [launched]

    def _egress_price(self, zone: str) -> float:
        """What an attempt in ``zone`` pays per checkpoint GB it moves: the cloud's inter-region price outside the
        bucket's region, nothing inside it (or on a cloud of one region)."""
        cloud = self.cloud
        if not isinstance(cloud, SpansRegions):
            return 0.0
        return egress_price(zone, cloud.home_region, cloud.transfer_price_per_gb)

    async def _terminate(self, instance_id: str, job_id: str) -> None:
        tries, waited = 0, 0.0
        while True:
            try:
                await self.cloud.terminate(instance_id, job_id)
                return
            except ForeignInstance:
                raise
            except CloudError as exc:
                if waited >= TERMINATE_PATIENCE_SECONDS:
                    raise
                tries += 1
                delay = backoff(tries, base=1.0, cap=30.0)
                log.warning("terminating %s failed (%s): again in %.0fs", instance_id, exc, delay)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), delay)
                if self._stop.is_set():
                    raise HandBack() from exc  # the next replica tries again
                waited += delay


def launching(job: Job) -> bool:
    """Whether ``job`` still wants instances: active and not being stopped. A stop ends a gang's launches still
    queued (node 0's result had ordered the others'): each is skipped here, and one already at the cloud when the
    stop came is terminated by its result (handlers/decide/gangs.py ``launched``)."""
    return job.state in ACTIVE_STATES and job.state is not JobState.STOPPING


def _moved_past(job: Job, instance_id: str, asked_in: JobState) -> bool:
    """The job left the state the effect was asked in, or ``instance_id``: interrupted, relaunched or ended since."""
    current = job.current
    return current is None or current.instance_id != instance_id or job.state is not asked_in


def _note(job: Job, note: Note) -> Notify:
    return Notify(job_id=job.id, channel="thread", note=note)
