"""The AWS provider's clients (one per service and retry policy, opened on first use), each handed out wrapped so its
calls raise the bot's error families, never botocore's (:mod:`bot.cloud.aws.errors`). Every call is aioboto3, so
nothing blocks the bot's event loop.

Client config comes from the standard AWS variables: ``AWS_ENDPOINT_URL`` (botocore honours it, and
``AWS_ENDPOINT_URL_<SERVICE>`` per service), the credential chain; the region from :mod:`bot.cloud.aws.region`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from contextlib import AsyncExitStack
from typing import Any

from botocore.config import Config

from bot.cloud.aws.errors import ErrorMapping, MappedClient, api_mapping, cloud_errors, object_mapping
from bot.cloud.aws.region import aws_session, region_name
from bot.cloud.aws.settings import AwsSettings
from bot.errors import CloudError, CloudRefused, CloudUnavailable

DENIED = frozenset(
    {"AccessDenied", "AccessDeniedException", "UnauthorizedOperation", "UnauthorizedException", "OptInRequired"}
)


def not_done(exc: CloudError, message: str) -> CloudError:
    """``message`` as the error of a call that failed with ``exc``: no answer stays :class:`CloudUnavailable`."""
    return CloudUnavailable(message) if isinstance(exc, CloudUnavailable) else CloudError(message)


def reason(exc: CloudRefused) -> str:
    """An error answer's code and message, for a message of our own."""
    return f"{exc.code}: {exc.message}" if exc.message else exc.code


def tags_of(resource: Mapping[str, Any]) -> dict[str, str]:
    """A resource's tags (EC2's ``Tags`` list) as a mapping."""
    return {str(tag["Key"]): str(tag["Value"]) for tag in resource.get("Tags") or []}


class AwsClients:
    """One client per (service, retry policy), opened on first use and closed by ``close``."""

    def __init__(self, settings: AwsSettings) -> None:
        self.region: str | None = region_name(settings.region)
        self._session = aws_session(settings.region)
        self._retries = settings.api_retries
        self._stack = AsyncExitStack()
        self._clients: dict[str, Any] = {}
        self._lock = asyncio.Lock()

    async def get(self, service: str, *, retries: bool = True, region: str | None = None) -> Any:
        """The service's client (a :class:`~bot.cloud.aws.errors.MappedClient`) in ``region`` (default the home
        region): its calls raise the cloud port's errors (S3's naming the object)."""
        region = region or self.region
        key = f"{service}:{region}:{'retry' if retries else 'once'}"
        async with self._lock:
            opened = self._clients.get(key)
            if opened is None:
                attempts = {"mode": "standard", "max_attempts": self._retries} if retries else {"total_max_attempts": 1}
                config = Config(retries=attempts, connect_timeout=10, read_timeout=60)
                mapping = _mapping(service)
                with mapping("OpenClient", {}):
                    client = await self._stack.enter_async_context(
                        self._session.client(service, region_name=region, config=config)
                    )
                opened = MappedClient(client, mapping)
                self._clients[key] = opened
            return opened

    async def credential_source(self) -> str | None:
        """Where botocore's chain finds credentials (``env``, ``shared-credentials-file``, ``container-role``,
        ``iam-role``…), asking AWS nothing; None when it finds none. CloudUnavailable when looking fails (a profile
        that does not exist, a metadata service that does not answer)."""
        with cloud_errors("FindCredentials", "the AWS credential chain"):
            found = await self._session.get_credentials()
        return str(found.method or "found") if found is not None else None

    async def close(self) -> None:
        async with self._lock:
            self._clients.clear()
            await self._stack.aclose()
            self._stack = AsyncExitStack()


_SERVICE_NAMES = {
    "ec2": "EC2",
    "autoscaling": "Auto Scaling",
    "fis": "FIS",
    "sts": "STS",
    "sqs": "SQS",
    "sns": "SNS",
    "iam": "IAM",
}


def _mapping(service: str) -> ErrorMapping:
    if service == "s3":
        return object_mapping("s3", "S3")
    return api_mapping(_SERVICE_NAMES.get(service, service))
