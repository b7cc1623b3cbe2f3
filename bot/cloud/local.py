"""The local cloud: an "instance" is a runner subprocess on this machine with its own IMDSv2 endpoint.

It behaves like EC2 Spot (or, with ``dialect="aliyun"``, a preemptible ECS instance) where it matters: ``drill``
posts an interruption notice on the instance's metadata service, in that cloud's dialect, and kills the instance
when the grace period is over, so the runner's real notice path runs;
an instance whose runner exits is gone, and the bot hears about it as a cloud event, as it would from
EventBridge.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import os
import secrets
import signal
import sys
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from bot.cloud.base import CloudEventSink, Instance, LaunchError
from bot.cloud.local_metadata import LocalMetadataServer
from handlers.jobs import Market
from handlers.messages import CloudEvent
from handlers.spec import JobSpec

log = logging.getLogger(__name__)

LOCAL_SPOT_PRICE = 0.30  # $/h: what the cost report uses for a local "instance"
LOCAL_ON_DEMAND_PRICE = 1.00


@dataclass
class LocalInstance:
    instance_id: str
    process: asyncio.subprocess.Process
    metadata: LocalMetadataServer
    tasks: list[asyncio.Task[None]] = field(default_factory=list)


class LocalCloud:
    """``dialect`` picks the metadata service the local instances serve and their runners watch: AWS IMDSv2, or
    Alibaba ECS's (``instance/spot/termination-time``), so Alibaba's notice path runs end to end on one machine."""

    name = "local"

    def __init__(
        self,
        state_dir: Path,
        on_event: CloudEventSink,
        grace_seconds: float = 30.0,
        runner_env: dict[str, str] | None = None,
        dialect: Literal["aws", "aliyun"] = "aws",
        checkpoint_base: str | None = None,
    ) -> None:
        self.dialect = dialect
        self.notice: Literal["aws", "aliyun", "none"] = dialect
        self.state_dir = state_dir
        # Where checkpoints go: a local directory by default, or any store the runner opens (s3://, oss://).
        self.checkpoint_base = checkpoint_base or (state_dir / "bucket").resolve().as_uri() + "/"
        self.on_event = on_event
        self.grace_seconds = grace_seconds
        self.runner_env = runner_env or {}
        self.instances: dict[str, LocalInstance] = {}
        self._numbers = itertools.count(1)
        self._prefix = secrets.token_hex(3)

    def checkpoint_uri(self, job_id: str) -> str:
        return f"{self.checkpoint_base.rstrip('/')}/jobs/{job_id}/"

    async def launch(
        self, spec: JobSpec, instance_types: list[str], market: Market, *, avoid_zones: Collection[str] = ()
    ) -> Instance:
        instance_id = f"i-{self._prefix}{next(self._numbers):010x}"
        metadata = await LocalMetadataServer(dialect=self.dialect, instance_id=instance_id).start()
        home = self.state_dir / "instances" / instance_id
        home.mkdir(parents=True, exist_ok=True)
        spec_path = home / "spec.json"
        spec_path.write_text(spec.model_dump_json())
        env = {
            **os.environ,
            "AWS_EC2_METADATA_SERVICE_ENDPOINT": metadata.endpoint,
            "ALIBABA_CLOUD_METADATA_ENDPOINT": metadata.endpoint,
            "FINETUNE_TRAINER_ECHO": "0",
            "FINETUNE_PROGRESS_SECONDS": "1",
            **self.runner_env,
        }
        try:
            with (home / "runner.log").open("ab") as log_file:
                process = await asyncio.create_subprocess_exec(
                    sys.executable,
                    "-m",
                    "runner.cli",
                    "run",
                    "--spec",
                    str(spec_path),
                    "--work-dir",
                    str(home / "work"),
                    env=env,
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=log_file,
                    stderr=log_file,
                    start_new_session=True,
                )
        except OSError as exc:
            await metadata.stop()
            raise LaunchError(f"could not start the local runner: {exc}") from exc
        instance = LocalInstance(instance_id, process, metadata)
        instance.tasks.append(asyncio.create_task(self._watch(instance), name=f"watch:{instance_id}"))
        self.instances[instance_id] = instance
        log.info("launched local instance %s for %s attempt %d", instance_id, spec.job_id, spec.attempt)
        price = LOCAL_SPOT_PRICE if market == "spot" else LOCAL_ON_DEMAND_PRICE
        return Instance(
            instance_id, (instance_types or ["local.cpu"])[0], "local-a", market, price, LOCAL_ON_DEMAND_PRICE
        )

    async def hourly_price(self, instance_types: list[str], market: Market) -> float | None:
        return LOCAL_SPOT_PRICE if market == "spot" else LOCAL_ON_DEMAND_PRICE

    async def terminate(self, instance_id: str) -> None:
        instance = self.instances.get(instance_id)
        if instance is not None and instance.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(instance.process.pid, signal.SIGKILL)

    async def drill(self, instance_id: str) -> str:
        instance = self._running(instance_id)
        deadline = instance.metadata.interrupt(seconds=self.grace_seconds)
        instance.tasks.append(asyncio.create_task(self._reclaim_after_grace(instance), name=f"reclaim:{instance_id}"))
        return f"spot interruption notice posted on {instance_id}; it is reclaimed at {deadline:%H:%M:%S} UTC"

    async def stop_runner(self, instance_id: str) -> None:
        instance = self._running(instance_id)
        instance.process.send_signal(signal.SIGTERM)

    async def close(self) -> None:
        """Local instances live and die with the bot: kill them quietly (no cloud events on the way out)."""
        for instance in list(self.instances.values()):
            for task in instance.tasks:
                task.cancel()
            await self.terminate(instance.instance_id)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(instance.process.wait(), 10)
            await instance.metadata.stop()

    def _running(self, instance_id: str) -> LocalInstance:
        instance = self.instances.get(instance_id)
        if instance is None or instance.process.returncode is not None:
            raise LaunchError(f"instance {instance_id} is not running")
        return instance

    async def _reclaim_after_grace(self, instance: LocalInstance) -> None:
        await asyncio.sleep(self.grace_seconds)
        await self.terminate(instance.instance_id)

    async def _watch(self, instance: LocalInstance) -> None:
        code = await instance.process.wait()
        await instance.metadata.stop()
        detail = json.dumps({"exit_code": code})
        log.info("local instance %s is gone (runner exit %s)", instance.instance_id, code)
        await self.on_event(
            CloudEvent(type="instance-gone", instance_id=instance.instance_id, source="local", detail=detail)
        )
