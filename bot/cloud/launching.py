"""The one launch of the clouds that start instances themselves (AWS EC2, Alibaba ECS): its body and its loop.

The body (:func:`launch_attempt`) is the same on both: the spec completed and uploaded, the boot script, the gang's
placement, the instance (a scaling group's, or the loop's), then the attempt's secret (AWS: its key object; Alibaba:
its sealed storage token) handed over, and an instance that cannot get it released again; each cloud supplies only its
steps (:class:`LaunchSteps`). The loop (:func:`launch_instance`) is the same everywhere too: a launch retried after a
crash finds the instance its first try started; otherwise the (zone, type) candidates come in the order the pure
:mod:`handlers.spot.zones` gives (zones the spot authority pinned, else the cloud's in preference order, zones to avoid
last), a capacity error moves on to the next candidate until ``max_failures`` of them in its region (then on to
the next region's; once every region refused, the launch reports a capacity refusal naming the zones that refused,
and the authority chooses again), any other refusal ends the launch at once. Each try carries an idempotency token
derived from the attempt and the candidate, so a request sent again after no answer starts nothing new. Each cloud
supplies only its calls (:class:`InstanceCalls`). The scaling-group modes (AWS Auto Scaling, Alibaba ESS) share the
wait for the group's new instance (:func:`wait_for_group_instance`), and both modes the tags, the instance's name and
how a found instance is priced.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

from bot.cloud.base import CloudError, ForeignInstance, GangPlacement, Instance, LaunchError
from handlers.jobs import Market
from handlers.spec import JobSpec
from handlers.spot.zones import (
    Candidate,
    ErrorKind,
    LaunchPlan,
    order_on_demand_candidates,
    order_spot_candidates,
)

log = logging.getLogger(__name__)

T = TypeVar("T")

MANAGED_TAG = "finetune:managed"  # the bot's policy launches, terminates and interrupts only instances tagged so
JOB_TAG = "finetune:job"
ATTEMPT_TAG = "finetune:attempt"


@dataclass(frozen=True)
class Started:
    """What a started instance's launch call says: its id and, where the cloud gives it, the private address a
    gang's other nodes reach it at (:attr:`bot.cloud.base.Instance.private_ip`; None: not known)."""

    instance_id: str
    private_ip: str | None = None


def client_token(*parts: object) -> str:
    """A launch's idempotency token (EC2's ``ClientToken``, ECS's ``ClientToken``): the same request sent again
    (after a crash or no answer) starts nothing new."""
    return hashlib.sha256("/".join(map(str, parts)).encode()).hexdigest()[:32]


def candidate_token(spec: JobSpec, candidate: Candidate) -> str:
    """The idempotency token of one try: one per (job, attempt, zone, type, market)."""
    return client_token(spec.job_id, spec.attempt, candidate.zone, candidate.instance_type, candidate.market)


def instance_name(spec: JobSpec) -> str:
    """The name an attempt's instance shows in the console."""
    return f"finetune-{spec.job_id}-{spec.attempt}"


def tags_of_spec(spec: JobSpec) -> dict[str, str]:
    """The tags every instance (or group, or scaling configuration) of an attempt carries."""
    return {MANAGED_TAG: "true", JOB_TAG: spec.job_id, ATTEMPT_TAG: str(spec.attempt)}


def attempt_of(tags: Mapping[str, str], instance_id: str, error: type[CloudError]) -> tuple[str, int]:
    """The job and attempt an instance's tags name; ``error`` when they name none (not launched by this bot)."""
    job_id, attempt = tags.get(JOB_TAG), tags.get(ATTEMPT_TAG, "")
    if not job_id or not attempt.isdigit():
        raise error(f"instance {instance_id} has no {JOB_TAG} / {ATTEMPT_TAG} tags: not launched by this bot")
    return job_id, int(attempt)


def check_owner(tags: Mapping[str, str], instance_id: str, job_id: str) -> None:
    """ForeignInstance unless the instance is tagged for ``job_id``: a forged report or a stale effect cannot end
    another job's instance."""
    owner = tags.get(JOB_TAG)
    if owner != job_id:
        raise ForeignInstance(f"instance {instance_id} is tagged for {owner or 'no job'}, not {job_id}: left alone")


def avoided_last(zones: Sequence[str], avoid_zones: Collection[str]) -> list[str]:
    """``zones`` in their order, the ones to avoid (where this job was just reclaimed or failed) moved last."""
    return [z for z in zones if z not in avoid_zones] + [z for z in zones if z in avoid_zones]


class InstanceCalls(Protocol):
    """What a cloud supplies to :func:`launch_instance`: its own calls, nothing of the loop."""

    refusals: tuple[type[Exception], ...]  # a try the cloud answered "no" to (then :meth:`refusal` reads it)

    def classify(self, code: str) -> ErrorKind:
        """The cloud's error code as capacity (next candidate, counted), skip (next candidate) or fatal (stop)."""
        ...

    def refusal(self, exc: Exception) -> tuple[str, str]:
        """The (code, message) of a refusal among ``refusals``."""
        ...

    async def attempt_instance(self, spec: JobSpec) -> Instance | None:
        """The live instance already tagged with this (job, attempt), if any; LaunchError when the cloud won't say."""
        ...

    async def zones(self) -> list[str]:
        """The zones a launch may use, in preference order."""
        ...

    async def spot_signals(
        self, instance_types: list[str], nodes: int = 1
    ) -> tuple[dict[tuple[str, str], float], dict[str, int] | None]:
        """The current spot price per (zone, type) and a 0..10 score per zone for ``nodes`` instances there (None:
        no scores) that order spot candidates; empty when the cloud will not say."""
        ...

    async def run_instance(
        self, spec: JobSpec, script: str, candidate: Candidate, gang: GangPlacement | None = None
    ) -> Started:
        """Start one instance of ``candidate`` (with :func:`candidate_token`); its id and private address.
        LaunchError when the cloud did not answer; one of ``refusals`` when it said no. ``gang``: a gang node, placed
        with its job's other nodes (the cloud's placement object, made before the loop)."""
        ...

    async def on_demand_price(self, instance_type: str) -> float | None: ...


@dataclass(frozen=True)
class Handover:
    """The last step of a launch: ``give`` hands the runner its attempt's secret (AWS: its key object; Alibaba: its
    sealed storage token); one of ``failures`` when it could not (``what`` says what, in the launch's error)."""

    give: Callable[[], Awaitable[None]]
    failures: tuple[type[Exception], ...]
    what: str


class LaunchSteps(Protocol):
    """What a cloud supplies to :func:`launch_attempt`: its own steps, nothing of their order."""

    name: str  # the key of the recipe's instance_types

    @property
    def launch_calls(self) -> InstanceCalls:
        """The calls of the launch loop (instance mode)."""
        ...

    @property
    def max_launch_failures(self) -> int | None: ...

    def group_mode(self) -> str | None:
        """Why a gang node cannot launch in the configured mode (a scaling-group mode: its group runs one instance
        and replaces it by itself, while only the bot replaces a gang's lost node); None in instance mode."""
        ...

    async def prepare_launch(self, spec: JobSpec) -> tuple[JobSpec, str]:
        """The spec completed with what only this cloud knows and uploaded where its runner reads it, and the boot
        script that points the runner there; LaunchError when the spec could not be written."""
        ...

    async def place_gang(self, gang: GangPlacement, spec: JobSpec) -> None:
        """The cloud's object that keeps a gang's nodes close (found, or made); LaunchError when it cannot."""
        ...

    async def launch_in_group(
        self,
        spec: JobSpec,
        script: str,
        instance_types: list[str],
        market: Market,
        avoid_zones: Collection[str],
        zone: str | None,
    ) -> Instance:
        """The scaling-group mode's launch (only called where :meth:`group_mode` says one is configured)."""
        ...

    def handover(self, spec: JobSpec, instance: Instance) -> Handover | None:
        """What the runner must be handed once the instance id is known; None: nothing."""
        ...

    async def terminate(self, instance_id: str, job_id: str) -> None: ...


async def launch_attempt(
    cloud: LaunchSteps,
    spec: JobSpec,
    instance_types: list[str],
    market: Market,
    *,
    avoid_zones: Collection[str],
    zone: str | None,
    gang: GangPlacement | None,
) -> Instance:
    """The attempt's instance on ``market`` (see :meth:`bot.cloud.base.CloudProvider.launch`), in the order every
    cloud launches: refusals first, the spec and boot script, the gang's placement, the instance, then its secret (an
    instance that cannot get it is released again)."""
    if not instance_types:
        raise LaunchError(f"the recipe lists no instance types for {cloud.name}")
    group_mode = cloud.group_mode()
    if gang is not None and group_mode is not None:
        raise LaunchError(f"{spec.job_id} is a multi-node job: {group_mode}")
    spec, script = await cloud.prepare_launch(spec)
    if gang is not None:
        await cloud.place_gang(gang, spec)
    if group_mode is not None:
        instance = await cloud.launch_in_group(spec, script, instance_types, market, avoid_zones, zone)
    else:
        instance = await launch_instance(
            cloud.launch_calls,
            spec,
            script,
            instance_types,
            market,
            avoid_zones=avoid_zones,
            zone=zone,
            max_failures=cloud.max_launch_failures,
            gang=gang,
        )
    step = cloud.handover(spec, instance)
    if step is None:
        return instance
    return await hand_over(
        spec, instance, step.give, failures=step.failures, release=cloud.terminate, what=step.what
    )


class Prices(Protocol):
    """What pricing an instance found (not started by this try) takes."""

    async def on_demand_price(self, instance_type: str) -> float | None: ...

    async def spot_price(self, zone: str, instance_type: str) -> float | None: ...


async def priced(
    prices: Prices,
    instance_id: str,
    instance_type: str,
    zone: str,
    market: Market,
    private_ip: str | None = None,
) -> Instance:
    """An instance found (a first try's, or a scaling group's), with the prices it pays now."""
    on_demand = await prices.on_demand_price(instance_type)
    price = await prices.spot_price(zone, instance_type) if market == "spot" else on_demand
    return Instance(instance_id, instance_type, zone, market, price, on_demand, private_ip=private_ip)


async def launch_instance(
    calls: InstanceCalls,
    spec: JobSpec,
    script: str,
    instance_types: list[str],
    market: Market,
    *,
    avoid_zones: Collection[str],
    zone: str | None,
    max_failures: int | None,
    gang: GangPlacement | None = None,
) -> Instance:
    """The attempt's instance on ``market``: the one a first try started, else the first candidate that starts;
    LaunchError naming every failed candidate when none would (``capacity`` True when the market had no room).
    ``gang``: every try places the instance with its job's other nodes."""
    existing = await calls.attempt_instance(spec)
    if existing is not None:  # a launch retried after a crash: the instance the first try started
        log.info("%s attempt %d: %s is up already", spec.job_id, spec.attempt, existing.instance_id)
        return existing
    zones = await calls.zones()
    if zone:  # pinned by the spot authority: there or nowhere
        zones = [zone]
    if market == "spot":
        prices, scores = await calls.spot_signals(instance_types, spec.gang.nodes if spec.gang is not None else 1)
        candidates = order_spot_candidates(zones, instance_types, scores, prices, avoid_zones)
    else:
        candidates = order_on_demand_candidates(zones, instance_types, avoid_zones)
    plan = LaunchPlan(candidates, max_failures=max_failures, classify=calls.classify)
    while (candidate := plan.next()) is not None:
        where = f"{candidate.market} {candidate.instance_type} in {candidate.zone}"
        try:
            started = await calls.run_instance(spec, script, candidate, gang)
        except calls.refusals as exc:
            code, message = calls.refusal(exc)
            kind = plan.failed(candidate, code, message)
            log.info("%s attempt %d: %s failed: %s (%s)", spec.job_id, spec.attempt, where, code, kind)
            continue
        instance_id = started.instance_id
        log.info("%s attempt %d: launched %s (%s)", spec.job_id, spec.attempt, instance_id, where)
        on_demand = await calls.on_demand_price(candidate.instance_type)
        price = candidate.spot_price if candidate.market == "spot" else on_demand
        return Instance(
            instance_id,
            candidate.instance_type,
            candidate.zone,
            candidate.market,
            price,
            on_demand,
            private_ip=started.private_ip,
        )
    raise LaunchError(plan.summary(), capacity=plan.refused, zone=zone, refused_zones=tuple(plan.refused_zones))


async def wait_for_group_instance(
    group: str,
    find: Callable[[], Awaitable[T | None]],
    *,
    failures: tuple[type[Exception], ...],
    last_activity: Callable[[], Awaitable[str]],
    set_to_zero: Callable[[], Awaitable[None]],
    refused: Callable[[str], bool],
    zone: str | None,
    wait_seconds: float,
    poll_seconds: float,
) -> T:
    """A scaling group's new instance (``find``: the group's instance that was not there before, or None), polled
    until ``wait_seconds``; then the group goes back to 0 (no instance nobody tracks may turn up later) and the launch
    fails, a capacity refusal when the group's last activity names a capacity error (``refused``)."""
    deadline = time.monotonic() + wait_seconds
    while True:
        try:
            found = await find()
        except failures as exc:
            log.warning("describing the instances of %s failed: %s", group, exc)
            found = None
        if found is not None:
            return found
        if time.monotonic() >= deadline:
            break
        await asyncio.sleep(poll_seconds)
    why = await last_activity()
    try:
        await set_to_zero()
    except failures as exc:
        log.warning("could not set %s back to 0: %s", group, exc)
    raise LaunchError(
        f"{group} launched no instance within {wait_seconds:g} s" + (f" (last activity: {why})" if why else ""),
        capacity=refused(why),
        zone=zone,
    )


async def hand_over(
    spec: JobSpec,
    instance: Instance,
    give: Callable[[], Awaitable[None]],
    *,
    failures: tuple[type[Exception], ...],
    release: Callable[[str, str], Awaitable[None]],
    what: str,
) -> Instance:
    """``instance``, once ``give`` handed its runner the attempt's secret; when it cannot, the instance is released
    (its runner could never report, or read its spec) and the launch fails, saying what it could not do (``what``:
    "write the report key of …")."""
    try:
        await give()
    except failures as exc:
        log.warning("%s attempt %d: could not %s: %s", spec.job_id, spec.attempt, what, exc)
        try:
            await release(instance.instance_id, spec.job_id)
        except CloudError as again:
            log.warning("could not release %s after that: %s", instance.instance_id, again)
        raise LaunchError(f"could not {what}: {exc}; the instance was released") from exc
    return instance


async def renew(
    write: Callable[[], Awaitable[None]],
    *,
    failures: tuple[type[Exception], ...],
    error: type[CloudError],
    what: str,
) -> None:
    """Rewrite an attempt's storage credentials (bot/storage_renewal.py drives it); ``error`` naming ``what`` when
    the cloud would not."""
    try:
        await write()
    except failures as exc:
        raise error(f"could not renew {what}: {exc}") from exc
    log.info("renewed %s", what)
