"""The runner's S3 store signs with the attempt's storage session from its key object, and picks up the session the
bot rewrote there as the one it holds nears its end (the real store against moto, through a proxy that records which
access key signed each request; the credentials' clock is the test's, so no wall time is waited for).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import boto3
import pytest

from handlers.attempt_keys import StorageCredentials, dump_attempt_key, parse_attempt_key
from runner.reports.key_object import FetchedKey, storage_credentials
from runner.storage.attempt_credentials import AttemptCredentials
from runner.storage.base import StorageError
from runner.storage.open import open_store
from tests.s3_proxy import S3FaultProxy
from tests.servers import AWS_TEST_ENV

BUCKET = "ft-rotate"
KEY_NAME = "attempt-keys/AROAEXAMPLERUNNERROLE:i-0a1b2c3d4e5f60718"
URI = f"s3://{BUCKET}/{KEY_NAME}"
T0 = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)
AMBIENT = AWS_TEST_ENV["AWS_ACCESS_KEY_ID"]  # the instance's own credentials: they read the key object, no job


def session(name: str, ends: datetime) -> StorageCredentials:
    return StorageCredentials(
        access_key_id=f"ASIA{name.upper():0<16}",
        secret_access_key=f"secret-of-{name}-0123456789",
        session_token=f"token-of-{name}-0123456789",
        expiration=ends,
    )


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now


@pytest.fixture
async def proxy(aws: str, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[S3FaultProxy]:
    started = await S3FaultProxy(aws).start()
    monkeypatch.setenv("AWS_ENDPOINT_URL", started.endpoint)  # the store and the key object's reader alike
    boto3.client("s3", endpoint_url=aws).create_bucket(Bucket=BUCKET)
    yield started
    await started.stop()


def bot_writes(aws: str, storage: StorageCredentials) -> None:
    """What the bot's renewal does: the key object again, with a fresh session."""
    body = dump_attempt_key("ft-rot1", 1, "ab" * 32, storage)
    boto3.client("s3", endpoint_url=aws).put_object(Bucket=BUCKET, Key=KEY_NAME, Body=body)


async def test_the_store_signs_with_the_session_the_bot_rewrote_as_the_one_held_nears_its_end(
    aws: str, proxy: S3FaultProxy, caplog: pytest.LogCaptureFixture
) -> None:
    first = session("one", T0 + timedelta(minutes=60))
    second = session("two", T0 + timedelta(minutes=75))
    third = session("three", T0 + timedelta(minutes=135))
    bot_writes(aws, first)
    clock = Clock()
    raw = boto3.client("s3", endpoint_url=aws).get_object(Bucket=BUCKET, Key=KEY_NAME)["Body"].read()
    credentials = storage_credentials(FetchedKey(URI, parse_attempt_key(raw)), clock=clock)
    assert isinstance(credentials, AttemptCredentials)
    store = open_store(f"s3://{BUCKET}/jobs/ft-rot1/", credentials)
    uploads = 0

    async def upload() -> str:
        """One checkpoint file; the access key that signed it."""
        nonlocal uploads
        uploads += 1
        await store.put_bytes(f"checkpoint-{uploads}/weights.bin", b"w" * 100)
        (signer,) = proxy.signers(f"/jobs/ft-rot1/checkpoint-{uploads}/")
        return signer

    try:
        assert await upload() == first.access_key_id
        bot_writes(aws, second)  # the bot renews 15 minutes in; the runner has no need to look yet
        clock.now = T0 + timedelta(minutes=30)
        assert await upload() == first.access_key_id
        assert proxy.arrivals("GET", "/attempt-keys/") == 0
        clock.now = T0 + timedelta(minutes=50)  # 10 minutes left: botocore asks, the object is read again
        assert await upload() == second.access_key_id
        assert credentials.renewals == 1 and proxy.signers("/attempt-keys/") == [AMBIENT]

        # The bot is down: nothing newer comes. The runner says so loudly and goes on signing while it may.
        clock.now = T0 + timedelta(minutes=66)  # 9 minutes left
        with caplog.at_level(logging.ERROR, logger="runner.storage.attempt_credentials"):
            assert await upload() == second.access_key_id
        assert "STORAGE CREDENTIALS NOT RENEWED" in caplog.text
        assert not await credentials.renew_if_due() and credentials.running_out()
        clock.now = T0 + timedelta(minutes=74, seconds=30)  # half a minute left: no request is signed with them
        with pytest.raises(StorageError, match="has not renewed them"):
            await store.put_bytes("checkpoint-late/weights.bin", b"w")
        assert proxy.signers("/checkpoint-late/") == []

        bot_writes(aws, third)  # the bot is back
        clock.now = T0 + timedelta(minutes=75, seconds=30)
        assert await upload() == third.access_key_id
        assert await credentials.renew_if_due() and not credentials.running_out()
    finally:
        await store.close()
        await credentials.close()


async def test_a_key_object_of_another_attempt_never_lends_its_credentials(aws: str, proxy: S3FaultProxy) -> None:
    first = session("one", T0 + timedelta(minutes=60))
    bot_writes(aws, first)
    clock = Clock()
    raw = boto3.client("s3", endpoint_url=aws).get_object(Bucket=BUCKET, Key=KEY_NAME)["Body"].read()
    credentials = storage_credentials(FetchedKey(URI, parse_attempt_key(raw)), clock=clock)
    assert credentials is not None
    other = dump_attempt_key("ft-rot1", 2, "cd" * 32, session("other", T0 + timedelta(minutes=120)))
    boto3.client("s3", endpoint_url=aws).put_object(Bucket=BUCKET, Key=KEY_NAME, Body=other)
    clock.now = T0 + timedelta(minutes=50)
    try:
        assert not await credentials.renew_if_due()
        assert credentials.current == first
    finally:
        await credentials.close()


def test_a_key_object_without_storage_credentials_leaves_the_ambient_ones() -> None:
    """A stack without a storage role: the runner signs with its instance profile."""
    plain = FetchedKey(URI, parse_attempt_key(dump_attempt_key("ft-rot1", 1, "ab" * 32)))
    assert storage_credentials(plain) is None


async def test_an_ended_session_is_waited_out_until_the_bot_writes_a_fresh_one(aws: str, proxy: S3FaultProxy) -> None:
    """What a finished job's output does when the bot was down for longer than the session's life: it waits for the
    renewal (reading the key object each poll) instead of failing; it gives up only once its patience is spent."""
    bot_writes(aws, session("one", T0 + timedelta(minutes=60)))
    clock = Clock()
    raw = boto3.client("s3", endpoint_url=aws).get_object(Bucket=BUCKET, Key=KEY_NAME)["Body"].read()
    credentials = storage_credentials(FetchedKey(URI, parse_attempt_key(raw)), clock=clock)
    assert isinstance(credentials, AttemptCredentials)
    store = open_store(f"s3://{BUCKET}/jobs/ft-rot1/", credentials)
    naps: list[float] = []
    renewed = session("two", T0 + timedelta(minutes=130))

    async def nap(seconds: float) -> None:
        """The test's sleep: time passes on the credentials' clock, none on the wall's."""
        naps.append(seconds)
        clock.now += timedelta(seconds=seconds)

    async def nap_while_the_bot_comes_back(seconds: float) -> None:
        await nap(seconds)
        if len(naps) == 14:
            bot_writes(aws, renewed)

    try:
        assert await credentials.wait_until_usable(300, 30, sleep=nap)  # still valid: no wait at all
        assert naps == []
        clock.now = T0 + timedelta(minutes=61)
        assert credentials.ended()
        assert not await credentials.wait_until_usable(300, 30, sleep=nap)  # nobody renews: patience runs out
        assert naps == [30] * 10
        reads = proxy.arrivals("GET", "/attempt-keys/")
        assert reads >= 10  # it looked each time

        assert await credentials.wait_until_usable(3600, 30, sleep=nap_while_the_bot_comes_back)
        assert len(naps) == 14 and not credentials.ended()
        assert credentials.current.access_key_id == renewed.access_key_id
        await store.put_bytes("output/model.bin", b"m" * 10)
        assert proxy.signers("/jobs/ft-rot1/output/") == [renewed.access_key_id]
    finally:
        await store.close()
        await credentials.close()
