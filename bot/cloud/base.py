"""The cloud-provider port: what the bot asks of a cloud, whichever it is (local, AWS, Alibaba)."""

from __future__ import annotations

import logging
from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime
from typing import Literal, Protocol, runtime_checkable

from bot.checks.result import Check
from bot.errors import CloudError as CloudError  # the port's errors, with the port
from bot.errors import ForeignInstance as ForeignInstance
from bot.errors import LaunchError as LaunchError
from handlers.jobs import Market
from handlers.notes import InterruptTestResult
from handlers.reconcile import CloudGroup, CloudInstance
from handlers.spec import JobSpec, RegroupControl

_logged_once: set[str] = set()


def log_once(log: logging.Logger, key: str, message: str, *args: object) -> None:
    """Warn of a degraded mode (no placement scores, no price history) once per process, not once per launch."""
    if key not in _logged_once:
        _logged_once.add(key)
        log.warning(message, *args)


@dataclass(frozen=True, slots=True)
class Instance:
    instance_id: str
    instance_type: str
    zone: str
    market: Market
    price_per_hour: float | None
    on_demand_price_per_hour: float | None
    private_ip: str | None = None  # a gang's other nodes meet this one there (handlers/gang.py); None: unknown
    # The provider's own figure of the launch, request to host booted, where it has one (the local cloud's profile).
    launch_seconds: float | None = None


@dataclass(frozen=True, slots=True)
class GangPlacement:
    """A gang node's launch: its job's nodes go close together in one zone (AWS: the job's cluster placement group;
    Alibaba: its deployment set; the bot pins the zone of every node after the first). ``efa``: EFA interfaces
    where the instance type has them (the recipe's ``efa=true``)."""

    job_id: str
    efa: bool = False


class ListsInstances(Protocol):
    """What reconciliation (:mod:`bot.reconciler`) asks of a cloud: every instance tagged for a job of ours.

    Every cloud implements it (local, AWS, Alibaba Cloud), so it is part of :class:`CloudProvider`.
    """

    async def list_instances(self) -> list[CloudInstance]:
        """Instances tagged ``finetune:job`` (any state the cloud still reports), with their job and attempt."""
        ...


@runtime_checkable
class ListsGroups(Protocol):
    """A cloud that makes scaling groups per job (AWS in Auto Scaling mode): reconciliation lists them too, and
    sets a group of a job that is over (or unknown) to 0. Alibaba's scaling groups are configured, not made per
    job, so it has none of its own to list."""

    async def list_groups(self) -> list[CloudGroup]:
        """Groups tagged ``finetune:job``, with their desired capacity."""
        ...

    async def release_group(self, name: str) -> None:
        """Set the group to 0 (a group already at 0, or gone, is fine)."""
        ...


@runtime_checkable
class SpansRegions(Protocol):
    """A cloud whose launches may go to several regions while its bucket stays in one: its zones, availability and
    launches span every configured region (zone names carry their region: :func:`handlers.regions.region_of`), and a
    runner outside ``home_region`` moves its checkpoint's bytes across regions at ``transfer_price_per_gb``
    (:mod:`handlers.egress`)."""

    @property
    def home_region(self) -> str:
        """The bucket's region (and the topic's, the bot's)."""
        ...

    @property
    def transfer_price_per_gb(self) -> float:
        """What moving a GB between regions costs, in the cloud's price currency."""
        ...


@runtime_checkable
class RenewsStorageCredentials(Protocol):
    """A cloud whose runners hold short storage sessions the bot must rewrite before they expire (AWS with a runner
    storage role, :mod:`handlers.storage_sessions`); bot/storage_renewal.py drives it."""

    @property
    def renews_storage(self) -> bool:
        """Whether it does here (configured): False leaves the renewal loop off."""
        ...

    async def renew_storage_credentials(self, job_id: str, attempt: int, instance_id: str, *, key_salt: str) -> None:
        """Hand the attempt's runner a fresh session (``key_salt``: the attempt's, for its key); CloudError when the
        cloud would not."""
        ...

    async def drop_storage_credentials(self, instance_id: str) -> None:
        """Take back what a renewal wrote for an attempt that ended meanwhile (best effort)."""
        ...


class CloudProvider(ListsInstances, Protocol):
    """Every method raises :class:`CloudError` (:class:`LaunchError` from ``launch``) for what the cloud did not do,
    never an SDK's own exception: each provider maps those at its edge."""

    name: str  # the key of the recipe's instance_types to use
    notice: Literal["aws", "aliyun", "none"]  # which metadata service the runner should watch
    notice_seconds: float  # a spot notice to the reclaim: what a notice-driven commit has (handlers.notice_budget)

    def checkpoint_uri(self, job_id: str) -> str: ...

    async def launch(
        self,
        spec: JobSpec,
        instance_types: list[str],
        market: Market,
        *,
        avoid_zones: Collection[str] = (),
        zone: str | None = None,
        gang: GangPlacement | None = None,
    ) -> Instance:
        """Start an instance on ``market`` whose runner runs ``spec`` (preferring zones not in ``avoid_zones``);
        LaunchError when it cannot (``capacity`` True when the market had no room). ``zone``: there only (the spot
        authority chose it). Never another market: the authority (:mod:`handlers.spot`) chooses again. ``gang``:
        one node of a multi-node job, placed with the job's other nodes."""
        ...

    async def release_gang_placement(self, job_id: str) -> None:
        """Remove what the cloud made to place a gang's nodes together (placement group, deployment set) once the
        job has ended; one already gone, or never made, is fine."""
        ...

    async def hourly_price(self, instance_types: list[str], market: Market) -> float | None:
        """The cheapest $/h a launch of these types would pay now (for the spend guard), None if unknown."""
        ...

    async def terminate(self, instance_id: str, job_id: str) -> None:
        """Release the instance (one already gone is fine). Only an instance tagged for ``job_id``: any other is
        never touched, and :class:`ForeignInstance` says so (a forged report or a stale effect cannot end another
        job's instance)."""
        ...

    async def interrupt_test(self, instance_id: str) -> InterruptTestResult:
        """Start an interrupt-test (a real spot interruption) on the instance; returns what was done, as data."""
        ...

    async def stop_runner(self, instance_id: str) -> None:
        """Ask the instance's runner to checkpoint and stop."""
        ...

    async def close(self) -> None: ...


@runtime_checkable
class HandsOver(Protocol):
    """A cloud that tells a runner launched ahead of a switch of market to go (:class:`~handlers.spec.GoControl` in
    the attempt's control object, where that runner waits)."""

    async def hand_over(self, job_id: str, attempt: int) -> None:
        """Write it (writing it again changes nothing); CloudError when the store would not."""
        ...


@runtime_checkable
class AsksSaves(Protocol):
    """A cloud that asks a runner for a fresh checkpoint without stopping it (:class:`~handlers.spec.SaveControl` in
    the attempt's control object): an early signal only the bot heard (an Alibaba scheduled system event)."""

    async def save_runner(self, instance_id: str, at: datetime) -> None:
        """Write it (writing the same again changes nothing); CloudError when the store would not."""
        ...


def launches_ahead(cloud: object) -> bool:
    """Whether a one-node job on ``cloud`` switches market make-before-break: the cloud tells a runner to go
    (:class:`HandsOver`) and can start a job's next instance beside its current one (``launches_ahead``: not in a
    group mode, whose one group per job would end the current instance to start the next)."""
    return isinstance(cloud, HandsOver) and bool(getattr(cloud, "launches_ahead", False))


@runtime_checkable
class RegroupsGangs(Protocol):
    """A cloud that tells a gang node standing by its place in the next world (:mod:`handlers.gang`): the regroup
    goes in that node's own control object (:func:`handlers.spec.node_control_key`), where its runner polls."""

    async def write_node_control(
        self, job_id: str, attempt: int, generation: int, node_rank: int, control: RegroupControl
    ) -> None:
        """Write it (writing it again changes nothing); CloudError when the store would not."""
        ...


@runtime_checkable
class ReadsTrainerLogs(Protocol):
    """A cloud whose trainers' logs the bot can read (the local cloud's are files on this machine; a cloud
    instance's stays on it)."""

    async def trainer_log(self, job_id: str, attempt: int, lines: int) -> list[str] | None:
        """The last ``lines`` lines the trainer of ``job_id``'s ``attempt`` wrote; None when it wrote no log."""
        ...


@runtime_checkable
class ListsZones(Protocol):
    """What the spot policy asks of a cloud: the zones a spot launch may be pinned to, in preference order
    (local, AWS and Alibaba Cloud all say; a cloud that cannot leaves the choice of zone to its launch)."""

    async def spot_zones(self, instance_types: list[str]) -> list[str]: ...


@runtime_checkable
class ReadsAvailability(Protocol):
    """A cloud that says, live, how likely spot is in each zone (AWS spot placement scores; Alibaba's stock
    status and spot price history): the signal the spot authority weighs (:mod:`handlers.spot.zones`)."""

    async def zone_availability(self, instance_types: list[str], nodes: int = 1) -> dict[str, float]:
        """0..1 per zone name for a job of ``nodes`` instances at once (a gang needs them all in one zone), cached
        by the provider; empty when the cloud gives no signal now."""
        ...


@dataclass(frozen=True, slots=True)
class SetupScope:
    """What a cloud's set-up check looks at beyond its own config section: what the bot launches (the recipes'
    instance types for this cloud) and the event routes configured for it."""

    instance_types: tuple[str, ...] = ()
    queues: tuple[str, ...] = ()  # SQS queue URLs the bot consumes (FINETUNE_SQS_QUEUE_URL)
    queue_topics: tuple[str, ...] = ()  # SNS topics that should feed those queues (events and report topics)
    https_topics: tuple[str, ...] = ()  # SNS topics that push to the bot's HTTPS endpoint (FINETUNE_SNS_TOPICS)


@runtime_checkable
class ChecksSetup(Protocol):
    """A cloud that says whether the bot can do its work there, before the first job (``finetune-bot check``, and
    ``serve`` at start): region, credentials, and dry runs of what the bot will call. Each probe asks the cloud
    only what the bot's own permissions allow, and maps the SDK's errors through the package's errors module."""

    async def check_setup(self, scope: SetupScope) -> list[Check]:
        """One :class:`~bot.checks.result.Check` per thing looked at; a failure that leaves the bot unable to act
        at all (no region, no credentials) ``blocks_start``, and the checks that would only repeat it are left out."""
        ...
