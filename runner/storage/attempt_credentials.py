"""AWS: the attempt's storage credentials, from its key object, read again as they near their end.

With a runner storage role the bot hands each attempt an STS session limited to its job's prefix, inside the key
object only this instance may read (handlers/attempt_keys.py, handlers/storage_sessions.py), and rewrites it with a
fresh session every 15 minutes (bot/storage_renewal.py): sessions last an hour at most. The runner's S3 stores take
these as botocore refreshable credentials (a credential provider, as runner/storage/aliyun_credentials.py does for
Alibaba's RAM role): from ``ADVISORY_SECONDS`` before the end botocore asks for fresh ones, and the key object is read
again (at most every ``reread_seconds``) with the instance's own credentials, which may read that object and no job.

If the object holds nothing newer (the bot is down, or STS refuses it), this says so loudly in the journal; the
runner itself watches :meth:`AttemptCredentials.running_out` and commits what it has while the credentials last
(runner/periodic_sync.py). After the end every storage request is refused until a bot writes fresh credentials again.

botocore is loaded by :meth:`AttemptCredentials.load` (an S3 store's first request), not with this module: a runner
whose store is a directory never pays the third of a second it takes to import.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any

from handlers.attempt_keys import AttemptKey, StorageCredentials, parse_attempt_key
from handlers.clock import utcnow
from runner.storage.base import StorageError

if TYPE_CHECKING:
    from aiobotocore.credentials import AioRefreshableCredentials

log = logging.getLogger(__name__)

METHOD = "finetune-attempt-key"
ADVISORY_SECONDS = 15 * 60  # botocore asks for fresh credentials from this long before their end
MANDATORY_SECONDS = 60  # ... and stops using them this long before it (the clocks of host and S3 may differ)
LOW_SECONDS = 10 * 60  # with less than this left and nothing newer in the object, the runner commits what it has
REREAD_SECONDS = 30.0  # the key object is read again at most this often (botocore asks on every request)


class AttemptCredentials:
    """A botocore credential provider (``insert_before`` into a session's resolver) for one attempt's storage
    session; every store of the attempt shares the one refreshable credentials object it loads."""

    METHOD = METHOD
    CANONICAL_NAME = "FinetuneAttemptKey"

    def __init__(
        self,
        uri: str,
        first: AttemptKey,
        read: Callable[[], Awaitable[bytes | None]],
        *,
        clock: Callable[[], datetime] | None = None,
        reread_seconds: float = REREAD_SECONDS,
        close: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        """``read``: the key object's bytes (None when it is gone), read with the instance's own credentials."""
        if first.storage is None:
            raise ValueError(f"{uri} holds no storage credentials")
        self.uri = uri
        self.job_id = first.job_id
        self.attempt = first.attempt
        self.current: StorageCredentials = first.storage
        self.clock = clock or utcnow
        self.reread_seconds = reread_seconds
        self.renewals = 0  # how often fresher credentials were found in the object
        self._read = read
        self._close = close
        self._last_read: datetime | None = None
        self._lock = asyncio.Lock()
        self._credentials: AioRefreshableCredentials | None = None

    def seconds_left(self) -> float:
        return self.current.seconds_left(self.clock())

    def running_out(self) -> bool:
        """Whether the credentials held end within ``LOW_SECONDS`` (call after :meth:`renew_if_due`)."""
        return self.seconds_left() < LOW_SECONDS

    async def renew_if_due(self, within: float = ADVISORY_SECONDS) -> bool:
        """True when the credentials held have more than ``within`` seconds left, reading the key object again when
        they have not (at most every ``reread_seconds``); False when the object has nothing newer either."""
        if self.seconds_left() > within:
            return True
        async with self._lock:
            now = self.clock()
            if self.current.seconds_left(now) > within:
                return True
            if self._last_read is None or (now - self._last_read).total_seconds() >= self.reread_seconds:
                self._last_read = now
                await self._reread()
            return self.seconds_left() > within

    def ended(self) -> bool:
        """Whether no request may be signed with the credentials held any more (botocore's mandatory margin)."""
        return self.seconds_left() <= MANDATORY_SECONDS

    async def wait_until_usable(
        self,
        patience_seconds: float,
        poll_seconds: float = REREAD_SECONDS,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> bool:
        """Once the credentials held have ended, read the key object every ``poll_seconds`` until the bot writes
        fresh ones (True) or ``patience_seconds`` pass on this object's clock (False): what the runner does with a
        finished job's output rather than lose it to a bot outage. True at once while they still work."""
        started = self.clock()
        while True:
            await self.renew_if_due(within=MANDATORY_SECONDS)
            if not self.ended():
                return True
            if (self.clock() - started).total_seconds() >= patience_seconds:
                return False
            await sleep(poll_seconds)

    async def _reread(self) -> None:
        try:
            raw = await self._read()
        except StorageError as exc:
            log.warning("could not read %s again for fresh storage credentials: %s", self.uri, exc)
            return
        found = self._parsed(raw)
        if found is not None and found.expiration > self.current.expiration:
            self.current = found
            self.renewals += 1
            log.info(
                "storage credentials of %s attempt %d renewed, until %s", self.job_id, self.attempt, found.expiration
            )
            return
        log.error(
            "STORAGE CREDENTIALS NOT RENEWED: those of %s attempt %d end at %s (%.0f s from now) and %s holds nothing "
            "newer; the bot renews them every 15 minutes, so it is down or cannot reach STS. After they end every "
            "checkpoint upload is refused until it is back.",
            self.job_id,
            self.attempt,
            self.current.expiration,
            self.seconds_left(),
            self.uri,
        )

    def _parsed(self, raw: bytes | None) -> StorageCredentials | None:
        if raw is None:
            log.error(
                "%s is gone: no fresh storage credentials (the bot deletes it when it releases the instance)", self.uri
            )
            return None
        try:
            found = parse_attempt_key(raw)
        except ValueError as exc:
            log.error("%s: %s", self.uri, exc)
            return None
        if (found.job_id, found.attempt) != (self.job_id, self.attempt):
            log.error(
                "%s now names %s attempt %d, not this attempt: its credentials are not used",
                self.uri,
                found.job_id,
                found.attempt,
            )
            return None
        return found.storage

    async def load(self) -> AioRefreshableCredentials:
        """The refreshable credentials every store of this attempt signs with (one object, one refresh for all)."""
        if self._credentials is None:
            from aiobotocore.credentials import AioRefreshableCredentials

            first = self.current
            self._credentials = AioRefreshableCredentials(
                access_key=first.access_key_id,
                secret_key=first.secret_access_key,
                token=first.session_token,
                expiry_time=first.expiration,
                refresh_using=self._metadata,
                method=METHOD,
                time_fetcher=self.clock,
                advisory_timeout=ADVISORY_SECONDS,
                mandatory_timeout=MANDATORY_SECONDS,
            )
        return self._credentials

    async def _metadata(self) -> dict[str, Any]:
        """What botocore refreshes from; near the end with nothing newer, a BotoCoreError, so each request fails as
        a storage error (retried and reported as such) rather than with a RuntimeError from botocore."""
        from botocore.exceptions import CredentialRetrievalError

        await self.renew_if_due()
        held = self.current
        if held.seconds_left(self.clock()) <= MANDATORY_SECONDS:
            raise CredentialRetrievalError(
                provider=METHOD,
                error_msg=f"the storage credentials of {self.job_id} attempt {self.attempt} end at {held.expiration} "
                f"and {self.uri} holds none newer (the bot has not renewed them)",
            )
        return {
            "access_key": held.access_key_id,
            "secret_key": held.secret_access_key,
            "token": held.session_token,
            "expiry_time": held.expiration.isoformat(),  # botocore parses it from text
        }

    async def close(self) -> None:
        if self._close is not None:
            await self._close()
