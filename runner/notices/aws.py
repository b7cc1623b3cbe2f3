"""AWS IMDSv2: spot interruption notices and rebalance recommendations, polled by the runner.

IMDSv2 needs a session token from ``PUT /latest/api/token``; we refresh it well before its TTL runs out and
once more on a 401 (the service restarted or the clock jumped). The base URL comes from
``AWS_EC2_METADATA_SERVICE_ENDPOINT`` like botocore, so tests and the local cloud can serve their own.
"""

from __future__ import annotations

import json
import os
import time
from datetime import datetime

from handlers.events import InstanceNotice
from runner.notices.base import MetadataUnavailable
from runner.notices.http import MetadataHttp, TokenRefused

DEFAULT_ENDPOINT = "http://169.254.169.254"
TOKEN_TTL_SECONDS = 21600


def parse_time(value: str) -> datetime:
    """IMDS times look like ``2026-11-30T08:22:00Z``."""
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


class AwsImdsSource(MetadataHttp):
    name = "aws-imds"

    def __init__(self, endpoint: str | None = None, token_ttl: int = TOKEN_TTL_SECONDS) -> None:
        super().__init__(endpoint or os.environ.get("AWS_EC2_METADATA_SERVICE_ENDPOINT") or DEFAULT_ENDPOINT)
        self.token_ttl = token_ttl
        self._token: str | None = None
        self._token_expires = 0.0

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

    async def get(self, path: str) -> str | None:
        """GET with a session token; on a 401 (expired or revoked) fetch a fresh token and ask once more."""
        for _ in range(2):
            token = await self._valid_token()
            try:
                return await self.request("GET", path, {"X-aws-ec2-metadata-token": token})
            except TokenRefused:
                self._token = None
        raise MetadataUnavailable(f"GET {path} refused a fresh token (401)")

    async def _valid_token(self) -> str:
        if self._token is not None and time.monotonic() < self._token_expires:
            return self._token
        token = await self.request(
            "PUT", "/latest/api/token", {"X-aws-ec2-metadata-token-ttl-seconds": str(self.token_ttl)}
        )
        if not token:
            raise MetadataUnavailable("PUT /latest/api/token gave no token")
        self._token = token.strip()
        # Renew at 80% of the TTL so a token never expires between two polls.
        self._token_expires = time.monotonic() + self.token_ttl * 0.8
        return self._token


def _deadline(doc: dict[str, str]) -> datetime:
    try:
        return parse_time(doc["time"])
    except (KeyError, TypeError, ValueError) as exc:
        raise MetadataUnavailable(f"instance-action has no valid time: {doc!r}") from exc


def _json(body: str) -> dict[str, str]:
    try:
        doc = json.loads(body)
    except ValueError as exc:
        raise MetadataUnavailable(f"metadata answered malformed JSON: {body[:100]!r}") from exc
    if not isinstance(doc, dict):
        raise MetadataUnavailable(f"metadata answered unexpected JSON: {body[:100]!r}")
    return doc
