"""A checkpoint of many files commits them in parallel, whole or not at all; a file that stopped growing goes up
(whole, as an object) while the trainer still writes the rest of the step, and only the manifest waits for the
marker."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Awaitable, Callable
from pathlib import Path

import boto3
import pytest

from runner.checkpoints import CheckpointStore
from runner.manifest import COMPLETE_MARKER, MANIFEST_NAME
from runner.storage.base import ObjectStore, StorageError
from runner.storage.s3 import S3Store
from tests.s3_proxy import S3FaultProxy
from tests.test_pipelined_upload import PART, fixture_store, part_crcs, restored_bytes  # noqa: F401 - fixture


async def until(condition: Callable[[], Awaitable[bool]], timeout: float = 120.0) -> None:
    """Look again until ``condition`` holds; the generous timeout only turns a hang into a failure."""
    async with asyncio.timeout(timeout):
        while not await condition():  # noqa: ASYNC110 (the store is polled: it has no event to wait on)
            await asyncio.sleep(0.02)


async def stored_size(store: ObjectStore, key: str) -> int | None:
    return {info.key: info.size for info in await store.list_objects(key)}.get(key)


async def test_a_file_that_stopped_growing_is_whole_in_the_store_before_the_marker(
    store: ObjectStore, tmp_path: Path
) -> None:
    checkpoints = CheckpointStore(store, "ft-par", 1)
    local = tmp_path / "out" / "checkpoint-7"
    local.mkdir(parents=True)
    upload = checkpoints.start_upload(local, 7, poll_seconds=0.05, settle_seconds=0.2)
    running = asyncio.create_task(upload.run())
    weights = os.urandom(2 * PART + 1234)  # written in one call, like torch.save of the weights
    (local / "model.bin").write_bytes(weights)

    async def weights_whole() -> bool:
        return await stored_size(store, "checkpoint-7/model.bin") == len(weights)

    await until(weights_whole)  # the object is complete while the step is not: no marker, no manifest yet
    assert not running.done()
    assert await store.get_bytes(f"checkpoint-7/{MANIFEST_NAME}") is None
    optimizer = os.urandom(PART + 99)  # the rest of the step, written after
    (local / "optimizer.pt").write_bytes(optimizer)
    (local / COMPLETE_MARKER).touch()
    upload.mark_complete()
    committed = await asyncio.wait_for(running, 60)

    assert committed.bytes == len(weights) + len(optimizer)
    manifest = json.loads(await store.get_bytes(f"checkpoint-7/{MANIFEST_NAME}") or b"")
    by_path = {item["path"]: item for item in manifest["files"]}
    assert by_path["model.bin"]["checksums"] == part_crcs(weights, PART)
    assert by_path["optimizer.pt"]["checksums"] == part_crcs(optimizer, PART)
    assert await restored_bytes(checkpoints, tmp_path, "model.bin") == weights


async def test_a_file_changed_after_it_went_up_whole_is_committed_as_it_ends(
    store: ObjectStore, tmp_path: Path
) -> None:
    checkpoints = CheckpointStore(store, "ft-par", 1)
    local = tmp_path / "out" / "checkpoint-8"
    local.mkdir(parents=True)
    upload = checkpoints.start_upload(local, 8, poll_seconds=0.05, settle_seconds=0.2)
    running = asyncio.create_task(upload.run())
    first = os.urandom(2 * PART + 5)
    (local / "model.bin").write_bytes(first)

    async def first_whole() -> bool:
        return await stored_size(store, "checkpoint-8/model.bin") == len(first)

    await until(first_whole)
    more = os.urandom(PART // 2)  # the writer paused longer than the settle time, then went on
    with (local / "model.bin").open("r+b") as handle:
        handle.write(b"NEW-HEADER")  # … and patched what had gone up
        handle.seek(0, os.SEEK_END)
        handle.write(more)
    final = b"NEW-HEADER" + first[len(b"NEW-HEADER") :] + more
    (local / COMPLETE_MARKER).touch()
    upload.mark_complete()
    await asyncio.wait_for(running, 60)

    manifest = json.loads(await store.get_bytes(f"checkpoint-8/{MANIFEST_NAME}") or b"")
    assert manifest["files"][0]["checksums"] == part_crcs(final, PART)
    assert await restored_bytes(checkpoints, tmp_path, "model.bin") == final


def write_shards(local: Path, count: int) -> dict[str, bytes]:
    local.mkdir(parents=True)
    shards = {f"shard-{index}.bin": os.urandom(2 * PART + index * 1000) for index in range(count)}
    for name, data in shards.items():
        (local / name).write_bytes(data)
    (local / COMPLETE_MARKER).touch()
    return shards


async def test_many_files_go_up_in_parallel_and_the_manifest_comes_last(
    aws: str, proxy: S3FaultProxy, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    boto3.client("s3", endpoint_url=aws).create_bucket(Bucket="ckpts")  # straight to moto: the proxy is ours
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
    store = S3Store("s3://ckpts/job/", part_size=PART, multipart_threshold=PART, concurrency=4)
    checkpoints = CheckpointStore(store, "ft-par", 1)
    shards = write_shards(tmp_path / "out" / "checkpoint-9", 8)
    try:
        committed = await checkpoints.commit(tmp_path / "out" / "checkpoint-9", 9)
        manifest = json.loads(await store.get_bytes(f"checkpoint-9/{MANIFEST_NAME}") or b"")
    finally:
        await store.close()

    assert committed.bytes == sum(len(data) for data in shards.values())
    by_path = {item["path"]: item for item in manifest["files"]}
    assert set(by_path) == set(shards)
    for name, data in shards.items():
        assert by_path[name]["size"] == len(data)
        assert by_path[name]["checksums"] == part_crcs(data, PART)
    writes = [(method, path) for method, path, status in proxy.seen if method in ("PUT", "POST") and status < 300]
    assert writes[-1] == ("PUT", f"/ckpts/job/checkpoint-9/{MANIFEST_NAME}")  # after every part and completion
    completions = [path for method, path in writes if method == "POST" and "uploadId=" in path]
    assert len(completions) == len(shards)


async def test_one_failing_file_fails_the_commit_and_leaves_no_manifest(
    aws: str, proxy: S3FaultProxy, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    boto3.client("s3", endpoint_url=aws).create_bucket(Bucket="ckpts")  # straight to moto: the proxy is ours
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
    store = S3Store("s3://ckpts/job/", part_size=PART, multipart_threshold=PART, concurrency=4)
    checkpoints = CheckpointStore(store, "ft-par", 1)
    write_shards(tmp_path / "out" / "checkpoint-10", 6)
    proxy.refuse = lambda method, path: method == "PUT" and "shard-3.bin?" in path and "partNumber=2" in path
    try:
        with pytest.raises(StorageError, match=r"shard-3\.bin"):
            await checkpoints.commit(tmp_path / "out" / "checkpoint-10", 10)
        assert await store.get_bytes(f"checkpoint-10/{MANIFEST_NAME}") is None
    finally:
        await store.close()  # lets the aborts of the given-up uploads finish
    assert not any(method == "PUT" and MANIFEST_NAME in path for method, path in proxy.arrived)
    pending = boto3.client("s3", endpoint_url=aws).list_multipart_uploads(Bucket="ckpts")
    assert pending.get("Uploads", []) == []  # no parts left behind, billed and invisible
