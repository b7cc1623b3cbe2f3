"""Alibaba Cloud ECS metadata: the preemptible instance's termination time, polled by the runner.

``/latest/meta-data/instance/spot/termination-time`` answers 404 until ECS decides to reclaim the instance,
then the UTC time it will be released (about five minutes ahead). Instances are launched in the hardened
metadata mode (``HttpTokens=required``), so every read carries a session token from ``PUT /latest/api/token``
(:class:`~runner.notices.http.TokenMetadataHttp`, with Alibaba's header names). The base URL is configurable with
``ALIBABA_CLOUD_METADATA_ENDPOINT`` so tests and the local cloud can serve their own.
"""

from __future__ import annotations

from handlers.reports import InstanceNotice
from runner.notices.aws import parse_time
from runner.notices.base import NoticeUnavailable
from runner.notices.http import TokenMetadataHttp

DEFAULT_ENDPOINT = "http://100.100.100.200"
TOKEN_HEADER = "X-aliyun-ecs-metadata-token"
TTL_HEADER = "X-aliyun-ecs-metadata-token-ttl-seconds"


class AliyunMetadataSource(TokenMetadataHttp):
    name = "aliyun-metadata"
    token_header = TOKEN_HEADER
    ttl_header = TTL_HEADER
    endpoint_variable = "ALIBABA_CLOUD_METADATA_ENDPOINT"
    default_endpoint = DEFAULT_ENDPOINT

    async def poll(self) -> list[InstanceNotice]:
        body = await self.get("/latest/meta-data/instance/spot/termination-time")
        if body is None:
            return []
        try:
            deadline = parse_time(body.strip())
        except ValueError as exc:
            raise NoticeUnavailable(f"termination-time is not a timestamp: {body[:60]!r}") from exc
        return [InstanceNotice(kind="spot-interruption", source=self.name, deadline=deadline)]
