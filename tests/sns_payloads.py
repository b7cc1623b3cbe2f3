"""AWS payloads in the shapes AWS documents: EventBridge EC2 events, SNS envelopes, runner report lines."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from typing import Any

from handlers.reports import Progress, dump_report

ACCOUNT = "123456789012"
REGION = "us-east-1"
TOPIC_ARN = f"arn:aws:sns:{REGION}:{ACCOUNT}:finetune-events"
ISSUED = datetime(2025, 3, 4, 5, 6, 7, tzinfo=UTC)


def ec2_event(detail_type: str, detail: dict[str, Any], *, event_id: str | None = None, time: datetime = ISSUED) -> str:
    """An EventBridge event as an SQS target receives it (the example events of the EC2 user guide)."""
    instance = detail.get("instance-id", "i-1234567890abcdef0")
    return json.dumps(
        {
            "version": "0",
            "id": event_id or str(uuid.uuid4()),
            "detail-type": detail_type,
            "source": "aws.ec2",
            "account": ACCOUNT,
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "region": REGION,
            "resources": [f"arn:aws:ec2:{REGION}:{ACCOUNT}:instance/{instance}"],
            "detail": detail,
        }
    )


def spot_warning(instance_id: str, action: str | None = "terminate", **kwargs: Any) -> str:
    detail = {"instance-id": instance_id}
    if action is not None:
        detail["instance-action"] = action
    return ec2_event("EC2 Spot Instance Interruption Warning", detail, **kwargs)


def rebalance(instance_id: str, **kwargs: Any) -> str:
    return ec2_event("EC2 Instance Rebalance Recommendation", {"instance-id": instance_id}, **kwargs)


def state_change(instance_id: str, state: str, **kwargs: Any) -> str:
    return ec2_event("EC2 Instance State-change Notification", {"instance-id": instance_id, "state": state}, **kwargs)


def sns_envelope(
    message: str, *, attributes: dict[str, str] | None = None, topic_arn: str = TOPIC_ARN, kind: str = "Notification"
) -> str:
    """An SNS notification as SNS delivers it to an SQS subscription without raw delivery (signature not checked)."""
    envelope: dict[str, Any] = {
        "Type": kind,
        "MessageId": str(uuid.uuid4()),
        "TopicArn": topic_arn,
        "Message": message,
        "Timestamp": "2025-03-04T05:06:08.123Z",
        "SignatureVersion": "1",
        "Signature": "c2lnbmF0dXJl",
        "SigningCertURL": f"https://sns.{REGION}.amazonaws.com/SimpleNotificationService-0000.pem",
        "UnsubscribeURL": f"https://sns.{REGION}.amazonaws.com/?Action=Unsubscribe",
    }
    if attributes:
        envelope["MessageAttributes"] = {name: {"Type": "String", "Value": value} for name, value in attributes.items()}
    return json.dumps(envelope)


def progress_report(job_id: str = "ft-7k2q", step: int = 10) -> tuple[Progress, str]:
    """A runner ``progress`` report and its wire line, as the runner publishes it to SNS."""
    report = Progress(job_id=job_id, attempt=1, step=step, total_steps=100, loss=1.5)
    return report, dump_report(report)
