"""Alibaba Cloud's official ECS and ESS SDKs (and STS through the same OpenAPI client), called off the event loop,
with their errors made plain.

The SDKs (``alibabacloud_ecs20140526``, ``alibabacloud_ess20220222``) block on every call, so each call runs in a
worker thread (``asyncio.to_thread``). Their answers come back as the API's own JSON (``body.to_map()``): the
field names are those of Alibaba's API reference, which keeps the provider readable next to the docs.

Every call (ECS, ESS, STS) runs inside the one mapping of the SDK's errors,
:func:`bot.cloud.aliyun.errors.cloud_errors`: an answer with an error code comes out as
:class:`~bot.errors.CloudRefused`, no answer as :class:`~bot.errors.CloudUnavailable`. SDK retries are off: the
provider decides what a failure means (RunInstances moves on to the next zone rather than retrying the same one).
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass
from typing import Any

from alibabacloud_credentials.client import Client as CredentialClient
from alibabacloud_ecs20140526.client import Client as EcsClient
from alibabacloud_ess20220222.client import Client as EssClient
from alibabacloud_tea_openapi.client import Client as OpenApiClient
from alibabacloud_tea_openapi.utils_models import Config, OpenApiRequest
from darabonba.runtime import RuntimeOptions

from bot.cloud.aliyun.errors import cloud_errors
from bot.cloud.aliyun.rpc import rpc_params
from bot.cloud.aliyun.settings import endpoint_parts
from bot.errors import CloudUnavailable

CONNECT_TIMEOUT_MS = 5_000
READ_TIMEOUT_MS = 30_000
STS_VERSION = "2015-04-01"


@dataclass(frozen=True, slots=True)
class Credentials:
    access_key_id: str
    access_key_secret: str
    security_token: str | None = None


class AliyunApi:
    """ECS, ESS and STS clients of the home region, and an ECS client for each other region a launch may go to
    (:meth:`add_region`: ECS's endpoints are regional). Credentials: the given key pair, else
    ``ALIBABA_CLOUD_ACCESS_KEY_ID`` / ``ALIBABA_CLOUD_ACCESS_KEY_SECRET`` (/ ``ALIBABA_CLOUD_SECURITY_TOKEN``), else the
    SDK's default chain (the credentials file, the ECS RAM role of the machine the bot runs on, …)."""

    def __init__(
        self,
        region: str,
        *,
        endpoint: str | None = None,
        ess_endpoint: str | None = None,
        sts_endpoint: str | None = None,
        access_key_id: str | None = None,
        access_key_secret: str | None = None,
    ) -> None:
        self.region = region
        if not (access_key_id and access_key_secret):  # the standard variables, read now (the SDK reads them
            access_key_id = os.environ.get("ALIBABA_CLOUD_ACCESS_KEY_ID")  # once, when it is first imported)
            access_key_secret = os.environ.get("ALIBABA_CLOUD_ACCESS_KEY_SECRET")
            token = os.environ.get("ALIBABA_CLOUD_SECURITY_TOKEN") or None
        else:
            token = None
        if access_key_id and access_key_secret:
            self._static: Credentials | None = Credentials(access_key_id, access_key_secret, token)
            self._chain: Any = None
        else:
            self._static = None
            self._chain = _default_chain()
        self._ecs = EcsClient(self._config(endpoint))
        self._regional: dict[str, Any] = {region: self._ecs}  # region -> its ECS client
        self._ess = EssClient(self._config(ess_endpoint))
        # STS has no SDK here: the generic OpenAPI client signs AssumeRole as the ECS one signs its calls
        self._sts = OpenApiClient(self._config(sts_endpoint or f"https://sts.{region}.aliyuncs.com"))
        self._runtime = RuntimeOptions(
            autoretry=False, connect_timeout=CONNECT_TIMEOUT_MS, read_timeout=READ_TIMEOUT_MS
        )

    def add_region(self, region: str, endpoint: str | None = None) -> None:
        """An ECS client for ``region`` (the SDK's endpoint for it, or ``endpoint``), sharing these credentials; the
        home region's client stays as it is unless ``endpoint`` names another."""
        if region == self.region and endpoint is None:
            return
        self._regional[region] = EcsClient(self._config(endpoint, region))

    def _config(self, endpoint: str | None, region: str | None = None) -> Config:
        config = Config(
            region_id=region or self.region, connect_timeout=CONNECT_TIMEOUT_MS, read_timeout=READ_TIMEOUT_MS
        )
        if self._static is not None:
            config.access_key_id = self._static.access_key_id
            config.access_key_secret = self._static.access_key_secret
            config.security_token = self._static.security_token
        else:
            config.credential = self._chain
        if endpoint:  # else the SDK's own regional endpoint (ecs.<region>.aliyuncs.com, ess.aliyuncs.com)
            config.protocol, config.endpoint = endpoint_parts(endpoint)
        return config

    async def ecs(self, action: str, request: Any, region: str | None = None) -> dict[str, Any]:
        """Call ECS ``action`` (the SDK's snake-case name, e.g. ``run_instances``) in ``region`` (default the home
        region; one added with :meth:`add_region`); the answer's JSON."""
        client = self._regional.get(region or self.region)
        if client is None:
            raise CloudUnavailable(f"no ECS client for region {region}: not among aliyun.regions")
        return await self._call(client, action, request)

    async def ess(self, action: str, request: Any) -> dict[str, Any]:
        """Call Auto Scaling (ESS, API 2022-02-22) ``action``; the answer's JSON."""
        return await self._call(self._ess, action, request)

    async def assume_role(self, role_arn: str, session_name: str, policy: str, seconds: int) -> dict[str, Any]:
        """STS ``AssumeRole`` with an inline ``policy`` (the token gets what the role AND it allow); the answer's
        ``Credentials`` (``AccessKeyId``, ``AccessKeySecret``, ``SecurityToken``, ``Expiration``)."""
        params = rpc_params("AssumeRole", STS_VERSION)
        query = {
            "RoleArn": role_arn,
            "RoleSessionName": session_name,
            "Policy": policy,
            "DurationSeconds": str(seconds),
        }
        with cloud_errors("AssumeRole", "Alibaba Cloud STS"):
            answer = await asyncio.to_thread(self._sts.call_api, params, OpenApiRequest(query=query), self._runtime)
        body = answer.get("body") if isinstance(answer, dict) else None
        found = body.get("Credentials") if isinstance(body, dict) else None
        if not isinstance(found, dict):
            raise CloudUnavailable("AssumeRole: STS answered without Credentials")
        return found

    async def credentials(self) -> Credentials:
        """The key pair (and STS token) in use now, for the OSS client that shares them."""
        if self._static is not None:
            return self._static
        try:
            found = await asyncio.to_thread(self._chain.get_credential)
        except Exception as exc:  # the chain raises plain exceptions of several kinds when it finds nothing
            raise CloudUnavailable(f"no Alibaba Cloud credentials: {exc}") from exc
        return Credentials(found.access_key_id, found.access_key_secret, found.security_token or None)

    async def _call(self, client: Any, action: str, request: Any) -> dict[str, Any]:
        method = getattr(client, f"{action}_with_options")
        name = "".join(part.capitalize() for part in action.split("_"))
        with cloud_errors(name, "Alibaba Cloud"):
            response = await asyncio.to_thread(method, request, self._runtime)
        body: dict[str, Any] = response.body.to_map() if response.body is not None else {}
        return body


def _default_chain() -> Any:
    """The SDK's default credential chain; it looks for credentials on first use and raises if it finds none."""
    return CredentialClient()
