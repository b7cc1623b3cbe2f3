"""AWS: EC2 Spot instances (or one Auto Scaling group per job) that run the runner from a prebuilt image.

A launch uploads the attempt's spec to S3 first, then starts an instance whose user-data only points the
runner's systemd unit at that object (the image carries the runner; nothing is installed at boot); once the
instance id is known, the attempt's report key goes to the one object that instance may read
(:mod:`handlers.attempt_keys`), deleted again when the instance is released. With a runner storage role that
object also carries the attempt's storage session, limited to the job's own prefix (:mod:`handlers.storage_sessions`)
and rewritten before it expires (:meth:`AwsCloud.renew_storage_credentials`, driven by bot/storage_renewal.py). The zone
and the market come from the spot authority (:mod:`handlers.spot`); within a launch the (zone, type) order comes
from the pure :mod:`handlers.spot.zones` over spot placement scores and spot prices, and capacity errors move on
to the next candidate of the same market until ``max_launch_failures`` of them in one region, then on to the next
region's: once every region refused, the launch reports a capacity refusal and the authority chooses again (another
zone or region, on-demand, or waiting). The market never changes here.

Launches may go to several regions (``aws.regions``), each with its own parts (:mod:`bot.cloud.aws.regions`); the
bucket, the report topic and the bot stay in the home region (``aws.region``), and a runner anywhere reaches the
bucket at the home region's endpoint.
Interrupt tests are AWS FIS experiments (``aws:ec2:send-spot-instance-interruptions``); a stop is a control object the
runner polls.

This module only composes the parts of the package, one idea each: settings, clients (handed out wrapped by the one
mapping of botocore's errors, errors), zones and subnets (zones), prices (pricing), placement scores across regions
(scores), EC2 instances (instances), the Auto Scaling mode (autoscaling), FIS (fis), the S3 objects (objects) and the
regions (regions), and supplies the launch's steps; the launch itself is :mod:`bot.cloud.launching`.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal

from bot.checks.result import Check
from bot.cloud.aws.autoscaling import GROUP_TAG, group_name
from bot.cloud.aws.clients import AwsClients, not_done, tags_of
from bot.cloud.aws.instances import user_data_script
from bot.cloud.aws.objects import KEY_FAILURES, AwsObjects
from bot.cloud.aws.probe import AwsProbe
from bot.cloud.aws.regions import AcrossRegions, AwsRegion, first, open_region
from bot.cloud.aws.scores import AwsScores
from bot.cloud.aws.settings import AwsSettings
from bot.cloud.base import (
    ChecksSetup,
    CloudProvider,
    GangPlacement,
    Instance,
    LaunchError,
    RegroupsGangs,
    SetupScope,
    SpansRegions,
)
from bot.cloud.launching import Handover, LaunchSteps, check_owner, launch_attempt, renew
from bot.errors import CloudError, CloudRefused, CloudUnavailable, ConfigError
from handlers.aws_events import SPOT_NOTICE_LEAD
from handlers.jobs import Market
from handlers.notes import InterruptTestResult
from handlers.reconcile import CloudGroup, CloudInstance
from handlers.report_keys import ReportKeys
from handlers.spec import JobSpec, RegroupControl, SaveControl
from handlers.spot.zones import score_availability

log = logging.getLogger(__name__)


class AwsCloud:
    name = "aws"
    notice: Literal["aws", "aliyun", "none"] = "aws"
    notice_seconds = SPOT_NOTICE_LEAD.total_seconds()

    def __init__(self, settings: AwsSettings, *, report_keys: ReportKeys | None = None) -> None:
        self.settings = settings  # (cloud events arrive through EventBridge -> SQS / SNS, not from here)
        # Each attempt's own report key goes into a key object only its instance may read (written once the
        # instance id is known), never into the spec (every runner reads every spec) nor user data (every process on
        # the instance reads that from IMDS).
        self.report_keys = report_keys
        self.clients = AwsClients(settings)  # the home region's: S3, STS, SNS, SQS, IAM, placement scores
        self.home_region = self.clients.region or ""  # the bucket's (empty: no region found; the check says so)
        self.transfer_price_per_gb = settings.transfer_price_per_gb
        launch_regions = settings.launch_regions(self.home_region)
        for name, launch in launch_regions.items():
            where = f"aws.regions.{name}" if settings.regions else "aws"
            if report_keys is not None and launch.runner_role_id is None:
                raise ConfigError(
                    f"{where}.runner_role_id is not set: the runner stack's output RunnerRoleId (each attempt's report "
                    "key is readable only by its instance, named <role id>:<instance id>)"
                )
            if settings.runner_storage_role_arn is not None and (report_keys is None or launch.runner_role_id is None):
                raise ConfigError(
                    f"aws.runner_storage_role_arn needs report keys and {where}.runner_role_id: the storage "
                    "credentials travel in each attempt's key object"
                )
        self.regions: dict[str, AwsRegion] = {
            name: open_region(name, settings.bound_to(name, launch), self.clients, report_keys)
            for name, launch in launch_regions.items()
        }
        self.objects: AwsObjects = first(self.regions).objects  # the bucket's objects (spec, control) are the same
        self.scores = AwsScores(self.clients, {name: region.zones for name, region in self.regions.items()})
        self._instance_regions: dict[str, AwsRegion] = {}  # instance id -> its region, from its launch or a listing
        self._calls = AcrossRegions(self.regions, self.scores, self._boot_script, self._remember)

    # -- where things live --------------------------------------------------------------------------------

    def checkpoint_uri(self, job_id: str) -> str:
        return f"s3://{self.settings.bucket}/{self.settings.prefix}{job_id}/"

    def spec_key(self, job_id: str, attempt: int) -> str:
        return self.objects.spec_key(job_id, attempt)

    def control_key(self, job_id: str, attempt: int) -> str:
        """The runner's control object, relative to the bucket (the runner reads it relative to its checkpoints)."""
        return self.objects.control_key(job_id, attempt)

    def key_prefix_uri(self) -> str | None:
        """Where the runners find their keys (the spec's ``report_key_from``): the runner appends its instance id.
        None where the launch regions' runner roles differ (each instance's user data then says its region's)."""
        prefixes = {region.objects.key_prefix_uri() for region in self.regions.values()}
        return prefixes.pop() if len(prefixes) == 1 else None

    async def release_gang_placement(self, job_id: str) -> None:
        """Delete the job's cluster placement group in every launch region (gone, or never made: fine; CloudError
        while a node of it is still shutting down, so the caller tries again)."""
        for region in self.regions.values():
            await region.gangs.release(job_id)

    # -- regions ------------------------------------------------------------------------------------------

    def _remember(self, instance_id: str, region: AwsRegion) -> None:
        self._instance_regions[instance_id] = region

    async def _find(self, instance_id: str) -> tuple[AwsRegion, dict[str, Any]] | None:
        """The instance's region and EC2's description of it: the region remembered from its launch or a listing,
        else each launch region asked in turn; None where none has it."""
        known = self._instance_regions.get(instance_id)
        if known is not None:
            found = await known.instances.describe(instance_id)
            if found is not None:
                return known, found
        for region in self.regions.values():
            if region is known:
                continue
            found = await region.instances.describe(instance_id)
            if found is not None:
                self._remember(instance_id, region)
                return region, found
        return None

    async def _job_of(self, instance_id: str) -> tuple[AwsRegion, dict[str, Any], str, int]:
        """The instance's region, description, job id and attempt (from its tags); CloudError where no region has
        it, or it is not one of ours."""
        found = await self._find(instance_id)
        if found is None:
            raise CloudError(f"instance {instance_id} does not exist in {', '.join(self.regions) or 'this region'}")
        region, instance = found
        _, job_id, attempt = await region.instances.job_of(instance_id)
        return region, instance, job_id, attempt

    # -- launch ---------------------------------------------------------------------------------------------

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
        """Start the attempt's instance on ``market``; LaunchError naming every failed candidate when none would
        start (``capacity`` True when the market had no room: the spot authority chooses again).

        ``avoid_zones``: zones where this job was just reclaimed or failed (the bot passes the zones of the
        job's previous attempts); they are tried last. ``zone``: there only. ``gang``: a gang node, launched into
        the job's cluster placement group (made here on the gang's first launch), with an EFA interface where asked
        for and the type has one (:mod:`bot.cloud.aws.placement`).

        Auto Scaling mode refuses gangs (LaunchError): its group per job holds at most one instance and replaces
        it by itself, while a gang is N attempts whose lost node only the bot replaces (in the same group and
        zone, then a regroup of the survivors); a group doing its own replacing would race that. Gangs launch in
        instance mode.
        """
        return await launch_attempt(self, spec, instance_types, market, avoid_zones=avoid_zones, zone=zone, gang=gang)

    # the steps of the launch (bot.cloud.launching.LaunchSteps)

    @property
    def launch_calls(self) -> AcrossRegions:
        return self._calls

    @property
    def max_launch_failures(self) -> int | None:
        return self.settings.max_launch_failures

    def group_mode(self) -> str | None:
        if self.settings.mode != "autoscaling":
            return None
        return "aws.mode autoscaling launches one instance per job, so gangs need aws.mode instance"

    async def prepare_launch(self, spec: JobSpec) -> tuple[JobSpec, str]:
        spec = self._complete_spec(spec)
        try:
            await self.objects.upload_spec(spec)
        except (CloudRefused, CloudUnavailable) as exc:
            raise LaunchError(f"could not upload the spec of {spec.job_id} attempt {spec.attempt}: {exc}") from exc
        return spec, self._boot_script(spec, first(self.regions))

    def _boot_script(self, spec: JobSpec, region: AwsRegion) -> str:
        """The user data of ``spec``'s attempt in ``region``: its spec object and that region's key objects, in the
        home region's bucket, which the runner reaches at the home region's endpoint."""
        spec_uri = self.objects.uri(self.objects.spec_key(spec.job_id, spec.attempt))
        return user_data_script(spec_uri, self.settings, self.home_region, region.objects.key_prefix_uri())

    async def place_gang(self, gang: GangPlacement, spec: JobSpec) -> None:
        """Nothing yet: the job's placement group is made in the region each node's try goes to
        (:meth:`bot.cloud.aws.regions.AcrossRegions.run_instance`)."""

    async def launch_in_group(
        self,
        spec: JobSpec,
        script: str,
        instance_types: list[str],
        market: Market,
        avoid_zones: Collection[str],
        zone: str | None,
    ) -> Instance:
        """The job's group in the chosen zone's region (else the preferred region); its groups in the other regions
        go to 0 first, so an older attempt's group does not replace its instance beside the new one."""
        region = self._calls.region(zone) if zone else first(self.regions)
        for other in self.regions.values():
            if other is not region:
                try:
                    await other.groups.release_group(group_name(spec.job_id))
                except CloudError as exc:  # said, not fatal: the launch here goes on
                    log.warning("could not set %s in %s to 0: %s", group_name(spec.job_id), other.name, exc)
        instance = await region.groups.launch(
            spec, self._boot_script(spec, region), instance_types, market, avoid_zones, zone
        )
        self._remember(instance.instance_id, region)
        return instance

    def handover(self, spec: JobSpec, instance: Instance) -> Handover:
        """The key object, written as soon as the instance id is known, before its runner can have booted; a
        replacement an Auto Scaling group starts by itself later gets none (its runner cannot report, and the bot
        relaunches the attempt in any case)."""
        region = self._instance_regions.get(instance.instance_id) or self._calls.region(instance.zone)
        objects = region.objects
        return Handover(
            lambda: objects.write_key(spec.job_id, spec.attempt, spec.key_salt, instance.instance_id),
            KEY_FAILURES,
            f"write the report key of {spec.job_id} attempt {spec.attempt} for {instance.instance_id} "
            f"(s3://{self.settings.bucket}/attempt-keys/…)",
        )

    def _complete_spec(self, spec: JobSpec) -> JobSpec:
        """What only the AWS side knows: the SNS report topic, and where the runner finds the report key it signs
        those reports with (not the key itself). The spec asks the runner for no release of its own: the bot ends
        the instance (or empties the group) on completion, and a runner's role may end or scale nothing, since an
        instance role cannot be limited to its own instance and would reach every other job's."""
        update: dict[str, Any] = {}
        topic = self.settings.report_topic_arn
        if topic and f"sns:{topic}" not in spec.report:
            update["report"] = [*spec.report, f"sns:{topic}"]
        where = self.key_prefix_uri()
        if where is not None and spec.report_key_from is None:
            update["report_key_from"] = where
        return spec.model_copy(update=update) if update else spec

    # -- the attempt's storage session ----------------------------------------------------------------------

    @property
    def renews_storage(self) -> bool:
        """Whether runners get per-attempt storage sessions (which then need rewriting before they expire)."""
        return self.objects.renews_storage

    async def renew_storage_credentials(self, job_id: str, attempt: int, instance_id: str, *, key_salt: str) -> None:
        """Rewrite the attempt's key object with a fresh storage session (bot/storage_renewal.py calls this for every
        live attempt well before the last one expires). CloudError when STS or S3 would not."""
        if not self.renews_storage:
            return
        found = await self._find(instance_id)
        objects = found[0].objects if found is not None else self.objects
        await renew(
            lambda: objects.write_key(job_id, attempt, key_salt, instance_id),
            failures=KEY_FAILURES,
            error=CloudError,
            what=f"the storage credentials of {job_id} attempt {attempt} on {instance_id}",
        )

    async def drop_storage_credentials(self, instance_id: str) -> None:
        """The key object of an attempt that ended while its credentials were being renewed goes again."""
        await self._delete_key(instance_id, self._instance_regions.get(instance_id))

    async def _delete_key(self, instance_id: str, region: AwsRegion | None) -> None:
        """The instance's key object, named after its region's runner role (unknown region: every region's name)."""
        for objects in {id(r.objects): r.objects for r in ([region] if region else self.regions.values())}.values():
            await objects.delete_key(instance_id)

    # -- prices and zones -----------------------------------------------------------------------------------

    async def on_demand_price(self, instance_type: str) -> float | None:
        return await first(self.regions).pricing.on_demand_price(instance_type)

    async def hourly_price(self, instance_types: list[str], market: Market) -> float | None:
        """Spot: the lowest current price of these types in the zones of every launch region; on-demand: the lowest
        list price."""
        if market == "spot":
            prices = await self._calls.spot_prices(instance_types)
            if prices:
                return min(prices.values())
        return await first(self.regions).pricing.hourly_price(instance_types, "on-demand")

    async def zone_availability(self, instance_types: list[str], nodes: int = 1) -> dict[str, float]:
        """The live signal the spot authority weighs: each zone's spot placement score / 10 for ``nodes``
        instances in one zone, over every launch region (one call for all; empty: no signal)."""
        return score_availability(await self.scores.placement_scores(instance_types, nodes) or {})

    async def spot_zones(self, instance_types: list[str]) -> list[str]:
        """The zones a launch may be pinned to (the spot policy's choice), in preference order: the home region's
        first, then the other launch regions' in their configured order."""
        return await self._calls.zones()

    # -- instances and groups after launch ------------------------------------------------------------------

    async def list_instances(self) -> list[CloudInstance]:
        """Every instance tagged ``finetune:job`` in every launch region, whatever its state, for reconciliation."""
        found: list[CloudInstance] = []
        for region in self.regions.values():
            listed = await region.instances.list_instances()
            for instance in listed:
                self._remember(instance.instance_id, region)
            found.extend(listed)
        return found

    async def list_groups(self) -> list[CloudGroup]:
        """Every Auto Scaling group tagged ``finetune:job`` in every launch region, for reconciliation."""
        return [group for region in self.regions.values() for group in await region.groups.list_groups()]

    async def release_group(self, name: str) -> None:
        """Set the group to 0 in every launch region (gone already: fine)."""
        for region in self.regions.values():
            await region.groups.release_group(name)

    async def terminate(self, instance_id: str, job_id: str) -> None:
        """Terminate the instance (a missing one is fine); an Auto Scaling instance's group goes to 0 first,
        so the group does not replace it. One not tagged ``finetune:job=<job_id>`` is never touched
        (ForeignInstance)."""
        found = await self._find(instance_id)
        if found is None:
            await self._delete_key(instance_id, None)
            return
        region, instance = found
        tags = tags_of(instance)
        check_owner(tags, instance_id, job_id)
        await self._delete_key(instance_id, region)  # first: an instance that ends here needs it no more
        group = tags.get(GROUP_TAG)
        if group:
            await region.groups.set_to_zero(group)
        await region.instances.terminate(instance_id)

    async def stop_runner(self, instance_id: str) -> None:
        """Ask the runner to checkpoint and stop by writing :class:`~handlers.spec.StopControl` to
        ``<prefix><job>/control/attempt-<n>.json``, the control object the runner polls.

        Not SSM Run Command: that needs the SSM agent and the AmazonSSMManagedInstanceCore role on the
        instance, and has no effect in moto. The control object needs only the S3 access the runner already
        has for checkpoints, and works the same on Alibaba OSS.
        """
        _, _, job_id, attempt = await self._job_of(instance_id)
        try:
            await self.objects.put_stop(job_id, attempt)
        except (CloudRefused, CloudUnavailable) as exc:
            raise not_done(exc, f"could not write the stop request of {instance_id}: {exc}") from exc

    async def save_runner(self, instance_id: str, at: datetime) -> None:
        """Ask the runner for a fresh checkpoint, training on: :class:`~handlers.spec.SaveControl` in its control
        object on S3 (the runner sees a rebalance recommendation itself; this is for a signal only the bot heard)."""
        _, _, job_id, attempt = await self._job_of(instance_id)
        try:
            await self.objects.put_control(job_id, attempt, SaveControl(at=at))
        except (CloudRefused, CloudUnavailable) as exc:
            raise not_done(exc, f"could not write the save request of {instance_id}: {exc}") from exc

    async def write_node_control(
        self, job_id: str, attempt: int, generation: int, node_rank: int, control: RegroupControl
    ) -> None:
        """A gang node's regroup, in its own control object on S3 (``<prefix><job>/control/attempt-<n>/generation-<g>/
        node-<k>.json``, under the bot role's grant for ``jobs/*/control/*``), where its runner polls. Only for an
        attempt with a live instance tagged for it, as a stop goes only to an instance tagged for its job: CloudError
        (nothing written) otherwise."""
        found = None
        try:
            for region in self.regions.values():
                found = await region.instances.live_instance(job_id, attempt)
                if found is not None:
                    break
        except (CloudRefused, CloudUnavailable) as exc:
            raise not_done(exc, f"could not look up the instance of {job_id} attempt {attempt}: {exc}") from exc
        if found is None:
            raise CloudError(f"no live instance is tagged for {job_id} attempt {attempt}: no control object written")
        try:
            await self.objects.put_node_control(job_id, attempt, generation, node_rank, control)
        except (CloudRefused, CloudUnavailable) as exc:
            raise not_done(exc, f"could not write the regroup of {job_id} attempt {attempt}: {exc}") from exc

    @property
    def launches_ahead(self) -> bool:
        """Instance mode starts a job's next instance beside its current one; Auto Scaling mode's group per job holds
        one, and a launch sets it to 0 first (the current instance would go): there a switch stops first."""
        return self.settings.mode != "autoscaling"

    async def hand_over(self, job_id: str, attempt: int) -> None:
        """Go, to the runner of ``attempt`` launched ahead of a switch of market: ``<prefix><job>/control/
        attempt-<n>.json``, where it waits (under the bot role's grant for ``jobs/*/control/*``)."""
        try:
            await self.objects.put_go(job_id, attempt)
        except (CloudRefused, CloudUnavailable) as exc:
            raise not_done(exc, f"could not write the go of {job_id} attempt {attempt}: {exc}") from exc

    async def interrupt_test(self, instance_id: str) -> InterruptTestResult:
        """A real spot interruption through AWS FIS in the instance's region (:mod:`bot.cloud.aws.fis`); the
        interruption comes from EC2."""
        first(self.regions).interrupt_tests.role()  # not set up: say so before looking anything up
        region, instance, job_id, _ = await self._job_of(instance_id)
        return await region.interrupt_tests.interrupt(instance_id, instance, job_id)

    async def check_setup(self, scope: SetupScope) -> list[Check]:
        """Region, credentials and dry runs of what the bot calls, the launch in each region
        (:mod:`bot.cloud.aws.probe`)."""
        launches = [(r.name, r.settings, r.clients, r.instances) for r in self.regions.values()]
        return await AwsProbe(self.settings, self.clients, launches).checks(scope)

    async def close(self) -> None:
        for region in self.regions.values():
            if region.clients is not self.clients:
                await region.clients.close()
        await self.clients.close()


if TYPE_CHECKING:  # AwsCloud must stay a CloudProvider (mypy checks this line)

    def _is_provider(cloud: AwsCloud) -> CloudProvider:
        return cloud

    def _regroups(cloud: AwsCloud) -> RegroupsGangs:
        return cloud

    def _launches(cloud: AwsCloud) -> LaunchSteps:
        return cloud

    def _checks_setup(cloud: AwsCloud) -> ChecksSetup:
        return cloud

    def _spans_regions(cloud: AwsCloud) -> SpansRegions:
        return cloud
