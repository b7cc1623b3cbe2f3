"""A gang's checkpoint: one part per node, and one marker that says every part is there.

HF Trainer on several nodes without a shared disk writes the model and optimizer on global rank 0's node and each
rank's ``rng_state_<i>.pth`` on its own node, so no node holds the whole checkpoint: each node's runner commits its
own directory as its part, under the usual commit protocol (files, then the part's manifest)::

    checkpoint-<step>/node-<k>/<files…>          node k's checkpoint directory, as its trainer wrote it
    checkpoint-<step>/node-<k>/MANIFEST.json     written last, by node k's runner
    checkpoint-<step>/GANG.json                  written by node 0's runner once it has seen every part's manifest

The checkpoint counts only with ``GANG.json`` (nodes, generation, step, each part's manifest digest). A restore
takes the newest one whose marker is there, was written for as many nodes as the spec's gang has, and whose every
part verifies; it downloads the union of the parts into one local ``checkpoint-<step>/``, so node ranks may be
reassigned between generations (whoever is rank 0 now has the model, every rank finds its RNG file). Anything less
is skipped with a reason, as an uncommitted checkpoint is.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from runner.checkpoints import CheckpointInvalid, CheckpointStore
from runner.held import DERIVED
from runner.manifest import MANIFEST_NAME, Manifest, ManifestFile
from runner.storage.base import ObjectStore, StorageError
from runner.upload import RateMeter

log = logging.getLogger(__name__)

GANG_MARKER = "GANG.json"


def part_name(node_rank: int) -> str:
    return f"node-{node_rank}/"


class GangMarker(BaseModel):
    """Every node's part of ``checkpoint-<step>/`` is committed: the manifests' SHA-256, part by part."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    version: int = 1
    job_id: str
    nodes: int = Field(ge=2)
    generation: int = Field(ge=1)
    step: int
    parts: dict[str, str]  # "node-<k>" -> SHA-256 of that part's MANIFEST.json as stored
    bytes: int = Field(ge=0)
    # "node-<k>" -> the rule its part was rebuilt by, where node k was lost without notice and the survivors
    # committed the step they held (runner.held): "seed-step-rank", or "checkpoint-<s>" (its last committed part).
    rebuilt: dict[str, str] = Field(default_factory=dict)


class GangCheckpointStore(CheckpointStore):
    """The checkpoints of one node of a gang: its part goes to ``node-<rank>/``; restore needs the marker."""

    def __init__(
        self,
        store: ObjectStore,
        job_id: str,
        attempt: int,
        *,
        nodes: int,
        node_rank: int,
        generation: int,
        meter: RateMeter | None = None,
    ) -> None:
        super().__init__(store, job_id, attempt, meter)
        self.nodes = nodes
        self.node_rank = node_rank
        self.generation = generation
        self.part = part_name(node_rank)

    async def marker(self, step: int) -> GangMarker | None:
        """``checkpoint-<step>/GANG.json``, if it is there (a malformed one is no marker)."""
        raw = await self.store.get_bytes(f"checkpoint-{step}/{GANG_MARKER}")
        if raw is None:
            return None
        try:
            return GangMarker.model_validate_json(raw)
        except ValidationError:
            log.warning("checkpoint-%d/%s is malformed", step, GANG_MARKER)
            return None

    async def mark_if_complete(self, step: int, rebuilt: dict[str, str] | None = None) -> GangMarker | None:
        """Write ``GANG.json`` for ``step`` if every node's part is committed (node 0's runner); the marker, or None
        while a part is missing. A marker already there is returned as it is."""
        existing = await self.marker(step)
        if existing is not None:
            return existing
        digests: dict[str, str] = {}
        total = 0
        for rank in range(self.nodes):
            part = part_name(rank)
            try:
                manifest, raw = await self._read_manifest(step, part)
            except CheckpointInvalid:
                return None
            digests[part.rstrip("/")] = hashlib.sha256(raw).hexdigest()
            total += manifest.total_bytes
        marker = GangMarker(
            job_id=self.job_id,
            nodes=self.nodes,
            generation=self.generation,
            step=step,
            parts=digests,
            bytes=total,
            rebuilt=rebuilt or {},
        )
        await self.store.put_bytes(f"checkpoint-{step}/{GANG_MARKER}", marker.model_dump_json(indent=1).encode())
        log.info("checkpoint-%d: every node's part is committed (%s)", step, GANG_MARKER)
        return marker

    async def mark_when_complete(self, step: int, poll_seconds: float) -> GangMarker:
        """Node 0: look for every node's part of ``step`` until all are there, then write the marker (storage
        trouble is retried; the caller cancels it once a newer step is marked or the attempt ends)."""
        while True:
            try:
                marker = await self.mark_if_complete(step)
            except StorageError as exc:
                log.warning("cannot look at the parts of checkpoint-%d yet: %s", step, exc)
                marker = None
            if marker is not None:
                return marker
            await asyncio.sleep(poll_seconds)

    async def newest_marked(self, at_least: int | None, wait: float, poll_seconds: float) -> int | None:
        """The newest step with its marker; first waits up to ``wait`` seconds for ``at_least`` (this node's own
        newest part) to be marked by node 0's runner. None: no complete checkpoint (or the store unreachable)."""
        deadline = time.monotonic() + wait
        while at_least is not None and time.monotonic() < deadline:
            with contextlib.suppress(StorageError):
                if await self.marker(at_least) is not None:
                    return at_least
            await asyncio.sleep(poll_seconds)
        try:
            for step in await self.stored_steps():
                if await self.marker(step) is not None:
                    return step
        except StorageError as exc:
            log.warning("cannot list the gang's checkpoints: %s", exc)
        return None

    async def _verified_files(self, step: int) -> list[tuple[str, ManifestFile]]:
        """Every file of every part of ``step`` (the union), once the marker and each part check out: a restore
        takes the newest complete gang checkpoint, every part of it, into one ``checkpoint-<step>``."""
        marker = await self.marker(step)
        if marker is None:
            raise CheckpointInvalid("no-manifest", f"no {GANG_MARKER}: not every node's part was committed")
        if marker.step != step:
            raise CheckpointInvalid("bad-manifest", f"{GANG_MARKER} is for step {marker.step}")
        if marker.nodes != self.nodes:
            raise CheckpointInvalid("bad-manifest", f"saved by {marker.nodes} nodes, this gang has {self.nodes}")
        expected = {part_name(rank).rstrip("/") for rank in range(self.nodes)}
        if set(marker.parts) != expected:
            raise CheckpointInvalid("bad-manifest", f"{GANG_MARKER} lists parts {sorted(marker.parts)}")
        union: dict[str, tuple[str, ManifestFile]] = {}
        for rank in range(self.nodes):
            part = part_name(rank)
            manifest, raw = await self._read_manifest(step, part)
            if hashlib.sha256(raw).hexdigest() != marker.parts[part.rstrip("/")]:
                raise CheckpointInvalid("bad-manifest", f"{part}{MANIFEST_NAME} is not the one {GANG_MARKER} names")
            prefix = f"checkpoint-{step}/{part}"
            await self._check_stored(prefix, manifest)
            for item in manifest.files:
                seen = union.get(item.path)
                if seen is not None and (seen[1].size, seen[1].checksums) != (item.size, item.checksums):
                    raise CheckpointInvalid("bad-manifest", f"{item.path} differs between two nodes' parts")
                union.setdefault(item.path, (prefix, item))
        return list(union.values())

    async def prune(self, keep: int) -> list[int]:
        """Node 0's runner only (it writes the markers): all but the newest ``keep`` marked checkpoints, and the
        unmarked leftovers older than them. Marker first, then the parts' manifests: a half-deleted checkpoint must
        read as incomplete, never as valid."""
        if self.node_rank != 0:
            return []
        steps = await self.stored_steps()
        marked = [step for step in steps if await self.store.get_bytes(f"checkpoint-{step}/{GANG_MARKER}")]
        kept = marked[:keep]
        if not kept:
            return []
        doomed = [step for step in steps if step < kept[-1]]
        for step in doomed:
            prefix = f"checkpoint-{step}/"
            keys = [info.key for info in await self.store.list_objects(prefix)]
            first = [key for key in keys if key == prefix + GANG_MARKER]
            manifests = [key for key in keys if key.endswith("/" + MANIFEST_NAME) and key not in first]
            for batch in (first, manifests):
                if batch:
                    await self.store.delete(batch)
            await self.store.delete([key for key in keys if key not in first and key not in manifests])
        if doomed:
            log.info("pruned checkpoints %s", doomed)
        return doomed

    # -- a node lost without notice: the survivors' held step ---------------------------------------------------

    async def missing_parts(self, step: int) -> list[int]:
        """The node ranks whose part of ``step`` has no manifest (yet)."""
        return [rank for rank in range(self.nodes) if await self.store.get_bytes(_manifest_key(step, rank)) is None]

    async def rebuild_part(self, step: int, rank: int, held: set[str], source: int | None, scratch: Path) -> str:
        """Commit lost node ``rank``'s part of the survivors' held ``step``, by rule; the rule, for the marker.

        ``source`` None: the held part already holds every rank's state as a function of (seed, step, rank), so
        the lost node's part lists no files of its own. Else the files of its part of checkpoint-``source`` (the
        gang's newest marked one) that the held part (``held``: its paths) does not have, copied under this step
        (through ``scratch``: the store has no copy of its own). The manifest goes last, as in any commit."""
        files: list[ManifestFile] = []
        if source is not None:
            old, _raw = await self._read_manifest(source, part_name(rank))
            for item in old.files:
                if item.path in held:
                    continue
                local = scratch / f"rebuilt-{rank}" / item.path
                local.parent.mkdir(parents=True, exist_ok=True)
                await self.store.download_file(f"checkpoint-{source}/{part_name(rank)}{item.path}", local)
                await self.store.upload_file(local, f"checkpoint-{step}/{part_name(rank)}{item.path}")
                local.unlink()
                files.append(item)
        manifest = Manifest(job_id=self.job_id, attempt=self.attempt, step=step, files=files)
        await self.store.put_bytes(_manifest_key(step, rank), manifest.to_json())
        rule = DERIVED if source is None else f"checkpoint-{source}"
        log.warning("checkpoint-%d: node %d's part rebuilt by rule (%s)", step, rank, rule)
        return rule


def _manifest_key(step: int, rank: int) -> str:
    return f"checkpoint-{step}/{part_name(rank)}{MANIFEST_NAME}"
