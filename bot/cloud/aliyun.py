"""Alibaba Cloud: preemptible ECS instances (or a pool of Auto Scaling groups) running the runner from an image.

A launch uploads the attempt's spec to OSS first (its S3-compatible API, virtual-hosted addressing: oss_objects.py),
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

There is no FIS on Alibaba Cloud: a drill writes the runner's control object (``{"action": "drill", "deadline"}``)
next to the checkpoints, and releases the instance when the grace period is over, as ECS would reclaim it. A stop is
the same control object with ``{"action": "stop"}``.

With a runner storage role (``aliyun.runner_storage_role_arn``) the instance role reaches no job object: per
attempt the bot assumes that role with an inline policy naming only the job's prefix (STS ``AssumeRole``,
:mod:`handlers.storage_sessions`) and writes the token to ``attempt-keys/<instance id>`` sealed with the attempt's
report key (:mod:`handlers.sealed_keys`), rewrites it before it expires (bot/storage_renewal.py) and deletes it with
the instance.

Every SDK call runs in a worker thread (:mod:`bot.cloud.aliyun_api`). Prices are in the currency of the account's
site (CNY on the China site, USD on the international one), per hour.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import logging
import re
import time
from collections.abc import Collection
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal

from alibabacloud_ecs20140526 import models as ecs_models
from alibabacloud_ess20220222 import models as ess_models

from bot.cloud.aliyun_api import AliyunApi, AliyunApiError, AliyunUnavailable
from bot.cloud.aliyun_settings import AliyunSettings
from bot.cloud.base import CloudError, CloudProvider, ForeignInstance, Instance, LaunchError, log_once
from bot.cloud.oss_objects import OssObjects
from bot.cloud.user_data import runner_boot_script
from bot.errors import ConfigError, ObjectStoreError
from handlers.attempt_keys import StorageCredentials
from handlers.jobs import Market
from handlers.notes import InterruptTestResult
from handlers.reconcile import CloudInstance
from handlers.report_keys import ReportKeys
from handlers.sealed_keys import seal, sealed_key_object
from handlers.spec import ATTEMPT_KEYS_PREFIX, DrillControl, JobSpec, StopControl, control_key, dump_control
from handlers.spot.zones import (
    Candidate,
    LaunchPlan,
    SpotPrice,
    as_scores,
    classify_aliyun_launch_error,
    latest_prices,
    order_on_demand_candidates,
    order_spot_candidates,
    stock_availability,
)
from handlers.storage_sessions import SESSION_SECONDS, aliyun_session_policy, dump_session_policy, session_name

log = logging.getLogger(__name__)

MANAGED_TAG = "finetune:managed"  # the bot's RAM policy launches and deletes only instances tagged so
JOB_TAG = "finetune:job"
ATTEMPT_TAG = "finetune:attempt"
LIST_PAGE_SIZE = 100  # DescribeInstances' largest page
LIVE_STATUSES = frozenset({"Pending", "Starting", "Running"})
_NOT_FOUND = frozenset({"InvalidInstanceId.NotFound", "InvalidInstanceIds.NotFound", "InvalidInstance.NotFound"})
_PRICE_TTL_SECONDS = 3600.0
STOCK_TTL_SECONDS = 600.0  # DescribeAvailableResource per instance type is asked again only this much later


class AliyunError(CloudError):
    """A terminate, a drill, a stop or a listing Alibaba Cloud did not do; the message says what to fix."""


def _tags(instance: dict[str, Any]) -> dict[str, str]:
    return {str(tag.get("TagKey")): str(tag.get("TagValue")) for tag in instance.get("Tags", {}).get("Tag", [])}


def _listed(instance: dict[str, Any]) -> CloudInstance:
    tags = _tags(instance)
    attempt = tags.get(ATTEMPT_TAG, "")
    created = str(instance.get("CreationTime") or "")
    try:
        launched: datetime | None = datetime.fromisoformat(created.replace("Z", "+00:00")) if created else None
    except ValueError:
        launched = None
    return CloudInstance(
        instance_id=str(instance.get("InstanceId")),
        state=str(instance.get("Status") or "unknown"),
        job_id=tags.get(JOB_TAG),
        attempt=int(attempt) if attempt.isdigit() else None,
        launched_at=launched,
    )


_CODES = re.compile(r"[A-Za-z]+(?:\.[A-Za-z]+)+")


def _activity_refused(status: str) -> bool:
    """Whether a failed scaling activity's message names an ECS capacity error (``OperationDenied.NoStock`` …)."""
    return any(classify_aliyun_launch_error(code) == "capacity" for code in _CODES.findall(status))


def _client_token(*parts: object) -> str:
    """RunInstances' idempotency token: the same request sent again (after no answer) starts nothing new."""
    return hashlib.sha256("/".join(map(str, parts)).encode()).hexdigest()[:32]


class AliyunCloud:
    name = "aliyun"
    notice: Literal["aws", "aliyun", "none"] = "aliyun"

    def __init__(self, settings: AliyunSettings, *, report_keys: ReportKeys | None = None) -> None:
        self.settings = settings  # (cloud events arrive through the CloudMonitor / EventBridge routes, not from here)
        self.report_keys = report_keys  # each runner gets its attempt's key in its own user data, never the master
        if settings.runner_storage_role_arn is not None and report_keys is None:
            raise ConfigError(
                "aliyun.runner_storage_role_arn needs report keys: each attempt's storage token is sealed with its "
                "report key (handlers/sealed_keys.py)"
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
        self.oss = OssObjects(  # the bot's own objects, with the API's credentials of each moment
            settings.bucket,
            endpoint=settings.bot_oss_endpoint,
            region=settings.region,
            addressing=settings.oss_addressing,
            credentials=self.api.credentials,
        )
        self._drills: set[asyncio.Task[None]] = set()
        self._group_lock = asyncio.Lock()
        self._on_demand: dict[str, tuple[float, float]] = {}  # type -> (price, monotonic time read)
        self._stock: dict[str, tuple[float, list[tuple[str, str]]]] = {}  # type -> (time read, [(zone, status)])

    # -- where things live --------------------------------------------------------------------------------

    def checkpoint_uri(self, job_id: str) -> str:
        return f"oss://{self.settings.bucket}/{self.settings.prefix}{job_id}/"

    def spec_key(self, job_id: str, attempt: int) -> str:
        return f"{self.settings.prefix}{job_id}/spec-attempt-{attempt}.json"

    def control_key(self, job_id: str, attempt: int) -> str:
        """The runner's control object, relative to the bucket (the runner reads it relative to its checkpoints)."""
        return f"{self.settings.prefix}{job_id}/{control_key(attempt)}"

    # -- launch ---------------------------------------------------------------------------------------------

    async def launch(
        self,
        spec: JobSpec,
        instance_types: list[str],
        market: Market,
        *,
        avoid_zones: Collection[str] = (),
        zone: str | None = None,
    ) -> Instance:
        """Start the attempt's instance on ``market``; LaunchError naming every failed candidate when none would
        start (``capacity`` True when the market had no room: the spot authority chooses again).

        ``avoid_zones``: zones where this job was just reclaimed or failed; they are tried last. ``zone``: there only.
        """
        if not instance_types:
            raise LaunchError("the recipe lists no instance types for aliyun")
        spec = self._complete_spec(spec)
        spec_uri = await self._upload_spec(spec)
        script = self.user_data(spec_uri, spec.job_id, spec.attempt)
        instance = await self._start(spec, script, instance_types, market, avoid_zones, zone)
        if self.renews_storage:
            await self._hand_token(spec, instance)
        return instance

    async def _start(
        self,
        spec: JobSpec,
        script: str,
        instance_types: list[str],
        market: Market,
        avoid_zones: Collection[str],
        zone: str | None,
    ) -> Instance:
        """The attempt's instance, in either mode (the launch's own work, before its storage token is handed over)."""
        if self.settings.mode == "scaling-group":
            return await self._launch_in_group(spec, script, instance_types, market, avoid_zones, zone)
        existing = await self._attempt_instance(spec)
        if existing is not None:  # a launch retried after a crash: the instance the first try started
            log.info("%s attempt %d: %s is up already", spec.job_id, spec.attempt, existing.instance_id)
            return existing
        zones = self._zones()
        if zone:  # pinned by the spot policy: there or nowhere
            zones = [zone]
        if market == "spot":
            prices, _ = await self._spot_prices(instance_types)
            stock = await self.zone_availability(instance_types)
            scores = as_scores(stock) if stock else None
            candidates = order_spot_candidates(zones, instance_types, scores, prices, avoid_zones)
        else:
            candidates = order_on_demand_candidates(zones, instance_types, avoid_zones)
        plan = LaunchPlan(
            candidates, max_failures=self.settings.max_launch_failures, classify=classify_aliyun_launch_error
        )
        while (candidate := plan.next()) is not None:
            where = f"{candidate.market} {candidate.instance_type} in {candidate.zone}"
            try:
                instance_id = await self._run_instance(spec, script, candidate)
            except AliyunApiError as exc:
                kind = plan.failed(candidate, exc.code, exc.message)
                log.info("%s attempt %d: %s failed: %s (%s)", spec.job_id, spec.attempt, where, exc.code, kind)
                continue
            except AliyunUnavailable as exc:
                raise LaunchError(f"ECS did not answer RunInstances: {exc}") from exc
            log.info("%s attempt %d: launched %s (%s)", spec.job_id, spec.attempt, instance_id, where)
            on_demand = await self.on_demand_price(candidate.instance_type)
            price = candidate.spot_price if candidate.market == "spot" else on_demand
            return Instance(instance_id, candidate.instance_type, candidate.zone, candidate.market, price, on_demand)
        raise LaunchError(plan.summary(), capacity=plan.refused, zone=zone)

    async def _attempt_instance(self, spec: JobSpec) -> Instance | None:
        """The live instance already tagged with this (job, attempt), if any (a retry may try another zone first,
        where the client token of the first try would not help)."""
        request = ecs_models.DescribeInstancesRequest(
            region_id=self.settings.region,
            tag=[
                ecs_models.DescribeInstancesRequestTag(key=JOB_TAG, value=spec.job_id),
                ecs_models.DescribeInstancesRequestTag(key=ATTEMPT_TAG, value=str(spec.attempt)),
            ],
        )
        try:
            reply = await self.api.ecs("describe_instances", request)
        except (AliyunApiError, AliyunUnavailable) as exc:
            raise LaunchError(f"ECS did not answer DescribeInstances: {exc}") from exc
        for found in reply.get("Instances", {}).get("Instance", []):
            if str(found.get("Status", "")) not in LIVE_STATUSES:
                continue
            instance_type, zone = str(found.get("InstanceType", "")), str(found.get("ZoneId", ""))
            market: Market = "spot" if found.get("SpotStrategy", "NoSpot") != "NoSpot" else "on-demand"
            on_demand = await self.on_demand_price(instance_type)
            price = on_demand
            if market == "spot":
                price = (await self._spot_prices([instance_type]))[0].get((zone, instance_type))
            return Instance(str(found["InstanceId"]), instance_type, zone, market, price, on_demand)
        return None

    def _complete_spec(self, spec: JobSpec) -> JobSpec:
        """What only this side knows: where runner reports go. The capacity is released by the bot (``terminate``
        on completion), so the spec asks the runner for no release of its own."""
        url = self.settings.report_url
        if url and url not in spec.report:
            return spec.model_copy(update={"report": [*spec.report, url]})
        return spec

    def user_data(self, spec_uri: str, job_id: str, attempt: int) -> str:
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
            env["FINETUNE_REPORT_SECRET"] = self.report_keys.of(job_id, attempt)
        if self.renews_storage:  # the runner opens attempt-keys/<its instance id> with that key, then reads the spec
            env["FINETUNE_KEY_FROM"] = f"oss://{self.settings.bucket}/{ATTEMPT_KEYS_PREFIX}"
        return runner_boot_script(env, self.settings.runner_path)

    async def _upload_spec(self, spec: JobSpec) -> str:
        key = self.spec_key(spec.job_id, spec.attempt)
        try:
            await self.oss.put(key, spec.model_dump_json().encode())
        except (AliyunApiError, AliyunUnavailable, ObjectStoreError) as exc:
            raise LaunchError(f"could not upload the spec to oss://{self.settings.bucket}/{key}: {exc}") from exc
        return f"oss://{self.settings.bucket}/{key}"

    # -- the runner's storage token (runner storage role) -----------------------------------------------------

    @property
    def renews_storage(self) -> bool:
        """Whether runners get per-attempt STS tokens (which then need rewriting before they expire)."""
        return self.settings.runner_storage_role_arn is not None

    async def _hand_token(self, spec: JobSpec, instance: Instance) -> None:
        """The launch's last step: the attempt's sealed token where its runner looks; an instance that cannot get
        one is released again (it could read nothing, not even its spec)."""
        try:
            await self._write_token(spec.job_id, spec.attempt, instance.instance_id)
        except (AliyunApiError, AliyunUnavailable, ObjectStoreError, ValueError) as exc:
            try:
                await self.terminate(instance.instance_id, spec.job_id)
            except CloudError as again:
                log.warning("could not release %s after that: %s", instance.instance_id, again)
            raise LaunchError(
                f"could not hand {spec.job_id} attempt {spec.attempt} its storage token on {instance.instance_id} "
                f"(oss://{self.settings.bucket}/{ATTEMPT_KEYS_PREFIX}…): {exc}; the instance was released"
            ) from exc

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
            raise AliyunUnavailable(f"AssumeRole: STS answered credentials of an unexpected shape ({shape})") from None

    async def _write_token(self, job_id: str, attempt: int, instance_id: str) -> None:
        """A fresh token, sealed with the attempt's report key for ``instance_id`` (handlers/sealed_keys.py)."""
        if self.report_keys is None:
            raise ValueError("no report keys to seal the storage token with")
        storage = await self._storage_token(job_id, attempt)
        body = seal(self.report_keys.of(job_id, attempt), instance_id, job_id, attempt, storage)
        await self.oss.put(sealed_key_object(instance_id), body)

    async def renew_storage_credentials(self, job_id: str, attempt: int, instance_id: str) -> None:
        """Rewrite the attempt's sealed token with a fresh one (bot/storage_renewal.py, for every live attempt well
        before the last one expires). AliyunError when STS or OSS would not."""
        if not self.renews_storage:
            return
        try:
            await self._write_token(job_id, attempt, instance_id)
        except (AliyunApiError, AliyunUnavailable, ObjectStoreError, ValueError) as exc:
            raise AliyunError(
                f"could not renew the storage token of {job_id} attempt {attempt} on {instance_id}: {exc}"
            ) from exc
        log.info("%s attempt %d: storage token renewed for %s", job_id, attempt, instance_id)

    async def drop_storage_credentials(self, instance_id: str) -> None:
        """The sealed token of an attempt that ended while it was being renewed goes again."""
        await self._delete_token(instance_id)

    async def _delete_token(self, instance_id: str) -> None:
        """Best effort, idempotent: a released instance's sealed token goes (it expires within the hour anyway)."""
        if not self.renews_storage:
            return
        try:
            await self.oss.delete(sealed_key_object(instance_id))
        except (AliyunApiError, AliyunUnavailable, ObjectStoreError, ValueError) as exc:
            log.warning("could not delete the sealed key object of %s: %s", instance_id, exc)

    def _zones(self) -> list[str]:
        """Candidate zones in preference order: ``zones`` first, then the other zones with a vSwitch."""
        return list(self.settings.zones) + [zone for zone in self.settings.vswitches if zone not in self.settings.zones]

    async def _run_instance(self, spec: JobSpec, script: str, candidate: Candidate) -> str:
        settings = self.settings
        spot = candidate.market == "spot"
        request = ecs_models.RunInstancesRequest(
            region_id=settings.region,
            zone_id=candidate.zone,
            v_switch_id=settings.vswitches.get(candidate.zone),
            instance_type=candidate.instance_type,
            image_id=settings.image_id,
            security_group_ids=list(settings.security_group_ids) or None,
            instance_charge_type="PostPaid",
            spot_strategy=self._spot_strategy(candidate.market),
            spot_price_limit=settings.spot_price_limit if spot else None,
            spot_duration=settings.spot_duration if spot else None,
            spot_interruption_behavior="Terminate" if spot else None,
            internet_max_bandwidth_out=0,
            user_data=base64.b64encode(script.encode()).decode(),
            ram_role_name=settings.ram_role,
            # Hardened metadata mode: every read needs a session token from a PUT (runner.notices.http).
            http_endpoint="enabled",
            http_tokens="required",
            key_pair_name=settings.key_pair,
            instance_name=f"finetune-{spec.job_id}-{spec.attempt}",
            tag=[
                ecs_models.RunInstancesRequestTag(key=MANAGED_TAG, value="true"),
                ecs_models.RunInstancesRequestTag(key=JOB_TAG, value=spec.job_id),
                ecs_models.RunInstancesRequestTag(key=ATTEMPT_TAG, value=str(spec.attempt)),
            ],
            amount=1,
            client_token=_client_token(spec.job_id, spec.attempt, candidate.zone, candidate.instance_type, spot),
        )
        if settings.system_disk_category or settings.system_disk_size:
            request.system_disk = ecs_models.RunInstancesRequestSystemDisk(
                category=settings.system_disk_category, size=settings.system_disk_size
            )
        try:
            reply = await self.api.ecs("run_instances", request)
        except AliyunUnavailable:
            # No answer: ECS may have started it all the same. The same client token returns that instance
            # instead of starting a second one.
            reply = await self.api.ecs("run_instances", request)
        ids = reply.get("InstanceIdSets", {}).get("InstanceIdSet", [])
        if not ids:
            raise AliyunApiError("RunInstances", "NoInstance", "ECS answered without an instance id")
        return str(ids[0])

    def _spot_strategy(self, market: Market) -> str:
        if market != "spot":
            return "NoSpot"
        return "SpotWithPriceLimit" if self.settings.spot_price_limit else "SpotAsPriceGo"

    # -- prices ---------------------------------------------------------------------------------------------

    async def _spot_prices(self, instance_types: list[str]) -> tuple[dict[tuple[str, str], float], dict[str, float]]:
        """The current spot price per (zone, type) in our zones, and the on-demand ("origin") price per type, from
        ``DescribeSpotPriceHistory`` (one call per type, concurrently). Empty when ECS will not say: the zones are
        then tried in the configured order."""
        zones = set(self._zones())

        async def history(instance_type: str) -> list[dict[str, Any]]:
            request = ecs_models.DescribeSpotPriceHistoryRequest(
                region_id=self.settings.region, instance_type=instance_type, network_type="vpc", ostype="linux"
            )
            reply = await self.api.ecs("describe_spot_price_history", request)
            return list(reply.get("SpotPrices", {}).get("SpotPriceType", []))

        try:
            replies = await asyncio.gather(*(history(instance_type) for instance_type in instance_types))
            points: list[SpotPrice] = []
            origin: dict[str, tuple[datetime, float]] = {}
            for item in (item for reply in replies for item in reply):
                zone, instance_type = str(item["ZoneId"]), str(item["InstanceType"])
                at = datetime.fromisoformat(str(item["Timestamp"]).replace("Z", "+00:00"))
                if zone in zones:
                    points.append(SpotPrice(zone, instance_type, float(item["SpotPrice"]), at))
                if item.get("OriginPrice") is not None and (
                    instance_type not in origin or at > origin[instance_type][0]
                ):
                    origin[instance_type] = (at, float(item["OriginPrice"]))
        except (AliyunApiError, AliyunUnavailable, KeyError, TypeError, ValueError) as exc:
            log_once(log, "spot-prices", "spot price history unavailable (%s); zones ordered without prices", exc)
            return {}, {}
        origins = {instance_type: price for instance_type, (_, price) in origin.items()}
        now = time.monotonic()
        for instance_type, price in origins.items():
            self._on_demand.setdefault(instance_type, (price, now))
        return latest_prices(points), origins

    async def on_demand_price(self, instance_type: str) -> float | None:
        """Pay-as-you-go $/h of the type: configured, else ``DescribePrice`` (cached for an hour), else the origin
        price of the spot history; None when nothing says."""
        configured = self.settings.on_demand_prices.get(instance_type)
        if configured is not None:
            return configured
        cached = self._on_demand.get(instance_type)
        if cached is not None and time.monotonic() - cached[1] < _PRICE_TTL_SECONDS:
            return cached[0]
        request = ecs_models.DescribePriceRequest(
            region_id=self.settings.region,
            resource_type="instance",
            instance_type=instance_type,
            instance_network_type="vpc",
            price_unit="Hour",
            amount=1,
        )
        if self.settings.system_disk_category:
            request.system_disk = ecs_models.DescribePriceRequestSystemDisk(category=self.settings.system_disk_category)
        try:
            reply = await self.api.ecs("describe_price", request)
            price_info = reply["PriceInfo"]["Price"]
            price = float(price_info.get("TradePrice", price_info.get("OriginalPrice")))
        except (AliyunApiError, AliyunUnavailable, KeyError, TypeError, ValueError) as exc:
            log_once(log, f"price:{instance_type}", "no on-demand price for %s (%s)", instance_type, exc)
            return cached[0] if cached is not None else None
        self._on_demand[instance_type] = (price, time.monotonic())
        return price

    async def zone_availability(self, instance_types: list[str]) -> dict[str, float]:
        """The live signal the spot authority weighs, per zone (0..1): the best spot stock status of these types
        from ``DescribeAvailableResource`` (cached ``STOCK_TTL_SECONDS`` per type), lowered where the spot price
        history says the price is close to the on-demand one. Empty (no signal) when ECS will not say."""
        stock: list[tuple[str, str]] = []
        for instance_type in instance_types:
            stock.extend(await self._stock_of(instance_type))
        if not stock:
            return {}
        zones = set(self._zones())
        prices, origins = await self._spot_prices(instance_types)
        return stock_availability([item for item in stock if item[0] in zones], prices, origins)

    async def _stock_of(self, instance_type: str) -> list[tuple[str, str]]:
        """(zone, stock status) of a preemptible ``instance_type`` in our region, [] when ECS will not say."""
        cached = self._stock.get(instance_type)
        if cached is not None and time.monotonic() - cached[0] < STOCK_TTL_SECONDS:
            return cached[1]
        request = ecs_models.DescribeAvailableResourceRequest(
            region_id=self.settings.region,
            destination_resource="InstanceType",
            instance_charge_type="PostPaid",
            spot_strategy="SpotAsPriceGo",
            resource_type="instance",
            instance_type=instance_type,
        )
        try:
            reply = await self.api.ecs("describe_available_resource", request)
            found: list[tuple[str, str]] = []
            for zone in reply.get("AvailableZones", {}).get("AvailableZone", []):
                status = str(zone.get("StatusCategory") or "")
                for resource in zone.get("AvailableResources", {}).get("AvailableResource", []):
                    for supported in resource.get("SupportedResources", {}).get("SupportedResource", []):
                        if supported.get("Value") == instance_type:
                            status = str(supported.get("StatusCategory") or status)
                found.append((str(zone["ZoneId"]), status))
        except (AliyunApiError, AliyunUnavailable, KeyError, TypeError, AttributeError) as exc:
            log_once(log, "stock", "available resources unavailable (%s); zones ordered without stock", exc)
            return []
        self._stock[instance_type] = (time.monotonic(), found)
        return found

    async def spot_zones(self, instance_types: list[str]) -> list[str]:
        """The zones a launch may be pinned to (the spot policy's choice), in preference order."""
        return self._zones()

    async def hourly_price(self, instance_types: list[str], market: Market) -> float | None:
        """Spot: the lowest current price of these types in our zones; on-demand: the lowest pay-as-you-go price."""
        if market == "spot":
            prices, _ = await self._spot_prices(instance_types)
            if prices:
                return min(prices.values())
        listed = [price for price in [await self.on_demand_price(t) for t in instance_types] if price is not None]
        return min(listed) if listed else None

    # -- scaling-group mode ---------------------------------------------------------------------------------

    async def _launch_in_group(
        self,
        spec: JobSpec,
        script: str,
        instance_types: list[str],
        market: Market,
        avoid_zones: Collection[str],
        zone: str | None = None,
    ) -> Instance:
        """Write the attempt into a free (or this job's) group's configuration (the chosen market's spot strategy
        only), then desired capacity 1 over the chosen zone's vSwitch (else every zone's, zones to avoid last). A
        group that starts nothing because the zone had no stock reports a capacity refusal to the spot authority.

        A relaunch first sets the group to 0, so a replacement ESS started by itself from the older attempt's
        configuration is not left running next to the new attempt.
        """
        async with self._group_lock:  # two launches must not claim the same free group
            group = await self._claim_group(spec.job_id)
            group_id = str(group["ScalingGroupId"])
            config_id = group.get("ActiveScalingConfigurationId")
            if not config_id:
                raise LaunchError(f"scaling group {group_id} has no active scaling configuration: enable it first")
            try:
                before = {str(item["InstanceId"]) for item in await self._group_instances(group_id)}
                if before or group.get("DesiredCapacity"):
                    await self._set_desired(group_id, 0)
                await self.api.ess(
                    "modify_scaling_configuration",
                    self._configuration(spec, script, instance_types, market, str(config_id)),
                )
                ordered = [z for z in self._zones() if z not in avoid_zones] + [
                    z for z in self._zones() if z in avoid_zones
                ]
                if zone:  # pinned by the spot authority: there or nowhere
                    if zone not in self.settings.vswitches:
                        raise LaunchError(f"no vSwitch configured in {zone} for scaling group {group_id}", zone=zone)
                    ordered = [zone]
                vswitches = [self.settings.vswitches[z] for z in ordered] or None
                await self.api.ess(
                    "modify_scaling_group",
                    ess_models.ModifyScalingGroupRequest(
                        scaling_group_id=group_id,
                        min_size=0,
                        max_size=max(1, int(group.get("MaxSize") or 1)),
                        desired_capacity=1,
                        v_switch_ids=vswitches,
                    ),
                )
            except (AliyunApiError, AliyunUnavailable) as exc:
                raise LaunchError(f"could not set up scaling group {group_id}: {exc}") from exc
        instance_id = await self._wait_for_group_instance(group_id, before, zone)
        described = await self._describe(instance_id) or {}
        instance_type = str(described.get("InstanceType") or instance_types[0])
        zone = str(described.get("ZoneId") or "")
        on_demand = await self.on_demand_price(instance_type)
        price = on_demand
        if market == "spot":
            price = (await self._spot_prices([instance_type]))[0].get((zone, instance_type))
        log.info(
            "%s attempt %d: group %s launched %s (%s in %s)",
            spec.job_id,
            spec.attempt,
            group_id,
            instance_id,
            instance_type,
            zone,
        )
        return Instance(instance_id, instance_type, zone, market, price, on_demand)

    def _configuration(
        self, spec: JobSpec, script: str, instance_types: list[str], market: Market, config_id: str
    ) -> Any:
        limit = self.settings.spot_price_limit if market == "spot" else None
        return ess_models.ModifyScalingConfigurationRequest(
            scaling_configuration_id=config_id,
            user_data=base64.b64encode(script.encode()).decode(),
            http_endpoint="enabled",
            http_tokens="required",  # hardened metadata mode, as in RunInstances
            tags=json.dumps({MANAGED_TAG: "true", JOB_TAG: spec.job_id, ATTEMPT_TAG: str(spec.attempt)}),
            instance_types=list(instance_types),
            instance_name=f"finetune-{spec.job_id}-{spec.attempt}",
            spot_strategy=self._spot_strategy(market),
            spot_price_limits=[
                ess_models.ModifyScalingConfigurationRequestSpotPriceLimits(instance_type=t, price_limit=limit)
                for t in instance_types
            ]
            if limit
            else None,
            spot_duration=self.settings.spot_duration if market == "spot" else None,
        )

    async def _claim_group(self, job_id: str) -> dict[str, Any]:
        """This job's group (its configuration is tagged with the job), else a free one (desired 0, no instances);
        LaunchError saying who holds them when every group is busy."""
        try:
            reply = await self.api.ess(
                "describe_scaling_groups",
                ess_models.DescribeScalingGroupsRequest(
                    region_id=self.settings.region, scaling_group_ids=list(self.settings.scaling_groups)
                ),
            )
            groups = {str(g["ScalingGroupId"]): g for g in reply.get("ScalingGroups", [])}
            free: list[dict[str, Any]] = []
            busy: list[str] = []
            for group_id in self.settings.scaling_groups:
                group = groups.get(group_id)
                if group is None:
                    busy.append(f"{group_id} does not exist")
                    continue
                if group.get("LifecycleState") not in (None, "Active"):
                    busy.append(f"{group_id} is {group.get('LifecycleState')}")
                    continue
                owner = await self._group_owner(group_id, group.get("ActiveScalingConfigurationId"))
                if owner == job_id:
                    return dict(group)
                if not group.get("DesiredCapacity") and not group.get("TotalCapacity"):
                    free.append(dict(group))
                else:
                    busy.append(f"{group_id} runs {owner or 'something else'}")
        except (AliyunApiError, AliyunUnavailable) as exc:
            raise LaunchError(f"could not read the scaling groups: {exc}") from exc
        if free:
            return free[0]
        raise LaunchError("every scaling group is busy: " + "; ".join(busy))

    async def _group_owner(self, group_id: str, config_id: object) -> str | None:
        if not config_id:
            return None
        reply = await self.api.ess(
            "describe_scaling_configurations",
            ess_models.DescribeScalingConfigurationsRequest(
                region_id=self.settings.region, scaling_group_id=group_id, scaling_configuration_ids=[str(config_id)]
            ),
        )
        for config in reply.get("ScalingConfigurations", []):
            for tag in config.get("Tags") or []:
                if tag.get("Key") == JOB_TAG:
                    return str(tag.get("Value"))
        return None

    async def _group_instances(self, group_id: str, instance_ids: list[str] | None = None) -> list[dict[str, Any]]:
        reply = await self.api.ess(
            "describe_scaling_instances",
            ess_models.DescribeScalingInstancesRequest(
                region_id=self.settings.region, scaling_group_id=group_id, instance_ids=instance_ids, page_size=50
            ),
        )
        return list(reply.get("ScalingInstances", []))

    async def _set_desired(self, group_id: str, desired: int) -> None:
        await self.api.ess(
            "modify_scaling_group",
            ess_models.ModifyScalingGroupRequest(scaling_group_id=group_id, min_size=0, desired_capacity=desired),
        )

    async def _wait_for_group_instance(self, group_id: str, before: set[str], zone: str | None = None) -> str:
        deadline = time.monotonic() + self.settings.group_wait_seconds
        while True:
            try:
                for item in await self._group_instances(group_id):
                    instance_id = str(item.get("InstanceId") or "")
                    if instance_id and instance_id not in before and item.get("LifecycleState") != "Removing":
                        return instance_id
            except (AliyunApiError, AliyunUnavailable) as exc:
                log.warning("describing the instances of group %s failed: %s", group_id, exc)
            if time.monotonic() >= deadline:
                break
            await asyncio.sleep(self.settings.group_poll_seconds)
        why = await self._last_activity(group_id)
        try:  # no instance nobody tracks may turn up later
            await self._set_desired(group_id, 0)
        except (AliyunApiError, AliyunUnavailable) as exc:
            log.warning("could not set group %s back to 0: %s", group_id, exc)
        raise LaunchError(
            f"scaling group {group_id} launched no instance within {self.settings.group_wait_seconds:g} s"
            + (f" (last activity: {why})" if why else ""),
            capacity=_activity_refused(why),
            zone=zone,
        )

    async def _last_activity(self, group_id: str) -> str:
        try:
            reply = await self.api.ess(
                "describe_scaling_activities",
                ess_models.DescribeScalingActivitiesRequest(
                    region_id=self.settings.region, scaling_group_id=group_id, page_size=10
                ),
            )
        except (AliyunApiError, AliyunUnavailable):
            return ""
        activities = reply.get("ScalingActivities", [])
        if not activities:
            return ""
        latest = activities[0]
        return str(latest.get("StatusMessage") or latest.get("Description") or latest.get("StatusCode") or "")

    async def _group_of(self, instance_id: str) -> str | None:
        """The configured scaling group holding the instance, if any."""
        for group_id in self.settings.scaling_groups:
            if await self._group_instances(group_id, [instance_id]):
                return group_id
        return None

    # -- instances after launch -----------------------------------------------------------------------------

    async def list_instances(self) -> list[CloudInstance]:
        """Every instance of the region tagged ``finetune:job`` (ECS lists no released ones), for reconciliation."""
        found: list[CloudInstance] = []
        page = 1
        while True:
            request = ecs_models.DescribeInstancesRequest(
                region_id=self.settings.region,
                tag=[ecs_models.DescribeInstancesRequestTag(key=JOB_TAG)],
                page_number=page,
                page_size=LIST_PAGE_SIZE,
            )
            try:
                reply = await self.api.ecs("describe_instances", request)
            except (AliyunApiError, AliyunUnavailable) as exc:
                raise AliyunError(f"could not list the instances tagged {JOB_TAG}: {exc}") from exc
            items = reply.get("Instances", {}).get("Instance", [])
            found.extend(_listed(item) for item in items)
            if not items or page * LIST_PAGE_SIZE >= int(reply.get("TotalCount") or 0):
                return found
            page += 1

    async def _describe(self, instance_id: str) -> dict[str, Any] | None:
        reply = await self.api.ecs(
            "describe_instances",
            ecs_models.DescribeInstancesRequest(region_id=self.settings.region, instance_ids=json.dumps([instance_id])),
        )
        for instance in reply.get("Instances", {}).get("Instance", []):
            if instance.get("InstanceId") == instance_id:
                return dict(instance)
        return None

    async def _job_of(self, instance_id: str) -> tuple[dict[str, Any], str, int]:
        """The instance, its job id and attempt number, from the tags the launch put on it."""
        try:
            instance = await self._describe(instance_id)
        except (AliyunApiError, AliyunUnavailable) as exc:
            raise AliyunError(f"could not look up instance {instance_id}: {exc}") from exc
        if instance is None:
            raise AliyunError(f"instance {instance_id} does not exist")
        tags = _tags(instance)
        job_id, attempt = tags.get(JOB_TAG), tags.get(ATTEMPT_TAG, "")
        if not job_id or not attempt.isdigit():
            raise AliyunError(f"instance {instance_id} has no {JOB_TAG} / {ATTEMPT_TAG} tags: not launched by this bot")
        return instance, job_id, int(attempt)

    async def terminate(self, instance_id: str, job_id: str) -> None:
        """Release the instance (a missing one is fine); in scaling-group mode its group goes to desired 0 first,
        so ESS does not replace it. An instance not tagged ``finetune:job=<job_id>`` is never touched
        (ForeignInstance)."""
        try:
            instance = await self._describe(instance_id)
            if instance is None:
                return
            owner = _tags(instance).get(JOB_TAG)
            if owner != job_id:
                why = f"instance {instance_id} is tagged for {owner or 'no job'}, not {job_id}: left alone"
                raise ForeignInstance(why)
            if self.settings.mode == "scaling-group":
                group_id = await self._group_of(instance_id)
                if group_id is not None:
                    try:
                        await self._set_desired(group_id, 0)
                    except AliyunApiError as exc:
                        log.warning("could not set group %s to 0: %s", group_id, exc)
            await self._delete(instance_id)
        except (AliyunApiError, AliyunUnavailable) as exc:
            raise AliyunError(f"could not release {instance_id}: {exc}") from exc
        await self._delete_token(instance_id)

    async def _delete(self, instance_id: str) -> None:
        try:
            await self.api.ecs("delete_instance", ecs_models.DeleteInstanceRequest(instance_id=instance_id, force=True))
        except AliyunApiError as exc:
            if exc.code not in _NOT_FOUND:
                raise

    async def stop_runner(self, instance_id: str) -> None:
        """Ask the runner to checkpoint and stop: :class:`~handlers.spec.StopControl` in its control object on OSS."""
        _, job_id, attempt = await self._job_of(instance_id)
        await self._write_control(job_id, attempt, StopControl())

    async def interrupt_test(self, instance_id: str) -> InterruptTestResult:
        """An interruption drill: the runner's control object announces a reclaim at now + grace (the runner then
        behaves exactly as on ECS's own notice), and the instance is released when the grace period is over."""
        instance, job_id, attempt = await self._job_of(instance_id)
        status = str(instance.get("Status", ""))
        if status not in LIVE_STATUSES:
            raise AliyunError(f"instance {instance_id} is {status or 'gone'}: nothing to interrupt")
        grace = self.settings.drill_grace_seconds
        deadline = datetime.now(UTC) + timedelta(seconds=grace)
        key = await self._write_control(job_id, attempt, DrillControl(deadline=deadline))
        task = asyncio.create_task(self._release_after(instance_id, grace), name=f"drill:{instance_id}")
        self._drills.add(task)
        task.add_done_callback(self._drills.discard)
        log.info("drill: notice for %s (%s attempt %d) written to %s", instance_id, job_id, attempt, key)
        return InterruptTestResult(
            instance_id=instance_id, way="notice", reference=f"oss://{self.settings.bucket}/{key}", reclaim_at=deadline
        )

    async def _write_control(self, job_id: str, attempt: int, request: StopControl | DrillControl) -> str:
        key = self.control_key(job_id, attempt)
        try:
            await self.oss.put(key, dump_control(request))
        except (AliyunApiError, AliyunUnavailable, ObjectStoreError) as exc:
            raise AliyunError(f"could not write oss://{self.settings.bucket}/{key}: {exc}") from exc
        return key

    async def _release_after(self, instance_id: str, seconds: float) -> None:
        """What ECS does at the end of a reclaim notice: the instance goes (a scaling group replaces it)."""
        await asyncio.sleep(seconds)
        try:
            await self._delete(instance_id)
        except (AliyunApiError, AliyunUnavailable) as exc:
            log.warning("drill: could not release %s: %s", instance_id, exc)
            return
        log.info("drill: released %s after %g s", instance_id, seconds)

    async def close(self) -> None:
        """Cancel pending drill releases (the instance then lives on; its runner has already checkpointed)."""
        for task in list(self._drills):
            task.cancel()
        await asyncio.gather(*self._drills, return_exceptions=True)
        self._drills.clear()


if TYPE_CHECKING:  # AliyunCloud must stay a CloudProvider (mypy checks this line)

    def _is_provider(cloud: AliyunCloud) -> CloudProvider:
        return cloud
