"""One local instance, in a process of its own, as an EC2 or ECS instance is a machine of its own.

``python -m bot.cloud.local.instance <home>/instance.json`` is what the local cloud starts for a launch. It

- serves the instance's metadata service (:class:`~bot.cloud.local.metadata.LocalMetadataServer`, in the
  configured cloud's dialect), where the runner hears its spot notice;
- serves a control endpoint for the cloud's side of things: ``interrupt-test`` (a notice now, the instance
  reclaimed when the grace period is over), ``notice`` (the notice only), ``rebalance``, ``stop`` (the runner's
  stop request) and ``terminate``; a caller presents the instance's token, read from the registry;
- relays the runner's reports to whichever replica is alive (``/runner/reports``, as a load balancer in front of
  the replicas would), so reports never depend on the replica that launched it;
- supervises the runner, and when the runner is gone, marks itself gone in the registry and puts the
  ``instance-gone`` cloud event on the events stream, in one transaction, as EventBridge would tell the bot.

Its record in the shared Redis (:mod:`bot.cloud.local.registry`) is how every replica finds it. It is the one
process of its (job, attempt): a second start of the same instance exits with :data:`EXIT_TAKEN`. It outlives
any replica; when Redis (the cloud's control plane here) is unreachable for longer than ``orphan_seconds``, it
takes its runner down and exits, so nothing trains forever for nobody.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import os
import secrets
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

import aiohttp
import redis.asyncio as aioredis
from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field

from bot.bus import encode_event
from bot.cloud.local.env import instance_environment
from bot.cloud.local.metadata import LocalMetadataServer
from bot.cloud.local.registry import LocalInstanceRecord
from bot.errors import StoreUnavailable
from bot.header_form import LOCAL_INSTANCE_TOKEN
from bot.keys import Keys
from bot.queues import EVENT_FIELD, STREAM_MAXLEN
from bot.redis_server import connect
from bot.replicas import Replicas
from handlers.backoff import backoff
from handlers.jobs import Market
from handlers.messages import CloudEvent
from handlers.notes import InterruptTestResult
from handlers.signing import SIGNATURE_HEADER, TIMESTAMP_HEADER
from handlers.spec import JobSpec

log = logging.getLogger("bot.cloud.local.instance")

EXIT_TAKEN = 3  # another process is this instance already
TOKEN_HEADER = LOCAL_INSTANCE_TOKEN.name
REPORTS_PATH = "/runner/reports"
OWNER_SECONDS = 60  # how long a starting instance holds its id before its record shows it is up
_RELAY_TIMEOUT = aiohttp.ClientTimeout(total=10)


class InstanceConfig(BaseModel):
    """What the local cloud hands a new instance (``instance.json`` in its home directory)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    instance_id: str
    job_id: str
    attempt: int
    redis_url: str
    prefix: str
    partitions: int = Field(default=1, ge=1)  # the store's (bot/keys.py): its events go to its job's partition
    cluster: bool = False  # the Redis at redis_url is a cluster (the bot found out; the instance need not ask)
    dialect: Literal["aws", "aliyun"] = "aws"
    grace_seconds: float = Field(default=30.0, gt=0)
    orphan_seconds: float = Field(default=60.0, gt=0)
    spec: Path  # the spec as the bot built it
    runner_env: dict[str, str] = Field(default_factory=dict)
    instance_type: str = "local.cpu"
    zone: str = "local-a"
    market: Market = "spot"
    price_per_hour: float | None = None
    on_demand_price_per_hour: float | None = None
    # The instance holds its runner after it is registered for its profile's boot (launch and fetch), in wall time
    # ``boot_seconds × time_scale`` (bot/cloud/local/profile_clock.py); 0 under the instant profile.
    boot_seconds: float = Field(default=0.0, ge=0)  # in the profile's seconds
    time_scale: float = Field(default=1.0, ge=0)  # wall seconds per profile second


class LocalInstance:
    def __init__(self, config: InstanceConfig, home: Path) -> None:
        self.config = config
        self.home = home
        self.keys = Keys(config.prefix, config.partitions)
        self.redis: aioredis.Redis = connect(config.redis_url, cluster=config.cluster)
        self.replicas = Replicas(self.redis, self.keys)
        self.metadata = LocalMetadataServer(dialect=config.dialect, instance_id=config.instance_id)
        self.token = secrets.token_urlsafe(24)
        self.runner: asyncio.subprocess.Process | None = None
        self.control_url = ""
        self._control: web.AppRunner | None = None
        self._http: aiohttp.ClientSession | None = None
        self._upstreams: list[str] = []
        self._upstreams_at = 0.0
        self._stop_sent = False
        self._reclaim: asyncio.Task[None] | None = None
        self._taken = asyncio.Event()  # reclaimed or terminated: a boot still under way ends without a runner

    async def run(self) -> int:
        owner = self.keys.local_owner(self.config.instance_id)
        taken: list[bool] = []

        async def claim() -> None:
            mine = str(os.getpid())
            # An answer lost on the way is told apart by the value: our pid means it was ours all along.
            ok = await self.redis.set(owner, mine, nx=True, ex=OWNER_SECONDS) or await self.redis.get(owner) == mine
            taken.append(bool(ok))

        await self._with_redis("claiming the instance id", claim)
        if not taken or not taken[0]:
            log.info("instance %s is already up elsewhere (or Redis is gone)", self.config.instance_id)
            await self.redis.aclose()
            return EXIT_TAKEN
        try:
            await self.metadata.start()
            await self._start_control()
            if self.config.boot_seconds * self.config.time_scale > 0:
                # Registered first, as a cloud's launch call returns while the host boots; the runner after the boot.
                if not await self._register():
                    return 1
                if not await self._boot():
                    await self._gone(-signal.SIGKILL)
                    return 0
            self.runner = await self._start_runner()
            if not await self._register():
                return 1  # no control plane to register with: nobody would ever see this instance
            watchdog = asyncio.create_task(self._watch_redis(), name="watchdog")
            code = await self.runner.wait()
            watchdog.cancel()
            log.info("runner of %s exited with %s", self.config.instance_id, code)
            await self._gone(code)
            return 0
        finally:
            if self.runner is not None and self.runner.returncode is None:
                self._kill_runner()
            if self._reclaim is not None:
                self._reclaim.cancel()
            await self.metadata.stop()
            if self._control is not None:
                await self._control.cleanup()
            if self._http is not None:
                await self._http.close()
            await self.redis.aclose()

    # -- start ----------------------------------------------------------------------------------------------

    async def _start_control(self) -> None:
        app = web.Application(client_max_size=1024 * 1024)
        app.router.add_post("/interrupt-test", self._interrupt_test)
        app.router.add_post("/notice", self._notice)
        app.router.add_post("/rebalance", self._rebalance)
        app.router.add_post("/stop", self._stop)
        app.router.add_post("/terminate", self._terminate)
        app.router.add_post(REPORTS_PATH, self._relay)
        self._control = web.AppRunner(app, access_log=None)
        await self._control.setup()
        site = web.TCPSite(self._control, "127.0.0.1", 0)
        await site.start()
        self.control_url = f"http://127.0.0.1:{self._control.addresses[0][1]}"

    async def _start_runner(self) -> asyncio.subprocess.Process:
        """The runner, on a spec whose reports come to this instance's relay."""
        spec = JobSpec.model_validate_json(self.config.spec.read_text())
        relay = self.control_url + REPORTS_PATH
        spec_path = self.home / "spec.json"
        spec_path.write_text(spec.model_copy(update={"report": [*spec.report, relay]}).model_dump_json())
        env = {
            # No firewall rule on the bot's host unless its operator asks (FINETUNE_METADATA_GUARD passes through):
            # the metadata service here is the local stand-in, and the trainer keeps the user the bot chose.
            "FINETUNE_METADATA_GUARD": "off",
            **instance_environment(os.environ),  # this process starts with no more; an older bot's may have
            "AWS_EC2_METADATA_SERVICE_ENDPOINT": self.metadata.endpoint,
            "ALIBABA_CLOUD_METADATA_ENDPOINT": self.metadata.endpoint,
            "FINETUNE_TRAINER_ECHO": "0",
            "FINETUNE_PROGRESS_SECONDS": "1",
            **self.config.runner_env,
        }
        with (self.home / "runner.log").open("ab") as log_file:
            return await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "runner.cli",
                "run",
                "--spec",
                str(spec_path),
                "--work-dir",
                str(self.home / "work"),
                env=env,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log_file,
                stderr=log_file,
                start_new_session=True,  # its own process group: terminate takes the trainer with it
            )

    async def _boot(self) -> bool:
        """The profile's boot: False when the instance was taken during it."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._taken.wait(), self.config.boot_seconds * self.config.time_scale)
        return not self._taken.is_set()

    async def _register(self) -> bool:
        config = self.config
        record = LocalInstanceRecord(
            instance_id=config.instance_id,
            job_id=config.job_id,
            attempt=config.attempt,
            control=self.control_url,
            token=self.token,
            metadata=self.metadata.endpoint,
            pid=os.getpid(),
            runner_pid=self.runner.pid if self.runner is not None else 0,
            instance_type=config.instance_type,
            zone=config.zone,
            market=config.market,
            price_per_hour=config.price_per_hour,
            on_demand_price_per_hour=config.on_demand_price_per_hour,
            boot_seconds=config.boot_seconds,
            launched_at=datetime.now(UTC),
        )
        if not await self._with_redis("registering", lambda: self._write_record(record)):
            return False
        log.info("instance %s up: control %s, metadata %s", config.instance_id, self.control_url, record.metadata)
        return True

    async def _write_record(self, record: LocalInstanceRecord) -> None:
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hset(self.keys.local_instance(record.instance_id), mapping=record.fields())  # type: ignore[arg-type]
            pipe.sadd(self.keys.local_instances, record.instance_id)
            await pipe.execute()

    # -- the end --------------------------------------------------------------------------------------------

    async def _gone(self, code: int) -> None:
        """Gone in the registry and on the bus, together (the event's id is fixed: a retry dedups)."""
        instance_id = self.config.instance_id
        event = CloudEvent(
            id=f"gone-{instance_id}",
            kind="instance-gone",
            instance_id=instance_id,
            source="local",
            detail=json.dumps({"exit_code": code}),
        )

        async def write() -> None:
            # One transaction on a single server; on a cluster (two slots) the two writes of one pipeline, which a
            # retry repeats whole (the event's id is fixed).
            async with self.redis.pipeline(transaction=True) as pipe:
                pipe.hset(
                    self.keys.local_instance(instance_id),
                    mapping={"state": "gone", "ended_at": datetime.now(UTC).isoformat(), "exit_code": str(code)},
                )
                pipe.xadd(
                    self.keys.events_in(self.keys.partition_of(self.config.job_id)),
                    {EVENT_FIELD: encode_event(event)[EVENT_FIELD]},
                    maxlen=STREAM_MAXLEN,
                    approximate=True,
                )
                await pipe.execute()

        await self._with_redis("reporting the instance gone", write)

    async def _with_redis(self, what: str, work: Callable[[], Awaitable[None]]) -> bool:
        """Run ``work`` until Redis answers, for at most ``orphan_seconds``; False if it never did."""
        deadline = time.monotonic() + self.config.orphan_seconds
        failures = 0
        while True:
            try:
                await work()
                return True
            except (StoreUnavailable, OSError) as exc:
                if time.monotonic() > deadline:
                    log.error("gave up %s: Redis unreachable for %.0fs (%s)", what, self.config.orphan_seconds, exc)
                    return False
                failures += 1
                await asyncio.sleep(backoff(failures, base=0.1, cap=2.0, jitter=0))

    async def _watch_redis(self) -> None:
        """No control plane for ``orphan_seconds``: nobody can see or stop this instance, so it stops itself."""
        last_seen = time.monotonic()
        while True:
            await asyncio.sleep(min(2.0, self.config.orphan_seconds / 4))
            try:
                await self.redis.ping()
                last_seen = time.monotonic()
            except Exception:
                if time.monotonic() - last_seen > self.config.orphan_seconds:
                    log.error("Redis unreachable for %.0fs: the instance shuts down", self.config.orphan_seconds)
                    self._kill_runner()
                    return

    def _kill_runner(self) -> None:
        self._taken.set()
        if self.runner is not None and self.runner.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.runner.pid, signal.SIGKILL)

    # -- control --------------------------------------------------------------------------------------------

    def _allowed(self, request: web.Request) -> bool:
        given = LOCAL_INSTANCE_TOKEN.read(request.headers)  # ASCII or None: compare_digest raises on other text
        return given is not None and secrets.compare_digest(given, self.token)

    async def _interrupt_test(self, request: web.Request) -> web.Response:
        """A spot notice now and a reclaim when the grace period is over; asked again, it repeats the first."""
        if not self._allowed(request):
            return web.json_response({"error": "bad token"}, status=403)
        if self.metadata.interruption is None:
            self.metadata.interrupt(seconds=self.config.grace_seconds)
            self._reclaim = asyncio.create_task(self._reclaim_after_grace(), name="reclaim")
        deadline = self.metadata.interruption
        assert deadline is not None
        done = InterruptTestResult(instance_id=self.config.instance_id, way="notice", reclaim_at=deadline)
        # Kept with the record, so the same test asked again, even once the instance is gone, answers the same.
        await self.redis.hset(
            self.keys.local_instance(self.config.instance_id), "interrupt_test", done.model_dump_json()
        )
        return web.json_response(done.model_dump(mode="json"))

    async def _notice(self, request: web.Request) -> web.Response:
        if not self._allowed(request):
            return web.json_response({"error": "bad token"}, status=403)
        seconds = float((await request.json()).get("seconds", self.config.grace_seconds))
        deadline = self.metadata.interrupt(seconds=seconds)
        return web.json_response({"deadline": deadline.isoformat()})

    async def _rebalance(self, request: web.Request) -> web.Response:
        if not self._allowed(request):
            return web.json_response({"error": "bad token"}, status=403)
        self.metadata.recommend_rebalance()
        return web.json_response({})

    async def _stop(self, request: web.Request) -> web.Response:
        """The runner's stop request (SIGTERM: it checkpoints, commits and exits), sent once."""
        if not self._allowed(request):
            return web.json_response({"error": "bad token"}, status=403)
        if self.runner is not None and self.runner.returncode is None and not self._stop_sent:
            self._stop_sent = True
            self.runner.send_signal(signal.SIGTERM)
        return web.json_response({})

    async def _terminate(self, request: web.Request) -> web.Response:
        if not self._allowed(request):
            return web.json_response({"error": "bad token"}, status=403)
        self._kill_runner()
        return web.json_response({})

    async def _reclaim_after_grace(self) -> None:
        await asyncio.sleep(self.config.grace_seconds)
        log.info("grace period over: reclaiming %s", self.config.instance_id)
        self._kill_runner()

    # -- the report relay -----------------------------------------------------------------------------------

    async def _relay(self, request: web.Request) -> web.Response:
        """Forward a runner report, signature and all, to a live replica; 503 (the runner retries) if none takes it."""
        body = await request.read()
        headers = {
            name: request.headers[name]
            for name in ("Content-Type", TIMESTAMP_HEADER, SIGNATURE_HEADER)
            if name in request.headers
        }
        if self._http is None:
            self._http = aiohttp.ClientSession(timeout=_RELAY_TIMEOUT)
        for url in await self._live_replicas():
            try:
                async with self._http.post(url, data=body, headers=headers) as response:
                    if response.status >= 500:
                        continue
                    kind = response.headers.get("Content-Type", "application/json")
                    answer = await response.read()
                    return web.Response(status=response.status, body=answer, headers={"Content-Type": kind})
            except (aiohttp.ClientError, TimeoutError):
                self._upstreams_at = 0.0  # that one may be gone: ask the registry again next time
                continue
        return web.json_response({"error": "no replica is taking reports"}, status=503)

    async def _live_replicas(self) -> list[str]:
        if time.monotonic() - self._upstreams_at > 2.0 or not self._upstreams:
            try:
                self._upstreams = await self.replicas.live()
                self._upstreams_at = time.monotonic()
            except Exception as exc:  # Redis down for a moment: the replicas last seen are still worth a try
                log.warning("cannot read the live replicas (%s)", exc)
        return list(self._upstreams)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m bot.cloud.local.instance <home>/instance.json", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    path = Path(args[0])
    config = InstanceConfig.model_validate_json(path.read_text())
    gc.freeze()  # the modules live as long as the process: kept out of every collection, the last at exit included
    return asyncio.run(LocalInstance(config, path.parent).run())


if __name__ == "__main__":
    sys.exit(main())
