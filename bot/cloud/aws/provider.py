"""AWS: EC2 Spot instances (or one Auto Scaling group per job) that run the runner from a prebuilt image.

A launch uploads the attempt's spec to S3 first, then starts an instance whose user-data only points the
runner's systemd unit at that object (the image carries the runner; nothing is installed at boot); once the
instance id is known, the attempt's report key goes to the one object that instance may read
(:mod:`handlers.attempt_keys`), deleted again when the instance is released. With a runner storage role that
object also carries the attempt's storage session, limited to the job's own prefix (:mod:`handlers.storage_sessions`)
and rewritten before it expires (:meth:`AwsCloud.renew_storage_credentials`, driven by bot/storage_renewal.py). The zone
and the market come from the spot authority (:mod:`handlers.spot`); within a launch the (zone, type) order comes
from the pure :mod:`handlers.spot.zones` over spot placement scores and spot prices, and capacity errors move on
to the next candidate of the same market until ``max_launch_failures`` of them: the launch then reports a capacity
refusal and the authority chooses again (another zone, on-demand, or waiting). The market never changes here.
Interrupt tests are AWS FIS experiments (``aws:ec2:send-spot-instance-interruptions``); a stop is a control object the
runner polls.

This module only composes the parts of the package, one idea each: settings, clients (handed out wrapped by the one
mapping of botocore's errors, errors), zones and subnets (zones), prices and placement scores (pricing), EC2 instances
(instances), the Auto Scaling mode (autoscaling), FIS (fis) and the S3 objects (objects), and supplies the launch's
steps; the launch itself is :mod:`bot.cloud.launching`.
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal

from bot.checks.result import Check
from bot.cloud.aws.autoscaling import GROUP_TAG, AwsGroups
from bot.cloud.aws.clients import AwsClients, not_done, tags_of
from bot.cloud.aws.fis import AwsFis
from bot.cloud.aws.instances import AwsInstances, user_data_script
from bot.cloud.aws.objects import KEY_FAILURES, AwsObjects
from bot.cloud.aws.placement import AwsPlacement
from bot.cloud.aws.pricing import AwsPricing
from bot.cloud.aws.probe import AwsProbe
from bot.cloud.aws.settings import AwsSettings
from bot.cloud.aws.zones import AwsZones
from bot.cloud.base import ChecksSetup, CloudProvider, GangPlacement, Instance, LaunchError, RegroupsGangs, SetupScope
from bot.cloud.launching import Handover, LaunchSteps, check_owner, launch_attempt, renew
from bot.errors import CloudError, CloudRefused, CloudUnavailable, ConfigError
from handlers.jobs import Market
from handlers.notes import InterruptTestResult
from handlers.reconcile import CloudGroup, CloudInstance
from handlers.report_keys import ReportKeys
from handlers.spec import JobSpec, RegroupControl, SaveControl


class AwsCloud:
    name = "aws"
    notice: Literal["aws", "aliyun", "none"] = "aws"

    def __init__(self, settings: AwsSettings, *, report_keys: ReportKeys | None = None) -> None:
        self.settings = settings  # (cloud events arrive through EventBridge -> SQS / SNS, not from here)
        # Each attempt's own report key goes into a key object only its instance may read (written once the
        # instance id is known), never into the spec (every runner reads every spec) nor user data (every process on
        # the instance reads that from IMDS).
        if report_keys is not None and settings.runner_role_id is None:
            raise ConfigError(
                "aws.runner_role_id is not set: the runner stack's output RunnerRoleId (each attempt's report key is "
                "readable only by its instance, named <role id>:<instance id>)"
            )
        if settings.runner_storage_role_arn is not None and (report_keys is None or settings.runner_role_id is None):
            raise ConfigError(
                "aws.runner_storage_role_arn needs report keys and aws.runner_role_id: the storage credentials travel "
                "in each attempt's key object"
            )
        self.report_keys = report_keys
        self.clients = AwsClients(settings)
        self.region = self.clients.region
        self.zones = AwsZones(settings, self.clients)
        self.pricing = AwsPricing(settings, self.clients, self.zones)
        self.gangs = AwsPlacement(self.clients)
        self.instances = AwsInstances(settings, self.clients, self.zones, self.pricing, self.gangs)
        self.groups = AwsGroups(settings, self.clients, self.zones, self.pricing, self.instances)
        self.fis_interrupt_tests = AwsFis(settings, self.clients)
        self.objects = AwsObjects(settings, self.clients, report_keys)

    # -- where things live --------------------------------------------------------------------------------

    @property
    def home_region(self) -> str:
        """The bucket's region (bot.cloud.base.SpansRegions); empty when only botocore's own chain knows it."""
        return self.region or ""

    @property
    def transfer_price_per_gb(self) -> float:
        return self.settings.transfer_price_per_gb

    def checkpoint_uri(self, job_id: str) -> str:
        return f"s3://{self.settings.bucket}/{self.settings.prefix}{job_id}/"

    def spec_key(self, job_id: str, attempt: int) -> str:
        return self.objects.spec_key(job_id, attempt)

    def control_key(self, job_id: str, attempt: int) -> str:
        """The runner's control object, relative to the bucket (the runner reads it relative to its checkpoints)."""
        return self.objects.control_key(job_id, attempt)

    def key_prefix_uri(self) -> str | None:
        """Where the runners find their keys (the spec's ``report_key_from``): the runner appends its instance id."""
        return self.objects.key_prefix_uri()

    async def release_gang_placement(self, job_id: str) -> None:
        """Delete the job's cluster placement group (gone, or never made: fine; CloudError while a node of it is
        still shutting down, so the caller tries again)."""
        await self.gangs.release(job_id)

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
        return await launch_attempt(
            self, spec, instance_types, market, avoid_zones=avoid_zones, zone=zone, gang=gang
        )

    # the steps of the launch (bot.cloud.launching.LaunchSteps)

    @property
    def launch_calls(self) -> AwsInstances:
        return self.instances

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
            spec_uri = await self.objects.upload_spec(spec)
        except (CloudRefused, CloudUnavailable) as exc:
            raise LaunchError(f"could not upload the spec of {spec.job_id} attempt {spec.attempt}: {exc}") from exc
        return spec, user_data_script(spec_uri, self.settings, self.region, self.key_prefix_uri())

    async def place_gang(self, gang: GangPlacement, spec: JobSpec) -> None:
        await self.gangs.ensure_group(gang.job_id)

    async def launch_in_group(
        self,
        spec: JobSpec,
        script: str,
        instance_types: list[str],
        market: Market,
        avoid_zones: Collection[str],
        zone: str | None,
    ) -> Instance:
        return await self.groups.launch(spec, script, instance_types, market, avoid_zones, zone)

    def handover(self, spec: JobSpec, instance: Instance) -> Handover:
        """The key object, written as soon as the instance id is known, before its runner can have booted; a
        replacement an Auto Scaling group starts by itself later gets none (its runner cannot report, and the bot
        relaunches the attempt in any case)."""
        return Handover(
            lambda: self.objects.write_key(spec.job_id, spec.attempt, spec.key_salt, instance.instance_id),
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
        await renew(
            lambda: self.objects.write_key(job_id, attempt, key_salt, instance_id),
            failures=KEY_FAILURES,
            error=CloudError,
            what=f"the storage credentials of {job_id} attempt {attempt} on {instance_id}",
        )

    async def drop_storage_credentials(self, instance_id: str) -> None:
        """The key object of an attempt that ended while its credentials were being renewed goes again."""
        await self.objects.delete_key(instance_id)

    # -- prices and zones -----------------------------------------------------------------------------------

    async def on_demand_price(self, instance_type: str) -> float | None:
        return await self.pricing.on_demand_price(instance_type)

    async def hourly_price(self, instance_types: list[str], market: Market) -> float | None:
        """Spot: the lowest current price of these types in our zones; on-demand: the lowest list price."""
        return await self.pricing.hourly_price(instance_types, market)

    async def zone_availability(self, instance_types: list[str], nodes: int = 1) -> dict[str, float]:
        """The live signal the spot authority weighs: each zone's spot placement score / 10 for ``nodes``
        instances in one zone (empty: no signal)."""
        return await self.pricing.zone_availability(instance_types, nodes)

    async def spot_zones(self, instance_types: list[str]) -> list[str]:
        """The zones a launch may be pinned to (the spot policy's choice), in preference order."""
        return await self.zones.zones()

    # -- instances and groups after launch ------------------------------------------------------------------

    async def list_instances(self) -> list[CloudInstance]:
        """Every instance tagged ``finetune:job`` in the region, whatever its state, for reconciliation."""
        return await self.instances.list_instances()

    async def list_groups(self) -> list[CloudGroup]:
        """Every Auto Scaling group tagged ``finetune:job``, for reconciliation."""
        return await self.groups.list_groups()

    async def release_group(self, name: str) -> None:
        """Set the group to 0 (gone already: fine)."""
        await self.groups.release_group(name)

    async def terminate(self, instance_id: str, job_id: str) -> None:
        """Terminate the instance (a missing one is fine); an Auto Scaling instance's group goes to 0 first,
        so the group does not replace it. One not tagged ``finetune:job=<job_id>`` is never touched
        (ForeignInstance)."""
        instance = await self.instances.describe(instance_id)
        if instance is None:
            await self.objects.delete_key(instance_id)
            return
        tags = tags_of(instance)
        check_owner(tags, instance_id, job_id)
        await self.objects.delete_key(instance_id)  # first: an instance that ends here needs it no more
        group = tags.get(GROUP_TAG)
        if group:
            await self.groups.set_to_zero(group)
        await self.instances.terminate(instance_id)

    async def stop_runner(self, instance_id: str) -> None:
        """Ask the runner to checkpoint and stop by writing :class:`~handlers.spec.StopControl` to
        ``<prefix><job>/control/attempt-<n>.json``, the control object the runner polls.

        Not SSM Run Command: that needs the SSM agent and the AmazonSSMManagedInstanceCore role on the
        instance, and has no effect in moto. The control object needs only the S3 access the runner already
        has for checkpoints, and works the same on Alibaba OSS.
        """
        _, job_id, attempt = await self.instances.job_of(instance_id)
        try:
            await self.objects.put_stop(job_id, attempt)
        except (CloudRefused, CloudUnavailable) as exc:
            raise not_done(exc, f"could not write the stop request of {instance_id}: {exc}") from exc

    async def save_runner(self, instance_id: str, at: datetime) -> None:
        """Ask the runner for a fresh checkpoint, training on: :class:`~handlers.spec.SaveControl` in its control
        object on S3 (the runner sees a rebalance recommendation itself; this is for a signal only the bot heard)."""
        _, job_id, attempt = await self.instances.job_of(instance_id)
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
        try:
            found = await self.instances.live_instance(job_id, attempt)
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
        """A real spot interruption through AWS FIS (:mod:`bot.cloud.aws.fis`); the interruption comes from EC2."""
        self.fis_interrupt_tests.role()  # not set up: say so before looking anything up
        instance, job_id, _ = await self.instances.job_of(instance_id)
        return await self.fis_interrupt_tests.interrupt(instance_id, instance, job_id)

    async def check_setup(self, scope: SetupScope) -> list[Check]:
        """Region, credentials and dry runs of what the bot calls (:mod:`bot.cloud.aws.probe`)."""
        return await AwsProbe(self.settings, self.clients, self.instances).checks(scope)

    async def close(self) -> None:
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
