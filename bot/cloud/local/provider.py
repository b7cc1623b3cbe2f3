"""The local cloud: an "instance" is a process of its own on this machine (see :mod:`bot.cloud.local.instance`)
running the runner, with its own metadata endpoint in the cloud's dialect.

It behaves like EC2 Spot (or, with ``dialect="aliyun"``, a preemptible ECS instance) where it matters: an interrupt test
posts an interruption notice on the instance's metadata service and the instance is reclaimed when the grace
period is over, so the runner's real notice path runs; an instance whose runner exits is gone, and the bot hears
about it as a cloud event on its events stream, as it would from EventBridge.

The instances belong to the cloud, not to a replica: each registers itself in the shared Redis
(:mod:`bot.cloud.local.registry`), so any replica launches, interrupt-tests, stops or terminates any of them through its
control endpoint, and a restarted bot finds them again (:meth:`LocalCloud.instances`). Their runners' reports go
through the instance to whichever replica is alive. A launch is idempotent per (job, attempt): the instance id is
derived from them, and a launch retried after a crash returns the instance the first one started.

An instance gets what a real one would (:mod:`bot.cloud.local.env`): its spec, its attempt's report key, its
metadata endpoint and the process basics; never the bot's own environment (chat tokens, the master report secret).

Zones and spot capacity: the cloud has ``zones`` (``local-a`` alone by default; named as a real cloud's, such as
``eu-west-1a,us-west-2a``, they span regions: the first one's is the home region), each with spot capacity until
:meth:`LocalCloud.take_spot_capacity` takes it away (shared in Redis, so every replica sees it): a spot launch
pinned there is refused as a capacity error, an unpinned one goes to another zone with capacity or is refused too
(the market is the spot authority's to change); and every spot instance held there is reclaimed (a notice, then
the end of the grace period), as a cloud reclaims spot when capacity runs out. On-demand always has room. Prices
are the cloud's own, configured per market (``spot_price``, ``on_demand_price``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
import time
from collections.abc import Collection
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal
from urllib.parse import unquote, urlsplit

import aiohttp
import redis.asyncio as aioredis

from bot.cloud.base import CloudError, ForeignInstance, GangPlacement, Instance, LaunchError
from bot.cloud.local.env import instance_environment
from bot.cloud.local.instance import EXIT_TAKEN, TOKEN_HEADER, InstanceConfig
from bot.cloud.local.profile import INSTANT, LocalProfile
from bot.cloud.local.profile_clock import ProfileClock
from bot.cloud.local.registry import LocalInstanceRecord, LocalRegistry, local_instance_id
from bot.cloud.local.trainer_user import TRAINER_USER_ENV, trainer_stays_with_root
from bot.keys import DEFAULT_KEYS, Keys
from bot.partitions import is_cluster_client
from handlers.gang import LOOPBACK
from handlers.jobs import Market
from handlers.notes import InterruptTestResult
from handlers.reconcile import CloudInstance
from handlers.regions import AWS_TRANSFER_PRICE_PER_GB, region_of
from handlers.report_keys import ReportKeys
from handlers.spec import (
    AnyControl,
    GoControl,
    JobSpec,
    RegroupControl,
    SaveControl,
    control_key,
    dump_control,
    node_control_key,
)

log = logging.getLogger(__name__)

LOCAL_SPOT_PRICE = 0.30  # $/h: what the cost report uses for a local "instance"
LOCAL_ON_DEMAND_PRICE = 1.00
START_TIMEOUT = 120.0  # how long a new instance may take to come up (a busy machine imports slowly)
REPORT_KEY_VARIABLE = "FINETUNE_REPORT_SECRET"
ORPHAN_SECONDS = 60.0  # an instance that cannot reach Redis that long takes itself down
_CONTROL_TIMEOUT = aiohttp.ClientTimeout(total=10)
_PROC = Path("/proc/self")


class LocalCloud:
    """``dialect`` picks the metadata service the local instances serve and their runners watch: AWS IMDSv2, or
    Alibaba ECS's (``instance/spot/termination-time``), so Alibaba's notice path runs end to end on one machine."""

    name = "local"

    def __init__(
        self,
        state_dir: Path,
        redis: aioredis.Redis | None = None,
        redis_url: str = "",
        keys: Keys = DEFAULT_KEYS,
        grace_seconds: float = 30.0,
        runner_env: dict[str, str] | None = None,
        report_keys: ReportKeys | None = None,
        dialect: Literal["aws", "aliyun"] = "aws",
        checkpoint_base: str | None = None,
        orphan_seconds: float = ORPHAN_SECONDS,
        zones: tuple[str, ...] = ("local-a",),
        spot_price: float = LOCAL_SPOT_PRICE,
        on_demand_price: float = LOCAL_ON_DEMAND_PRICE,
        profile: LocalProfile = INSTANT,
    ) -> None:
        # The real cloud it stands in for (launch, restore, capacity), and its timeline (profile_clock.py).
        self.profile = profile
        self.clock = ProfileClock(profile)
        self.zones = zones or ("local-a",)
        # Regions as a real cloud's (bot.cloud.base.SpansRegions): its zones' names say them, the first zone's is the
        # home region (the bucket's), and an instance in another pays this per checkpoint GB it moves.
        self.home_region = region_of(self.zones[0])
        self.transfer_price_per_gb = AWS_TRANSFER_PRICE_PER_GB
        self.spot_price = spot_price
        self.on_demand_price = on_demand_price
        self.dialect = dialect
        self.notice: Literal["aws", "aliyun", "none"] = dialect
        self.state_dir = state_dir
        # Where checkpoints go: a local directory by default, or any store the runner opens (s3://, oss://).
        self.checkpoint_base = checkpoint_base or (state_dir / "bucket").resolve().as_uri() + "/"
        self.redis_url = redis_url
        self.keys = keys
        self._registry = LocalRegistry(redis, keys) if redis is not None else None
        self.grace_seconds = grace_seconds
        self.notice_seconds = grace_seconds  # its spot notice: the grace from the notice to the reclaim
        self.runner_env = dict(runner_env or {})
        # A bot run as root from a place other users cannot reach keeps its trainers as root (said once, here).
        self.trainer_note: str | None = None
        if TRAINER_USER_ENV not in self.runner_env:
            self.trainer_note = trainer_stays_with_root(state_dir, os.environ)
        if self.trainer_note is not None:
            self.runner_env[TRAINER_USER_ENV] = "root"
            log.warning("%s", self.trainer_note)
        self.report_keys = report_keys  # each runner gets its attempt's key (FINETUNE_REPORT_SECRET), never the master
        self.orphan_seconds = orphan_seconds
        self._http: aiohttp.ClientSession | None = None
        self._starting: set[asyncio.subprocess.Process] = set()

    @property
    def registry(self) -> LocalRegistry:
        if self._registry is None:
            raise RuntimeError("the local cloud was made without a Redis")
        return self._registry

    def checkpoint_uri(self, job_id: str) -> str:
        return f"{self.checkpoint_base.rstrip('/')}/jobs/{job_id}/"

    async def release_gang_placement(self, job_id: str) -> None:
        """Nothing to remove: local instances of a gang share the loopback, no placement object."""

    async def write_node_control(
        self, job_id: str, attempt: int, generation: int, node_rank: int, control: RegroupControl
    ) -> None:
        """A gang node's regroup, into its control object in the job's checkpoint store (a ``file://`` one: the
        local cloud's own; an object store is written by the AWS and Alibaba providers)."""
        self._write_control(job_id, node_control_key(attempt, generation, node_rank), control)

    launches_ahead = True  # an instance is a process: a job's next one starts beside its current one

    async def hand_over(self, job_id: str, attempt: int) -> None:
        """Go, to the runner of ``attempt`` launched ahead of a switch of market (its control object)."""
        self._write_control(job_id, control_key(attempt), GoControl())

    async def save_runner(self, instance_id: str, at: datetime) -> None:
        """Ask the runner for a fresh checkpoint, training on (its control object)."""
        record = await self._running(instance_id)
        self._write_control(record.job_id, control_key(record.attempt), SaveControl(at=at))

    def _write_control(self, job_id: str, key: str, control: AnyControl) -> None:
        parsed = urlsplit(self.checkpoint_uri(job_id))
        if parsed.scheme != "file":
            raise CloudError(f"the local cloud writes control objects to a file:// store only, not {parsed.scheme}://")
        target = Path(unquote(parsed.path)) / key
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            partial = target.with_name(target.name + ".partial")
            partial.write_bytes(dump_control(control))
            partial.replace(target)  # the runner reads a whole object or none
        except OSError as exc:
            raise CloudError(f"could not write {target}: {exc}") from exc

    # -- launch -------------------------------------------------------------------------------------------

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
        """The attempt's instance: the one already up for (job, attempt) if there is one, else a new one."""
        instance_id = local_instance_id(spec.job_id, spec.attempt)
        found = await self.registry.get(instance_id)
        if found is None:
            where = await self._placement(market, zone, avoid_zones)
            found = await self._start(instance_id, spec, (instance_types or ["local.cpu"])[0], market, where)
        else:
            log.info("local instance %s of %s attempt %d is up already", instance_id, spec.job_id, spec.attempt)
        return Instance(
            found.instance_id,
            found.instance_type,
            found.zone,
            found.market,
            found.price_per_hour,
            found.on_demand_price_per_hour,
            private_ip=LOOPBACK,  # every local instance is this machine: a gang's nodes meet on loopback
            launch_seconds=found.boot_seconds,
        )

    async def _placement(self, market: Market, zone: str | None, avoid_zones: Collection[str]) -> str:
        """The zone of a new instance; LaunchError(capacity) when spot was asked where there is none."""
        if zone is not None and zone not in self.zones:
            raise LaunchError(f"the local cloud has no zone {zone!r} (zones: {', '.join(self.zones)})", zone=zone)
        if market == "on-demand":
            return zone or self.zones[0]
        lost = await self.zones_without_spot()
        if zone is not None:
            candidates = [zone]
        else:
            candidates = [z for z in self.zones if z not in avoid_zones] + [z for z in self.zones if z in avoid_zones]
        for candidate in candidates:
            if candidate not in lost:
                return candidate
        raise LaunchError(
            f"InsufficientInstanceCapacity: no spot capacity in {', '.join(candidates)}", capacity=True, zone=zone
        )

    async def spot_zones(self, instance_types: list[str]) -> list[str]:
        return list(self.zones)

    async def zones_without_spot(self) -> set[str]:
        return {str(zone) for zone in await self.registry.redis.smembers(self.keys.local_no_spot)}

    async def take_spot_capacity(self, zone: str, reclaim: bool = True) -> list[str]:
        """No spot in ``zone`` from now on: launches there are refused, and each spot instance held there is
        reclaimed (its notice, then the end of the grace period). Returns the instances being reclaimed.
        ``reclaim`` False: only new launches are refused (a zone that has run out, its instances kept)."""
        await self.registry.redis.sadd(self.keys.local_no_spot, zone)
        if not reclaim:
            return []
        held = [
            record
            for record in await self.instances()
            if record.state == "running" and record.zone == zone and record.market == "spot"
        ]
        for record in held:
            await self.interrupt_test(record.instance_id)
        return [record.instance_id for record in held]

    async def give_spot_capacity(self, zone: str) -> None:
        await self.registry.redis.srem(self.keys.local_no_spot, zone)

    async def _start(
        self, instance_id: str, spec: JobSpec, instance_type: str, market: Market, zone: str
    ) -> LocalInstanceRecord:
        home = (self.state_dir / "instances" / instance_id).resolve()
        home.mkdir(parents=True, exist_ok=True)
        (home / "launch-spec.json").write_text(spec.model_dump_json())
        runner_env = dict(self.runner_env)
        if self.report_keys is not None:
            runner_env[REPORT_KEY_VARIABLE] = self.report_keys.of(spec.job_id, spec.attempt, spec.key_salt)
        config = InstanceConfig(
            instance_id=instance_id,
            job_id=spec.job_id,
            attempt=spec.attempt,
            redis_url=self.redis_url,
            prefix=self.keys.prefix,
            partitions=self.keys.partitions,
            cluster=is_cluster_client(self.registry.redis),
            dialect=self.dialect,
            grace_seconds=self.grace_seconds,
            orphan_seconds=self.orphan_seconds,
            spec=home / "launch-spec.json",
            runner_env=runner_env,
            instance_type=instance_type,
            zone=zone,
            market=market,
            price_per_hour=self.spot_price if market == "spot" else self.on_demand_price,
            on_demand_price_per_hour=self.on_demand_price,
            boot_seconds=self.clock.boot(zone, launch_group(spec)),
            time_scale=self.profile.time_scale,
        )
        # Its user data, in effect (the attempt's report key): readable by the instance's owner only.
        descriptor = os.open(home / "instance.json", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "w") as handle:
            handle.write(config.model_dump_json())
        deadline = time.monotonic() + START_TIMEOUT
        process = await self._spawn(home)
        while time.monotonic() < deadline:
            found = await self.registry.get(instance_id)
            if found is not None and found.state == "gone" and process.returncode is not None:
                # Up and gone before this launch even saw it: the runner refused to start (a bad spec, say).
                raise LaunchError(f"the runner of {instance_id} exited at once: {_tail(home / 'runner.log')}")
            if found is not None:
                log.info("launched local instance %s for %s attempt %d", instance_id, spec.job_id, spec.attempt)
                return found
            if process.returncode == EXIT_TAKEN and not await self.registry.redis.exists(
                self.keys.local_owner(instance_id)
            ):
                process = await self._spawn(home)  # whoever held the id died before it came up
            elif process.returncode not in (None, EXIT_TAKEN, 0):
                raise LaunchError(f"local instance {instance_id} did not start: {_tail(home / 'instance.log')}")
            await asyncio.sleep(0.05)
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        raise LaunchError(f"local instance {instance_id} did not come up within {START_TIMEOUT:.0f}s")

    async def _spawn(self, home: Path) -> asyncio.subprocess.Process:
        try:
            with (home / "instance.log").open("ab") as log_file:
                process = await asyncio.create_subprocess_exec(
                    sys.executable,
                    "-m",
                    "bot.cloud.local.instance",
                    str(home / "instance.json"),
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=log_file,
                    stderr=log_file,
                    env=instance_environment(os.environ),  # what an instance would have, not the bot's own
                    start_new_session=True,  # not the bot's: a replica killed leaves its instances running
                )
        except OSError as exc:
            raise LaunchError(f"could not start a local instance: {exc}") from exc
        self._starting.add(process)
        task = asyncio.ensure_future(process.wait())
        task.add_done_callback(lambda _done: self._starting.discard(process))
        return process

    async def trainer_log(self, job_id: str, attempt: int, lines: int) -> list[str] | None:
        """The tail of the trainer's log of ``job_id``'s ``attempt``: the file its runner writes in the instance's
        work directory (its output, stdout and stderr; the runner's own log is ``runner.log`` beside it)."""
        path = self.state_dir / "instances" / local_instance_id(job_id, attempt) / "work" / "trainer.log"
        return await asyncio.to_thread(_last_lines, path, lines)

    async def hourly_price(self, instance_types: list[str], market: Market) -> float | None:
        return self.spot_price if market == "spot" else self.on_demand_price

    # -- acting on an instance, from any replica -------------------------------------------------------------

    async def terminate(self, instance_id: str, job_id: str) -> None:
        """Reclaim the instance (one that is gone, or never was, is fine); ForeignInstance, touching nothing, when
        it is not ``job_id``'s."""
        record = await self.registry.get(instance_id)
        if record is None or record.state == "gone":
            return
        if record.job_id != job_id:
            raise ForeignInstance(f"instance {instance_id} belongs to {record.job_id}, not {job_id}: left alone")
        try:
            await self._control(record, "terminate")
        except CloudError:
            # Its control endpoint is down (the instance process died): the machine is ours, so its runner is
            # taken down here, if that process group is still this instance's runner (a pid may be reused).
            if _is_runner_of(record.runner_pid, instance_id):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(record.runner_pid, signal.SIGKILL)

    async def interrupt_test(self, instance_id: str) -> InterruptTestResult:
        """One interrupt-test per instance: asked again (a retried effect), it says what the first one did."""
        record = await self.registry.get(instance_id)
        if record is not None and record.interrupt_test:
            return InterruptTestResult.model_validate_json(record.interrupt_test)
        reply = await self._control(await self._running(instance_id), "interrupt-test")
        return InterruptTestResult.model_validate(reply)

    async def stop_runner(self, instance_id: str) -> None:
        await self._control(await self._running(instance_id), "stop")

    async def post_notice(self, instance_id: str, seconds: float) -> None:
        """Post a spot notice on the instance's metadata, with no reclaim (the cloud's own notice, for tests)."""
        await self._control(await self._running(instance_id), "notice", {"seconds": seconds})

    async def recommend_rebalance(self, instance_id: str) -> None:
        await self._control(await self._running(instance_id), "rebalance")

    async def instances(self) -> list[LocalInstanceRecord]:
        """Every instance of this cloud, running or gone (what a reconciliation compares the jobs with)."""
        return await self.registry.instances()

    async def list_instances(self) -> list[CloudInstance]:
        """Every instance of this cloud as reconciliation sees it: ``running`` only while its process is alive and
        can reach this bot's Redis; ``terminated`` once gone.

        The registry alone would keep an instance "running" whose process was killed without a word (with the
        bot, say): the machine is this one, so its process is checked. An instance cut off from this control
        plane (started against another Redis: an embedded one that stopped with its bot) cannot be seen, stopped
        or reached by its runner's reports here, and takes itself down within ``orphan_seconds``; it is taken
        down now. Either way the registry records it gone (no event: reconciliation says it), and a runner left
        behind by a dead instance process is stopped, as a machine that lost power takes its processes with it.
        """
        listed: list[CloudInstance] = []
        for record in await self.instances():
            state = record.state
            if state == "running":
                why = self._cut_off(record)
                if why is not None:
                    await self._reap(record, why)
                    state = "gone"
            listed.append(
                CloudInstance(
                    record.instance_id,
                    "running" if state == "running" else "terminated",
                    record.job_id,
                    record.attempt,
                    record.launched_at,
                )
            )
        return listed

    def _cut_off(self, record: LocalInstanceRecord) -> str | None:
        """Why a registered instance cannot be running for this bot (None: it is)."""
        if not _is_instance_of(record.pid, record.instance_id):
            return "its process is gone"
        config = self.state_dir / "instances" / record.instance_id / "instance.json"
        try:
            started = InstanceConfig.model_validate_json(config.read_text())
        except (OSError, ValueError):
            return None  # not started from this state dir: nothing more to check here
        if self.redis_url and not _same_server(started.redis_url, self.redis_url):
            return "it serves another Redis (its bot's embedded one, gone)"
        return None

    async def _reap(self, record: LocalInstanceRecord, why: str) -> None:
        log.warning("local instance %s of %s is gone: %s", record.instance_id, record.job_id, why)
        if _is_instance_of(record.pid, record.instance_id):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(record.pid, signal.SIGKILL)
        if _is_runner_of(record.runner_pid, record.instance_id):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(record.runner_pid, signal.SIGKILL)
        await self.registry.redis.hset(
            self.keys.local_instance(record.instance_id),
            mapping={"state": "gone", "ended_at": datetime.now(UTC).isoformat()},
        )

    async def terminate_all(self, timeout: float = 30.0) -> None:
        """Reclaim every running instance and wait until each is gone (tests and the demo clean up with it)."""
        running = [record for record in await self.instances() if record.state == "running"]
        for record in running:
            await self.terminate(record.instance_id, record.job_id)
        deadline = time.monotonic() + timeout
        for record in running:
            while time.monotonic() < deadline:
                current = await self.registry.get(record.instance_id)
                if current is None or current.state == "gone" or not _alive(current.pid):
                    break
                await asyncio.sleep(0.05)

    async def close(self) -> None:
        """The instances are the cloud's: they outlive this bot (and take themselves down without Redis)."""
        if self._http is not None:
            await self._http.close()
            self._http = None

    async def _running(self, instance_id: str) -> LocalInstanceRecord:
        record = await self.registry.get(instance_id)
        if record is None or record.state != "running":
            raise CloudError(f"instance {instance_id} is not running")
        return record

    async def _control(self, record: LocalInstanceRecord, action: str, body: dict[str, Any] | None = None) -> Any:
        if self._http is None:
            self._http = aiohttp.ClientSession(timeout=_CONTROL_TIMEOUT)
        url = f"{record.control}/{action}"
        try:
            async with self._http.post(url, json=body or {}, headers={TOKEN_HEADER: record.token}) as response:
                if response.status != 200:
                    raise CloudError(f"instance {record.instance_id} refused {action}: HTTP {response.status}")
                return await response.json()
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise CloudError(f"instance {record.instance_id} is not running ({action}: {exc})") from exc


def launch_group(spec: JobSpec) -> str | None:
    """The launch a node's boot belongs to (:meth:`ProfileClock.boot`): a gang's nodes of one generation."""
    return f"{spec.job_id}/{spec.gang.generation}" if spec.gang is not None else None


def _same_server(one: str, other: str) -> bool:
    """Do two Redis URLs name the same server and database (however spelled)?"""

    def where(url: str) -> tuple[str, int, str]:
        parts = urlsplit(url)
        host = parts.hostname or ""
        host = "127.0.0.1" if host in ("localhost", "::1") else host
        return host if parts.scheme != "unix" else parts.path, parts.port or 6379, parts.path.strip("/") or "0"

    return where(one) == where(other)


def _is_instance_of(pid: int, instance_id: str) -> bool:
    """Is ``pid`` the live process of local instance ``instance_id``? (Its command line names the instance's home.)"""
    if not _PROC.exists():
        return _alive(pid)  # no /proc to tell a reused pid apart: a live pid is taken for the instance
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return b"bot.cloud.local.instance" in cmdline and instance_id.encode() in cmdline


def _is_runner_of(pid: int, instance_id: str) -> bool:
    """Is ``pid`` a live runner started for ``instance_id``? (Its command line names the instance's spec.)"""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return b"runner.cli" in cmdline and instance_id.encode() in cmdline


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _last_lines(path: Path, count: int, most: int = 64 * 1024) -> list[str] | None:
    """The last ``count`` lines of ``path``, read from its last ``most`` bytes (a log may be long); None when it
    does not exist."""
    try:
        with path.open("rb") as handle:
            size = handle.seek(0, os.SEEK_END)
            handle.seek(max(size - most, 0))
            tail = handle.read()
    except FileNotFoundError:
        return None
    found = tail.decode(errors="replace").splitlines()
    if size > most:
        found = found[1:]  # the first one read may be the end of a line
    return found[-count:]


def _tail(path: Path, lines: int = 5) -> str:
    """The last ``lines`` of a log on one line, for an error message."""
    try:
        found = _last_lines(path, lines)
    except OSError:
        found = None
    return "(no log)" if found is None else " | ".join(found)
