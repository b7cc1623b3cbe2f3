"""The cloud-provider port: what the bot asks of a cloud, whichever it is (local, AWS, Alibaba)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

from handlers.jobs import Market
from handlers.messages import CloudEvent
from handlers.reconcile import CloudGroup, CloudInstance
from handlers.spec import JobSpec

CloudEventSink = Callable[[CloudEvent], Awaitable[None]]

_logged_once: set[str] = set()


def log_once(log: logging.Logger, key: str, message: str, *args: object) -> None:
    """Warn of a degraded mode (no placement scores, no price history) once per process, not once per launch."""
    if key not in _logged_once:
        _logged_once.add(key)
        log.warning(message, *args)


class LaunchError(RuntimeError):
    """No capacity, no permission, a bad template: the attempt did not start (the message says why).

    ``capacity``: every try was refused for capacity (the spot policy may try another zone, on-demand, or later);
    ``zone``: the zone the launch was pinned to."""

    def __init__(self, message: str, *, capacity: bool = False, zone: str | None = None) -> None:
        super().__init__(message)
        self.capacity = capacity
        self.zone = zone


@dataclass(frozen=True, slots=True)
class Instance:
    instance_id: str
    instance_type: str
    zone: str
    market: Market
    price_per_hour: float | None
    on_demand_price_per_hour: float | None


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


class CloudProvider(ListsInstances, Protocol):
    name: str  # the key of the recipe's instance_types to use
    notice: Literal["aws", "aliyun", "none"]  # which metadata service the runner should watch

    def checkpoint_uri(self, job_id: str) -> str: ...

    async def launch(
        self,
        spec: JobSpec,
        instance_types: list[str],
        market: Market,
        *,
        avoid_zones: Collection[str] = (),
        zone: str | None = None,
        fallback: bool = True,
    ) -> Instance:
        """Start an instance whose runner runs ``spec`` (preferring zones not in ``avoid_zones``); LaunchError when
        it cannot. ``zone``: there only (the spot policy chose it); ``fallback`` False: no move to on-demand after
        spot capacity errors (the policy decides that)."""
        ...

    async def hourly_price(self, instance_types: list[str], market: Market) -> float | None:
        """The cheapest $/h a launch of these types would pay now (for the spend guard), None if unknown."""
        ...

    async def terminate(self, instance_id: str) -> None: ...

    async def drill(self, instance_id: str) -> str:
        """Start an interruption drill on the instance; returns what was done (e.g. the FIS experiment id)."""
        ...

    async def stop_runner(self, instance_id: str) -> None:
        """Ask the instance's runner to checkpoint and stop."""
        ...

    async def close(self) -> None: ...


class ListsZones(Protocol):
    """What the spot policy asks of a cloud: the zones a spot launch may be pinned to, in preference order."""

    async def spot_zones(self, instance_types: list[str]) -> list[str]: ...
