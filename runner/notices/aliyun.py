"""Alibaba Cloud ECS metadata: the preemptible instance's termination time, polled by the runner.

``/latest/meta-data/instance/spot/termination-time`` answers 404 until ECS decides to reclaim the instance,
then the UTC time it will be released (about five minutes ahead). The base URL is configurable with
``ALIBABA_CLOUD_METADATA_ENDPOINT`` so tests and the local cloud can serve their own.
"""

from __future__ import annotations

import os

import aiohttp

from runner.notices.aws import parse_time
from runner.notices.base import MetadataUnavailable, Notice

DEFAULT_ENDPOINT = "http://100.100.100.200"
_REQUEST_TIMEOUT = aiohttp.ClientTimeout(total=0.5)


class AliyunMetadataSource:
    name = "aliyun-metadata"

    def __init__(self, endpoint: str | None = None) -> None:
        base = endpoint or os.environ.get("ALIBABA_CLOUD_METADATA_ENDPOINT") or DEFAULT_ENDPOINT
        self.base = base.rstrip("/")
        self._session: aiohttp.ClientSession | None = None

    async def poll(self) -> list[Notice]:
        body = await self._get("/latest/meta-data/instance/spot/termination-time")
        if body is None:
            return []
        try:
            deadline = parse_time(body.strip())
        except ValueError as exc:
            raise MetadataUnavailable(f"termination-time is not a timestamp: {body[:60]!r}") from exc
        return [Notice("termination", self.name, deadline)]

    async def instance_id(self) -> str | None:
        try:
            return await self._get("/latest/meta-data/instance-id")
        except MetadataUnavailable:
            return None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def _get(self, path: str) -> str | None:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=_REQUEST_TIMEOUT)
        try:
            async with self._session.get(self.base + path) as response:
                if response.status == 404:
                    return None
                if response.status != 200:
                    raise MetadataUnavailable(f"GET {path} answered HTTP {response.status}")
                return await response.text()
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise MetadataUnavailable(f"GET {path}: {exc!r}") from exc
