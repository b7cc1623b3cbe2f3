"""Alibaba Cloud: preemptible ECS instances (or a pool of Auto Scaling groups) running the runner from an image.

A launch uploads the attempt's spec to OSS first (its S3-compatible API, virtual-hosted addressing: objects.py),
then starts a preemptible instance whose user-data only points the runner's systemd unit at that object, with the
bucket's *internal* endpoint and the attempt's own report key (never a secret of the bot's; why there: see
:meth:`AliyunCloud.user_data`), and the instance runs in the hardened metadata mode (``HttpTokens=required``).
Two modes:

- ``instances``: ``RunInstances`` with ``SpotStrategy`` ``SpotAsPriceGo`` (or ``SpotWithPriceLimit`` when a price
  limit is configured; ``NoSpot`` for on-demand) over the configured zones and vSwitches, on the market and in the
  zone the spot authority chose (:mod:`handlers.spot`). The order within a launch comes from the pure
  :mod:`handlers.spot.zones` over ``DescribeAvailableResource`` (stock) and ``DescribeSpotPriceHistory`` (zones where
  this job was just reclaimed go last; without either, the configured order); ``OperationDenied.NoStock`` and kin
  move on to the next candidate, and after ``max_launch_failures`` of them the launch reports a capacity refusal:
  the authority chooses again (another zone, on-demand, or waiting). The market never changes here.
- ``scaling-group``: the guide's setup, a multi-zone ESS scaling group (``deploy/aliyun/finetune.ros.yaml``) per
  concurrent job. A launch writes the attempt into the group's scaling configuration (user-data, tags, types, the
  spot strategy of the chosen market) and sets the desired capacity to 1 over the chosen zone's vSwitch (else every
  zone's); ESS replaces a reclaimed instance by itself, in that zone and market.
  Completion or stop sets it back to 0. A group belongs to the job named in its configuration's tags while it has
  capacity; a group at 0 is free.

Regions (``aliyun.regions``): the bucket, the bot and scaling groups stay in the home region (``aliyun.region``);
instances may launch in every configured region, each through its own ECS endpoint, and a runner outside the home
region reaches the bucket at its public endpoint (OSS's internal endpoints answer within their own region only).
What crosses regions is counted at ``aliyun.transfer_price_per_gb`` (:class:`~bot.cloud.base.SpansRegions`).

No FIS on Alibaba Cloud: an interrupt test writes the runner's control object (``{"type": "interrupt-test"…}``)
next to the checkpoints, and releases the instance when the grace period is over, as ECS would reclaim it. A stop is
the same control object with ``{"type": "stop"}``.

With a runner storage role (``aliyun.runner_storage_role_arn``) the instance role reaches no job object: per
attempt the bot assumes that role with an inline policy naming only the job's prefix (STS ``AssumeRole``,
:mod:`handlers.storage_sessions`) and writes the token to ``attempt-keys/<instance id>`` sealed with the attempt's
report key (:mod:`handlers.attempt_keys`), rewrites it before it expires (bot/storage_renewal.py) and deletes it with
the instance.

Every SDK call runs in a worker thread (:mod:`bot.cloud.aliyun.api`). Prices are in the currency of the account's
site (CNY on the China site, USD on the international one), per hour.

This module composes the parts of the package: settings, the API client (api; the SDK's errors mapped once: errors),
prices and stock (pricing), ECS instances (instances), the scaling-group mode (scaling), OSS objects (objects); the
launch is :mod:`bot.cloud.launching`. What stays here: the launch's steps, the spec and user data, the storage token,
interrupt tests and stops.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Literal

from bot.checks.result import Check
from bot.cloud.aliyun.api import AliyunApi
from bot.cloud.aliyun.instances import LIVE_STATUSES, AliyunInstances, tags_of
from bot.cloud.aliyun.objects import OssObjects
from bot.cloud.aliyun.placement import AliyunPlacement
from bot.cloud.aliyun.pricing import AliyunPricing
from bot.cloud.aliyun.probe import AliyunProbe
from bot.cloud.aliyun.scaling import AliyunGroups
from bot.cloud.aliyun.settings import AliyunSettings, candidate_zones, launch_regions
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
from bot.cloud.user_data import runner_boot_script
from bot.errors import CloudError, CloudRefused, CloudUnavailable, ConfigError
from handlers.aliyun_events import NOTICE_LEAD
from handlers.attempt_keys import StorageCredentials, seal, sealed_key_object
from handlers.jobs import Market
from handlers.notes import InterruptTestResult
from handlers.reconcile import CloudInstance
from handlers.report_keys import ReportKeys
from handlers.spec import (
    ATTEMPT_KEYS_PREFIX,
    AnyControl,
    GoControl,
    InterruptTestControl,
    JobSpec,
    RegroupControl,
    SaveControl,
    StopControl,
    control_key,
    dump_control,
    node_control_key,
)
from handlers.storage_sessions import SESSION_SECONDS, aliyun_session_policy, dump_session_policy, session_name

log = logging.getLogger(__name__)

# a sealed token that could not be written
TOKEN_FAILURES = (CloudRefused, CloudUnavailable, ValueError)


class AliyunCloud:
    name = "aliyun"
    notice: Literal["aws", "aliyun", "none"] = "aliyun"
    notice_seconds = NOTICE_LEAD.total_seconds()

    def __init__(self, settings: AliyunSettings, *, report_keys: ReportKeys | None = None) -> None:
        self.settings = settings  # (cloud events arrive through the CloudMonitor / EventBridge routes, not from here)
        self.report_keys = report_keys  # each runner gets its attempt's key in its own user data, never the master
        if settings.runner_storage_role_arn is not None and report_keys is None:
            raise ConfigError(
                "aliyun.runner_storage_role_arn needs report keys: each attempt's storage token is sealed with its "
                "report key (handlers/attempt_keys.py)"
            )
        secret = settings.access_key_secret.get_secret_value() if settings.access_key_secret else None
        self.api = AliyunApi(
            settings.region,
            endpoint=settings.endpoint,
            ess_endpoint=settings.ess_endpoint,
            sts_endpoint=settings.sts_endpoint,
            access_key_id=settings.access_key_id,
            access_key_secret=secret,
        )
        for launch in launch_regions(settings):
            self.api.add_region(launch.region, launch.endpoint)
        self.oss = OssObjects(  # the bot's own objects, with the API's credentials of each moment
            settings.bucket,
            endpoint=settings.bot_oss_endpoint,
            region=settings.region,
            addressing=settings.oss_addressing,
            credentials=self.api.credentials,
        )
        self.pricing = AliyunPricing(settings, self.api)
        self.gangs = AliyunPlacement([launch.region for launch in launch_regions(settings)], self.api)
        self.instances = AliyunInstances(settings, self.api, self.pricing, self.gangs)
        self.groups = AliyunGroups(settings, self.api, self.pricing, self.instances)
        self._interrupt_tests: set[asyncio.Task[None]] = set()

    # -- where things live --------------------------------------------------------------------------------

    @property
    def home_region(self) -> str:
        """The bucket's region (bot.cloud.base.SpansRegions)."""
        return self.settings.region

    @property
    def transfer_price_per_gb(self) -> float:
        return self.settings.transfer_price_per_gb

    def checkpoint_uri(self, job_id: str) -> str:
        return f"oss://{self.settings.bucket}/{self.settings.prefix}{job_id}/"

    def spec_key(self, job_id: str, attempt: int) -> str:
        return f"{self.settings.prefix}{job_id}/spec-attempt-{attempt}.json"

    def control_key(self, job_id: str, attempt: int) -> str:
        """The runner's control object, relative to the bucket (the runner reads it relative to its checkpoints)."""
        return f"{self.settings.prefix}{job_id}/{control_key(attempt)}"

    async def release_gang_placement(self, job_id: str) -> None:
        """Delete the job's deployment set (none, or gone: fine; CloudError while ECS still counts a node in it,
        so the caller tries again)."""
        await self.gangs.release(job_id)
        for key in [key for key in self.instances.deployment_sets if key[0] == job_id]:
            del self.instances.deployment_sets[key]

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

        ``avoid_zones``: zones where this job was just reclaimed or failed; they are tried last. ``zone``: there only.
        ``gang``: a gang node, launched into the job's deployment set (found or made here:
        :mod:`bot.cloud.aliyun.placement`); the bot pins every node after the first to the first one's zone.

        The scaling-group mode refuses gangs (LaunchError): each group of its pool runs one instance and ESS replaces
        it by itself, while a gang is N attempts whose lost node only the bot replaces (into the same deployment set
        and zone, then a regroup of the survivors); a group replacing on its own would race that.
        """
        return await launch_attempt(
            self, spec, instance_types, market, avoid_zones=avoid_zones, zone=zone, gang=gang
        )

    # the steps of the launch (bot.cloud.launching.LaunchSteps)

    @property
    def launch_calls(self) -> AliyunInstances:
        return self.instances

    @property
    def max_launch_failures(self) -> int | None:
        return self.settings.max_launch_failures

    def group_mode(self) -> str | None:
        if self.settings.mode != "scaling-group":
            return None
        return "aliyun.mode scaling-group runs one instance per group, so gangs need aliyun.mode instances"

    async def prepare_launch(self, spec: JobSpec) -> tuple[JobSpec, str]:
        spec = self._complete_spec(spec)
        spec_uri = await self._upload_spec(spec)
        return spec, self.user_data(spec_uri, spec.job_id, spec.attempt, spec.key_salt)

    async def place_gang(self, gang: GangPlacement, spec: JobSpec) -> None:
        """Nothing before the launch loop: deployment sets are regional, so the node's set is found or made in the
        region of the zone it launches in (:meth:`AliyunInstances.run_instance`)."""

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

    def handover(self, spec: JobSpec, instance: Instance) -> Handover | None:
        """With a runner storage role, the attempt's sealed storage token: an instance without it could read
        nothing. Without one, nothing."""
        if not self.renews_storage:
            return None
        return Handover(
            lambda: self._write_token(spec.job_id, spec.attempt, spec.key_salt, instance.instance_id),
            TOKEN_FAILURES,
            f"hand {spec.job_id} attempt {spec.attempt} its storage token on {instance.instance_id} "
            f"(oss://{self.settings.bucket}/{ATTEMPT_KEYS_PREFIX}…)",
        )

    def _complete_spec(self, spec: JobSpec) -> JobSpec:
        """What only this side knows: where runner reports go. The capacity is released by the bot (``terminate``
        on completion), so the spec asks the runner for no release of its own."""
        url = self.settings.report_url
        if url and url not in spec.report:
            return spec.model_copy(update={"report": [*spec.report, url]})
        return spec

    def user_data(self, spec_uri: str, job_id: str, attempt: int, key_salt: str) -> str:
        """The boot script: the spec's OSS URI, the bucket's internal endpoint, the RAM role's name and, when runners
        report to the bot's URL, the attempt's own report key.

        The key is the one credential here, and on purpose: user data is served only by this instance's own metadata
        service (hardened mode: with a session token) and to whoever may ``DescribeUserData`` (the bot's operators,
        never a runner's role), while without a runner storage role every runner may read the bucket's ``jobs/``, so a
        key in the spec object would be readable by every other job's instance; with one, the key also opens the
        attempt's sealed storage token (``FINETUNE_KEY_FROM``). It speaks for this attempt of this job and nothing
        else; none of the bot's own secrets (the master, tokens, Redis) is ever here."""
        env = {
            "FINETUNE_SPEC": spec_uri,
            "FINETUNE_WORK_DIR": self.settings.work_dir,
            "OSS_ENDPOINT": self.settings.runner_oss_endpoint,
            "OSS_REGION": self.settings.region,
        }
        if self.settings.ram_role:  # the runner reads the role's STS credentials from the instance metadata
            env["ALIBABA_CLOUD_ECS_METADATA"] = self.settings.ram_role
        if self.settings.report_url and self.report_keys is not None:
            env["FINETUNE_REPORT_SECRET"] = self.report_keys.of(job_id, attempt, key_salt)
        if self.renews_storage:  # the runner opens attempt-keys/<its instance id> with that key, then reads the spec
            env["FINETUNE_KEY_FROM"] = f"oss://{self.settings.bucket}/{ATTEMPT_KEYS_PREFIX}"
        return runner_boot_script(env, self.settings.runner_path)

    async def _upload_spec(self, spec: JobSpec) -> str:
        key = self.spec_key(spec.job_id, spec.attempt)
        try:
            await self.oss.put(key, spec.model_dump_json().encode())
        except (CloudRefused, CloudUnavailable) as exc:
            raise LaunchError(f"could not upload the spec to oss://{self.settings.bucket}/{key}: {exc}") from exc
        return f"oss://{self.settings.bucket}/{key}"

    # -- the runner's storage token (runner storage role) -----------------------------------------------------

    @property
    def renews_storage(self) -> bool:
        """Whether runners get per-attempt STS tokens (which then need rewriting before they expire)."""
        return self.settings.runner_storage_role_arn is not None

    async def _storage_token(self, job_id: str, attempt: int) -> StorageCredentials:
        """An STS token of the runner storage role whose inline policy names only the job's prefix, for an hour,
        named after the job and attempt so ActionTrail says whose each request was."""
        role = self.settings.runner_storage_role_arn
        if role is None:
            raise ValueError("no aliyun.runner_storage_role_arn")
        policy = aliyun_session_policy(self.settings.bucket, self.settings.prefix, job_id)
        found = await self.api.assume_role(
            role, session_name(job_id, attempt), dump_session_policy(policy), SESSION_SECONDS
        )
        try:
            return StorageCredentials(
                access_key_id=found["AccessKeyId"],
                secret_access_key=found["AccessKeySecret"],
                session_token=found["SecurityToken"],
                expiration=found["Expiration"],
            )
        except (KeyError, ValueError) as exc:  # pydantic's ValidationError is a ValueError; no secret in the text
            shape = type(exc).__name__
            raise CloudUnavailable(f"AssumeRole: STS answered credentials of an unexpected shape ({shape})") from None

    async def _write_token(self, job_id: str, attempt: int, key_salt: str, instance_id: str) -> None:
        """A fresh token, sealed with the attempt's report key for ``instance_id`` (handlers/attempt_keys.py)."""
        if self.report_keys is None:
            raise ValueError("no report keys to seal the storage token with")
        storage = await self._storage_token(job_id, attempt)
        body = seal(self.report_keys.of(job_id, attempt, key_salt), instance_id, job_id, attempt, storage)
        await self.oss.put(sealed_key_object(instance_id), body)

    async def renew_storage_credentials(self, job_id: str, attempt: int, instance_id: str, *, key_salt: str) -> None:
        """Rewrite the attempt's sealed token with a fresh one (bot/storage_renewal.py, for every live attempt well
        before the last one expires). CloudError when STS or OSS would not."""
        if not self.renews_storage:
            return
        await renew(
            lambda: self._write_token(job_id, attempt, key_salt, instance_id),
            failures=TOKEN_FAILURES,
            error=CloudError,
            what=f"the storage token of {job_id} attempt {attempt} on {instance_id}",
        )

    async def drop_storage_credentials(self, instance_id: str) -> None:
        """The sealed token of an attempt that ended while it was being renewed goes again."""
        await self._delete_token(instance_id)

    async def _delete_token(self, instance_id: str) -> None:
        """Best effort, idempotent: a released instance's sealed token goes (it expires within the hour anyway)."""
        if not self.renews_storage:
            return
        try:
            await self.oss.delete(sealed_key_object(instance_id))
        except TOKEN_FAILURES as exc:
            log.warning("could not delete the sealed key object of %s: %s", instance_id, exc)

    # -- prices and zones -----------------------------------------------------------------------------------

    async def on_demand_price(self, instance_type: str) -> float | None:
        """Pay-as-you-go $/h of the type (:meth:`AliyunPricing.on_demand_price`); None when nothing says."""
        return await self.pricing.on_demand_price(instance_type)

    async def hourly_price(self, instance_types: list[str], market: Market) -> float | None:
        """Spot: the lowest current price of these types in our zones; on-demand: the lowest pay-as-you-go price."""
        return await self.pricing.hourly_price(instance_types, market)

    async def zone_availability(self, instance_types: list[str], nodes: int = 1) -> dict[str, float]:
        """The live signal the spot authority weighs, per zone (0..1); empty (no signal) when ECS will not say.
        ``nodes`` is not asked about: ``DescribeAvailableResource`` says a type's stock status, not for how many."""
        return await self.pricing.zone_availability(instance_types)

    async def spot_zones(self, instance_types: list[str]) -> list[str]:
        """The zones a launch may be pinned to (the spot policy's choice), in preference order."""
        return candidate_zones(self.settings)

    # -- instances after launch -----------------------------------------------------------------------------

    async def list_instances(self) -> list[CloudInstance]:
        """Every instance of the region tagged ``finetune:job`` (ECS lists no released ones), for reconciliation."""
        return await self.instances.list_instances()

    async def terminate(self, instance_id: str, job_id: str) -> None:
        """Release the instance (a missing one is fine); in scaling-group mode its group goes to desired 0 first,
        so ESS does not replace it. An instance not tagged ``finetune:job=<job_id>`` is never touched
        (ForeignInstance)."""
        try:
            instance = await self.instances.describe(instance_id)
            if instance is None:
                return
            check_owner(tags_of(instance), instance_id, job_id)
            if self.settings.mode == "scaling-group":
                group_id = await self.groups.group_of(instance_id)
                if group_id is not None:
                    try:
                        await self.groups.set_desired(group_id, 0)
                    except CloudRefused as exc:
                        log.warning("could not set group %s to 0: %s", group_id, exc)
            await self.instances.delete(instance_id)
        except (CloudRefused, CloudUnavailable) as exc:
            raise CloudError(f"could not release {instance_id}: {exc}") from exc
        await self._delete_token(instance_id)

    async def stop_runner(self, instance_id: str) -> None:
        """Ask the runner to checkpoint and stop: :class:`~handlers.spec.StopControl` in its control object on OSS."""
        _, job_id, attempt = await self.instances.job_of(instance_id)
        await self._write_control(job_id, attempt, StopControl())

    async def interrupt_test(self, instance_id: str) -> InterruptTestResult:
        """An interrupt test: the runner's control object announces a reclaim at now + grace (the runner then
        behaves exactly as on ECS's own notice), and the instance is released when the grace period is over."""
        instance, job_id, attempt = await self.instances.job_of(instance_id)
        status = str(instance.get("Status", ""))
        if status not in LIVE_STATUSES:
            raise CloudError(f"instance {instance_id} is {status or 'gone'}: nothing to interrupt")
        grace = self.settings.interrupt_test_grace_seconds
        deadline = datetime.now(UTC) + timedelta(seconds=grace)
        key = await self._write_control(job_id, attempt, InterruptTestControl(deadline=deadline))
        task = asyncio.create_task(self._release_after(instance_id, grace), name=f"interrupt-test:{instance_id}")
        self._interrupt_tests.add(task)
        task.add_done_callback(self._interrupt_tests.discard)
        log.info("interrupt test: notice for %s (%s attempt %d) written to %s", instance_id, job_id, attempt, key)
        return InterruptTestResult(
            instance_id=instance_id, way="notice", reference=f"oss://{self.settings.bucket}/{key}", reclaim_at=deadline
        )

    async def write_node_control(
        self, job_id: str, attempt: int, generation: int, node_rank: int, control: RegroupControl
    ) -> None:
        """A gang node's regroup, in its own control object on OSS (``<prefix><job>/control/attempt-<n>/generation-<g>/
        node-<k>.json``, under the bot's grant for ``jobs/*/control/*``), where its runner polls. Only for an attempt
        with a live instance tagged for it, as a stop goes only to an instance tagged for its job: CloudError
        (nothing written) otherwise."""
        try:
            found = await self.instances.live_instance(job_id, attempt)
        except (CloudRefused, CloudUnavailable) as exc:
            raise CloudError(f"could not look up the instance of {job_id} attempt {attempt}: {exc}") from exc
        if found is None:
            raise CloudError(f"no live instance is tagged for {job_id} attempt {attempt}: no control object written")
        key = f"{self.settings.prefix}{job_id}/{node_control_key(attempt, generation, node_rank)}"
        await self._write_control(job_id, attempt, control, key)

    @property
    def launches_ahead(self) -> bool:
        """Instances mode starts a job's next instance beside its current one; a scaling group holds one per job (its
        configuration is rewritten for the next attempt): there a switch stops first."""
        return self.settings.mode != "scaling-group"

    async def hand_over(self, job_id: str, attempt: int) -> None:
        """Go, to the runner of ``attempt`` launched ahead of a switch of market (its control object on OSS)."""
        await self._write_control(job_id, attempt, GoControl())

    async def save_runner(self, instance_id: str, at: datetime) -> None:
        """Ask the runner for a fresh checkpoint, training on: :class:`~handlers.spec.SaveControl` in its control
        object on OSS (a scheduled system event for its instance)."""
        _, job_id, attempt = await self.instances.job_of(instance_id)
        await self._write_control(job_id, attempt, SaveControl(at=at))

    async def _write_control(
        self,
        job_id: str,
        attempt: int,
        request: AnyControl,
        key: str | None = None,
    ) -> str:
        key = key or self.control_key(job_id, attempt)
        try:
            await self.oss.put(key, dump_control(request))
        except (CloudRefused, CloudUnavailable) as exc:
            raise CloudError(f"could not write oss://{self.settings.bucket}/{key}: {exc}") from exc
        return key

    async def _release_after(self, instance_id: str, seconds: float) -> None:
        """What ECS does at the end of a reclaim notice: the instance goes (a scaling group replaces it)."""
        await asyncio.sleep(seconds)
        try:
            await self.instances.delete(instance_id)
        except (CloudRefused, CloudUnavailable) as exc:
            log.warning("interrupt test: could not release %s: %s", instance_id, exc)
            return
        log.info("interrupt test: released %s after %g s", instance_id, seconds)

    async def check_setup(self, scope: SetupScope) -> list[Check]:
        """Credentials, region and dry runs of what the bot calls (:mod:`bot.cloud.aliyun.probe`)."""
        return await AliyunProbe(self.settings, self.api, self.instances, self.oss).checks(scope)

    async def close(self) -> None:
        """Cancel pending interrupt test releases (the instance then lives on; its runner has already checkpointed)."""
        for task in list(self._interrupt_tests):
            task.cancel()
        await asyncio.gather(*self._interrupt_tests, return_exceptions=True)
        self._interrupt_tests.clear()


if TYPE_CHECKING:  # AliyunCloud must stay a CloudProvider (mypy checks this line)

    def _is_provider(cloud: AliyunCloud) -> CloudProvider:
        return cloud

    def _regroups(cloud: AliyunCloud) -> RegroupsGangs:
        return cloud

    def _launches(cloud: AliyunCloud) -> LaunchSteps:
        return cloud

    def _checks_setup(cloud: AliyunCloud) -> ChecksSetup:
        return cloud

    def _spans_regions(cloud: AliyunCloud) -> SpansRegions:
        return cloud
