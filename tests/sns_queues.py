"""SQS / SNS / EventBridge plumbing on moto for the event-source tests, plus a bus stand-in that records."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import boto3

from handlers.messages import BusMessage, dump_message


class RecordingBus:
    """``publish`` as the SQS source and SNS endpoint call it; ``fail_next`` makes the next calls raise."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.fail_next = 0

    async def publish(self, event: BusMessage) -> str:
        if self.fail_next:
            self.fail_next -= 1
            raise ConnectionError("the bus is down")
        self.events.append(dump_message(event))  # as the bus stores it
        return f"{len(self.events)}-0"


class Aws:
    """Sync boto3 clients on moto (the calls are quick; the code under test uses aiobotocore)."""

    def __init__(self, endpoint: str) -> None:
        self.sqs = boto3.client("sqs", endpoint_url=endpoint)
        self.sns = boto3.client("sns", endpoint_url=endpoint)
        self.events = boto3.client("events", endpoint_url=endpoint)

    def queue(self, name: str, *, dlq_arn: str | None = None, max_receives: int = 2, visibility: int = 1) -> str:
        attributes = {"VisibilityTimeout": str(visibility)}
        if dlq_arn:
            attributes["RedrivePolicy"] = json.dumps({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": max_receives})
        return str(self.sqs.create_queue(QueueName=name, Attributes=attributes)["QueueUrl"])

    def arn(self, queue_url: str) -> str:
        reply = self.sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["QueueArn"])
        return str(reply["Attributes"]["QueueArn"])

    def depth(self, queue_url: str) -> int:
        """Messages in the queue, visible or in flight."""
        names = ["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]
        attributes = self.sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=names)["Attributes"]
        return sum(int(attributes[name]) for name in names)

    def subscribe(self, topic_arn: str, queue_url: str, *, raw: bool = False) -> None:
        attributes = {"RawMessageDelivery": "true"} if raw else {}
        self.sns.subscribe(TopicArn=topic_arn, Protocol="sqs", Endpoint=self.arn(queue_url), Attributes=attributes)

    def route_ec2_events(self, queue_url: str) -> None:
        """An EventBridge rule for the three EC2 events the bot handles, targeting the queue."""
        pattern = {
            "source": ["aws.ec2"],
            "detail-type": [
                "EC2 Spot Instance Interruption Warning",
                "EC2 Instance Rebalance Recommendation",
                "EC2 Instance State-change Notification",
            ],
        }
        self.events.put_rule(Name="finetune-ec2", EventPattern=json.dumps(pattern))
        self.events.put_targets(Rule="finetune-ec2", Targets=[{"Id": "queue", "Arn": self.arn(queue_url)}])


async def until(condition: Callable[[], bool], timeout: float = 60.0, what: str = "condition") -> None:
    """Wait for ``condition`` (polled); fail the test if it does not hold within ``timeout`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)
