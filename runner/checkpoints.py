"""The commit protocol on object storage: upload every file, then the manifest; restore the newest valid one.

Layout under the job's ``checkpoint_uri``::

    checkpoint-<step>/<files…>          the trainer's checkpoint directory, as written
    checkpoint-<step>/MANIFEST.json     written last: files, sizes, SHA-256, step
    output/<files…>                     the final output (see runner.final_output)
    COMPLETED.json                      the job finished; a late replacement instance exits at once

A checkpoint without a manifest is an upload that never committed (the instance died mid-way); one whose
files do not match their manifest is corrupt. Restore skips both, says why, and falls back to the previous.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import ValidationError

from handlers.events import SkippedCheckpoint
from runner.final_output import output_files
from runner.local_checkpoints import checkpoint_step
from runner.manifest import (
    COMPLETE_MARKER,
    MANIFEST_NAME,
    Manifest,
    ManifestFile,
    checkpoint_files,
    sha256_file,
)
from runner.storage.base import ObjectStore, StorageError

log = logging.getLogger(__name__)

COMPLETED_NAME = "COMPLETED.json"
OUTPUT_PREFIX = "output/"


@dataclass(frozen=True, slots=True)
class Committed:
    step: int
    uri: str
    bytes: int
    seconds: float


@dataclass(slots=True)
class Restored:
    step: int | None = None
    path: Path | None = None
    uri: str | None = None
    seconds: float = 0.0
    skipped: list[SkippedCheckpoint] = field(default_factory=list)


class CheckpointInvalid(Exception):
    """This stored checkpoint must not be loaded; the message says why."""


class CheckpointStore:
    def __init__(self, store: ObjectStore, job_id: str, attempt: int) -> None:
        self.store = store
        self.job_id = job_id
        self.attempt = attempt

    def checkpoint_uri(self, step: int) -> str:
        return self.store.uri(f"checkpoint-{step}/")

    async def commit(self, local_dir: Path, step: int) -> Committed:
        """Upload ``local_dir`` as ``checkpoint-<step>/`` and commit it by writing its manifest last."""
        started = time.monotonic()
        prefix = f"checkpoint-{step}/"
        files = checkpoint_files(local_dir)

        async def put(path: Path) -> ManifestFile:
            relative = path.relative_to(local_dir).as_posix()
            size = path.stat().st_size
            digest, _ = await asyncio.gather(
                asyncio.to_thread(sha256_file, path), self.store.upload_file(path, prefix + relative)
            )
            return ManifestFile(path=relative, size=size, sha256=digest)

        entries = await asyncio.gather(*(put(path) for path in files))
        manifest = Manifest(job_id=self.job_id, attempt=self.attempt, step=step, files=list(entries))
        await self.store.put_bytes(prefix + MANIFEST_NAME, manifest.model_dump_json(indent=1).encode())
        seconds = time.monotonic() - started
        log.info(
            "committed checkpoint-%d: %d files, %d bytes in %.2fs",
            step,
            len(files),
            manifest.total_bytes,
            seconds,
        )
        return Committed(step, self.checkpoint_uri(step), manifest.total_bytes, seconds)

    async def stored_steps(self) -> list[int]:
        """Steps of every ``checkpoint-<step>/`` in the store, committed or not, newest first."""
        steps = [checkpoint_step(name) for name in await self.store.list_dirs()]
        return sorted((step for step in steps if step is not None), reverse=True)

    async def restore(self, output_dir: Path) -> Restored:
        """Download the newest checkpoint that verifies into ``output_dir/checkpoint-<step>``."""
        started = time.monotonic()
        result = Restored()
        for step in await self.stored_steps():
            try:
                path = await self._download_verified(step, output_dir)
            except CheckpointInvalid as exc:
                log.warning("skipping checkpoint-%d: %s", step, exc)
                result.skipped.append(SkippedCheckpoint(step=step, uri=self.checkpoint_uri(step), reason=str(exc)))
                continue
            result.step, result.path, result.uri = step, path, self.checkpoint_uri(step)
            break
        result.seconds = time.monotonic() - started
        return result

    async def _download_verified(self, step: int, output_dir: Path) -> Path:
        prefix = f"checkpoint-{step}/"
        manifest = await self._manifest(step)
        stored = {info.key[len(prefix) :]: info.size for info in await self.store.list_objects(prefix)}
        for item in manifest.files:
            if item.path not in stored:
                raise CheckpointInvalid(f"partial: {item.path} is missing")
            if stored[item.path] != item.size:
                raise CheckpointInvalid(
                    f"partial: {item.path} has {stored[item.path]} bytes, manifest says {item.size}"
                )
        staging = output_dir / f".restore-{uuid.uuid4().hex[:8]}-checkpoint-{step}"
        try:
            # Let every download finish before judging: one failing early must not leave others writing into a
            # staging directory that is being removed.
            outcomes = await asyncio.gather(
                *(self._fetch(prefix, item, staging) for item in manifest.files), return_exceptions=True
            )
            for outcome in outcomes:
                if isinstance(outcome, BaseException):
                    raise outcome
            (staging / COMPLETE_MARKER).touch()
            final = output_dir / f"checkpoint-{step}"
            if final.exists():
                shutil.rmtree(final)
            staging.rename(final)
            return final
        finally:
            if staging.exists():
                shutil.rmtree(staging)

    async def _manifest(self, step: int) -> Manifest:
        raw = await self.store.get_bytes(f"checkpoint-{step}/{MANIFEST_NAME}")
        if raw is None:
            raise CheckpointInvalid("no manifest: its upload never committed")
        try:
            manifest = Manifest.model_validate_json(raw)
        except ValidationError as exc:
            raise CheckpointInvalid(f"corrupt manifest: {exc.error_count()} error(s)") from None
        if manifest.step != step:
            raise CheckpointInvalid(f"manifest is for step {manifest.step}")
        if any(".." in item.path.split("/") or item.path.startswith("/") for item in manifest.files):
            raise CheckpointInvalid("manifest names a path outside the checkpoint")
        return manifest

    async def _fetch(self, prefix: str, item: ManifestFile, staging: Path) -> None:
        target = staging / item.path
        try:
            await self.store.download_file(prefix + item.path, target)
        except StorageError as exc:
            raise CheckpointInvalid(f"cannot download {item.path}: {exc}") from exc
        digest = await asyncio.to_thread(sha256_file, target)
        if digest != item.sha256:
            raise CheckpointInvalid(f"checksum mismatch in {item.path}")

    async def prune(self, keep: int) -> list[int]:
        """Delete all but the newest ``keep`` committed checkpoints, and uncommitted leftovers older than them.

        Called only after a commit, so an old checkpoint goes only once a newer one is safe.
        """
        steps = await self.stored_steps()
        committed = [step for step in steps if await self.store.get_bytes(f"checkpoint-{step}/{MANIFEST_NAME}")]
        kept = committed[:keep]
        if not kept:
            return []
        oldest_kept = kept[-1]
        doomed = [step for step in steps if step < oldest_kept]
        for step in doomed:
            prefix = f"checkpoint-{step}/"
            keys = [info.key for info in await self.store.list_objects(prefix)]
            # Manifest first: a half-deleted checkpoint must read as uncommitted, never as valid.
            manifest_key = prefix + MANIFEST_NAME
            if manifest_key in keys:
                await self.store.delete([manifest_key])
            await self.store.delete([key for key in keys if key != manifest_key])
        if doomed:
            log.info("pruned checkpoints %s", doomed)
        return doomed

    async def upload_output(self, output_dir: Path) -> str:
        """Upload the final output: what the trainer wrote outside its checkpoint dirs (the final adapter, logs,
        metrics), and the last checkpoint's model where that is the trainer's final save (``runner.final_output``)."""
        files = output_files(output_dir)
        await asyncio.gather(*(self.store.upload_file(path, OUTPUT_PREFIX + key) for path, key in files))
        return self.store.uri(OUTPUT_PREFIX)

    async def mark_completed(self, record: bytes) -> None:
        await self.store.put_bytes(COMPLETED_NAME, record)

    async def completed_record(self) -> bytes | None:
        return await self.store.get_bytes(COMPLETED_NAME)
