"""Checkpoint files go up while the trainer writes them, and what is committed is exactly the final file."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from awscrt import checksums

from runner.checkpoints import CheckpointStore
from runner.manifest import COMPLETE_MARKER, MANIFEST_NAME
from runner.storage.base import ObjectStore
from runner.storage.file import FileStore
from runner.storage.s3 import MiB, S3Store
from runner.storage.slots import PrioritySlots
from runner.upload import FileChanged, RateMeter
from tests.runner_harness import wait_until

PART = 5 * MiB


@pytest.fixture(params=["file", "s3"], name="store")
async def fixture_store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[ObjectStore]:
    """Each store a commit goes to: a ``file://`` one, and moto's S3 with 5 MiB parts (tests/test_commit_parallel.py
    imports it as ``fixture_store``)."""
    backend: ObjectStore
    if request.param == "file":
        backend = FileStore(f"file://{tmp_path}/bucket/job/")
        backend.part_size = PART
    else:
        endpoint = request.getfixturevalue("aws")
        boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket="ckpts")
        backend = S3Store("s3://ckpts/job/", part_size=PART, multipart_threshold=PART, concurrency=4)
    yield backend
    await backend.close()


def part_crcs(data: bytes, part_size: int) -> dict[str, object]:
    """What the manifest must say of ``data``: the CRC32C of each part, computed here with no help from ours."""
    pieces = [data[start : start + part_size] for start in range(0, len(data), part_size)] or [b""]
    crcs = [base64.b64encode(checksums.crc32c(piece).to_bytes(4, "big")).decode() for piece in pieces]
    return {"algorithm": "CRC32C", "part_size": part_size, "parts": crcs}


async def restored_bytes(checkpoints: CheckpointStore, tmp_path: Path, name: str) -> bytes:
    restored = await checkpoints.restore(tmp_path / "restored")
    assert restored.path is not None and restored.skipped == []
    return (restored.path / name).read_bytes()


async def test_parts_go_up_before_the_marker_and_the_commit_is_the_final_file(
    store: ObjectStore, tmp_path: Path
) -> None:
    checkpoints = CheckpointStore(store, "ft-pipe", 1)
    local = tmp_path / "out" / "checkpoint-3"
    local.mkdir(parents=True)
    upload = checkpoints.start_upload(local, 3, poll_seconds=0.05, settle_seconds=0.3)
    running = asyncio.create_task(upload.run())
    written = bytearray()
    with (local / "model.safetensors").open("wb") as handle:
        for _ in range(4):  # 4 parts' worth, written slowly, like a save of big weights
            chunk = os.urandom(PART)
            handle.write(chunk)
            handle.flush()
            written += chunk
            await asyncio.sleep(0.05)
        # Parts are on their way while the file is still open and growing.
        await wait_until(lambda: upload.bytes_uploaded >= 2 * PART)
        tail = os.urandom(PART // 3)
        handle.write(tail)
        written += tail
        # A writer that seeks back and patches its header after the first part was sent (zip, some formats).
        handle.seek(0)
        handle.write(b"PATCHED-HEADER")
        written[: len(b"PATCHED-HEADER")] = b"PATCHED-HEADER"
    (local / "trainer_state.json").write_text(json.dumps({"global_step": 3}))
    assert not running.done()  # no manifest before the marker, whatever is already up
    assert await store.get_bytes(f"checkpoint-3/{MANIFEST_NAME}") is None
    (local / COMPLETE_MARKER).touch()
    upload.mark_complete()
    committed = await asyncio.wait_for(running, 60)

    assert committed.step == 3 and committed.bytes == len(written) + len(json.dumps({"global_step": 3}))
    manifest = json.loads(await store.get_bytes(f"checkpoint-3/{MANIFEST_NAME}") or b"")
    by_path = {item["path"]: item for item in manifest["files"]}
    assert set(by_path) == {"model.safetensors", "trainer_state.json"}
    assert by_path["model.safetensors"]["checksums"] == part_crcs(bytes(written), PART)
    assert await restored_bytes(checkpoints, tmp_path, "model.safetensors") == bytes(written)


async def test_a_temporary_name_renamed_into_place_is_committed_under_its_final_name(
    store: ObjectStore, tmp_path: Path
) -> None:
    checkpoints = CheckpointStore(store, "ft-pipe", 1)
    local = tmp_path / "out" / "checkpoint-4"
    local.mkdir(parents=True)
    upload = checkpoints.start_upload(local, 4, poll_seconds=0.05, settle_seconds=0.2)
    running = asyncio.create_task(upload.run())
    data = os.urandom(2 * PART + 123)
    (local / "optimizer.pt.tmp").write_bytes(data)
    await wait_until(lambda: upload.bytes_uploaded >= PART)  # the temporary file is being uploaded
    os.replace(local / "optimizer.pt.tmp", local / "optimizer.pt")
    small = os.urandom(1000)
    (local / "rng_state.pth").write_bytes(small)
    (local / COMPLETE_MARKER).touch()
    upload.mark_complete()
    await asyncio.wait_for(running, 60)
    keys = {info.key for info in await store.list_objects("checkpoint-4/")}
    assert {"checkpoint-4/optimizer.pt", "checkpoint-4/rng_state.pth", f"checkpoint-4/{MANIFEST_NAME}"} <= keys
    manifest = json.loads(await store.get_bytes(f"checkpoint-4/{MANIFEST_NAME}") or b"")
    assert sorted(item["path"] for item in manifest["files"]) == ["optimizer.pt", "rng_state.pth"]
    assert await restored_bytes(checkpoints, tmp_path, "optimizer.pt") == data


async def test_a_file_that_shrinks_and_is_rewritten_is_uploaded_again(store: ObjectStore, tmp_path: Path) -> None:
    checkpoints = CheckpointStore(store, "ft-pipe", 1)
    local = tmp_path / "out" / "checkpoint-5"
    local.mkdir(parents=True)
    upload = checkpoints.start_upload(local, 5, poll_seconds=0.05, settle_seconds=0.2)
    running = asyncio.create_task(upload.run())
    (local / "weights.bin").write_bytes(os.urandom(3 * PART))
    await wait_until(lambda: upload.bytes_uploaded >= 2 * PART)
    final = os.urandom(PART + 77)
    (local / "weights.bin").write_bytes(final)  # opened with "w" again: truncated, then shorter content
    (local / COMPLETE_MARKER).touch()
    upload.mark_complete()
    await asyncio.wait_for(running, 60)
    assert await restored_bytes(checkpoints, tmp_path, "weights.bin") == final


async def test_a_file_changed_after_the_marker_fails_the_commit(store: ObjectStore, tmp_path: Path) -> None:
    checkpoints = CheckpointStore(store, "ft-pipe", 1)
    local = tmp_path / "out" / "checkpoint-6"
    local.mkdir(parents=True)
    (local / "weights.bin").write_bytes(os.urandom(3 * PART))
    slots = store._slots  # type: ignore[attr-defined]
    async with contextlib.AsyncExitStack() as held:
        for _ in range(slots.slots):  # hold the wire: the commit takes its final look, then waits
            await held.enter_async_context(store.slot())
        upload = checkpoints.start_upload(local, 6)
        upload.mark_complete()
        running = asyncio.create_task(upload.run())
        await wait_until(lambda: slots.waiting > 0)
        with (local / "weights.bin").open("r+b") as handle:  # the trainer still writes a "complete" checkpoint
            handle.write(b"late")
    with pytest.raises(FileChanged, match="changed after its checkpoint was complete") as changed:
        await asyncio.wait_for(running, 60)
    assert not changed.value.rewritten  # not one to start over: the caller tries the checkpoint again
    assert await store.get_bytes(f"checkpoint-6/{MANIFEST_NAME}") is None


async def test_priority_slots_serve_the_lowest_number_first() -> None:
    slots = PrioritySlots(1)
    order: list[str] = []
    release = asyncio.Event()

    async def holder() -> None:
        async with slots.hold(0):
            await release.wait()

    async def waiter(name: str, priority: int) -> None:
        async with slots.hold(priority):
            order.append(name)

    first = asyncio.create_task(holder())
    await asyncio.sleep(0)
    waiters = [
        asyncio.create_task(waiter(name, priority))
        for name, priority in [("newer-a", 20), ("older", 10), ("newer-b", 20)]
    ]
    cancelled = asyncio.create_task(waiter("cancelled", 5))
    await asyncio.sleep(0.01)
    cancelled.cancel()
    release.set()
    await asyncio.gather(first, *waiters)
    assert order == ["older", "newer-a", "newer-b"]
    assert slots.free == 1


def test_rate_meter_counts_busy_time_only() -> None:
    now = [0.0]
    meter = RateMeter(window_seconds=10.0, clock=lambda: now[0])
    assert meter.rate is None
    meter.begin()
    meter.begin()
    now[0] = 2.0
    meter.end(100)
    meter.end(100)  # two concurrent requests: 200 bytes in 2 s of busy time
    assert meter.rate == pytest.approx(100.0)
    now[0] = 50.0  # idle time does not dilute the rate
    assert meter.rate == pytest.approx(100.0)
    meter.begin()
    now[0] = 54.0
    meter.end(0)  # a failed request: its time counts, no bytes
    assert meter.rate == pytest.approx(200 / 6)


async def test_a_file_written_by_another_thread_goes_up_part_by_part_while_it_grows(
    store: ObjectStore, tmp_path: Path
) -> None:
    """A trainer thread writes 6 parts' worth at its own pace and, half-way, waits until parts are up before
    writing on: so parts were sent while the file grew (no clock involved), and the manifest's per-part CRCs are
    those of what was written, and those S3 was sent to check."""
    checkpoints = CheckpointStore(store, "ft-pipe", 1)
    local = tmp_path / "out" / "checkpoint-8"
    local.mkdir(parents=True)
    on_wire: list[str] = []
    if isinstance(store, S3Store):

        def note(request: Any, **_: Any) -> None:
            on_wire.append(request.headers["x-amz-checksum-crc32c"].decode())

        store.hook("before-send.s3.UploadPart", note)
    upload = checkpoints.start_upload(local, 8, poll_seconds=0.05, settle_seconds=5.0)
    running = asyncio.create_task(upload.run())
    loop = asyncio.get_running_loop()
    parts_up = threading.Event()
    data = os.urandom(6 * PART + 4321)
    written: list[int] = []

    def trainer() -> None:
        with (local / "model.bin").open("wb") as handle:
            for start in range(0, len(data), MiB):
                handle.write(data[start : start + MiB])
                handle.flush()
                written.append(start + MiB)
                if start + MiB == 3 * PART:
                    parts_up.wait()  # the save goes on only once parts are on their way
        (local / COMPLETE_MARKER).touch()

    writing = loop.run_in_executor(None, trainer)
    try:
        await wait_until(lambda: upload.bytes_uploaded >= 2 * PART)
        # Parts went up while the file was a half-written checkpoint: the writer waits at 3 parts until they are
        # (a busy writer may still be short of 3 parts when 2 are up).
        assert written[-1] <= 3 * PART < len(data)
    finally:
        parts_up.set()  # never leave the thread waiting, whatever failed
    await writing
    upload.mark_complete()
    await asyncio.wait_for(running, 60)

    manifest = json.loads(await store.get_bytes(f"checkpoint-8/{MANIFEST_NAME}") or b"")
    [entry] = manifest["files"]
    assert entry["checksums"] == part_crcs(data, PART)
    if isinstance(store, S3Store):  # every part S3 stored was sent with the CRC the manifest keeps
        assert set(entry["checksums"]["parts"]) <= set(on_wire)
    assert await restored_bytes(checkpoints, tmp_path, "model.bin") == data
