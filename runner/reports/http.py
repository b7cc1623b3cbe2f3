"""``http(s)://…``: POST the report to the bot, signed with HMAC-SHA256 of the attempt's report key."""

from __future__ import annotations

import time

import aiohttp

from handlers.signing import SIGNATURE_HEADER, TIMESTAMP_HEADER, sign
from runner.errors import ReportRejected, RunnerError
from runner.reports.key import KEY_VARIABLE, report_key

_TIMEOUT = aiohttp.ClientTimeout(total=10)
_RETRYABLE = {408, 425, 429}


class HttpTarget:
    def __init__(self, target: str, secret: str | None = None) -> None:
        self.name = target
        self.url = target
        secret = secret if secret is not None else report_key()
        if not secret:
            raise ValueError(f"report target {target} needs the attempt's report key ({KEY_VARIABLE}) to sign reports")
        self.secret = secret
        self._session: aiohttp.ClientSession | None = None

    async def deliver(self, line: str, report_type: str) -> None:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=_TIMEOUT)
        body = line.encode()
        now = int(time.time())
        headers = {
            "Content-Type": "application/json",
            TIMESTAMP_HEADER: str(now),
            SIGNATURE_HEADER: sign(self.secret, now, body),
        }
        try:
            async with self._session.post(self.url, data=body, headers=headers) as response:
                if response.status < 300:
                    return
                detail = (await response.text(errors="replace"))[:200]
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:  # aiohttp's edge: no answer, mapped once
            raise RunnerError(f"{self.url} did not answer: {exc!r}") from exc
        if 400 <= response.status < 500 and response.status not in _RETRYABLE:
            raise ReportRejected(f"{self.url} refused the report: HTTP {response.status} {detail}")
        raise RunnerError(f"{self.url} answered HTTP {response.status} {detail}")

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
