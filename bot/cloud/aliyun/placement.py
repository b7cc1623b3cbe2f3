"""Where a gang's nodes go on Alibaba Cloud: one zone (the bot pins it) and the job's deployment set.

ECS's deployment set of strategy ``LowLatency`` places its instances close together in the network of one zone
(the nearest thing ECS has to AWS's cluster placement group; its default, ``Availability``, spreads them over
hosts instead, the opposite of what a gang wants). One set per job, ``finetune-<job>``, found by name on each launch
(a node's replacement joins the same set) and made when there is none, with a client token of the launching attempt,
so a request sent again after no answer makes no second set. ECS puts no tags on deployment sets: the name says it
is ours, and only the bot makes sets of that name. Deployment sets are regional: a gang's set is made in the region
its nodes launch in (all in one zone), and on release the set goes from every region (:meth:`AliyunPlacement.release`).
"""

from __future__ import annotations

import logging

from alibabacloud_ecs20140526 import models as ecs_models

from bot.cloud.aliyun.api import AliyunApi
from bot.cloud.base import LaunchError
from bot.cloud.launching import client_token
from bot.errors import CloudError, CloudRefused, CloudUnavailable

log = logging.getLogger(__name__)

STRATEGY = "LowLatency"
_GONE = frozenset({"InvalidDeploymentSetId.NotFound", "InvalidDeploymentSet.NotFound"})


def deployment_set_name(job_id: str) -> str:
    """The job's deployment set (one per job, whatever its attempts and generations)."""
    return f"finetune-{job_id}"


class AliyunPlacement:
    """The job's deployment set: found or made before a gang node's launch, deleted when the job has ended."""

    def __init__(self, regions: list[str], api: AliyunApi) -> None:
        self.regions = regions  # every region a node may launch in, home first
        self.api = api

    async def _find(self, job_id: str, region: str) -> list[str]:
        """The ids of the sets named for this job in ``region`` (normally one)."""
        name = deployment_set_name(job_id)
        request = ecs_models.DescribeDeploymentSetsRequest(region_id=region, deployment_set_name=name)
        reply = await self.api.ecs("describe_deployment_sets", request, region)
        found = reply.get("DeploymentSets", {}).get("DeploymentSet", [])
        return [str(item["DeploymentSetId"]) for item in found if item.get("DeploymentSetName") == name]

    async def ensure_set(self, job_id: str, attempt: int, region: str) -> str:
        """The id of the job's deployment set in ``region``, made if there is none yet. LaunchError when ECS would not
        say or make it: a gang node launched outside it would not be close to the others."""
        name = deployment_set_name(job_id)
        try:
            found = await self._find(job_id, region)
            if found:
                return found[0]
            request = ecs_models.CreateDeploymentSetRequest(
                region_id=region,
                deployment_set_name=name,
                description=f"finetune-bot: the nodes of {job_id}, close together",
                strategy=STRATEGY,
                client_token=client_token("deployment-set", job_id, attempt, region),
            )
            reply = await self.api.ecs("create_deployment_set", request, region)
        except (CloudRefused, CloudUnavailable) as exc:
            raise LaunchError(f"could not find or make the deployment set {name}: {exc}") from exc
        made = str(reply.get("DeploymentSetId") or "")
        if not made:
            raise LaunchError(f"ECS made the deployment set {name} but did not say its id")
        log.info("%s: made the deployment set %s (%s)", job_id, name, made)
        return made

    async def release(self, job_id: str) -> None:
        """Delete the job's deployment set in every region (none, or gone meanwhile: fine). CloudError when ECS would
        not (while a node of it is still being released, say), CloudUnavailable when it did not answer: the caller
        tries again."""
        for region in self.regions:
            await self._release_in(job_id, region)

    async def _release_in(self, job_id: str, region: str) -> None:
        name = deployment_set_name(job_id)
        try:
            for found in await self._find(job_id, region):
                try:
                    await self.api.ecs(
                        "delete_deployment_set",
                        ecs_models.DeleteDeploymentSetRequest(region_id=region, deployment_set_id=found),
                        region,
                    )
                except CloudRefused as exc:
                    if exc.code not in _GONE:
                        raise
                log.info("%s: deleted the deployment set %s (%s)", job_id, name, found)
        except CloudRefused as exc:
            raise CloudError(f"could not delete the deployment set {name}: {exc}") from exc
