"""The cloud-provider port: what the bot asks of a cloud, whichever it is (local, AWS, Alibaba)."""

from __future__ import annotations

import logging
from collections.abc import Collection
from dataclasses import dataclass
from typing import Literal, Protocol

from bot.errors import CloudError as CloudError  # the port's errors, with the port
from bot.errors import LaunchError as LaunchError
from handlers.jobs import Market
from handlers.reconcile import CloudInstance
from handlers.spec import JobSpec

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


class CloudProvider(Protocol):
    """Every method raises :class:`CloudError` (:class:`LaunchError` from ``launch``) for what the cloud did not do,
    never an SDK's own exception: each provider maps those at its edge."""

    name: str  # the key of the recipe's instance_types to use
    notice: Literal["aws", "aliyun", "none"]  # which metadata service the runner should watch

    def checkpoint_uri(self, job_id: str) -> str: ...

    async def launch(
        self, spec: JobSpec, instance_types: list[str], market: Market, *, avoid_zones: Collection[str] = ()
    ) -> Instance:
        """Start an instance whose runner runs ``spec`` (preferring zones not in ``avoid_zones``); LaunchError when
        it cannot."""
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


class ListsInstances(Protocol):
    """What reconciliation (:mod:`handlers.reconcile`) asks of a cloud: every instance tagged for a job of ours.

    AWS and Alibaba Cloud implement it today; it joins :class:`CloudProvider` once the local cloud does too.
    """

    async def list_instances(self) -> list[CloudInstance]:
        """Instances tagged ``finetune:job`` (any state the cloud still reports), with their job and attempt."""
        ...
