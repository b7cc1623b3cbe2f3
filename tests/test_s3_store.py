"""S3Store against a real moto server: round trips, listing, deletes, failed multipart, oss:// settings."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import os
import re
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from awscrt import checksums

import runner.storage.s3 as s3_module
from runner.storage.base import ObjectInfo, ObjectMissing, StorageError
from runner.storage.s3 import MiB, S3Store, client_settings
from tests.runner_harness import runner_env, wait_until, write_spec

BUCKET = "ckpt"
# Small parts keep the multipart tests quick while still giving several concurrent parts.
SMALL = {"part_size": 5 * MiB, "multipart_threshold": 6 * MiB, "concurrency": 4}


def s3_client(endpoint: str) -> Any:
    return boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")


@pytest.fixture
def bucket(aws: str) -> Any:
    client = s3_client(aws)
    client.create_bucket(Bucket=BUCKET)
    return client


@pytest.fixture
async def store(bucket: Any) -> AsyncIterator[S3Store]:
    opened = S3Store(f"s3://{BUCKET}/runs/r1/", **SMALL)
    yield opened
    await opened.close()


def random_file(path: Path, size: int) -> bytes:
    data = os.urandom(size)
    path.write_bytes(data)
    return data


def test_base_uri_and_uri_are_normalised() -> None:
    assert S3Store("s3://b/p").base_uri == "s3://b/p/"
    assert S3Store("s3://b").prefix == ""
    assert S3Store("s3://b/a/b/").uri("x/y.bin") == "s3://b/a/b/x/y.bin"
    with pytest.raises(StorageError):
        S3Store("gs://b/p/")
    with pytest.raises(ValueError):
        S3Store("s3://b/p/", part_size=1 * MiB)


async def test_small_round_trip(store: S3Store, bucket: Any, work: Path) -> None:
    data = random_file(work / "small.bin", 100_000)
    await store.upload_file(work / "small.bin", "ckpt-1/small.bin")

    stored = bucket.get_object(Bucket=BUCKET, Key="runs/r1/ckpt-1/small.bin")["Body"].read()
    assert stored == data
    await store.download_file("ckpt-1/small.bin", work / "out" / "small.bin")
    assert (work / "out" / "small.bin").read_bytes() == data
    assert [p.name for p in (work / "out").iterdir()] == ["small.bin"]  # no temp file left behind


async def test_empty_file_round_trip(store: S3Store, work: Path) -> None:
    (work / "empty").write_bytes(b"")
    await store.upload_file(work / "empty", "empty")
    await store.download_file("empty", work / "back")
    assert (work / "back").read_bytes() == b""


async def test_multipart_round_trip(store: S3Store, bucket: Any, work: Path) -> None:
    data = random_file(work / "big.bin", 23 * MiB + 12345)  # 5 parts, the last one short
    await store.upload_file(work / "big.bin", "ckpt-1/model.safetensors")

    head = bucket.head_object(Bucket=BUCKET, Key="runs/r1/ckpt-1/model.safetensors")
    assert head["ContentLength"] == len(data)
    assert head["ETag"].strip('"').endswith("-5")  # really went as a 5-part multipart upload
    assert bucket.list_multipart_uploads(Bucket=BUCKET).get("Uploads", []) == []

    target = work / "restore" / "nested" / "model.safetensors"
    await store.download_file("ckpt-1/model.safetensors", target)
    assert target.read_bytes() == data
    assert sorted(p.name for p in target.parent.iterdir()) == ["model.safetensors"]


async def test_s3_uploads_carry_crc32c_checksums(store: S3Store, bucket: Any, work: Path) -> None:
    small = random_file(work / "small.bin", 1000)
    big = random_file(work / "big.bin", 12 * MiB)
    sent: dict[str, list[str]] = {}

    def note(request: Any, **_: Any) -> None:  # what actually goes on the wire, per request
        name = request.url.split("?")[0].rsplit("/", 1)[-1]
        sent.setdefault(name, []).append(request.headers.get("x-amz-checksum-crc32c", b"").decode())

    store.hook("before-send.s3.PutObject", note)
    store.hook("before-send.s3.UploadPart", note)
    await store.upload_file(work / "small.bin", "small.bin")
    await store.upload_file(work / "big.bin", "big.bin")

    def b64crc(data: bytes) -> str:
        return base64.b64encode(checksums.crc32c(data).to_bytes(4, "big")).decode()

    assert sent["small.bin"] == [b64crc(small)]
    # Every part carries its own CRC32C (5 + 5 + 2 MiB), for S3 to check on arrival.
    parts = [big[start : start + 5 * MiB] for start in range(0, len(big), 5 * MiB)]
    assert sorted(sent["big.bin"]) == sorted(b64crc(part) for part in parts)
    head = bucket.head_object(Bucket=BUCKET, Key="runs/r1/small.bin", ChecksumMode="ENABLED")
    assert head["ChecksumCRC32C"] == b64crc(small)
    # The multipart object was declared CRC32C, so S3 keeps a composite of its parts' (moto computes it its own way).
    head = bucket.head_object(Bucket=BUCKET, Key="runs/r1/big.bin", ChecksumMode="ENABLED")
    assert "ChecksumCRC32C" in head


async def test_concurrent_uploads_share_the_store(store: S3Store, work: Path) -> None:
    files = {f"shard-{i}.bin": random_file(work / f"shard-{i}.bin", (7 + i) * MiB) for i in range(3)}
    files["config.json"] = random_file(work / "config.json", 300)
    await asyncio.gather(*(store.upload_file(work / name, f"c/{name}") for name in files))

    listed = await store.list_objects("c/")
    assert listed == sorted((ObjectInfo(f"c/{name}", len(data)) for name, data in files.items()), key=lambda i: i.key)
    for name, data in files.items():
        assert await store.get_bytes(f"c/{name}") == data


async def test_put_and_get_bytes(store: S3Store) -> None:
    await store.put_bytes("ckpt-1/manifest.json", b'{"ok": true}')
    assert await store.get_bytes("ckpt-1/manifest.json") == b'{"ok": true}'
    assert await store.get_bytes("ckpt-1/missing.json") is None
    assert await store.get_bytes("nope") is None


async def test_list_and_list_dirs_are_relative_to_the_base(store: S3Store, bucket: Any) -> None:
    for key in ["ckpt-1/a", "ckpt-1/sub/b", "ckpt-2/c", "latest.json"]:
        await store.put_bytes(key, key.encode())
    bucket.put_object(Bucket=BUCKET, Key="runs/r2/ckpt-9/x", Body=b"other run")  # outside our prefix
    bucket.put_object(Bucket=BUCKET, Key="runs/r1x/y", Body=b"sibling with a shared prefix")

    assert [info.key for info in await store.list_objects()] == [
        "ckpt-1/a",
        "ckpt-1/sub/b",
        "ckpt-2/c",
        "latest.json",
    ]
    assert await store.list_objects("ckpt-1/") == [
        ObjectInfo("ckpt-1/a", 8),
        ObjectInfo("ckpt-1/sub/b", 12),
    ]
    assert await store.list_objects("nothing/") == []
    assert await store.list_dirs() == ["ckpt-1", "ckpt-2"]
    assert await store.list_dirs("ckpt-1") == ["sub"]
    assert await store.list_dirs("ckpt-1/") == ["sub"]
    assert await store.list_dirs("ckpt-2") == []


async def test_list_and_delete_page_through_batches(bucket: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(s3_module, "LIST_PAGE_SIZE", 7)
    monkeypatch.setattr(s3_module, "DELETE_BATCH", 10)
    keys = [f"k/{i:03d}" for i in range(30)]
    dirs = [f"d{i:02d}" for i in range(9)]
    store = S3Store(f"s3://{BUCKET}/")
    try:
        await asyncio.gather(*(store.put_bytes(key, b"x") for key in keys + [f"{d}/f" for d in dirs]))
        pages: list[str] = []
        client = await store._client()
        client.meta.events.register("after-call.s3.ListObjectsV2", lambda **_: pages.append("page"))
        assert [info.key for info in await store.list_objects("k/")] == keys
        assert len(pages) == 5  # 30 keys, 7 a page: really paged
        assert await store.list_dirs() == sorted([*dirs, "k"])
        await store.delete([*keys, "k/never-existed"])  # four DeleteObjects batches, one missing key
        assert await store.list_dirs() == dirs
    finally:
        await store.close()


async def test_delete_with_missing_keys(store: S3Store) -> None:
    await store.put_bytes("a/1", b"1")
    await store.put_bytes("a/2", b"2")
    sent: list[Any] = []
    client = await store._client()
    client.meta.events.register("before-send.s3.DeleteObjects", lambda request, **_: sent.append(request))
    await store.delete(["a/1", "a/does-not-exist"])
    # OSS and most S3 clones refuse DeleteObjects without Content-MD5, which botocore >= 1.36 leaves out.
    (request,) = sent
    expected = base64.b64encode(hashlib.md5(request.body, usedforsecurity=False).digest())
    assert request.headers["Content-MD5"] in (expected, expected.decode())
    assert [info.key for info in await store.list_objects()] == ["a/2"]
    await store.delete([])


async def test_download_missing_key_raises_and_leaves_nothing(store: S3Store, work: Path) -> None:
    with pytest.raises(StorageError, match="does not exist"):
        await store.download_file("nope.bin", work / "dl" / "nope.bin")
    assert not (work / "dl" / "nope.bin").exists()


async def test_multipart_into_missing_bucket_raises(aws: str, work: Path) -> None:
    random_file(work / "big.bin", 12 * MiB)
    store = S3Store("s3://no-such-bucket/p/", **SMALL)
    try:
        with pytest.raises(StorageError, match=re.escape("s3://no-such-bucket/p/big.bin")) as failed:
            await store.upload_file(work / "big.bin", "big.bin")
        assert "failed: HTTP 404: " in str(failed.value)  # the store's answer, whatever botocore's text says
    finally:
        await store.close()
    client = s3_client(aws)
    client.create_bucket(Bucket="no-such-bucket")
    assert client.list_objects_v2(Bucket="no-such-bucket").get("KeyCount") == 0


async def test_failed_part_aborts_the_upload(
    store: S3Store, bucket: Any, work: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    random_file(work / "big.bin", 20 * MiB)
    real_read = s3_module._read_range

    def flaky_read(path: Path, offset: int, size: int, buffer: bytearray) -> tuple[memoryview, int]:
        if offset >= 10 * MiB:
            raise OSError("disk went away")
        return real_read(path, offset, size, buffer)

    monkeypatch.setattr(s3_module, "_read_range", flaky_read)
    with pytest.raises(StorageError, match="disk went away"):
        await store.upload_file(work / "big.bin", "big.bin")
    monkeypatch.undo()

    assert bucket.list_multipart_uploads(Bucket=BUCKET).get("Uploads", []) == []
    assert bucket.list_objects_v2(Bucket=BUCKET).get("KeyCount") == 0


async def test_download_replaces_existing_file_only_when_complete(
    store: S3Store, work: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = random_file(work / "big.bin", 16 * MiB)
    await store.upload_file(work / "big.bin", "big.bin")
    target = work / "restore.bin"
    target.write_bytes(b"previous")

    real_write = s3_module._write_chunks

    def failing_write(path: Path, offset: int, chunks: list[bytes]) -> None:
        if offset >= 10 * MiB:
            raise OSError("disk full")
        real_write(path, offset, chunks)

    monkeypatch.setattr(s3_module, "_write_chunks", failing_write)
    with pytest.raises(StorageError, match="disk full"):
        await store.download_file("big.bin", target)
    assert target.read_bytes() == b"previous"
    assert sorted(p.name for p in work.iterdir()) == ["big.bin", "restore.bin"]

    monkeypatch.undo()
    await store.download_file("big.bin", target)
    assert target.read_bytes() == data


async def test_oss_against_moto_with_path_override(aws: str, work: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AWS_ENDPOINT_URL")
    monkeypatch.setenv("OSS_ENDPOINT", aws)
    monkeypatch.setenv("FINETUNE_S3_ADDRESSING", "path")
    s3_client(aws).create_bucket(Bucket="oss-bucket")
    data = random_file(work / "w.bin", 11 * MiB)

    store = S3Store("oss://oss-bucket/jobs/j1/", **SMALL)
    try:
        assert store.settings.endpoint_url == aws
        await store.upload_file(work / "w.bin", "ckpt/w.bin")
        await store.put_bytes("ckpt/manifest.json", b"{}")
        assert await store.list_dirs() == ["ckpt"]
        assert [info.key for info in await store.list_objects()] == ["ckpt/manifest.json", "ckpt/w.bin"]
        await store.download_file("ckpt/w.bin", work / "back.bin")
        assert (work / "back.bin").read_bytes() == data
        await store.delete(["ckpt/w.bin", "ckpt/manifest.json"])
        assert await store.list_objects() == []
    finally:
        await store.close()


def test_oss_without_endpoint_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OSS_ENDPOINT", raising=False)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    with pytest.raises(StorageError, match="OSS_ENDPOINT"):
        S3Store("oss://bucket/prefix/")


def test_oss_defaults_to_virtual_addressing_and_region_from_host(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("FINETUNE_S3_ADDRESSING", "OSS_REGION", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OSS_ENDPOINT", "https://oss-cn-hangzhou-internal.aliyuncs.com")
    monkeypatch.setenv("ALIBABA_CLOUD_ACCESS_KEY_ID", "LTAI-id")
    monkeypatch.setenv("ALIBABA_CLOUD_ACCESS_KEY_SECRET", "secret")

    store = S3Store("oss://bucket/")
    config = store.client_config()
    assert config.s3["addressing_style"] == "virtual"
    assert config.s3["payload_signing_enabled"] is False
    assert config.request_checksum_calculation == "when_required"
    assert config.retries == {"max_attempts": 5, "mode": "standard"}
    assert config.max_pool_connections >= store.concurrency
    assert store.settings.region == "cn-hangzhou"
    assert store.settings.send_checksums is False  # OSS's S3 API does not document x-amz-checksum-*
    assert store.settings.endpoint_url == "https://oss-cn-hangzhou-internal.aliyuncs.com"
    assert (store.settings.access_key_id, store.settings.secret_access_key) == ("LTAI-id", "secret")


def test_client_settings_resolution() -> None:
    assert client_settings("s3", {}).addressing_style is None
    assert client_settings("s3", {"AWS_DEFAULT_REGION": "eu-west-1"}).region == "eu-west-1"
    assert client_settings("s3", {"FINETUNE_S3_ADDRESSING": "path"}).addressing_style == "path"
    oss = client_settings("oss", {"AWS_ENDPOINT_URL": "http://minio:9000", "OSS_REGION": "cn-beijing"})
    assert (oss.endpoint_url, oss.region, oss.access_key_id) == ("http://minio:9000", "cn-beijing", None)
    assert client_settings("oss", {"OSS_ENDPOINT": "https://example.com"}).region == "us-east-1"
    assert client_settings("oss", {"OSS_ENDPOINT": "oss-ap-southeast-1.aliyuncs.com"}).region == "ap-southeast-1"
    with pytest.raises(StorageError, match="FINETUNE_S3_ADDRESSING"):
        client_settings("s3", {"FINETUNE_S3_ADDRESSING": "sideways"})


def test_the_storage_region_wins_over_the_instances_own() -> None:
    """A runner launched in us-west-2 reaches a bucket of us-east-1 at us-east-1's endpoint."""
    away = {"AWS_REGION": "us-west-2", "AWS_DEFAULT_REGION": "us-west-2", "FINETUNE_STORAGE_REGION": "us-east-1"}
    assert client_settings("s3", away).region == "us-east-1"
    assert client_settings("s3", {"AWS_REGION": "us-west-2"}).region == "us-west-2"
    for bad in ("us-east-1/../x", "US-EAST-1", "https://s3.us-east-1.amazonaws.com"):
        with pytest.raises(StorageError, match="FINETUNE_STORAGE_REGION"):
            client_settings("s3", {"FINETUNE_STORAGE_REGION": bad})


@pytest.fixture
async def proxied(bucket: Any, aws: str, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[tuple[S3Store, Any]]:
    from tests.s3_proxy import S3FaultProxy

    proxy = await S3FaultProxy(aws).start()
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
    opened = S3Store(f"s3://{BUCKET}/runs/r1/", **SMALL)
    yield opened, proxy
    await opened.close()
    await proxy.stop()


async def test_a_download_cut_short_resumes_where_it_stopped(proxied: tuple[S3Store, Any], work: Path) -> None:
    store, proxy = proxied
    data = random_file(work / "big.bin", 12 * MiB)
    await store.upload_file(work / "big.bin", "big.bin")
    proxy.truncate = lambda path: "big.bin" in path
    proxy.truncate_times = 2
    await store.download_file("big.bin", work / "back.bin")
    assert (work / "back.bin").read_bytes() == data
    assert len(proxy.truncated) == 2
    resumed = [path for method, path in proxy.arrived if method == "GET" and "big.bin" in path]
    assert len(resumed) == len(proxy.truncated) + 3  # three ranges, and one more GET per cut


async def test_a_download_that_keeps_being_cut_fails_as_a_storage_error(
    proxied: tuple[S3Store, Any], work: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, proxy = proxied
    random_file(work / "big.bin", 6 * MiB)
    await store.upload_file(work / "big.bin", "big.bin")
    monkeypatch.setattr(s3_module, "RANGE_RETRIES", 1)
    proxy.truncate = lambda path: "big.bin" in path
    proxy.truncate_times = 1000
    with pytest.raises(StorageError, match="was cut at byte") as failed:
        await store.download_file("big.bin", work / "back.bin")
    assert not isinstance(failed.value, ObjectMissing)
    assert not (work / "back.bin").exists()


async def test_uploads_wait_for_their_turn_by_priority(bucket: Any, work: Path) -> None:
    store = S3Store(f"s3://{BUCKET}/runs/r1/", part_size=5 * MiB, multipart_threshold=5 * MiB, concurrency=1)
    try:
        random_file(work / "old.bin", 15 * MiB)
        random_file(work / "new.bin", 15 * MiB)
        done: list[str] = []

        async def upload(name: str, priority: int) -> None:
            await store.upload_file(work / name, name, priority=priority)
            done.append(name)

        async with store.slot(0):  # everything queues behind this; then the older checkpoint goes first
            newer = asyncio.create_task(upload("new.bin", 20))
            await wait_until(lambda: store._slots.waiting == 3)
            older = asyncio.create_task(upload("old.bin", 10))
            await wait_until(lambda: store._slots.waiting == 6)
        await asyncio.gather(newer, older)
        assert done == ["old.bin", "new.bin"]
    finally:
        await store.close()


@pytest.mark.parametrize(
    ("name", "value"), [("FINETUNE_S3_PART_MIB", "1"), ("FINETUNE_S3_CONCURRENCY", "many"), ("AWS_MAX_ATTEMPTS", "0")]
)
async def test_bad_transfer_settings_stop_the_runner_with_one_line(work: Path, name: str, value: str) -> None:
    spec = write_spec(work / "spec.json", checkpoint_uri="s3://bucket/jobs/ft-test/", command=["true"])
    runner = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "runner.cli",
        "run",
        "--spec",
        str(spec),
        "--work-dir",
        str(work / "w"),
        env=runner_env(**{name: value}),
        stderr=asyncio.subprocess.PIPE,
    )
    _, stderr = await runner.communicate()
    assert runner.returncode == 2
    text = stderr.decode()
    [error] = [line for line in text.splitlines() if line.startswith("finetune-runner:")]
    assert name in error and "Traceback" not in text
    assert not (work / "w").exists()
