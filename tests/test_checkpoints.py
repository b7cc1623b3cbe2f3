"""The commit protocol on both kinds of store: manifest last, verify on restore, prune only after a commit."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path

import boto3
import pytest

import runner.checkpoints as checkpoints_module
import runner.storage.s3 as s3_module
from runner.checkpoints import CheckpointStore
from runner.local_checkpoints import complete_checkpoints, stack_step
from runner.manifest import COMPLETE_MARKER, MANIFEST_NAME
from runner.storage.base import ObjectStore, StorageError
from runner.storage.file import FileStore
from runner.storage.s3 import MiB, S3Store
from tests.s3_proxy import S3FaultProxy


@pytest.fixture(params=["file", pytest.param("s3", marks=pytest.mark.scenario)])  # s3: moto
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[ObjectStore]:
    backend: ObjectStore
    if request.param == "file":
        backend = FileStore(f"file://{tmp_path}/bucket/job/")
    else:
        endpoint = request.getfixturevalue("aws")
        boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket="ckpts")
        backend = S3Store("s3://ckpts/job/")
    yield backend
    await backend.close()


def fake_checkpoint(root: Path, step: int, size: int = 3000) -> Path:
    directory = root / f"checkpoint-{step}"
    (directory / "nested").mkdir(parents=True)
    (directory / "adapter_model.safetensors").write_bytes(os.urandom(size))
    (directory / "nested" / "optimizer.pt").write_bytes(os.urandom(size // 2))
    (directory / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    (directory / COMPLETE_MARKER).touch()
    return directory


async def test_commit_then_restore_round_trips_every_byte(store: ObjectStore, tmp_path: Path) -> None:
    checkpoints = CheckpointStore(store, "ft-abcd", 1)
    source = fake_checkpoint(tmp_path / "local", 7)
    committed = await checkpoints.commit(source, 7)
    assert committed.uri == store.uri("checkpoint-7/")
    assert committed.bytes == 3000 + 1500 + len(json.dumps({"global_step": 7}))
    keys = [info.key for info in await store.list_objects("checkpoint-7/")]
    assert f"checkpoint-7/{MANIFEST_NAME}" in keys
    assert f"checkpoint-7/{COMPLETE_MARKER}" not in keys

    restored = await checkpoints.restore(tmp_path / "fresh")
    assert restored.step == 7 and restored.skipped == []
    assert restored.path == tmp_path / "fresh" / "checkpoint-7"
    assert restored.bytes == restored.fetched_bytes == committed.bytes  # every byte came over the network
    for name in ("adapter_model.safetensors", "nested/optimizer.pt", "trainer_state.json"):
        assert (restored.path / name).read_bytes() == (source / name).read_bytes()
    assert (restored.path / COMPLETE_MARKER).exists()


async def test_restore_falls_back_past_uncommitted_partial_and_corrupt(store: ObjectStore, tmp_path: Path) -> None:
    checkpoints = CheckpointStore(store, "ft-abcd", 1)
    for step in (10, 20, 30, 40, 50):
        await checkpoints.commit(fake_checkpoint(tmp_path / "local", step), step)
    await store.delete([f"checkpoint-50/{MANIFEST_NAME}"])  # the instance died before the commit
    await store.delete(["checkpoint-40/nested/optimizer.pt"])  # a file went missing
    await store.put_bytes(f"checkpoint-30/{MANIFEST_NAME}", b'{"version": 1, "trunc')  # a torn manifest
    raw = await store.get_bytes("checkpoint-20/adapter_model.safetensors")
    assert raw is not None
    await store.put_bytes("checkpoint-20/adapter_model.safetensors", bytes([raw[0] ^ 0xFF]) + raw[1:])

    restored = await checkpoints.restore(tmp_path / "fresh")
    assert restored.step == 10
    assert [(skip.step, skip.reason) for skip in restored.skipped] == [
        (50, "no manifest: its upload never committed"),
        (40, "partial: nested/optimizer.pt is missing"),
        (30, "corrupt manifest: 1 error(s)"),
        (20, "checksum mismatch in adapter_model.safetensors"),
    ]
    assert [path.name for path in (tmp_path / "fresh").iterdir()] == ["checkpoint-10"]  # no staging left over


async def test_restore_refuses_a_manifest_pointing_outside_the_checkpoint(store: ObjectStore, tmp_path: Path) -> None:
    checkpoints = CheckpointStore(store, "ft-abcd", 1)
    await checkpoints.commit(fake_checkpoint(tmp_path / "local", 3), 3)
    manifest = json.loads(await store.get_bytes(f"checkpoint-3/{MANIFEST_NAME}") or b"")
    manifest["files"][0]["path"] = "../../escape"
    await store.put_bytes(f"checkpoint-3/{MANIFEST_NAME}", json.dumps(manifest).encode())
    restored = await checkpoints.restore(tmp_path / "fresh")
    assert restored.step is None
    assert restored.skipped[0].reason == "manifest names a path outside the checkpoint"


async def test_an_empty_store_restores_nothing(store: ObjectStore, tmp_path: Path) -> None:
    restored = await CheckpointStore(store, "ft-abcd", 1).restore(tmp_path / "fresh")
    assert restored.step is None and restored.path is None and restored.skipped == []


async def test_prune_keeps_the_newest_committed_and_only_drops_older(store: ObjectStore, tmp_path: Path) -> None:
    checkpoints = CheckpointStore(store, "ft-abcd", 1)
    for step in (1, 2, 3):
        await checkpoints.commit(fake_checkpoint(tmp_path / "local", step), step)
    await store.put_bytes("checkpoint-4/adapter_model.safetensors", b"upload in flight")
    assert await checkpoints.prune(keep=2) == [1]
    assert await checkpoints.stored_steps() == [4, 3, 2]  # the in-flight newer upload is left alone
    assert await checkpoints.prune(keep=5) == []
    assert await checkpoints.stored_steps() == [4, 3, 2]


def test_local_completeness_rules(tmp_path: Path) -> None:
    for step in (5, 10, 15):
        (tmp_path / f"checkpoint-{step}").mkdir()
    (tmp_path / "checkpoint-5" / COMPLETE_MARKER).touch()
    (tmp_path / "checkpoint-x").mkdir()
    assert [c.step for c in complete_checkpoints(tmp_path)] == [5, 10]  # 10 superseded by 15; 15 may be mid-write
    assert [c.step for c in complete_checkpoints(tmp_path, trainer_exited_cleanly=True)] == [5, 10, 15]



def test_a_hugging_face_save_is_complete_by_its_own_sign_once_its_state_is_whole_and_its_sentinel_gone(
    tmp_path: Path,
) -> None:
    output = tmp_path / "output"
    newest = output / "checkpoint-13"  # the newest: no newer directory vouches for it, nor our marker
    newest.mkdir(parents=True)
    (newest / "model.safetensors").write_bytes(b"w" * 64)
    assert complete_checkpoints(output) == []
    sentinel = newest / "checkpoint-is-incomplete.txt"  # a SIGTERM save in progress (enable_jit_checkpoint)
    sentinel.write_text("Checkpoint started at step 13 and in progress...")
    (newest / "trainer_state.json").write_text('{"global_step": 13, "log_hist')  # torn: still being written
    assert complete_checkpoints(output) == []
    (newest / "trainer_state.json").write_text(json.dumps({"global_step": 13, "log_history": []}))
    assert complete_checkpoints(output) == []  # whole, but the sentinel says the save goes on
    sentinel.unlink()
    [done] = complete_checkpoints(output)
    assert done.step == 13 and stack_step(done.path) == 13
    # A trainer running our callback (it watches the stop file) is judged by our marker alone: its other ranks may
    # still be writing their files when rank 0 writes trainer_state.json.
    (tmp_path / "stop-request.watched").touch()
    assert complete_checkpoints(output) == []
    (newest / COMPLETE_MARKER).touch()
    assert [c.step for c in complete_checkpoints(output)] == [13]
    (newest / COMPLETE_MARKER).unlink()
    (tmp_path / "stop-request.watched").unlink()
    (newest / "trainer_state.json").unlink()
    (newest / "trainer_state.json").symlink_to(tmp_path / "elsewhere.json")  # never followed
    (tmp_path / "elsewhere.json").write_text(json.dumps({"global_step": 13}))
    assert complete_checkpoints(output) == []

async def test_a_network_that_keeps_failing_fails_the_restore_instead_of_skipping_a_good_checkpoint(
    aws: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    boto3.client("s3", endpoint_url=aws).create_bucket(Bucket="ckpts")
    proxy = await S3FaultProxy(aws).start()
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
    store = S3Store("s3://ckpts/job/", part_size=5 * MiB, multipart_threshold=5 * MiB)
    try:
        checkpoints = CheckpointStore(store, "ft-abcd", 1)
        for step in (1, 2):
            await checkpoints.commit(fake_checkpoint(tmp_path / "local", step, size=2 * MiB), step)
        monkeypatch.setattr(checkpoints_module, "FETCH_PATIENCE_SECONDS", 1.0)
        monkeypatch.setattr(s3_module, "RANGE_RETRIES", 1)
        proxy.truncate = lambda path: "checkpoint-2/adapter_model.safetensors" in path
        proxy.truncate_times = 1000  # every download of it is cut off half-way
        with pytest.raises(StorageError, match="was cut at byte"):
            await checkpoints.restore(tmp_path / "fresh")
        proxy.truncate_times = len(proxy.truncated)  # the network heals
        restored = await checkpoints.restore(tmp_path / "fresh")
        assert restored.step == 2 and restored.skipped == []
    finally:
        await store.close()
        await proxy.stop()


async def test_skips_say_what_kind_of_proof_they_rest_on(store: ObjectStore, tmp_path: Path) -> None:
    checkpoints = CheckpointStore(store, "ft-abcd", 1)
    for step in (10, 20, 30):
        await checkpoints.commit(fake_checkpoint(tmp_path / "local", step), step)
    await store.delete([f"checkpoint-30/{MANIFEST_NAME}"])
    await store.put_bytes("checkpoint-20/trainer_state.json", b"{}")  # a different size than the manifest says
    restored = await checkpoints.restore(tmp_path / "fresh")
    assert restored.step == 10
    assert [(skip.step, skip.kind) for skip in restored.skipped] == [(30, "no-manifest"), (20, "partial")]


async def test_a_multipart_file_with_one_part_rewritten_is_refused(store: ObjectStore, tmp_path: Path) -> None:
    store.part_size = 5 * MiB  # the file store too: the manifest's parts follow the store's part size
    checkpoints = CheckpointStore(store, "ft-abcd", 1)
    for step in (10, 20):
        await checkpoints.commit(fake_checkpoint(tmp_path / "local", step, size=3 * 5 * MiB + 999), step)
    manifest = json.loads(await store.get_bytes(f"checkpoint-20/{MANIFEST_NAME}") or b"")
    [weights] = [item for item in manifest["files"] if item["path"] == "adapter_model.safetensors"]
    assert "sha256" not in weights and len(weights["checksums"]["parts"]) == 4
    # The stored object rewritten with different bytes of the same size, in its third part only.
    raw = bytearray(await store.get_bytes("checkpoint-20/adapter_model.safetensors") or b"")
    raw[2 * 5 * MiB + 77] ^= 0x01
    await store.put_bytes("checkpoint-20/adapter_model.safetensors", bytes(raw))

    restored = await checkpoints.restore(tmp_path / "fresh")
    assert restored.step == 10
    assert [(skip.step, skip.kind) for skip in restored.skipped] == [(20, "checksum")]


async def test_a_manifest_vouching_for_its_files_without_part_checksums_is_refused(
    store: ObjectStore, tmp_path: Path
) -> None:
    """One way to vouch for a file (its parts' CRCs): a manifest saying it any other way (one SHA-256 per file) is
    malformed, and its checkpoint skipped, however right the digests are."""
    checkpoints = CheckpointStore(store, "ft-abcd", 1)
    await checkpoints.commit(fake_checkpoint(tmp_path / "local", 5), 5)
    files = {"adapter_model.safetensors": os.urandom(7 * MiB + 5), "trainer_state.json": b'{"global_step": 6}'}
    for name, data in files.items():
        await store.put_bytes(f"checkpoint-6/{name}", data)
    entries = [
        {"path": name, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()} for name, data in files.items()
    ]
    other = {"version": 2, "job_id": "ft-abcd", "attempt": 1, "step": 6, "files": entries}
    other["created"] = "2026-01-01T00:00:00Z"
    await store.put_bytes(f"checkpoint-6/{MANIFEST_NAME}", json.dumps(other).encode())

    restored = await checkpoints.restore(tmp_path / "fresh")
    assert restored.step == 5 and [(skip.step, skip.kind) for skip in restored.skipped] == [(6, "bad-manifest")]
