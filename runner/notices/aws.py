"""AWS IMDSv2: spot interruption notices and rebalance recommendations, polled by the runner.

IMDSv2 needs a session token from ``PUT /latest/api/token`` (:class:`~runner.notices.http.TokenMetadataHttp`);
the launches require it, with a hop limit of 1 so a container on the host cannot get one. The base URL comes from
``AWS_EC2_METADATA_SERVICE_ENDPOINT`` like botocore, so tests and the local cloud can serve their own.
"""

from __future__ import annotations

import json
from datetime import datetime

from handlers.reports import InstanceNotice
from runner.notices.base import NoticeUnavailable
from runner.notices.http import TokenMetadataHttp

DEFAULT_ENDPOINT = "http://169.254.169.254"


def parse_time(value: str) -> datetime:
    """IMDS times look like ``2026-11-30T08:22:00Z``."""
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


class AwsImdsSource(TokenMetadataHttp):
    name = "aws-imds"
    token_header = "X-aws-ec2-metadata-token"
    ttl_header = "X-aws-ec2-metadata-token-ttl-seconds"
    endpoint_variable = "AWS_EC2_METADATA_SERVICE_ENDPOINT"
    default_endpoint = DEFAULT_ENDPOINT

    async def poll(self) -> list[InstanceNotice]:
        notices = []
        action = await self.get("/latest/meta-data/spot/instance-action")
        if action is not None:
            notices.append(
                InstanceNotice(kind="spot-interruption", source=self.name, deadline=_deadline(_json(action)))
            )
        rebalance = await self.get("/latest/meta-data/events/recommendations/rebalance")
        if rebalance is not None:
            _json(rebalance)
            notices.append(InstanceNotice(kind="rebalance", source=self.name, deadline=None))
        return notices


def _deadline(doc: dict[str, str]) -> datetime:
    try:
        return parse_time(doc["time"])
    except (KeyError, TypeError, ValueError) as exc:
        raise NoticeUnavailable(f"instance-action has no valid time: {doc!r}") from exc


def _json(body: str) -> dict[str, str]:
    try:
        doc = json.loads(body)
    except ValueError as exc:
        raise NoticeUnavailable(f"metadata answered malformed JSON: {body[:100]!r}") from exc
    if not isinstance(doc, dict):
        raise NoticeUnavailable(f"metadata answered unexpected JSON: {body[:100]!r}")
    return doc
