"""Give the capacity back when the job is done, so nobody pays for an idle GPU.

``aws-instance`` terminates this instance (id from IMDS); ``aws-autoscaling`` sets the job's group to zero,
which also stops a scaling group from replacing the instance, as the Alibaba guide recommends for ESS. The AWS
SDK is loaded here, when a release is asked, not when the runner starts.
"""

from __future__ import annotations

import logging

from handlers.spec import ReleaseAwsAutoScaling, ReleaseAwsInstance

log = logging.getLogger(__name__)


async def release_capacity(
    release: ReleaseAwsInstance | ReleaseAwsAutoScaling | None, instance_id: str | None
) -> str | None:
    """Release as the spec asks; returns what was done (for the log), or None when nothing was asked."""
    if release is None:
        return None
    from aiobotocore.session import get_session

    session = get_session()
    if isinstance(release, ReleaseAwsAutoScaling):
        async with session.create_client("autoscaling") as client:
            await client.update_auto_scaling_group(AutoScalingGroupName=release.group, MinSize=0, DesiredCapacity=0)
        return f"set Auto Scaling group {release.group} to desired capacity 0"
    if isinstance(release, ReleaseAwsInstance):
        if not instance_id:
            raise RuntimeError("cannot terminate this instance: instance metadata gave no instance id")
        async with session.create_client("ec2") as client:
            await client.terminate_instances(InstanceIds=[instance_id])
        return f"terminated instance {instance_id}"
    return None
