"""The HTTP side both metadata services share: one short-timeout session, one reading of their answers, and the
session-token flow both clouds' hardened metadata modes require.

A metadata service answers 200 with a body, 404 when there is nothing to tell (no notice), or something else
when it is in trouble; a slow or unreachable one must never hold up a polling round.

Tokens: AWS IMDSv2 and Alibaba's hardened ECS metadata mode both hand out a session token on
``PUT /latest/api/token`` (its TTL in a request header) and want it back on every GET (another header); only the
header names differ. A process that cannot PUT (a container behind a hop limit of 1) never gets one.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable

import aiohttp

from runner.notices.base import NoticeUnavailable

log = logging.getLogger(__name__)

_REQUEST_TIMEOUT = aiohttp.ClientTimeout(total=0.5)  # a polling round: a slow service must not hold it up
_ONE_TIME_READ_TIMEOUT = aiohttp.ClientTimeout(total=5.0)  # a read made once, whose answer is needed later
INSTANCE_ID_TRIES = 5
TOKEN_TTL_SECONDS = 21600  # the longest both clouds allow


class MetadataHttp:
    def __init__(self, base: str) -> None:
        self.base = base.rstrip("/")
        self._session: aiohttp.ClientSession | None = None

    async def request(
        self,
        method: str,
        path: str,
        headers: dict[str, str] | None = None,
        timeout: aiohttp.ClientTimeout = _REQUEST_TIMEOUT,
    ) -> str | None:
        """The body at ``path``; None on 404; NoticeUnavailable on anything else."""
        return _body(method, path, *await self._send(method, path, headers, timeout))

    async def _send(
        self, method: str, path: str, headers: dict[str, str] | None, timeout: aiohttp.ClientTimeout
    ) -> tuple[int, str]:
        """The service's HTTP status and, on a 200, its body; NoticeUnavailable when it gives no answer."""
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=_REQUEST_TIMEOUT)
        try:
            async with self._session.request(method, self.base + path, headers=headers, timeout=timeout) as response:
                return response.status, await response.text() if response.status == 200 else ""
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise NoticeUnavailable(f"{method} {path}: {exc!r}") from exc

    async def instance_id(self, tries: int = INSTANCE_ID_TRIES) -> str | None:
        """This instance's id (both services use the same path), None when the service does not say (404) or gives
        no answer in ``tries`` tries. Read once, at start, and needed later (a release, the
        ``started`` report): one slow answer must not cost it, so this read waits longer than a polling round and
        tries again."""
        for attempt in range(tries):
            try:
                return await self.get("/latest/meta-data/instance-id", timeout=_ONE_TIME_READ_TIMEOUT)
            except NoticeUnavailable as exc:
                log.warning("instance id: %s (try %d of %d)", exc, attempt + 1, tries)
                if attempt + 1 < tries:
                    await asyncio.sleep(min(2.0**attempt, 8.0))
        return None

    async def get(self, path: str, timeout: aiohttp.ClientTimeout = _REQUEST_TIMEOUT) -> str | None:
        return await self.request("GET", path, timeout=timeout)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()


class TokenMetadataHttp(MetadataHttp):
    """Every GET carries a session token: refreshed well before its TTL runs out, and once more on a 401 (the
    service restarted or the clock jumped). Subclasses name the cloud's two headers, and where the service is: the
    variable that moves it (tests, the local cloud) and the address it answers on in the cloud."""

    token_header: str
    ttl_header: str
    endpoint_variable: str
    default_endpoint: str

    def __init__(
        self,
        endpoint: str | None = None,
        token_ttl: int = TOKEN_TTL_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(endpoint or os.environ.get(self.endpoint_variable) or self.default_endpoint)
        self.token_ttl = token_ttl
        self.clock = clock  # seconds, only ever compared: a test moves it instead of sleeping through a TTL
        self._token: str | None = None
        self._token_expires = 0.0

    async def get(self, path: str, timeout: aiohttp.ClientTimeout = _REQUEST_TIMEOUT) -> str | None:
        """GET with a session token; on a 401 (expired or revoked) fetch a fresh token and ask once more."""
        for _ in range(2):
            token = await self._valid_token(timeout)
            status, body = await self._send("GET", path, {self.token_header: token}, timeout)
            if status != 401:
                return _body("GET", path, status, body)
            self._token = None  # expired or revoked
        raise NoticeUnavailable(f"GET {path} refused a fresh token (401)")

    async def _valid_token(self, timeout: aiohttp.ClientTimeout = _REQUEST_TIMEOUT) -> str:
        if self._token is not None and self.clock() < self._token_expires:
            return self._token
        token = await self.request("PUT", "/latest/api/token", {self.ttl_header: str(self.token_ttl)}, timeout)
        if not token:
            raise NoticeUnavailable("PUT /latest/api/token gave no token")
        self._token = token.strip()
        # Renew at 80% of the TTL so a token never expires between two polls.
        self._token_expires = self.clock() + self.token_ttl * 0.8
        return self._token


def _body(method: str, path: str, status: int, body: str) -> str | None:
    """A metadata service's answer read the one way: the body on a 200, None on a 404 (nothing to tell), and
    NoticeUnavailable for anything else (a 401 included: a token refused)."""
    if status == 404:
        return None
    if status != 200:
        raise NoticeUnavailable(f"{method} {path} answered HTTP {status}")
    return body
