"""Upload one checkpoint file while the trainer is still writing it, and prove the upload equals the final file.

Waiting for the trainer's marker before uploading anything makes notice → commit the *sum* of save and upload;
starting as the bytes land makes it approach the larger of the two. The catch is a file that is still being
written: a part may be read before the trainer wrote (or rewrote) its bytes. So:

* a part is sent once the file has grown past it (or, for the short tail and for small files, once the file
  has not changed for ``settle_seconds``), read with the file's stamp (size, mtime, ctime, inode) taken before
  and after the read, and its CRC32C, which goes with it (S3 checks it on arrival);
* when the checkpoint is complete (the marker), the file's final stamp is taken and every part is settled at
  once, without waiting for the sends still in flight: a part read while the file already had that stamp, and
  quiet for longer than the clock's tick, cannot have changed since; any other part is read again (once its
  send is done, while later parts are still going up) and its CRC compared, and sent again if it differs. The
  tail goes first, the object is completed, and the stamp must still be the final one;
* the manifest keeps the parts' CRCs: exactly what was sent and verified, with no second hash of the file.

A file that stops changing for ``settle_seconds`` before the marker (a trainer that writes its weights in one call,
then its other files) is finished then, as at the marker: its parts settled against that stamp and the object
completed in the store. The marker then costs it one look at its stamp; should it have changed after all, it is
uploaded again from the start. So save and upload overlap for such a writer too: only the manifest waits.

A file that vanishes before the checkpoint is complete (a trainer writing to a temporary name and renaming it)
is given up quietly; one that vanishes or changes after it is complete fails the upload (FileNotFoundError or
:class:`FileChanged`), and the caller tries the checkpoint again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections import deque
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runner.beneath import open_file_beneath, pinned
from runner.checksums import crc, file_part_crcs
from runner.errors import RunnerError
from runner.storage.base import ObjectStore, PartUpload, read_fully

log = logging.getLogger(__name__)

MAX_PARTS = 10_000  # the S3 limit on parts of one object
QUIET_NS = 50_000_000  # a file untouched this long before a read cannot be rewritten within the same mtime tick
MAX_RESTARTS = 5  # a file truncated and rewritten under us more often than this is not a checkpoint file


class FileChanged(RunnerError):
    """A checkpoint file changed under its upload. ``rewritten``: it is shorter than parts already read (truncated
    and being written anew), and :class:`FileUpload` starts it over, a few times; otherwise it changed after the
    checkpoint was complete, and this upload cannot vouch for it (the caller tries the checkpoint again)."""

    def __init__(self, message: str, *, rewritten: bool = False) -> None:
        super().__init__(message)
        self.rewritten = rewritten


@dataclass(frozen=True, slots=True)
class FileStamp:
    """What a write to the file changes: its size or its times; a replacement changes the inode."""

    size: int
    mtime_ns: int
    ctime_ns: int
    ino: int

    @classmethod
    def of_stat(cls, st: os.stat_result) -> FileStamp:
        return cls(st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)

    @classmethod
    def of(cls, path: Path) -> FileStamp:
        return cls.of_stat(os.stat(path))


@dataclass(frozen=True, slots=True)
class UploadedFile:
    """What the manifest says of a stored file: its size and the CRC32C of each ``part_size`` piece."""

    size: int
    part_size: int
    crcs: tuple[int, ...]


class RateMeter:
    """This run's upload rate: bytes sent per second of the time during which any upload was in flight.

    Measured over the last ``window_seconds`` of such busy time, so it follows a link that gets slower; time
    spent on a request that failed counts, bytes only once a request succeeded. ``None`` until one has.
    """

    def __init__(self, window_seconds: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.window_seconds = window_seconds
        self.clock = clock
        self._active = 0
        self._busy = 0.0
        self._since = clock()
        self._bytes = 0
        self._samples: deque[tuple[float, int]] = deque()

    @property
    def total_bytes(self) -> int:
        return self._bytes

    @property
    def rate(self) -> float | None:
        self._advance()
        if not self._samples:
            return None
        floor = self._busy - self.window_seconds
        base_busy, base_bytes = 0.0, 0
        for busy, sent in self._samples:
            if busy >= floor:
                break
            base_busy, base_bytes = busy, sent
        seconds = self._busy - base_busy
        if seconds <= 0:
            return None
        return (self._bytes - base_bytes) / seconds

    def begin(self) -> None:
        self._advance()
        self._active += 1

    def end(self, sent: int) -> None:
        self._advance()
        self._active -= 1
        if sent:
            self._bytes += sent
            self._samples.append((self._busy, self._bytes))
            while len(self._samples) > 2 and self._samples[1][0] < self._busy - self.window_seconds:
                self._samples.popleft()

    def _advance(self) -> None:
        now = self.clock()
        if self._active:
            self._busy += now - self._since
        self._since = now


@dataclass(frozen=True, slots=True)
class _Sent:
    """One part (or a small file's single object) as sent: where, how much, its CRC32C, the stamps around it."""

    offset: int
    size: int
    crc: int
    before: FileStamp
    after: FileStamp
    started_ns: int  # wall clock when the read began, comparable with mtime

    def unchanged_at(self, final: FileStamp) -> bool:
        """The file cannot have changed since this read: same stamp, and quiet for longer than a tick."""
        return self.before == final and self.after == final and self.started_ns - final.mtime_ns >= QUIET_NS


@dataclass(frozen=True, slots=True)
class _Read:
    data: memoryview  # into the buffer of the slot held while reading: valid only while that slot is held
    sent: _Sent


def _read(root: Path, path: Path, offset: int, size: int, buffer: bytearray) -> _Read:
    started = time.time_ns()
    view = memoryview(buffer if len(buffer) >= size else bytearray(size))[:size]
    # Never through a link, at any component below ``root``: the runner may be root and the checkpoint the
    # unprivileged trainer's, who may swap a directory on the way for a link while this reads.
    with open(open_file_beneath(root, path), "rb", buffering=0) as file:
        before = FileStamp.of_stat(os.fstat(file.fileno()))
        got = read_fully(file, offset, view)
        after = FileStamp.of_stat(os.fstat(file.fileno()))
    if got != size:
        raise FileChanged(f"{path}: wanted {size} bytes at {offset}, got {got}", rewritten=True)
    return _Read(view, _Sent(offset, size, crc(view), before, after, started))


def _changed(path: Path, early: bool) -> FileChanged:
    if early:  # still being written: start over, as for a file truncated under us
        return FileChanged(f"{path} changed after it was uploaded whole", rewritten=True)
    return FileChanged(f"{path} changed after its checkpoint was complete")


class FileUpload:
    """One file of one checkpoint on its way up; ``run`` returns once ``final`` is set and the object is whole.

    ``priority`` orders its requests against other uploads of the store (the runner passes the step), ``meter``
    measures them. ``root``: the directory of the runner's the file lies below (the trainer's output directory,
    in the runner's work directory; default: the file's own directory); no link is followed from there on.
    ``uploaded_bytes`` and ``size`` say how far it got, for the commit plan.
    """

    def __init__(
        self,
        store: ObjectStore,
        path: Path,
        key: str,
        *,
        final: asyncio.Event,
        priority: int = 0,
        root: Path | None = None,
        meter: RateMeter | None = None,
        poll_seconds: float = 0.2,
        settle_seconds: float = 1.0,
    ) -> None:
        self.store = store
        self.path = path
        self.root = root or path.parent
        self.key = key
        self.final = final
        self.priority = priority
        self.meter = meter or RateMeter()
        self.poll_seconds = poll_seconds
        self.settle_seconds = settle_seconds
        self.part_size = store.part_size
        self.size = 0
        self._counted: dict[int, int] = {}
        self._reset()

    @property
    def uploaded_bytes(self) -> int:
        return sum(self._counted.values())

    def _reset(self) -> None:
        self._upload: PartUpload | None = None
        self._parts: dict[int, _Sent] = {}
        self._sending: dict[int, tuple[int, asyncio.Task[None]]] = {}  # the latest send of each part: length, task
        self._single: _Sent | None = None
        self._next_index = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._tail: asyncio.Task[None] | None = None
        self._early: tuple[UploadedFile, FileStamp] | None = None  # completed before the marker, at this stamp
        self._early_task: asyncio.Task[None] | None = None
        self._counted = {}

    async def run(self) -> UploadedFile | None:
        """Upload the file; ``None`` if it vanished before ``final`` was set (it was not part of the checkpoint)."""
        restarts = 0
        try:
            while True:
                try:
                    await self._stream()
                    return await self._finish()
                except FileChanged as exc:
                    if not exc.rewritten:
                        raise
                    restarts += 1
                    if restarts > MAX_RESTARTS:
                        raise FileChanged(f"{self.path} keeps being truncated and rewritten") from exc
                    log.warning("%s; uploading it again from the start", exc)
                    await self._cancel_tasks()
                    self._discard()
                    self._reset()
                except FileNotFoundError:
                    if self.final.is_set():
                        raise
                    log.info("%s vanished while being written; not part of the checkpoint", self.path)
                    await self._cancel_tasks()
                    self._discard()
                    return None
        except BaseException:
            await self._cancel_tasks()
            self._discard()
            raise

    # -- while the trainer writes --------------------------------------------------------------------------

    async def _stream(self) -> None:
        stable: FileStamp | None = None
        stable_since = 0.0
        while not self.final.is_set():
            self._raise_failed()
            stamp = await asyncio.to_thread(FileStamp.of, self.path)
            self.size = stamp.size
            if self._early is not None:
                if stamp != self._early[1]:
                    raise _changed(self.path, early=True)
                await self._wait_final()
                continue
            if self._early_task is not None:  # finishing it early: nothing more to send meanwhile
                await self._wait_final()
                continue
            now = time.monotonic()
            if stamp != stable:
                stable, stable_since = stamp, now
            settled = now - stable_since >= self.settle_seconds
            full = stamp.size // self.part_size
            tail_busy = self._tail is not None and not self._tail.done()
            if full > MAX_PARTS:
                pass  # too big for parts of this size: the finish falls back to a whole-file upload
            elif full > self._next_index and not tail_busy:  # never two sends of one part number at once
                if self._upload is None:
                    self._upload = await self.store.begin_upload(self.key, self.part_size)
                for index in range(self._next_index, full):
                    self._sending[index] = (self.part_size, self._spawn(self._send_part(index, self.part_size)))
                self._next_index = full
            elif settled and stamp.size and not self._tasks:
                self._send_settled(stamp)
            await self._wait_final()

    async def _wait_final(self) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.final.wait(), self.poll_seconds)

    def _send_settled(self, stamp: FileStamp) -> None:
        """A file quiet for a while is likely final: send a small one whole, a large one's short tail part."""
        if self._upload is None and stamp.size <= self.part_size:
            if self._single is None or self._single.after != stamp:
                self._spawn(self._send_single())
            return
        if self._upload is not None:
            self._early_task = self._spawn(self._finish_early(stamp))

    async def _finish_early(self, stamp: FileStamp) -> None:
        """The file has been quiet for a while: finish it now as if ``stamp`` were final, before the marker."""
        self._early = (await self._finish_parts(stamp, early=True), stamp)

    # -- once the checkpoint is complete ---------------------------------------------------------------------

    async def _finish(self) -> UploadedFile:
        early = self._early_task
        if early is not None:  # finishing the file already: never two finishes of one upload at once
            self._tasks.discard(early)
            await early
        final = await asyncio.to_thread(FileStamp.of, self.path)
        self.size = size = final.size
        if self._early is not None:
            if final != self._early[1]:
                raise _changed(self.path, early=True)
            await self._check_unchanged(final)
            return self._early[0]
        if -(-size // self.part_size) > MAX_PARTS:
            return await self._whole_file(final)
        if self._upload is None and size <= self.part_size:
            await self._drain_tasks()
            return await self._finish_single(final)
        return await self._finish_parts(final, early=False)

    async def _finish_parts(self, final: FileStamp, *, early: bool) -> UploadedFile:
        """Complete the multipart upload as the file is at ``final``. ``early``: before the marker, where a change
        is the trainer still writing (the upload starts over), not a checkpoint changed after it was complete."""
        size = final.size
        if any(index * self.part_size + length > size for index, (length, _) in self._sending.items()):
            raise FileChanged(f"{self.path} shrank to {size} bytes after parts were sent", rewritten=True)
        if self._upload is None:
            self._upload = await self.store.begin_upload(self.key, self.part_size)
        count = -(-size // self.part_size)
        # Parts never sent (the tail) first: they are what the commit waits for; the rest only re-read.
        settling = [
            self._spawn(self._settle_part(index, length, final, early))
            for index in sorted(range(count), key=lambda index: index in self._sending)
            for length in [min(self.part_size, size - index * self.part_size)]
        ]
        if early:
            await self._drain(settling)  # this is itself one of the tasks: wait on its own only
        else:
            await self._drain_tasks()
        crcs = tuple(self._parts[index].crc for index in range(count))
        await self._upload.complete()
        self._upload = None
        await self._check_unchanged(final, early)
        return UploadedFile(size, self.part_size, crcs)

    async def _settle_part(self, index: int, length: int, final: FileStamp, early: bool = False) -> None:
        """Make part ``index`` hold the final bytes: keep it if provably unchanged, else compare, else resend."""
        sending = self._sending.get(index)
        if sending is not None:
            await sending[1]  # its CRC is known once it is up; meanwhile the slots carry other parts
        sent = self._parts.get(index)
        if sent is not None and sent.size == length and sent.unchanged_at(final):
            return
        async with self.store.slot(self.priority) as buffer:
            read = await asyncio.to_thread(_read, self.root, self.path, index * self.part_size, length, buffer)
            if read.sent.after != final:
                raise _changed(self.path, early)
            if sent is not None and sent.size == length and sent.crc == read.sent.crc:
                self._parts[index] = read.sent  # the same bytes, now known to be the final ones
                return
            await self._put(index, read)

    async def _finish_single(self, final: FileStamp) -> UploadedFile:
        single = self._single
        if single is not None and single.size == final.size and single.unchanged_at(final):
            await self._check_unchanged(final)
            return UploadedFile(final.size, self.part_size, (single.crc,))
        async with self.store.slot(self.priority) as buffer:
            read = await asyncio.to_thread(_read, self.root, self.path, 0, final.size, buffer)
            if read.sent.after != final:
                raise FileChanged(f"{self.path} changed after its checkpoint was complete")
            if single is None or single.size != final.size or single.crc != read.sent.crc:
                await self._put_single(read)
        await self._check_unchanged(final)
        return UploadedFile(final.size, self.part_size, (read.sent.crc,))

    async def _whole_file(self, final: FileStamp) -> UploadedFile:
        """More parts than S3 allows at this part size: one ordinary upload, which picks a larger part size, and
        the manifest's CRCs from a read of their own, in parts as large as it takes to stay within the limit."""
        await self._cancel_tasks()
        self._discard()
        self._reset()
        part_size = max(self.part_size, -(-final.size // MAX_PARTS))
        with pinned(self.root, self.path) as name:  # read by name, twice: the very file, never through a link
            crcs, _ = await asyncio.gather(
                asyncio.to_thread(file_part_crcs, name, part_size),
                self.store.upload_file(name, self.key, self.priority),
            )
        await self._check_unchanged(final)
        self._counted = {0: final.size}
        return UploadedFile(final.size, part_size, tuple(crcs))

    async def _check_unchanged(self, final: FileStamp, early: bool = False) -> None:
        if await asyncio.to_thread(FileStamp.of, self.path) != final:
            raise _changed(self.path, early)

    # -- sending -------------------------------------------------------------------------------------------

    async def _send_part(self, index: int, length: int) -> None:
        async with self.store.slot(self.priority) as buffer:
            read = await asyncio.to_thread(_read, self.root, self.path, index * self.part_size, length, buffer)
            await self._put(index, read)

    async def _send_single(self) -> None:
        async with self.store.slot(self.priority) as buffer:
            stamp = await asyncio.to_thread(FileStamp.of, self.path)
            if stamp.size > self.part_size:
                return  # it grew meanwhile: parts will carry it
            read = await asyncio.to_thread(_read, self.root, self.path, 0, stamp.size, buffer)
            await self._put_single(read)
            self._single = read.sent

    async def _put(self, index: int, read: _Read) -> None:
        assert self._upload is not None
        self.meter.begin()
        sent = 0
        try:
            await self._upload.put_part(index, read.data, read.sent.crc)
            sent = read.sent.size
        finally:
            self.meter.end(sent)
        self._parts[index] = read.sent
        self._counted[index] = read.sent.size

    async def _put_single(self, read: _Read) -> None:
        self.meter.begin()
        sent = 0
        try:
            await self.store.put_bytes(self.key, read.data)
            sent = read.sent.size
        finally:
            self.meter.end(sent)
        self._counted = {0: read.sent.size}

    # -- bookkeeping -------------------------------------------------------------------------------------

    def _spawn(self, job: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.create_task(job)
        self._tasks.add(task)
        return task

    def _raise_failed(self) -> None:
        for task in [task for task in self._tasks if task.done()]:
            self._tasks.discard(task)
            failure = None if task.cancelled() else task.exception()
            if failure is not None:
                raise failure

    async def _drain_tasks(self) -> None:
        while self._tasks:
            await asyncio.wait(self._tasks, return_when=asyncio.FIRST_EXCEPTION)
            self._raise_failed()

    async def _drain(self, tasks: list[asyncio.Task[None]]) -> None:
        """Until ``tasks`` are done, raising the first failure among them."""
        pending = set(tasks)
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_EXCEPTION)
            for task in done:
                self._tasks.discard(task)
                failure = None if task.cancelled() else task.exception()
                if failure is not None:
                    raise failure

    async def _cancel_tasks(self) -> None:
        tasks, self._tasks = self._tasks, set()
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    def _discard(self) -> None:
        if self._upload is not None:
            self._upload.discard()
            self._upload = None
