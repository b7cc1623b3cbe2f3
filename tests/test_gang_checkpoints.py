"""A gang's checkpoint parts on a real store (a local directory, and moto S3): a checkpoint counts only with every
node's part and the marker; restore takes the union of the parts, reuses a survivor's verified local files, and
never takes a checkpoint with a part missing, without its marker or saved by another number of nodes."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path

import boto3
import pytest

from runner.gang_checkpoints import GANG_MARKER, GangCheckpointStore
from runner.manifest import MANIFEST_NAME
from runner.storage.base import ObjectStore
from runner.storage.file import FileStore
from runner.storage.s3 import S3Store


@pytest.fixture(params=["file", pytest.param("s3", marks=pytest.mark.scenario)])  # s3: moto
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[ObjectStore]:
    backend: ObjectStore
    if request.param == "file":
        backend = FileStore(f"file://{tmp_path}/bucket/job/")
    else:
        endpoint = request.getfixturevalue("aws")
        boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket="gangs")
        backend = S3Store("s3://gangs/job/")
    yield backend
    await backend.close()


def node(store: ObjectStore, rank: int, nodes: int = 2) -> GangCheckpointStore:
    return GangCheckpointStore(store, "ft-gang", 1, nodes=nodes, node_rank=rank, generation=1)


def node_part(root: Path, rank: int, step: int) -> Path:
    """What HF Trainer leaves on a node without a shared disk: the model on rank 0's node, each rank's RNG state."""
    directory = root / f"node-{rank}" / f"checkpoint-{step}"
    directory.mkdir(parents=True)
    (directory / f"rng_state_{rank}.pth").write_bytes(os.urandom(300))
    if rank == 0:
        (directory / "adapter_model.safetensors").write_bytes(os.urandom(2000))
        (directory / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    return directory


async def commit_parts(store: ObjectStore, root: Path, step: int, ranks: tuple[int, ...] = (0, 1)) -> None:
    for rank in ranks:
        await node(store, rank).commit(node_part(root, rank, step), step)


async def test_the_marker_needs_every_part_and_restore_takes_their_union(store: ObjectStore, tmp_path: Path) -> None:
    await commit_parts(store, tmp_path / "local", 5, ranks=(0,))
    assert await node(store, 0).mark_if_complete(5) is None  # node 1's part is not there yet
    assert await store.get_bytes(f"checkpoint-5/{GANG_MARKER}") is None
    await commit_parts(store, tmp_path / "local", 5, ranks=(1,))
    marker = await node(store, 0).mark_if_complete(5)
    assert marker is not None and sorted(marker.parts) == ["node-0", "node-1"] and marker.nodes == 2

    # Node ranks may change between generations: whoever is node 1 now gets the model files and every RNG state.
    restored = await node(store, 1).restore(tmp_path / "fresh")
    assert restored.step == 5 and restored.skipped == []
    assert restored.path is not None
    names = sorted(path.name for path in restored.path.iterdir())
    assert names == [".finetune-complete", "adapter_model.safetensors", "rng_state_0.pth", "rng_state_1.pth",
                     "trainer_state.json"]  # fmt: skip
    original = tmp_path / "local" / "node-1" / "checkpoint-5" / "rng_state_1.pth"
    assert (restored.path / "rng_state_1.pth").read_bytes() == original.read_bytes()


async def test_a_part_missing_no_marker_or_another_gang_size_is_never_restored(
    store: ObjectStore, tmp_path: Path
) -> None:
    local = tmp_path / "local"
    await commit_parts(store, local, 5)
    await node(store, 0).mark_if_complete(5)
    await commit_parts(store, local, 10)  # every part, but no marker: node 0's runner never saw them all
    await commit_parts(store, local, 15)
    await node(store, 0).mark_if_complete(15)
    await store.delete([f"checkpoint-15/node-1/{MANIFEST_NAME}"])  # a part gone after the marker was written
    await commit_parts(store, local, 20)
    await node(store, 0).mark_if_complete(20)
    await store.delete(["checkpoint-20/node-1/rng_state_1.pth"])  # a part's file gone
    await commit_parts(store, local, 25)
    await GangCheckpointStore(store, "ft-gang", 1, nodes=3, node_rank=0, generation=1).commit(
        node_part(local / "three", 2, 25), 25
    )
    three = {"node-0": "0" * 64, "node-1": "0" * 64, "node-2": "0" * 64}
    marker = {"job_id": "ft-gang", "nodes": 3, "generation": 1, "step": 25, "parts": three, "bytes": 0}
    await store.put_bytes(f"checkpoint-25/{GANG_MARKER}", json.dumps(marker).encode())

    restored = await node(store, 1).restore(tmp_path / "fresh")
    assert restored.step == 5
    assert [(skip.step, skip.kind, skip.reason) for skip in restored.skipped] == [
        (25, "bad-manifest", "saved by 3 nodes, this gang has 2"),
        (20, "missing", "partial: rng_state_1.pth is missing"),
        (15, "no-manifest", "no manifest of node-1: its upload never committed"),
        (10, "no-manifest", f"no {GANG_MARKER}: not every node's part was committed"),
    ]


async def test_a_part_rewritten_after_the_marker_is_not_restored(store: ObjectStore, tmp_path: Path) -> None:
    await commit_parts(store, tmp_path / "local", 5)
    await node(store, 0).mark_if_complete(5)
    await commit_parts(store, tmp_path / "again", 10)
    await node(store, 0).mark_if_complete(10)
    await node(store, 1).commit(node_part(tmp_path / "other", 1, 10), 10)  # another save of node 1's part
    restored = await node(store, 0).restore(tmp_path / "fresh")
    assert restored.step == 5
    assert [(skip.step, skip.reason) for skip in restored.skipped] == [
        (10, f"node-1/{MANIFEST_NAME} is not the one {GANG_MARKER} names")
    ]


async def test_a_survivors_local_copy_is_trusted_only_where_it_verifies(store: ObjectStore, tmp_path: Path) -> None:
    await commit_parts(store, tmp_path / "local", 5)
    await node(store, 0).mark_if_complete(5)
    stored = tmp_path / "local" / "node-0" / "checkpoint-5"
    output = tmp_path / "survivor"
    output.mkdir()
    # This node's own copy: the model as stored, its RNG state and trainer state not (a different save).
    node_part(tmp_path / "stale", 0, 5).rename(output / "checkpoint-5")
    model = "adapter_model.safetensors"
    (output / "checkpoint-5" / model).write_bytes((stored / model).read_bytes())
    restored = await node(store, 0).restore(output, reuse=True)
    assert restored.step == 5 and restored.path == output / "checkpoint-5"
    for name in ("adapter_model.safetensors", "rng_state_0.pth", "trainer_state.json"):
        assert (restored.path / name).read_bytes() == (stored / name).read_bytes()
    # The model was taken from the local copy: only what did not verify came over the network (and is paid for).
    model_size = (stored / model).stat().st_size
    assert 0 < restored.fetched_bytes <= restored.bytes - model_size
    assert (restored.path / "rng_state_1.pth").exists()


async def test_only_node_0_prunes_and_the_marker_goes_first(store: ObjectStore, tmp_path: Path) -> None:
    for step in (5, 10, 15):
        await commit_parts(store, tmp_path / "local", step)
        await node(store, 0).mark_if_complete(step)
    assert await node(store, 1).prune(keep=1) == []
    assert await node(store, 0).prune(keep=2) == [5]
    assert [info.key for info in await store.list_objects("checkpoint-5/")] == []
    assert await store.get_bytes(f"checkpoint-10/{GANG_MARKER}") is not None


async def test_node_0_marks_a_step_once_the_last_part_lands(store: ObjectStore, tmp_path: Path) -> None:
    await commit_parts(store, tmp_path / "local", 5)
    await node(store, 0).mark_if_complete(5)
    await commit_parts(store, tmp_path / "local", 10, ranks=(0,))
    assert await node(store, 1).newest_marked(10, wait=0.0, poll_seconds=0.05) == 5  # 10 lacks node 1's part
    marking = asyncio.create_task(node(store, 0).mark_when_complete(10, poll_seconds=0.05))
    await commit_parts(store, tmp_path / "local", 10, ranks=(1,))
    marker = await asyncio.wait_for(marking, 30)
    assert marker.step == 10 and marker.bytes > 0
    assert await node(store, 1).newest_marked(10, wait=30.0, poll_seconds=0.05) == 10
