"""Which region an SQS queue is in, read from its URL (bot/cloud/aws/queue_url.py): every form AWS gives names it,
a local endpoint's names none (the home region's), and anything else is refused with the reason."""

from __future__ import annotations

import pytest

from bot.cloud.aws.queue_url import check_queue_urls, queue_name, queue_region

pytestmark = pytest.mark.unit

ACCOUNT = "123456789012"


@pytest.mark.parametrize(
    ("url", "region"),
    [
        (f"https://sqs.us-west-2.amazonaws.com/{ACCOUNT}/finetune-events", "us-west-2"),
        (f"https://sqs.ap-southeast-1.amazonaws.com/{ACCOUNT}/finetune-events.fifo", "ap-southeast-1"),
        (f"https://sqs.cn-north-1.amazonaws.com.cn/{ACCOUNT}/finetune-events", "cn-north-1"),
        (f"https://sqs.us-gov-west-1.amazonaws.com/{ACCOUNT}/finetune-events", "us-gov-west-1"),
        (f"https://vpce-0a1b2c3d-4e5f.sqs.us-east-2.vpce.amazonaws.com/{ACCOUNT}/finetune-events", "us-east-2"),
        (f"http://sqs.eu-west-1.localhost.localstack.cloud:4566/{ACCOUNT}/finetune-events", "eu-west-1"),
        (f"http://127.0.0.1:5000/{ACCOUNT}/finetune-events", None),  # moto: the home region
        (f"http://localhost:4566/{ACCOUNT}/finetune-events/", None),
    ],
)
def test_the_region_is_read_from_the_url(url: str, region: str | None) -> None:
    assert queue_region(url) == region
    assert queue_name(url) in ("finetune-events", "finetune-events.fifo")


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        (f"https://sqs.amazonaws.com/{ACCOUNT}/q", "no region in its host"),
        (f"https://queue.amazonaws.com/{ACCOUNT}/q", "no region in its host"),  # one spelling: sqs.<region>…
        (f"https://eu-central-1.queue.amazonaws.com/{ACCOUNT}/q", "no region in its host"),
        (f"https://sqs.Not_A_Region.amazonaws.com/{ACCOUNT}/q", "no region in its host"),
        ("https://sqs.us-west-2.amazonaws.com/q", "does not end in /<account>/<queue>"),
        ("https://sqs.us-west-2.amazonaws.com/12345/q", "does not end in /<account>/<queue>"),
        (f"https://sqs.us-west-2.amazonaws.com/{ACCOUNT}/q?x=1#y/", "does not end in /<account>/<queue>"),
        (f"https://sqs.us-west-2.amazonaws.com/{ACCOUNT}/bad name", "does not end in /<account>/<queue>"),
        ("arn:aws:sqs:us-west-2:123456789012:q", "is not a queue URL"),
        (f"https://me:pw@sqs.us-west-2.amazonaws.com/{ACCOUNT}/q", "holds no user or password"),
        (f"ftp://sqs.us-west-2.amazonaws.com/{ACCOUNT}/q", "is not a queue URL"),
    ],
)
def test_anything_else_is_refused_with_the_reason(url: str, reason: str) -> None:
    with pytest.raises(ValueError, match=reason.replace("<", ".").replace(">", ".")):
        queue_region(url)


def test_a_list_is_stripped_empty_items_dropped_and_a_queue_listed_twice_refused() -> None:
    west = f"https://sqs.us-west-2.amazonaws.com/{ACCOUNT}/finetune-events"
    east = f"https://sqs.us-east-1.amazonaws.com/{ACCOUNT}/finetune-events"
    assert check_queue_urls([f" {east}", "", f"{west} "]) == [east, west]
    with pytest.raises(ValueError, match="listed twice"):
        check_queue_urls([west, east, west])
