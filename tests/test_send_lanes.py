"""The S3 store's send lanes (runner/storage/lanes.py), against moto through the fault proxy: a commit of several files
sent from several lane threads lands byte-exact with its manifest (and comes back through them); a part refused on a
lane fails the upload and aborts it; credentials the bot renews mid-commit sign every lane's requests; close() leaves
no lane thread behind.

Which thread sent a request is what a botocore ``before-send`` hook sees (it runs on the sending client's loop), so
these tests fail if parts go back to being sent from the caller's loop.
"""

from __future__ import annotations

import json
import os
import re
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import boto3
import pytest

from handlers.attempt_keys import StorageCredentials, dump_attempt_key, parse_attempt_key
from runner.checkpoints import CheckpointStore
from runner.manifest import COMPLETE_MARKER, MANIFEST_NAME
from runner.reports.key_object import FetchedKey, storage_credentials
from runner.storage.attempt_credentials import AttemptCredentials
from runner.storage.base import StorageError
from runner.storage.s3 import MiB, S3Store
from tests.s3_proxy import S3FaultProxy
from tests.test_pipelined_upload import part_crcs, restored_bytes

BUCKET = "ckpts"
PART = 5 * MiB
LANES = 3
SIGNED_BY = re.compile(r"Credential=([^/]+)/")


@dataclass
class Wire:
    """Every part and whole-object send: the thread it left from and the access key that signed it."""

    sends: list[tuple[str, str, str]] = field(default_factory=list)  # (thread name, access key id, url)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def note(self, request: Any, **_: Any) -> None:
        signer = SIGNED_BY.search(request.headers.get("Authorization", b"").decode())
        with self.lock:
            self.sends.append((threading.current_thread().name, signer.group(1) if signer else "", request.url))

    def threads(self, key_id: str | None = None) -> set[str]:
        return {thread for thread, signer, _ in self.sends if key_id is None or signer == key_id}


def watched(store: S3Store) -> Wire:
    wire = Wire()
    store.hook("before-send.s3.UploadPart", wire.note)
    store.hook("before-send.s3.PutObject", wire.note)
    return wire


def write_shards(local: Path, count: int) -> dict[str, bytes]:
    local.mkdir(parents=True)
    shards = {f"shard-{index}.bin": os.urandom(2 * PART + index * 1000) for index in range(count)}
    for name, data in shards.items():
        (local / name).write_bytes(data)
    (local / COMPLETE_MARKER).touch()
    return shards


def lane_threads() -> set[str]:
    return {thread.name for thread in threading.enumerate() if thread.name.startswith("send-lane-")}


@pytest.fixture
async def proxied(aws: str, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[S3FaultProxy]:
    boto3.client("s3", endpoint_url=aws).create_bucket(Bucket=BUCKET)  # straight to moto: the proxy is ours
    started = await S3FaultProxy(aws).start()
    monkeypatch.setenv("AWS_ENDPOINT_URL", started.endpoint)
    yield started
    await started.stop()


async def test_a_commit_through_several_lanes_lands_byte_exact_and_close_stops_them(
    aws: str, proxied: S3FaultProxy, tmp_path: Path
) -> None:
    store = S3Store(f"s3://{BUCKET}/job/", part_size=PART, multipart_threshold=PART, concurrency=6, lanes=LANES)
    wire = watched(store)
    reads = Wire()
    store.hook("before-send.s3.GetObject", reads.note)
    checkpoints = CheckpointStore(store, "ft-lanes", 1)
    shards = write_shards(tmp_path / "out" / "checkpoint-4", 5)
    before = lane_threads()
    try:
        committed = await checkpoints.commit(tmp_path / "out" / "checkpoint-4", 4)
        manifest = json.loads(await store.get_bytes(f"checkpoint-4/{MANIFEST_NAME}") or b"")
        for name, data in shards.items():
            assert await restored_bytes(checkpoints, tmp_path / name, name) == data
        assert len(lane_threads() - before) == LANES
    finally:
        await store.close()

    assert committed.bytes == sum(len(data) for data in shards.values())
    assert {item["path"]: item["checksums"] for item in manifest["files"]} == {
        name: part_crcs(data, PART) for name, data in shards.items()
    }
    # 14 parts and the manifest, sent from more than one lane's thread and never from the caller's.
    assert len(wire.sends) == sum(-(-len(data) // PART) for data in shards.values()) + 1 == 15
    assert len(wire.threads()) >= 2 and all(name.startswith("send-lane-") for name in wire.threads())
    assert lane_threads() == before  # close() joined every lane's thread
    # The restores' ranged GETs stream on the lanes too (the manifest's small read on the store's own client).
    downloads = {thread for thread, _, url in reads.sends if "/shard-" in url}
    assert len(downloads) >= 2 and all(name.startswith("send-lane-") for name in downloads)

    # A closed store opens its lanes afresh when used again.
    try:
        await store.put_bytes("after-close", b"again")
        assert await store.get_bytes("after-close") == b"again"
    finally:
        await store.close()
    assert lane_threads() == before


async def test_a_part_refused_on_a_lane_fails_the_upload_and_aborts_it(
    aws: str, proxied: S3FaultProxy, tmp_path: Path
) -> None:
    store = S3Store(f"s3://{BUCKET}/job/", part_size=PART, multipart_threshold=PART, concurrency=6, lanes=LANES)
    wire = watched(store)
    checkpoints = CheckpointStore(store, "ft-lanes", 1)
    write_shards(tmp_path / "out" / "checkpoint-5", 4)
    proxied.refuse = lambda method, path: method == "PUT" and "shard-2.bin?" in path and "partNumber=2" in path
    try:
        with pytest.raises(StorageError, match=r"upload to s3://ckpts/job/checkpoint-5/shard-2\.bin failed: HTTP 403"):
            await checkpoints.commit(tmp_path / "out" / "checkpoint-5", 5)
        assert await store.get_bytes(f"checkpoint-5/{MANIFEST_NAME}") is None
    finally:
        await store.close()  # lets the aborts of the given-up uploads finish

    refused = [thread for thread, _, url in wire.sends if "shard-2.bin?" in url and "partNumber=2" in url]
    assert refused and all(thread.startswith("send-lane-") for thread in refused)
    moto = boto3.client("s3", endpoint_url=aws)
    assert moto.list_multipart_uploads(Bucket=BUCKET).get("Uploads", []) == []  # no parts left behind
    stored = moto.list_objects_v2(Bucket=BUCKET, Prefix="job/checkpoint-5/shard-2").get("Contents", [])
    assert stored == []  # no half object
    assert lane_threads() == set()


T0 = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)
KEY_NAME = "attempt-keys/AROAEXAMPLERUNNERROLE:i-0a1b2c3d4e5f60718"


def session(name: str, ends: datetime) -> StorageCredentials:
    return StorageCredentials(
        access_key_id=f"ASIA{name.upper():0<16}",
        secret_access_key=f"secret-of-{name}-0123456789",
        session_token=f"token-of-{name}-0123456789",
        expiration=ends,
    )


def bot_writes(aws: str, storage: StorageCredentials) -> None:
    """What the bot's renewal does: the key object again, with a fresh session."""
    body = dump_attempt_key("ft-lanes", 1, "ab" * 32, storage)
    boto3.client("s3", endpoint_url=aws).put_object(Bucket=BUCKET, Key=KEY_NAME, Body=body)


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now


async def test_credentials_renewed_mid_commit_sign_every_lane(aws: str, proxied: S3FaultProxy, tmp_path: Path) -> None:
    first = session("one", T0 + timedelta(minutes=60))
    second = session("two", T0 + timedelta(minutes=120))
    bot_writes(aws, first)
    clock = Clock()
    raw = boto3.client("s3", endpoint_url=aws).get_object(Bucket=BUCKET, Key=KEY_NAME)["Body"].read()
    credentials = storage_credentials(FetchedKey(f"s3://{BUCKET}/{KEY_NAME}", parse_attempt_key(raw)), clock=clock)
    assert isinstance(credentials, AttemptCredentials)
    store = S3Store(
        f"s3://{BUCKET}/jobs/ft-lanes/",
        part_size=PART,
        multipart_threshold=PART,
        concurrency=6,
        lanes=LANES,
        credentials=credentials,
    )
    wire = watched(store)
    renewed = threading.Event()

    def bot_renews_after_the_first_parts(**_: Any) -> None:
        """Once a few parts are up (on the lane that sent the last of them): the bot writes a fresh session and the
        held one nears its end, so botocore asks for fresh credentials at the next signing."""
        if len(wire.sends) >= LANES and not renewed.is_set():
            renewed.set()
            bot_writes(aws, second)
            clock.now = T0 + timedelta(minutes=50)

    store.hook("after-call.s3.UploadPart", bot_renews_after_the_first_parts)
    checkpoints = CheckpointStore(store, "ft-lanes", 1)
    shards = write_shards(tmp_path / "out" / "checkpoint-6", 6)
    try:
        await checkpoints.commit(tmp_path / "out" / "checkpoint-6", 6)
        for name, data in shards.items():
            assert await restored_bytes(checkpoints, tmp_path / name, name) == data
    finally:
        await store.close()
        await credentials.close()

    assert renewed.is_set() and credentials.renewals == 1
    assert {signer for _, signer, _ in wire.sends} == {first.access_key_id, second.access_key_id}
    assert wire.sends[-1][1] == second.access_key_id  # the manifest, last, with the fresh session
    assert len(wire.threads(second.access_key_id)) >= 2  # more than one lane signed with what the bot renewed
    # The proxy agrees: every part and the manifest signed by the attempt's sessions, never the instance's own keys.
    assert set(proxied.signers("/jobs/ft-lanes/checkpoint-6/")) <= {first.access_key_id, second.access_key_id}
