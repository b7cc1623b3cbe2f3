"""AWS events reach the bot: an EventBridge spot warning on SQS (moto) alerts the channel before the runner."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from pathlib import Path

import boto3

from fakes.bot_harness import (
    CHANNEL,
    SLEEPS,
    eventually,
    quick_recipe,
    running_bot,
    settled,
    start_job,
    wait_job,
    write_config,
)
from handlers.jobs import JobState


def spot_warning(instance_id: str) -> str:
    return json.dumps(
        {
            "version": "0",
            "id": "1e5527d7-bb36-4607-3370-4164db56a40e",
            "detail-type": "EC2 Spot Instance Interruption Warning",
            "source": "aws.ec2",
            "account": "123456789012",
            "time": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "region": "us-east-1",
            "resources": [f"arn:aws:ec2:us-east-1a:instance/{instance_id}"],
            "detail": {"instance-id": instance_id, "instance-action": "terminate"},
        }
    )


async def test_an_eventbridge_spot_warning_on_sqs_alerts_at_once(tmp_path: Path, aws: str) -> None:
    sqs = boto3.client("sqs", endpoint_url=aws)
    queue_url = sqs.create_queue(QueueName="finetune-events")["QueueUrl"]
    config = write_config(tmp_path / "bot.yaml", recipes=[quick_recipe("sleepy", SLEEPS)])
    async with running_bot(tmp_path / "state", config, finetune_sqs_queue_url=queue_url) as (service, chat):
        job_id = await start_job(service, "console:ana", "start sleepy")
        running = await wait_job(service, job_id, lambda job: job.state is JobState.RUNNING)
        assert running.current is not None and running.current.instance_id
        for _ in range(2):  # SQS delivers at least once; the same EventBridge event twice alerts once
            sqs.send_message(QueueUrl=queue_url, MessageBody=spot_warning(running.current.instance_id))
        warned = await wait_job(service, job_id, lambda job: job.state is JobState.INTERRUPTED)
        assert warned.interruptions == 1

        async def both_taken() -> bool:  # deleted from the queue only once published to the bus
            attributes = await asyncio.to_thread(sqs.get_queue_attributes, QueueUrl=queue_url, AttributeNames=["All"])
            counts = attributes["Attributes"]
            return counts["ApproximateNumberOfMessages"] == counts["ApproximateNumberOfMessagesNotVisible"] == "0"

        await eventually(both_taken)
        await eventually(lambda: settled(service))  # both copies handled, and every note they made posted
        alerts = [text for job, channel, text in chat.transcript if job == job_id and channel == "alert"]
        assert len(alerts) == 1 and "from aws.ec2" in alerts[0]


async def test_a_spot_warning_on_another_regions_queue_alerts_and_every_surface_names_the_zone(
    tmp_path: Path, aws: str
) -> None:
    """One queue per region (issue 51): the home region's by moto's URL (no region in it: the home region's), the
    other's by the URL AWS gives (us-west-2, read from it). A job in us-west-2b is warned through us-west-2's queue
    alone; the alert, its card (``status``) and ``costs`` say us-west-2b, which names the region."""
    home = boto3.client("sqs", endpoint_url=aws, region_name="us-east-1")
    west = boto3.client("sqs", endpoint_url=aws, region_name="us-west-2")
    home_url = home.create_queue(QueueName="finetune-events")["QueueUrl"]
    west.create_queue(QueueName="finetune-events")
    west_url = "https://sqs.us-west-2.amazonaws.com/123456789012/finetune-events"  # the runner stack's output
    policy = {"admins": ["console:ana"]}
    config = write_config(tmp_path / "bot.yaml", recipes=[quick_recipe("sleepy", SLEEPS)], policy=policy)
    queues = f"{home_url},{west_url}"
    async with running_bot(
        tmp_path / "state", config, finetune_sqs_queue_url=queues, finetune_local_zones="us-west-2b"
    ) as (service, chat):
        job_id = await start_job(service, "console:ana", "start sleepy")
        running = await wait_job(service, job_id, lambda job: job.state is JobState.RUNNING)
        assert running.current is not None and running.current.instance_id
        instance = running.current.instance_id
        west.send_message(QueueUrl=west_url, MessageBody=spot_warning(instance))
        warned = await wait_job(service, job_id, lambda job: job.state is JobState.INTERRUPTED)
        assert warned.interruptions == 1

        async def taken() -> bool:  # from us-west-2's queue, by the consumer of that region
            attributes = await asyncio.to_thread(west.get_queue_attributes, QueueUrl=west_url, AttributeNames=["All"])
            counts = attributes["Attributes"]
            return counts["ApproximateNumberOfMessages"] == counts["ApproximateNumberOfMessagesNotVisible"] == "0"

        await eventually(taken)
        await eventually(lambda: settled(service))
        alerts = [text for job, channel, text in chat.transcript if job == job_id and channel == "alert"]
        assert len(alerts) == 1 and f"{instance} in us-west-2b (from aws.ec2)" in alerts[0], alerts
        assert (
            home.get_queue_attributes(QueueUrl=home_url, AttributeNames=["ApproximateNumberOfMessages"])["Attributes"][
                "ApproximateNumberOfMessages"
            ]
            == "0"
        )
        names = {task.get_name() for task in service.loops.tasks}
        assert {"sqs us-east-1/finetune-events", "sqs us-west-2/finetune-events"} <= names

        card = await service.bot.command("console:ana", CHANNEL, f"status {job_id}")
        assert "· us-west-2b (" in card, card
        costs = await service.bot.command("console:ana", CHANNEL, "costs")
        assert "By zone:\n  us-west-2b: $" in costs, costs
