"""Where a gang's nodes go on AWS: the job's cluster placement group, and EFA where the instance type has it.

A gang's nodes (one attempt each) launch into ``finetune-<job>``, a placement group of strategy ``cluster`` (one
zone, one network spine: the lowest latency between the nodes that EC2 offers), made on the gang's first launch and
found again on every later one (a node's replacement goes into the same group). With the recipe's ``efa=true`` a
node of an instance type EC2 says has EFA (``DescribeInstanceTypes`` ``NetworkInfo.EfaSupported``) gets its primary
network interface as an EFA interface; a type without EFA launches without one, said once in the log, since the gang
still trains (over TCP), only slower. The group goes when the job has ended (:meth:`AwsPlacement.release`).
"""

from __future__ import annotations

import logging
from typing import Any

from bot.cloud.aws.clients import AwsClients, not_done, reason
from bot.cloud.base import LaunchError, log_once
from bot.cloud.launching import JOB_TAG, MANAGED_TAG
from bot.errors import CloudError, CloudRefused, CloudUnavailable

log = logging.getLogger(__name__)

_EXISTS = frozenset({"InvalidPlacementGroup.Duplicate"})
_GONE = frozenset({"InvalidPlacementGroup.Unknown"})


def placement_group_name(job_id: str) -> str:
    """The job's cluster placement group (one per job, whatever its attempts and generations)."""
    return f"finetune-{job_id}"


def efa_interface(subnet: str | None, security_groups: list[str]) -> dict[str, Any]:
    """The node's primary network interface as an EFA interface (RunInstances' ``NetworkInterfaces`` entry): the
    subnet and security groups move into it, since EC2 refuses them beside ``NetworkInterfaces``."""
    interface: dict[str, Any] = {"DeviceIndex": 0, "InterfaceType": "efa", "DeleteOnTermination": True}
    if subnet:
        interface["SubnetId"] = subnet
    if security_groups:
        interface["Groups"] = list(security_groups)
    return interface


class AwsPlacement:
    """The job's placement group, and which instance types have EFA (asked once per type, then remembered)."""

    def __init__(self, clients: AwsClients) -> None:
        self.clients = clients
        self._efa: dict[str, bool] = {}

    async def ensure_group(self, job_id: str) -> str:
        """The job's cluster placement group, made (tagged as ours) if it is not there yet; its name. LaunchError
        when EC2 would not make it: a gang node launched outside it would not be close to the others."""
        name = placement_group_name(job_id)
        tags = [{"Key": MANAGED_TAG, "Value": "true"}, {"Key": JOB_TAG, "Value": job_id}]
        ec2 = await self.clients.get("ec2")
        try:
            await ec2.create_placement_group(
                GroupName=name,
                Strategy="cluster",
                TagSpecifications=[{"ResourceType": "placement-group", "Tags": tags}],
            )
        except CloudRefused as exc:
            if exc.code in _EXISTS:  # an earlier node of the gang (or a launch tried again) made it
                return name
            raise LaunchError(f"could not make the placement group {name}: {reason(exc)}") from exc
        except CloudUnavailable as exc:
            raise LaunchError(f"EC2 did not answer CreatePlacementGroup for {name}: {exc}") from exc
        log.info("%s: made the cluster placement group %s", job_id, name)
        return name

    async def release(self, job_id: str) -> None:
        """DeletePlacementGroup (one already gone, or never made, is fine). CloudError while EC2 still counts an
        instance in it (``InvalidPlacementGroup.InUse``: a node still shutting down), so the caller tries again."""
        name = placement_group_name(job_id)
        ec2 = await self.clients.get("ec2")
        try:
            await ec2.delete_placement_group(GroupName=name)
        except CloudRefused as exc:
            if exc.code in _GONE:
                return
            raise CloudError(f"could not delete the placement group {name}: {reason(exc)}") from exc
        except CloudUnavailable as exc:
            raise not_done(exc, f"EC2 did not answer DeletePlacementGroup for {name}: {exc}") from exc
        log.info("%s: deleted the placement group %s", job_id, name)

    async def has_efa(self, instance_type: str) -> bool:
        """Whether EC2 says ``instance_type`` supports EFA; a type without it is logged once (the node launches
        without EFA). LaunchError when EC2 will not say (a guess either way would be wrong: an EFA interface on a
        type without it is refused, and none on a type with it is a silently slow gang)."""
        known = self._efa.get(instance_type)
        if known is not None:
            return known
        ec2 = await self.clients.get("ec2")
        try:
            reply = await ec2.describe_instance_types(InstanceTypes=[instance_type])
        except (CloudRefused, CloudUnavailable) as exc:
            raise LaunchError(f"EC2 would not say whether {instance_type} has EFA: {exc}") from exc
        found = reply.get("InstanceTypes") or [{}]
        supported = bool(found[0].get("NetworkInfo", {}).get("EfaSupported", False))
        self._efa[instance_type] = supported
        if not supported:
            log_once(
                log,
                f"no-efa:{instance_type}",
                "%s has no EFA: gang nodes of this type launch without an EFA interface (efa=true asked for one)",
                instance_type,
            )
        return supported
