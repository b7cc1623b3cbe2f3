"""The few OSS objects the bot writes itself (specs, control objects, sealed attempt-key objects), over OSS's
S3-compatible API through aioboto3.

The bot never imports the runner (DESIGN.md), so it does not borrow the runner's checkpoint store: it needs one
PUT and one DELETE of small objects, not parallel multipart transfers. The client is the one the runner's store
would build for ``oss://`` (virtual-hosted addressing unless told otherwise, SigV4 without payload hashing or
botocore's checksum trailers, which OSS rejects; five attempts in botocore's standard retry mode), opened per call
with the credentials of that moment, because the RAM role's STS key rotates.

Errors are mapped here, at the edge, to the cloud's family of ``bot/errors.py``, as AWS's S3 writes are
(:func:`bot.cloud.aws.errors.object_errors`): OSS answering with an error code becomes
:class:`~bot.errors.CloudRefused` naming the object; a 5xx still failing after botocore's retries, no answer at all,
or a reply botocore cannot parse becomes :class:`~bot.errors.CloudUnavailable`. The credentials callable raises the
same family.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from typing import Any, Literal

import aioboto3  # type: ignore[import-untyped]
from botocore.config import Config

from bot.cloud.aliyun.api import Credentials
from bot.cloud.aws.errors import object_errors
from bot.errors import CloudRefused

MAX_ATTEMPTS = 5  # per request, botocore's own retries included (as the runner's store does for OSS)


class OssObjects:
    """Whole small objects in one bucket; keys are the bucket's own (no prefix is added)."""

    def __init__(
        self,
        bucket: str,
        *,
        endpoint: str,
        region: str,
        addressing: Literal["virtual", "path"],
        credentials: Callable[[], Awaitable[Credentials]],
        max_attempts: int = MAX_ATTEMPTS,
    ) -> None:
        self.bucket = bucket
        self.endpoint = endpoint
        self.region = region
        self.addressing = addressing
        self.credentials = credentials  # asked before every call: STS credentials rotate
        self.max_attempts = max_attempts
        self._session = aioboto3.Session()

    def uri(self, key: str) -> str:
        return f"oss://{self.bucket}/{key}"

    def client_config(self) -> Config:
        """No payload hashing and no checksum trailers (OSS rejects aws-chunked bodies); a little retrying."""
        return Config(
            retries={"max_attempts": self.max_attempts, "mode": "standard"},
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
            s3={"payload_signing_enabled": False, "addressing_style": self.addressing},
        )

    async def put(self, key: str, data: bytes) -> None:
        """Write (or overwrite) one object."""
        with self._errors("PutObject", key):
            async with await self._client() as s3:
                await s3.put_object(Bucket=self.bucket, Key=key, Body=data)

    async def delete(self, key: str) -> None:
        """Delete one object; an object that is not there is no error (S3's and OSS's DeleteObject are idempotent)."""
        with self._errors("DeleteObject", key):
            async with await self._client() as s3:
                await s3.delete_object(Bucket=self.bucket, Key=key)

    async def found(self, key: str) -> bool:
        """Whether the object is there (GetObject, the permission the bot has under the job prefix): False for
        ``NoSuchKey``; a missing bucket or a refusal raises :class:`~bot.errors.CloudRefused`, as every call does."""
        try:
            with self._errors("GetObject", key):
                async with await self._client() as s3:
                    reply = await s3.get_object(Bucket=self.bucket, Key=key)
                    await reply["Body"].read()  # a key that is never written: nothing to read
        except CloudRefused as exc:
            if exc.code == "NoSuchKey":
                return False
            raise
        return True

    async def _client(self) -> Any:
        """An S3 client signed with the credentials of this moment (a context manager: closed after the call)."""
        found = await self.credentials()
        return self._session.client(
            "s3",
            endpoint_url=self.endpoint,
            region_name=self.region,
            aws_access_key_id=found.access_key_id,
            aws_secret_access_key=found.access_key_secret,
            aws_session_token=found.security_token or None,
            config=self.client_config(),
        )

    def _errors(self, action: str, key: str) -> contextlib.AbstractContextManager[None]:
        """OSS's error answers and the SDK's network failures, as the cloud's errors naming the object."""
        return object_errors(action, self.uri(key), "OSS")
