"""The commit protocol on object storage: upload every file, then the manifest; restore the newest valid one.

Layout under the job's ``checkpoint_uri``::

    checkpoint-<step>/<files…>          the trainer's checkpoint directory, as written
    checkpoint-<step>/MANIFEST.json     written last: files, sizes, per-part CRC32C, step
    output/<files…>                     the final output (see runner.final_output)
    COMPLETED.json                      the job finished; a late replacement instance exits at once

A checkpoint without a manifest is an upload that never committed (the instance died mid-way); one whose
files do not match their manifest is corrupt. Restore skips both, says why, and falls back to the previous.
A network fault while reading is neither: it is retried, and if it persists the restore fails as a storage
outage (the caller retries it) instead of passing over a checkpoint that may well be good.

Uploads start while the trainer is still writing (:class:`CheckpointUpload`, files by :mod:`runner.upload`);
the manifest only once the directory is complete and every file is proven final.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import ValidationError

from handlers.reports import SkipKind, SkippedCheckpoint
from runner.beneath import fd_name, open_file_beneath
from runner.checksums import encode, file_part_crcs
from runner.errors import RunnerError
from runner.final_output import output_files
from runner.local_checkpoints import checkpoint_step, is_marked_complete
from runner.manifest import (
    COMPLETE_MARKER,
    MANIFEST_NAME,
    Manifest,
    ManifestFile,
    PartChecksums,
    checkpoint_files,
)
from runner.retry import with_retries
from runner.storage.base import ObjectMissing, ObjectStore, StorageError
from runner.upload import FileUpload, RateMeter, UploadedFile

log = logging.getLogger(__name__)

COMPLETED_NAME = "COMPLETED.json"
OUTPUT_PREFIX = "output/"
FETCH_PATIENCE_SECONDS = 30.0  # how long one file of a restore keeps retrying a flaky network before giving up


@dataclass(frozen=True, slots=True)
class Committed:
    step: int
    uri: str
    bytes: int
    seconds: float  # from the checkpoint being complete on disk to its manifest being stored
    # What the sync measured by then, for the bot's notice budget: the trainer's last observed save, and this run's
    # upload rate (None: not measured yet).
    save_seconds: float | None = None
    upload_bytes_per_second: float | None = None


@dataclass(slots=True)
class Restored:
    step: int | None = None
    path: Path | None = None
    uri: str | None = None
    seconds: float = 0.0
    bytes: int = 0  # the checkpoint's size
    fetched_bytes: int = 0  # what came over the network (files reused from a local copy did not)
    skipped: list[SkippedCheckpoint] = field(default_factory=list)


class CheckpointInvalid(RunnerError):
    """This stored checkpoint must not be loaded; ``kind`` and the message say why."""

    def __init__(self, kind: SkipKind, message: str) -> None:
        super().__init__(message)
        self.kind: SkipKind = kind


class CheckpointUpload:
    """One local ``checkpoint-<step>/`` on its way to the store, from the moment the trainer starts writing it.

    Every file gets a :class:`FileUpload` as soon as it appears; ``mark_complete`` says the directory is
    complete (its marker, a newer checkpoint, the trainer's clean exit), after which the final listing is
    taken, every listed file finished and verified, and the manifest written last. ``run`` returns the commit.
    """

    def __init__(
        self,
        checkpoints: CheckpointStore,
        local_dir: Path,
        step: int,
        *,
        poll_seconds: float = 0.2,
        settle_seconds: float = 1.0,
    ) -> None:
        self.checkpoints = checkpoints
        self.local_dir = local_dir
        self.step = step
        self.prefix = f"checkpoint-{step}/{checkpoints.part}"
        self.poll_seconds = poll_seconds
        self.settle_seconds = settle_seconds
        self.complete = asyncio.Event()
        self.complete_at: float | None = None
        self._files: dict[Path, tuple[FileUpload, asyncio.Task[UploadedFile | None]]] = {}

    @property
    def bytes_on_disk(self) -> int:
        return sum(upload.size for upload, _ in self._files.values())

    @property
    def bytes_uploaded(self) -> int:
        return sum(upload.uploaded_bytes for upload, _ in self._files.values())

    def mark_complete(self) -> None:
        if not self.complete.is_set():
            self.complete_at = time.monotonic()
            self.complete.set()

    async def run(self) -> Committed:
        try:
            while not self.complete.is_set():
                self._raise_failed()
                self._start_new(await asyncio.to_thread(checkpoint_files, self.local_dir))
                if await asyncio.to_thread(is_marked_complete, self.local_dir):
                    self.mark_complete()
                    break
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.complete.wait(), self.poll_seconds)
            return await self._commit()
        finally:
            tasks = [task for _, task in self._files.values()]
            for task in tasks:
                task.cancel()
            # Collects every outcome, the failures of files after the first one too (never left unretrieved).
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _commit(self) -> Committed:
        if not await asyncio.to_thread(self.local_dir.is_dir):
            raise FileNotFoundError(f"{self.local_dir} is gone")
        listed = await asyncio.to_thread(checkpoint_files, self.local_dir)
        for path in set(self._files) - set(listed):  # a temporary name, renamed or deleted meanwhile
            self._files.pop(path)[1].cancel()
        for path, (_, task) in list(self._files.items()):
            if task.done() and not task.cancelled() and task.exception() is None and task.result() is None:
                del self._files[path]  # it vanished mid-write and came back: upload what is there now
        self._start_new(listed)
        entries = []
        for path in listed:
            done = await self._files[path][1]
            if done is None:  # vanished after the checkpoint was complete: it is not complete after all
                raise FileNotFoundError(f"{path} vanished from a complete checkpoint")
            checksums = PartChecksums(part_size=done.part_size, parts=[encode(crc) for crc in done.crcs])
            entries.append(
                ManifestFile(path=path.relative_to(self.local_dir).as_posix(), size=done.size, checksums=checksums)
            )
        checkpoints = self.checkpoints
        manifest = Manifest(job_id=checkpoints.job_id, attempt=checkpoints.attempt, step=self.step, files=entries)
        await checkpoints.store.put_bytes(self.prefix + MANIFEST_NAME, manifest.to_json())
        seconds = time.monotonic() - (self.complete_at or time.monotonic())
        log.info(
            "committed checkpoint-%d: %d files, %d bytes, %.2fs after it was complete",
            self.step,
            len(entries),
            manifest.total_bytes,
            seconds,
        )
        return Committed(self.step, checkpoints.checkpoint_uri(self.step), manifest.total_bytes, seconds)

    def _start_new(self, paths: list[Path]) -> None:
        for path in paths:
            if path in self._files:
                continue
            upload = FileUpload(
                self.checkpoints.store,
                path,
                self.prefix + path.relative_to(self.local_dir).as_posix(),
                final=self.complete,
                priority=self.step,
                root=self.local_dir.parent,  # the output directory: no link followed below it
                meter=self.checkpoints.meter,
                poll_seconds=self.poll_seconds,
                settle_seconds=self.settle_seconds,
            )
            self._files[path] = (upload, asyncio.create_task(upload.run(), name=f"upload:{path.name}"))

    def _raise_failed(self) -> None:
        for path, (_, task) in list(self._files.items()):
            if not task.done() or task.cancelled():
                continue
            failure = task.exception()
            if failure is not None:
                raise failure
            if task.result() is None:
                del self._files[path]  # vanished mid-write; if it comes back, it gets a new upload


class CheckpointStore:
    part = ""  # where this runner's files go inside checkpoint-<step>/ (a gang node: its node-<k>/)

    def __init__(self, store: ObjectStore, job_id: str, attempt: int, meter: RateMeter | None = None) -> None:
        self.store = store
        self.job_id = job_id
        self.attempt = attempt
        self.meter = meter or RateMeter()

    def checkpoint_uri(self, step: int) -> str:
        return self.store.uri(f"checkpoint-{step}/")

    def start_upload(self, local_dir: Path, step: int, **options: float) -> CheckpointUpload:
        """An upload of ``local_dir`` as ``checkpoint-<step>/`` that may start before the directory is complete."""
        return CheckpointUpload(self, local_dir, step, **options)

    async def commit(self, local_dir: Path, step: int) -> Committed:
        """Upload the complete ``local_dir`` as ``checkpoint-<step>/`` and commit it by writing its manifest last."""
        upload = self.start_upload(local_dir, step)
        upload.mark_complete()
        return await upload.run()

    async def stored_steps(self) -> list[int]:
        """Steps of every ``checkpoint-<step>/`` in the store, committed or not, newest first."""
        steps = [checkpoint_step(name) for name in await self.store.list_dirs()]
        return sorted((step for step in steps if step is not None), reverse=True)

    async def restore(self, output_dir: Path, reuse: bool = False) -> Restored:
        """Download the newest checkpoint that verifies into ``output_dir/checkpoint-<step>``.

        ``reuse``: take files of a local ``checkpoint-<step>`` already there when they verify (a gang's survivor)."""
        started = time.monotonic()
        result = Restored()
        for step in await self.stored_steps():
            try:
                reused = output_dir / f"checkpoint-{step}" if reuse else None
                entries = await self._verified_files(step)
                path, result.fetched_bytes = await self._download(step, entries, output_dir, reused)
                result.bytes = sum(item.size for _, item in entries)
            except CheckpointInvalid as exc:
                log.warning("skipping checkpoint-%d: %s", step, exc)
                result.skipped.append(
                    SkippedCheckpoint(step=step, uri=self.checkpoint_uri(step), reason=str(exc), kind=exc.kind)
                )
                continue
            result.step, result.path, result.uri = step, path, self.checkpoint_uri(step)
            break
        result.seconds = time.monotonic() - started
        return result

    async def _verified_files(self, step: int) -> list[tuple[str, ManifestFile]]:
        """Every ``(prefix, file)`` of checkpoint ``step``, once its manifest and stored files check out."""
        prefix = f"checkpoint-{step}/"
        manifest = await self._manifest(step)
        await self._check_stored(prefix, manifest)
        return [(prefix, item) for item in manifest.files]

    async def _check_stored(self, prefix: str, manifest: Manifest) -> None:
        """Every file the manifest lists is stored, at its size (cheap, before any download)."""
        stored = {info.key[len(prefix) :]: info.size for info in await self.store.list_objects(prefix)}
        for item in manifest.files:
            if item.path not in stored:
                raise CheckpointInvalid("missing", f"partial: {item.path} is missing")
            if stored[item.path] != item.size:
                raise CheckpointInvalid(
                    "partial", f"partial: {item.path} has {stored[item.path]} bytes, manifest says {item.size}"
                )

    async def _download(
        self, step: int, entries: list[tuple[str, ManifestFile]], output_dir: Path, reuse: Path | None = None
    ) -> tuple[Path, int]:
        """Fetch every ``(prefix, file)`` into one ``output_dir/checkpoint-<step>``; a file of ``reuse`` (an earlier
        local copy) whose checksums match is taken from there instead of the store. The path, and the bytes fetched."""
        staging = output_dir / f".restore-{uuid.uuid4().hex[:8]}-checkpoint-{step}"
        try:
            # Let every download finish before judging: one failing early must not leave others writing into a
            # staging directory that is being removed.
            outcomes = await asyncio.gather(
                *(self._fetch(prefix, item, staging, reuse) for prefix, item in entries), return_exceptions=True
            )
            failures = [outcome for outcome in outcomes if isinstance(outcome, BaseException)]
            # Wrong bytes anywhere make the checkpoint invalid, whatever else failed only for now.
            for failure in sorted(failures, key=lambda failure: not isinstance(failure, CheckpointInvalid)):
                raise failure
            (staging / COMPLETE_MARKER).touch()
            final = output_dir / f"checkpoint-{step}"
            if final.exists():
                shutil.rmtree(final)
            staging.rename(final)
            return final, sum(outcome for outcome in outcomes if isinstance(outcome, int))
        finally:
            if staging.exists():
                shutil.rmtree(staging)

    async def _manifest(self, step: int) -> Manifest:
        return (await self._read_manifest(step))[0]

    async def _read_manifest(self, step: int, part: str = "") -> tuple[Manifest, bytes]:
        """The manifest of ``checkpoint-<step>/<part>``, checked, and its bytes as stored."""
        raw = await self.store.get_bytes(f"checkpoint-{step}/{part}{MANIFEST_NAME}")
        if raw is None:
            where = f" of {part.rstrip('/')}" if part else ""
            raise CheckpointInvalid("no-manifest", f"no manifest{where}: its upload never committed")
        try:
            manifest = Manifest.model_validate_json(raw)
        except ValidationError as exc:
            raise CheckpointInvalid("bad-manifest", f"corrupt manifest: {exc.error_count()} error(s)") from None
        if manifest.step != step:
            raise CheckpointInvalid("bad-manifest", f"manifest is for step {manifest.step}")
        if any(".." in item.path.split("/") or item.path.startswith("/") for item in manifest.files):
            raise CheckpointInvalid("bad-manifest", "manifest names a path outside the checkpoint")
        return manifest, raw

    async def _fetch(self, prefix: str, item: ManifestFile, staging: Path, reuse: Path | None = None) -> int:
        """Download one file and check it; the bytes fetched (0: reused). A flaky network is retried here (with
        backoff, for a while) and then raised as the StorageError it is; only a missing object or wrong bytes make
        the checkpoint invalid."""
        target = staging / item.path
        if reuse is not None and await asyncio.to_thread(_reused, reuse / item.path, target, item):
            return 0
        try:
            await with_retries(
                f"downloading {prefix}{item.path}",
                lambda: self.store.download_file(prefix + item.path, target),
                FETCH_PATIENCE_SECONDS,
            )
        except ObjectMissing as exc:
            raise CheckpointInvalid("missing", f"partial: {item.path} is missing ({exc})") from exc
        if not await asyncio.to_thread(_matches, target, item):
            raise CheckpointInvalid("checksum", f"checksum mismatch in {item.path}")
        return item.size

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
        files = await asyncio.to_thread(output_files, output_dir)

        async def upload(path: Path, key: str) -> None:
            try:  # never through a link the trainer put on the way
                fd = open_file_beneath(output_dir, path)
            except OSError as exc:  # a link or a FIFO where a file was listed: never uploaded
                raise StorageError(f"{path} cannot be uploaded safely: {exc}") from exc
            try:
                await self.store.upload_file(fd_name(fd), OUTPUT_PREFIX + key)
            finally:
                os.close(fd)

        await asyncio.gather(*(upload(path, key) for path, key in files))
        return self.store.uri(OUTPUT_PREFIX)

    async def mark_completed(self, record: bytes) -> None:
        await self.store.put_bytes(COMPLETED_NAME, record)

    async def completed_record(self) -> bytes | None:
        return await self.store.get_bytes(COMPLETED_NAME)


def _reused(local: Path, target: Path, item: ManifestFile) -> bool:
    """Copy ``local`` to ``target`` if it is the very file the manifest vouches for (a survivor's own copy)."""
    if local.is_symlink() or not local.is_file() or local.stat().st_size != item.size or not _matches(local, item):
        return False
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(local, target)
    return True


def _matches(path: Path, item: ManifestFile) -> bool:
    """The downloaded file has the checksums its manifest entry vouches for: every part's CRC (computed in
    C, cheap beside the download)."""
    algorithm = item.checksums.algorithm
    crcs = file_part_crcs(path, item.checksums.part_size, algorithm)
    return [encode(crc, algorithm) for crc in crcs] == item.checksums.parts
