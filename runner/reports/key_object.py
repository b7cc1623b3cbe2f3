"""AWS: fetch this attempt's report key from the key object only this instance may read (handlers/attempt_keys.py).

The spec says where keys lie (``report_key_from``, ``s3://<bucket>/attempt-keys/<role id>:``); the runner appends
its instance id from IMDS and polls, since the bot writes the object once it knows the instance, which may be a
moment after the instance boots. Until the object is there S3 answers 404, or 403 on AWS (the runner may not list
``attempt-keys/``, and the Deny of untagged key objects applies): both mean "not yet". After ``patience`` seconds
the runner gives up: with no key it cannot sign a report, not even a ``failed``, so it says why on stderr (the
journal) and exits :data:`runner.exit_codes.EXIT_NO_REPORT_KEY` without starting the trainer.

With a runner storage role the instance may read no job object, not even its spec, until it holds the storage
credentials its key object carries: the user data then says where keys lie (``FINETUNE_KEY_FROM``), the runner reads
its key object first (:func:`fetch_attempt_key`), the spec with those credentials, and only then checks that the object
is its own attempt's (:func:`own_key`).

Alibaba, with a runner storage role: the same order with a sealed object (handlers/attempt_keys.py). The user data
says ``FINETUNE_KEY_FROM=oss://<bucket>/attempt-keys/`` and carries the report key; the runner appends its instance id
from the metadata service (hardened mode), reads the object with its instance role and opens it with that key
(:func:`fetch_sealed_key`). The token inside is read and opened again as it nears its end, like AWS's session.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from handlers.attempt_keys import ECS_INSTANCE_ID, INSTANCE_ID, AttemptKey, parse_attempt_key, unseal
from handlers.spec import JobSpec
from runner.errors import RunnerError
from runner.notices.aliyun import AliyunMetadataSource
from runner.notices.aws import AwsImdsSource
from runner.notices.http import MetadataHttp
from runner.storage.attempt_credentials import AttemptCredentials
from runner.storage.base import StorageError
from runner.storage.open import open_store

log = logging.getLogger(__name__)

POLL_SECONDS = 2.0


class NoReportKey(RunnerError):
    """No key for this attempt: none came in time, or the one found is another attempt's."""


@dataclass(frozen=True, slots=True)
class FetchedKey:
    """A key object as read: where it lies, and what it says (whose it is is checked by :func:`own_key`)."""

    uri: str
    found: AttemptKey
    # Alibaba: what opens the object's bytes (read again for a fresh token); None: a plain AWS key object
    opener: Callable[[bytes], bytes] | None = field(default=None, repr=False)


async def fetch_attempt_key(
    key_from: str, patience: float, poll: float = POLL_SECONDS, imds: AwsImdsSource | None = None
) -> FetchedKey:
    """The key object ``<key_from><instance id>``, well formed; NoReportKey when none comes within ``patience``."""
    deadline = time.monotonic() + patience
    instance_id = await _instance_id(imds or AwsImdsSource(), INSTANCE_ID, "EC2", deadline, poll)
    uri = key_from + instance_id
    return _parsed(uri, await _poll(uri, patience, deadline, poll))


async def fetch_sealed_key(
    key_from: str, report_key: str, patience: float, poll: float = POLL_SECONDS, metadata: MetadataHttp | None = None
) -> FetchedKey:
    """Alibaba: the sealed object ``<key_from><instance id>``, opened with this attempt's ``report_key``;
    NoReportKey when none comes within ``patience``, or when the one there does not open (another attempt's)."""
    deadline = time.monotonic() + patience
    instance_id = await _instance_id(metadata or AliyunMetadataSource(), ECS_INSTANCE_ID, "ECS", deadline, poll)
    uri = key_from + instance_id

    def opener(raw: bytes) -> bytes:
        return unseal(raw, report_key, instance_id)

    raw = await _poll(uri, patience, deadline, poll)
    try:
        plain = opener(raw)
    except ValueError as exc:
        raise NoReportKey(f"{uri}: {exc}") from None
    fetched = _parsed(uri, plain)
    return FetchedKey(fetched.uri, fetched.found, opener)


async def _poll(uri: str, patience: float, deadline: float, poll: float) -> bytes:
    """The object's bytes once it is there (the bot writes it once it knows the instance)."""
    base, _, name = uri.rpartition("/")
    store = open_store(base + "/")
    last = "not there"
    try:
        while True:
            try:
                raw = await store.get_bytes(name)
            except StorageError as exc:  # 403 until the object exists, or an outage: both worth waiting out
                raw, last = None, str(exc)
            if raw is not None:
                return raw
            if time.monotonic() + poll > deadline:
                raise NoReportKey(f"no report key at {uri} within {patience:g} s ({last})")
            await asyncio.sleep(poll)
    finally:
        await store.close()


async def _instance_id(source: MetadataHttp, pattern: re.Pattern[str], cloud: str, deadline: float, poll: float) -> str:
    try:
        while True:
            found = await source.instance_id()
            if found is not None:
                if not pattern.fullmatch(found.strip()):
                    raise NoReportKey(f"the metadata service names no {cloud} instance ({found[:40]!r})")
                return found.strip()
            if time.monotonic() + poll > deadline:
                raise NoReportKey("the metadata service did not say which instance this is: no key object to read")
            await asyncio.sleep(poll)
    finally:
        await source.close()


def _parsed(uri: str, raw: bytes) -> FetchedKey:
    try:
        return FetchedKey(uri, parse_attempt_key(raw))
    except ValueError as exc:
        raise NoReportKey(f"{uri}: {exc}") from None


def own_key(spec: JobSpec, fetched: FetchedKey) -> str:
    """The report key, once the object is shown to be this attempt's; NoReportKey when it is another's."""
    uri, found = fetched.uri, fetched.found
    if (found.job_id, found.attempt) != (spec.job_id, spec.attempt):
        raise NoReportKey(
            f"{uri} holds the key of {found.job_id} attempt {found.attempt}, not {spec.job_id} attempt {spec.attempt}"
        )
    log.info("report key of %s attempt %d read from %s", spec.job_id, spec.attempt, uri)
    return found.key


def storage_credentials(fetched: FetchedKey, clock: Callable[[], datetime] | None = None) -> AttemptCredentials | None:
    """The attempt's storage session from its key object, read again with the instance's own credentials as it nears
    its end; None when the object carries none (a stack without a storage role): ambient credentials."""
    if fetched.found.storage is None:
        return None
    base, _, name = fetched.uri.rpartition("/")
    store = open_store(base + "/")
    opener = fetched.opener

    async def read() -> bytes | None:
        raw = await store.get_bytes(name)
        if raw is None or opener is None:
            return raw
        try:
            return opener(raw)
        except ValueError as exc:  # what the credentials report as an object they could not read
            raise StorageError(f"{fetched.uri}: {exc}") from None

    return AttemptCredentials(fetched.uri, fetched.found, read, close=store.close, clock=clock)
