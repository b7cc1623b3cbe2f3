"""OSS credentials on an ECS instance: the STS key of the instance's RAM role, from the metadata service.

No long-lived key ever sits on a GPU instance: the instance carries a RAM role that may use the bucket (the guide's
"实例RAM角色"), and ECS serves its short-lived credentials at
``/latest/meta-data/ram/security-credentials/<role>`` (``AccessKeyId``, ``AccessKeySecret``, ``SecurityToken``,
``Expiration``). They are handed to botocore as refreshable credentials, so a training run longer than the token's
life keeps uploading: botocore asks again shortly before ``Expiration``.

The role name comes from ``ALIBABA_CLOUD_ECS_METADATA`` (the variable Alibaba's own SDKs read), the service from
``ALIBABA_CLOUD_METADATA_ENDPOINT`` (default ``http://100.100.100.200``). Instances run in the hardened metadata
mode (``HttpTokens=required``), so every read carries a session token from ``PUT /latest/api/token``; a service
that will not hand one out is an error, never a reason to read without one.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
from aiobotocore.credentials import AioRefreshableCredentials

from runner.storage.base import StorageError

DEFAULT_METADATA_ENDPOINT = "http://100.100.100.200"
TOKEN_TTL_HEADER = "X-aliyun-ecs-metadata-token-ttl-seconds"
TOKEN_HEADER = "X-aliyun-ecs-metadata-token"
METHOD = "aliyun-ecs-ram-role"
_TIMEOUT = aiohttp.ClientTimeout(total=5)
_ATTEMPTS = 3


async def fetch_role_credentials(endpoint: str, role: str) -> dict[str, Any]:
    """The role's current credentials in botocore's metadata shape; StorageError when the service will not say."""
    base = endpoint.rstrip("/")
    last: Exception | None = None
    for attempt in range(_ATTEMPTS):
        try:
            async with aiohttp.ClientSession(timeout=_TIMEOUT) as session:
                async with session.put(f"{base}/latest/api/token", headers={TOKEN_TTL_HEADER: "21600"}) as reply:
                    if reply.status != 200:
                        raise StorageError(f"the metadata service gave no session token (HTTP {reply.status})")
                    headers = {TOKEN_HEADER: (await reply.text()).strip()}
                url = f"{base}/latest/meta-data/ram/security-credentials/{role}"
                async with session.get(url, headers=headers) as reply:
                    if reply.status == 404:
                        raise StorageError(f"the instance has no RAM role {role!r} (metadata answered 404)")
                    if reply.status != 200:
                        raise StorageError(f"the metadata service answered HTTP {reply.status} for role {role!r}")
                    document = json.loads(await reply.text())
            if document.get("Code", "Success") != "Success":
                raise StorageError(f"the metadata service refused role {role!r}: {document.get('Code')}")
            return {
                "access_key": document["AccessKeyId"],
                "secret_key": document["AccessKeySecret"],
                "token": document["SecurityToken"],
                "expiry_time": document["Expiration"],
            }
        except (aiohttp.ClientError, TimeoutError, ValueError, KeyError) as exc:
            last = exc
            await asyncio.sleep(0.2 * (attempt + 1))
    raise StorageError(f"could not read the credentials of RAM role {role!r} from {base}: {last!r}")


class RamRoleCredentialProvider:
    """A botocore credential provider (``insert_before`` into the session's resolver) for the instance's role."""

    METHOD = METHOD
    CANONICAL_NAME = "AliyunEcsRamRole"

    def __init__(self, role: str, endpoint: str = DEFAULT_METADATA_ENDPOINT) -> None:
        self.role = role
        self.endpoint = endpoint

    async def load(self) -> AioRefreshableCredentials:
        async def refresh() -> dict[str, Any]:
            return await fetch_role_credentials(self.endpoint, self.role)

        return AioRefreshableCredentials.create_from_metadata(
            metadata=await refresh(), refresh_using=refresh, method=METHOD
        )
