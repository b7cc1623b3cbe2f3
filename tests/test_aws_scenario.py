"""The AWS story end to end on moto: launch, spot warning through EventBridge → SQS, checkpoint, relaunch in
another zone, resume, completion and the cost report.

moto runs the APIs (EC2, S3, SNS, SQS); it does not boot instances. :class:`Ec2Bodies` plays EC2's part: when
the real ``AwsCloud`` has launched an instance, it boots the runner the instance's user-data names, with a
local IMDSv2 for that instance id. Everything else is the production path: the spec and checkpoints on S3, the
runner's reports over SNS → SQS, the bot's SQS consumer, decisions, relaunch with ``avoid_zones``. Each runner
signs with the key it read from its own instance's key object (attempt-keys/<role id>:<instance id>, found through
its IMDS); the spec objects hold none, and the key objects are gone once the instances are released.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
from collections.abc import Collection
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import boto3

from bot.cloud.aws.provider import AwsCloud
from bot.cloud.base import Instance
from bot.cloud.local.metadata import LocalMetadataServer
from fakes.bot_harness import SECRET, running_bot, start_job, wait_job
from handlers.jobs import JobState, Market
from handlers.notes import InterruptTestResult
from handlers.reconcile import CloudInstance
from handlers.report_keys import ReportKeys
from handlers.spec import JobSpec
from tests.runner_harness import runner_env
from tests.test_aws_cloud import BUCKET, build_world


class Ec2Bodies:
    """The real provider, plus what EC2 does with an instance it launched: boot the runner of its user-data."""

    def __init__(self, cloud: AwsCloud, world: Any, root: Path, endpoint: str) -> None:
        self.cloud = cloud
        self.world = world
        self.root = root
        self.endpoint = endpoint
        self.name = cloud.name
        self.notice = cloud.notice
        self.notice_seconds = cloud.notice_seconds
        self.bodies: dict[str, tuple[asyncio.subprocess.Process, LocalMetadataServer]] = {}

    def checkpoint_uri(self, job_id: str) -> str:
        return self.cloud.checkpoint_uri(job_id)

    async def launch(
        self,
        spec: JobSpec,
        instance_types: list[str],
        market: Market,
        *,
        avoid_zones: Collection[str] = (),
        zone: str | None = None,
    ) -> Instance:
        instance = await self.cloud.launch(spec, instance_types, market, avoid_zones=avoid_zones, zone=zone)
        user_data = self.world.user_data(instance.instance_id)
        spec_uri = re.search(r"FINETUNE_SPEC=(\S+)", user_data)
        assert spec_uri is not None, "the user-data must name the spec"
        key_from = re.search(r"FINETUNE_KEY_FROM=(\S+)", user_data)  # where key objects lie, as the unit reads it
        imds = await LocalMetadataServer(instance_id=instance.instance_id).start()
        env = runner_env(
            AWS_ENDPOINT_URL=self.endpoint,
            AWS_EC2_METADATA_SERVICE_ENDPOINT=imds.endpoint,
            FINETUNE_PROGRESS_SECONDS="0.5",
            **({"FINETUNE_KEY_FROM": key_from.group(1)} if key_from else {}),
        )
        log = (self.root / f"{instance.instance_id}.log").open("wb")
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "runner.cli",
            "run",
            "--spec",
            spec_uri.group(1),
            "--work-dir",
            str(self.root / instance.instance_id),
            env=env,
            stdout=log,
            stderr=log,
        )
        self.bodies[instance.instance_id] = (process, imds)
        return instance

    @property
    def renews_storage(self) -> bool:
        return self.cloud.renews_storage

    async def renew_storage_credentials(self, job_id: str, attempt: int, instance_id: str, *, key_salt: str) -> None:
        await self.cloud.renew_storage_credentials(job_id, attempt, instance_id, key_salt=key_salt)

    async def drop_storage_credentials(self, instance_id: str) -> None:
        await self.cloud.drop_storage_credentials(instance_id)

    async def hourly_price(self, instance_types: list[str], market: Market) -> float | None:
        return await self.cloud.hourly_price(instance_types, market)

    async def terminate(self, instance_id: str, job_id: str) -> None:
        await self.cloud.terminate(instance_id, job_id)

    async def interrupt_test(self, instance_id: str) -> InterruptTestResult:
        return await self.cloud.interrupt_test(instance_id)

    async def stop_runner(self, instance_id: str) -> None:
        await self.cloud.stop_runner(instance_id)

    async def list_instances(self) -> list[CloudInstance]:
        return await self.cloud.list_instances()

    async def close(self) -> None:
        for process, imds in self.bodies.values():
            if process.returncode is None:
                process.kill()
                await process.wait()
            await imds.stop()
        await self.cloud.close()


def spot_warning(instance_id: str) -> str:
    return json.dumps(
        {
            "version": "0",
            "id": f"warning-{instance_id}",
            "detail-type": "EC2 Spot Instance Interruption Warning",
            "source": "aws.ec2",
            "account": "123456789012",
            "time": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "region": "us-east-1",
            "resources": [f"arn:aws:ec2:us-east-1:123456789012:instance/{instance_id}"],
            "detail": {"instance-id": instance_id, "instance-action": "terminate"},
        }
    )


async def test_spot_warning_relaunch_in_another_zone_resume_and_cost_report(tmp_path: Path, aws: str) -> None:
    world = build_world(aws)
    sns = boto3.client("sns", endpoint_url=aws)
    sqs = boto3.client("sqs", endpoint_url=aws)
    # Two topics into one queue, as deploy/aws/finetune.yaml makes them: EventBridge's and the runners'.
    events_topic = sns.create_topic(Name="finetune-events")["TopicArn"]
    report_topic = sns.create_topic(Name="finetune-reports")["TopicArn"]
    queue_url = sqs.create_queue(QueueName="finetune-events")["QueueUrl"]
    queue_arn = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    for topic in (events_topic, report_topic):
        sns.subscribe(TopicArn=topic, Protocol="sqs", Endpoint=queue_arn)
    settings = world.settings(report_topic_arn=report_topic, zones=["us-east-1a", "us-east-1b"])
    cloud = Ec2Bodies(
        AwsCloud(settings, report_keys=ReportKeys(SECRET)),  # each runner signs with its attempt's key
        world,
        tmp_path / "instances",
        aws,
    )
    (tmp_path / "instances").mkdir()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    intake = {
        "finetune_sqs_queue_url": queue_url,
        "finetune_events_topics": events_topic,
        "finetune_report_topics": report_topic,
    }
    async with running_bot(tmp_path / "state", cloud=lambda _: cloud, **intake) as (
        service,
        chat,
    ):
        job_id = await start_job(service, "console:ana", "start tiny steps=20 step_seconds=0.25")
        running = await wait_job(
            service, job_id, lambda j: j.state is JobState.RUNNING and (j.step or 0) >= 6, timeout=180
        )
        first = running.attempts[0]
        assert first.instance_id and first.zone == "us-east-1a" and first.market == "spot"
        assert world.instance(first.instance_id)["InstanceLifecycle"] == "spot"

        # EC2 posts the notice on the instance and EventBridge puts the warning on the queue.
        process, imds = cloud.bodies[first.instance_id]
        imds.interrupt(seconds=120)
        sqs.send_message(QueueUrl=queue_url, MessageBody=spot_warning(first.instance_id))

        done = await wait_job(
            service,
            job_id,
            lambda j: j.state in (JobState.SUCCEEDED, JobState.RESUME_FAILED, JobState.FAILED),
            timeout=240,
        )
        assert await asyncio.wait_for(process.wait(), 30) == 75
        for _ in range(100):
            if any("finished" in text for _, channel, text in chat.transcript if channel == "thread"):
                break
            await asyncio.sleep(0.1)

    assert done.state is JobState.SUCCEEDED and done.step == 20
    second = done.attempts[1]
    assert second.zone == "us-east-1b" and second.resumed_from_step is not None
    assert done.interruptions == 1 and done.steps_lost == 0
    said = [(channel, text) for job, channel, text in chat.transcript if job == job_id]
    alerts = [index for index, (channel, _) in enumerate(said) if channel == "alert"]
    saved = [index for index, (_, text) in enumerate(said) if text.startswith("💾")]
    assert len(alerts) == 1 and saved and alerts[0] < saved[0]  # the channel hears of the warning first
    [report] = [text for channel, text in said if channel == "thread" and "finished" in text]
    assert "1 interruption(s), 0 steps lost" in report and "against on-demand" in report
    for attempt in done.attempts:  # both instances released: the old by the bot, the last by its runner
        assert world.instance(str(attempt.instance_id))["State"]["Name"] in ("shutting-down", "terminated")
    assert world.s3.get_object(Bucket=BUCKET, Key=f"jobs/{job_id}/COMPLETED.json")["Body"].read()
    for attempt in done.attempts:  # signed reports came from both runners, yet no spec ever held a key
        spec = world.object(f"jobs/{job_id}/spec-attempt-{attempt.number}.json")
        key = ReportKeys(SECRET).of(job_id, attempt.number, attempt.key_salt)
        assert b'"report_key_from"' in spec and key.encode() not in spec
    assert world.keys_under("attempt-keys/") == []  # deleted as each instance was released
