"""The HTTP side both metadata services share: one short-timeout session, and one reading of their answers.

A metadata service answers 200 with a body, 404 when there is nothing to tell (no notice), or something else
when it is in trouble; a slow or unreachable one must never hold up a polling round.
"""

from __future__ import annotations

import aiohttp

from runner.notices.base import MetadataUnavailable

_REQUEST_TIMEOUT = aiohttp.ClientTimeout(total=0.5)


class TokenRefused(MetadataUnavailable):
    """HTTP 401: the request's token expired or was revoked."""


class MetadataHttp:
    def __init__(self, base: str) -> None:
        self.base = base.rstrip("/")
        self._session: aiohttp.ClientSession | None = None

    async def request(self, method: str, path: str, headers: dict[str, str] | None = None) -> str | None:
        """The body at ``path``; None on 404; TokenRefused on 401; MetadataUnavailable on anything else."""
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=_REQUEST_TIMEOUT)
        try:
            async with self._session.request(method, self.base + path, headers=headers) as response:
                if response.status == 404:
                    return None
                if response.status == 401:
                    raise TokenRefused(f"{method} {path} answered HTTP 401")
                if response.status != 200:
                    raise MetadataUnavailable(f"{method} {path} answered HTTP {response.status}")
                return await response.text()
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise MetadataUnavailable(f"{method} {path}: {exc!r}") from exc

    async def instance_id(self) -> str | None:
        """This instance's id (both services use the same path), None when the service does not say."""
        try:
            return await self.get("/latest/meta-data/instance-id")
        except MetadataUnavailable:
            return None

    async def get(self, path: str) -> str | None:
        return await self.request("GET", path)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
