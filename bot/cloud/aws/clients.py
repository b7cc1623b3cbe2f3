"""The AWS provider's clients (one per service and retry policy, opened on first use) and how it reads botocore's
errors (sorted as every botocore client's are: :mod:`bot.cloud.aws.errors`). Every call is aioboto3, so nothing
blocks the bot's event loop.

Client config comes from the standard AWS variables: ``AWS_ENDPOINT_URL`` (botocore honours it, and
``AWS_ENDPOINT_URL_<SERVICE>`` per service), ``AWS_REGION`` / ``AWS_DEFAULT_REGION``, the credential chain.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping
from contextlib import AsyncExitStack
from typing import Any

import aioboto3  # type: ignore[import-untyped]
from botocore.config import Config
from botocore.exceptions import ClientError

from bot.cloud.aws.settings import AwsSettings
from bot.cloud.base import CloudError
from bot.cloud.aws.errors import NO_ANSWER, error_of
from bot.errors import CloudUnavailable

DENIED = frozenset(
    {"AccessDenied", "AccessDeniedException", "UnauthorizedOperation", "UnauthorizedException", "OptInRequired"}
)


class AwsError(CloudError):
    """A terminate, an interrupt test, a stop or a listing AWS did not do; the message says what to fix."""


class AwsUnavailable(AwsError, CloudUnavailable):
    """AWS gave no usable answer (connection refused, a timeout, a reply botocore cannot parse): trying later may
    work. Alibaba's twin is ``AliyunUnavailable``."""


def not_done(exc: BaseException, message: str) -> AwsError:
    """``message`` as the error of a call that failed with ``exc``: no answer is :class:`AwsUnavailable`."""
    return AwsUnavailable(message) if isinstance(exc, NO_ANSWER) else AwsError(message)


def reason(exc: ClientError) -> str:
    code, message = error_of(exc)
    return f"{code}: {message}" if message else code or str(exc)


def tags_of(resource: Mapping[str, Any]) -> dict[str, str]:
    """A resource's tags (EC2's ``Tags`` list) as a mapping."""
    return {str(tag["Key"]): str(tag["Value"]) for tag in resource.get("Tags") or []}


class AwsClients:
    """One client per (service, retry policy), opened on first use and closed by ``close``."""

    def __init__(self, settings: AwsSettings) -> None:
        self.region: str | None = (
            settings.region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
        )
        self._session = aioboto3.Session(region_name=self.region)
        self._retries = settings.api_retries
        self._stack = AsyncExitStack()
        self._clients: dict[str, Any] = {}
        self._lock = asyncio.Lock()

    async def get(self, service: str, *, retries: bool = True) -> Any:
        key = f"{service}:{'retry' if retries else 'once'}"
        async with self._lock:
            opened = self._clients.get(key)
            if opened is None:
                attempts = {"mode": "standard", "max_attempts": self._retries} if retries else {"total_max_attempts": 1}
                config = Config(retries=attempts, connect_timeout=10, read_timeout=60)
                opened = await self._stack.enter_async_context(self._session.client(service, config=config))
                self._clients[key] = opened
            return opened

    async def close(self) -> None:
        async with self._lock:
            self._clients.clear()
            await self._stack.aclose()
            self._stack = AsyncExitStack()
