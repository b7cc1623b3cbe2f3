"""Is the bot ready to work on Alibaba Cloud? The probes of ``finetune-bot check`` (and of ``serve`` at start).

Through the provider's own clients (:mod:`bot.cloud.aliyun.api`, the SDK's errors mapped once by
:mod:`bot.cloud.aliyun.errors`; OSS by :mod:`bot.cloud.aliyun.objects`), asking only what the bot's RAM policy
allows (deploy/aliyun/finetune.ros.yaml, BotPolicy):

- credentials found (a key pair, an STS token, the ECS RAM role of the machine), then ECS ``DescribeRegions``: they
  are accepted, and ``aliyun.region`` (and every region of ``aliyun.regions``) is a region ECS offers. Without
  credentials, or with refused ones, ``serve`` refuses to start;
- instances mode: ``RunInstances`` with ``DryRun=true``, as a launch calls it (image, vSwitch, groups, RAM role, the
  ``finetune:managed`` tag, the spot strategy), in each launch region: ECS answers ``DryRunOperation`` when it would
  have started it.
  Scaling-group mode: ``DescribeScalingGroups`` finds every configured group;
- the OSS bucket: ``GetObject`` of a key under the job prefix that is never written (``NoSuchKey``: the bucket is
  there and the bot may read under the prefix; ``NoSuchBucket``, ``AccessDenied``: not).

Tested against the local fake of the ECS / ESS OpenAPI (tests/aliyun_fakes.py, which checks the requests'
signatures) and moto standing in for OSS; not against Alibaba Cloud itself.
"""

from __future__ import annotations

from alibabacloud_ecs20140526 import models as ecs_models
from alibabacloud_ess20220222 import models as ess_models

from bot.checks.result import Check, failed, passed
from bot.cloud.aliyun.api import AliyunApi
from bot.cloud.aliyun.instances import AliyunInstances
from bot.cloud.aliyun.objects import OssObjects
from bot.cloud.aliyun.settings import AliyunSettings, launch_regions
from bot.cloud.base import SetupScope
from bot.cloud.launching import MANAGED_TAG
from bot.errors import CloudError, CloudRefused, CloudUnavailable

POLICY = "BotPolicy in deploy/aliyun/finetune.ros.yaml"
CREDENTIALS_FIX = (
    "run the bot with an instance RAM role (ALIBABA_CLOUD_ECS_METADATA), or hand it an STS token "
    "(ALIBABA_CLOUD_ACCESS_KEY_ID, ALIBABA_CLOUD_ACCESS_KEY_SECRET, ALIBABA_CLOUD_SECURITY_TOKEN)"
)
REFUSED_CREDENTIALS = ("InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidSecurityToken", "IncompleteSignature")
DENIED = ("Forbidden", "NoPermission")
PROBE_KEY = ".finetune-check"  # under the job prefix, never written


class AliyunProbe:
    def __init__(self, settings: AliyunSettings, api: AliyunApi, instances: AliyunInstances, oss: OssObjects) -> None:
        self.settings = settings
        self.api = api
        self.instances = instances
        self.oss = oss

    async def checks(self, scope: SetupScope) -> list[Check]:
        found = [passed("Alibaba Cloud region", f"{self.settings.region} (from aliyun.region)")]
        try:
            await self.api.credentials()
        except CloudError as exc:
            missing = failed("Alibaba Cloud credentials", f"none found: {exc}", CREDENTIALS_FIX, blocks_start=True)
            return [*found, missing]
        accepted = await self._regions()
        found.append(accepted)
        if not accepted.ok:
            return found
        if self.settings.mode == "scaling-group":
            found.append(await self._groups())
        else:
            regions = launch_regions(self.settings)
            for launch in regions:
                named = "ECS launch (dry run)" if len(regions) == 1 else f"ECS launch in {launch.region} (dry run)"
                found.append(await self._launch(named, launch.zones, scope.instance_types))
        found.append(await self._bucket())
        return found

    async def _regions(self) -> Check:
        name = "Alibaba Cloud credentials"
        try:
            reply = await self.api.ecs("describe_regions", ecs_models.DescribeRegionsRequest())
        except CloudRefused as exc:
            refused = exc.code.startswith(REFUSED_CREDENTIALS)
            fix = CREDENTIALS_FIX if refused else f"the bot's RAM policy needs ecs:DescribeRegions ({POLICY})"
            return failed(name, f"DescribeRegions refused: {exc.code}: {exc.message}", fix, blocks_start=refused)
        except CloudUnavailable as exc:
            return failed(name, f"not checked, ECS did not answer: {exc}", "check the network path to ECS")
        regions = [str(region.get("RegionId")) for region in reply.get("Regions", {}).get("Region", [])]
        offered = f"one of {', '.join(regions[:8])}{'…' if len(regions) > 8 else ''}"
        if self.settings.region not in regions:
            return failed(
                name, f"accepted, but ECS offers no region {self.settings.region}", f"set aliyun.region to {offered}"
            )
        unknown = [region for region in self.settings.regions if region not in regions]
        if unknown:
            fix = f"name regions ECS offers under aliyun.regions ({offered})"
            return failed(name, f"accepted, but ECS offers no region {', '.join(unknown)}", fix)
        return passed(name, f"accepted by ECS ({len(regions)} regions, {self.settings.region} among them)")

    async def _launch(self, name: str, zones: tuple[str, ...], instance_types: tuple[str, ...]) -> Check:
        if not instance_types:
            return failed(name, "no recipe names an Alibaba instance type", "add instance_types.aliyun to a recipe")
        instance_type, zone = instance_types[0], zones[0]
        request = self.instances.launch_request(zone, instance_type, "spot", {MANAGED_TAG: "true"})
        request.dry_run = True
        try:
            reply = await self.api.ecs("run_instances", request, request.region_id)
        except CloudRefused as exc:
            if exc.code == "DryRunOperation":
                return passed(name, f"RunInstances of a preemptible {instance_type} in {zone} would be allowed")
            if exc.code.startswith(DENIED):
                fix = f"the bot's RAM policy needs ecs:RunInstances with the {MANAGED_TAG} tag, ram:PassRole ({POLICY})"
                return failed(name, f"RunInstances denied: {exc.code}: {exc.message}", fix)
            keys = f"aliyun.regions.{request.region_id}" if self.settings.regions else "aliyun"
            fix = f"check {keys}.image_id, .vswitches, .security_group_ids and the recipes' instance types"
            return failed(name, f"RunInstances refused: {exc.code}: {exc.message}", fix)
        except CloudUnavailable as exc:
            return failed(name, f"ECS did not answer: {exc}", "check the network path to ECS")
        started = reply.get("InstanceIdSets", {}).get("InstanceIdSet", [])
        return failed(  # an endpoint that ignores DryRun: say so loudly, it started something
            name,
            f"the ECS endpoint ignored DryRun and started {', '.join(map(str, started)) or 'something'}",
            "release it, and point aliyun.endpoint at ECS",
        )

    async def _groups(self) -> Check:
        name = "Auto Scaling groups"
        wanted = list(self.settings.scaling_groups)
        request = ess_models.DescribeScalingGroupsRequest(region_id=self.settings.region, scaling_group_ids=wanted)
        try:
            reply = await self.api.ess("describe_scaling_groups", request)
        except CloudRefused as exc:
            fix = f"the bot's RAM policy needs ess:DescribeScalingGroups ({POLICY})"
            return failed(name, f"DescribeScalingGroups refused: {exc.code}: {exc.message}", fix)
        except CloudUnavailable as exc:
            return failed(name, f"ESS did not answer: {exc}", "check the network path to Auto Scaling")
        there = {str(group.get("ScalingGroupId")) for group in reply.get("ScalingGroups", [])}
        missing = [group for group in wanted if group not in there]
        if missing:
            fix = "set aliyun.scaling_groups to the stack's groups (deploy/aliyun/finetune.ros.yaml)"
            return failed(name, f"{', '.join(missing)} not found in {self.settings.region}", fix)
        return passed(name, f"{len(wanted)} found (a group launches with its own configuration: no dry run)")

    async def _bucket(self) -> Check:
        bucket = self.settings.bucket
        name = f"OSS bucket {bucket}"
        try:
            await self.oss.found(f"{self.settings.prefix}{PROBE_KEY}")
        except CloudRefused as exc:
            if exc.code == "NoSuchBucket":
                return failed(name, "does not exist", "create it (the runner stack's bucket), or fix aliyun.bucket")
            if exc.code in ("AccessDenied", "403"):
                fix = f"the bot's RAM policy needs oss:GetObject and oss:PutObject under {self.settings.prefix}"
                return failed(name, "access denied", f"{fix} ({POLICY})")
            return failed(name, f"refused: {exc.code}: {exc.message}", "check aliyun.oss_endpoint and aliyun.bucket")
        except CloudError as exc:
            return failed(name, f"OSS did not answer: {exc}", "check aliyun.oss_endpoint and the network path to OSS")
        return passed(name, f"exists, and the bot may read under {self.settings.prefix}")
