"""Which region an SQS queue is in, read from its URL: the bot consumes one queue per region (issue 51), and a
queue is reached only through a client of its own region (SQS finds it by the region a request is signed for).

AWS's queue URLs say their region: ``https://sqs.us-west-2.amazonaws.com/<account>/<name>`` (also ``.amazonaws.com.cn``
and a VPC endpoint's ``vpce-….sqs.us-west-2.vpce.amazonaws.com``), the one spelling the runner stack's output and
``GetQueueUrl`` give; so do LocalStack's (``sqs.us-west-2.localhost.localstack.cloud``). A
local endpoint's URL (moto's ``http://127.0.0.1:5000/<account>/<name>``) says none: that queue is in the bot's home
region (``aws.region``). An AWS host whose region cannot be read, or a URL that is not ``<account>/<name>``, is
refused.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

REGION = r"[a-z]{2}(?:-[a-z]+)+-\d{1,2}"
# The hosts that say their region, each with it as the group "region".
REGION_HOSTS = (
    re.compile(rf"^sqs\.(?P<region>{REGION})\.amazonaws\.com(?:\.cn)?$"),
    re.compile(rf"^vpce-[a-z0-9-]+\.sqs\.(?P<region>{REGION})\.vpce\.amazonaws\.com(?:\.cn)?$"),
    re.compile(rf"^sqs\.(?P<region>{REGION})\.localhost\.localstack\.cloud$"),
)
QUEUE_PATH = re.compile(r"^/(?P<account>\d{12})/(?P<name>[A-Za-z0-9_-]{1,80}(?:\.fifo)?)/?$")
EXAMPLE = "https://sqs.<region>.amazonaws.com/<account>/<queue>"


def queue_region(url: str) -> str | None:
    """The region ``url`` names; None for a local endpoint's (the home region's). ValueError for a URL that is no
    SQS queue's, with the reason in one line."""
    parts = urlsplit(url.strip())
    if parts.username or parts.password:  # not repeated here: it may hold a secret
        raise ValueError("a queue URL holds no user or password: the bot signs with its AWS credentials")
    if parts.scheme not in ("https", "http") or not parts.hostname:
        raise ValueError(f"{url!r} is not a queue URL ({EXAMPLE})")
    if parts.query or parts.fragment or not QUEUE_PATH.match(parts.path):
        raise ValueError(f"{url!r} does not end in /<account>/<queue> ({EXAMPLE})")
    host = parts.hostname.lower()
    for pattern in REGION_HOSTS:
        found = pattern.match(host)
        if found:
            return found.group("region")
    if host.endswith((".amazonaws.com", ".amazonaws.com.cn")):
        raise ValueError(f"{url!r}: no region in its host ({EXAMPLE})")
    return None


def queue_name(url: str) -> str:
    """The queue's name, the last part of its URL."""
    return url.rstrip("/").rsplit("/", 1)[-1]


def check_queue_urls(urls: list[str]) -> list[str]:
    """``urls`` stripped, each a queue's URL and none twice; ValueError naming the first that is not."""
    checked: list[str] = []
    for url in (url.strip() for url in urls):
        if not url:
            continue
        queue_region(url)
        if url in checked:
            raise ValueError(f"{url!r} is listed twice")
        checked.append(url)
    return checked
