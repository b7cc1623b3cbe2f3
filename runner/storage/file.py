"""``file://`` store: a local directory, or a bucket mounted with Mountpoint for S3 or ossfs."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import uuid
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from urllib.parse import unquote, urlparse

from runner.storage.base import Buffer, ObjectInfo, ObjectMissing, StorageError
from runner.storage.slots import BufferSlots

MiB = 1024 * 1024
DEFAULT_PART_SIZE = 16 * MiB
DEFAULT_CONCURRENCY = 8


class FileStore:
    """Objects are files under a root directory; writes go to a temp name and are renamed into place."""

    def __init__(self, base_uri: str, *, concurrency: int = DEFAULT_CONCURRENCY) -> None:
        self.base_uri = base_uri if base_uri.endswith("/") else base_uri + "/"
        self.root = Path(unquote(urlparse(self.base_uri).path))
        self.part_size = DEFAULT_PART_SIZE
        self.last_error: tuple[float, str] | None = None  # what the S3 store remembers of its requests; none here
        self._slots = BufferSlots(concurrency, DEFAULT_PART_SIZE)

    def uri(self, key: str) -> str:
        return self.base_uri + key

    def slot(self, priority: int = 0) -> AbstractAsyncContextManager[bytearray]:
        return self._slots.lend(priority)

    def _path(self, key: str) -> Path:
        if key.startswith("/") or ".." in key.split("/"):
            raise StorageError(f"refusing key outside the store: {key!r}")
        return self.root / key

    async def list_objects(self, prefix: str = "") -> list[ObjectInfo]:
        return await asyncio.to_thread(self._list_sync, prefix)

    def _list_sync(self, prefix: str) -> list[ObjectInfo]:
        if not self.root.is_dir():
            return []
        found = []
        for dirpath, _dirs, files in os.walk(self.root):
            for name in files:
                if name.startswith(".tmp-"):
                    continue  # an upload in flight (or one killed mid-way) is not an object
                full = Path(dirpath) / name
                key = full.relative_to(self.root).as_posix()
                if key.startswith(prefix):
                    found.append(ObjectInfo(key, full.stat().st_size))
        return sorted(found, key=lambda info: info.key)

    async def list_dirs(self, prefix: str = "") -> list[str]:
        base = self._path(prefix) if prefix else self.root
        if not base.is_dir():
            return []
        return sorted(entry.name for entry in base.iterdir() if entry.is_dir())

    async def upload_file(self, path: Path, key: str, priority: int = 0) -> None:
        async with self.slot(priority):
            await asyncio.to_thread(self._write_atomic, key, lambda tmp: shutil.copyfile(path, tmp))

    async def begin_upload(self, key: str, part_size: int) -> FilePartUpload:
        target = self._path(key)

        def create() -> Path:
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = target.parent / f".tmp-{uuid.uuid4().hex}-{target.name}"
            tmp.touch()
            return tmp

        return FilePartUpload(await asyncio.to_thread(create), target, part_size)

    async def download_file(self, key: str, path: Path) -> None:
        source = self._path(key)
        if not source.is_file():
            raise ObjectMissing(f"{self.uri(key)} does not exist")
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            await asyncio.to_thread(shutil.copyfile, source, path)
        except FileNotFoundError as exc:
            raise ObjectMissing(f"{self.uri(key)} does not exist") from exc
        except OSError as exc:
            raise StorageError(f"download of {self.uri(key)} failed: {exc}") from exc

    async def put_bytes(self, key: str, data: Buffer) -> None:
        await asyncio.to_thread(self._write_atomic, key, lambda tmp: tmp.write_bytes(data))

    async def get_bytes(self, key: str) -> bytes | None:
        path = self._path(key)
        try:
            return await asyncio.to_thread(path.read_bytes)
        except FileNotFoundError:
            return None

    async def delete(self, keys: list[str]) -> None:
        def remove() -> None:
            for key in keys:
                path = self._path(key)
                path.unlink(missing_ok=True)
                self._prune_empty_parents(path.parent)

        await asyncio.to_thread(remove)

    async def close(self) -> None:
        return None

    def _write_atomic(self, key: str, write: Callable[[Path], object]) -> None:
        target = self._path(key)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.parent / f".tmp-{uuid.uuid4().hex}-{target.name}"
        try:
            write(tmp)
            os.replace(tmp, target)
        finally:
            tmp.unlink(missing_ok=True)

    def _prune_empty_parents(self, directory: Path) -> None:
        while directory != self.root and directory.is_relative_to(self.root):
            try:
                directory.rmdir()
            except OSError:
                return
            directory = directory.parent


class FilePartUpload:
    """Parts written at their offsets into a temp file beside the target, renamed into place on ``complete``."""

    def __init__(self, tmp: Path, target: Path, part_size: int) -> None:
        self.tmp = tmp
        self.target = target
        self.part_size = part_size
        self._ends: dict[int, int] = {}

    async def put_part(self, index: int, data: Buffer, crc: int) -> None:
        offset = index * self.part_size
        try:
            await asyncio.to_thread(_pwrite, self.tmp, offset, data)
        except OSError as exc:
            raise StorageError(f"writing part {index} of {self.target} failed: {exc}") from exc
        self._ends[index] = offset + len(data)

    async def complete(self) -> None:
        size = self._ends[max(self._ends)] if self._ends else 0

        def finish() -> None:
            os.truncate(self.tmp, size)
            os.replace(self.tmp, self.target)

        try:
            await asyncio.to_thread(finish)
        except OSError as exc:
            raise StorageError(f"completing {self.target} failed: {exc}") from exc

    def discard(self) -> None:
        with contextlib.suppress(OSError):
            self.tmp.unlink(missing_ok=True)


def _pwrite(path: Path, offset: int, data: Buffer) -> None:
    fd = os.open(path, os.O_WRONLY)  # no O_CREAT: a straggler after a discard must not resurrect the file
    try:
        view = memoryview(data)
        while view:
            written = os.pwrite(fd, view, offset)
            view = view[written:]
            offset += written
    finally:
        os.close(fd)
