"""The object-store port the checkpoint protocol talks to; one adapter per backend (file, S3 API)."""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from io import FileIO
from pathlib import Path
from typing import Protocol, TypeAlias

from runner.errors import RunnerError

Buffer: TypeAlias = bytes | bytearray | memoryview


class StorageError(RunnerError, RuntimeError):
    """A storage operation failed after the backend's own retries: an outage, a timeout, a cut connection.

    Worth trying again: nothing here says the stored data is bad. What does is :class:`ObjectMissing`.
    """


class ObjectMissing(StorageError):
    """The object does not exist (HTTP 404 / no such file): trying again will not make it appear."""


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    """One stored object; ``key`` is relative to the store's base URI."""

    key: str
    size: int


class PartUpload(Protocol):
    """One object written in numbered parts of ``part_size`` bytes (the last may be shorter), then completed.

    A part may be sent again under the same index; the last one sent is what ``complete`` assembles. The
    object is invisible to readers until ``complete`` returns. The caller holds one of the store's slots
    (``ObjectStore.slot``) around each ``put_part``, and sends from the buffer the slot lent it.
    """

    part_size: int

    async def put_part(self, index: int, data: Buffer, crc: int) -> None:
        """Send bytes ``[index * part_size, index * part_size + len(data))``; ``crc`` is their CRC32C, which a
        store that can checks on arrival."""
        ...

    async def complete(self) -> None:
        """Assemble the parts sent so far, in index order, into the object."""
        ...

    def discard(self) -> None:
        """Give the upload up without waiting: its parts are removed in the background (see ``close``)."""
        ...


class ObjectStore(Protocol):
    """A flat key space under one base URI (``s3://bucket/prefix/``, ``file:///dir/``).

    Keys use ``/`` separators and are relative to the base. Writes of one object are atomic for readers:
    a reader sees the whole object or none of it, which the commit protocol relies on for manifests.
    """

    base_uri: str
    part_size: int  # the part size its large transfers use
    last_error: tuple[float, str] | None  # (time.monotonic(), what) of the last failed request, retried or not

    def uri(self, key: str) -> str:
        """The absolute URI of ``key``, as reported to people."""
        ...

    def slot(self, priority: int = 0) -> AbstractAsyncContextManager[bytearray]:
        """Hold one transfer slot (a request in flight) and its buffer of at least ``part_size`` bytes, which is
        only the holder's until it lets go; lower ``priority`` goes first."""
        ...

    async def list_objects(self, prefix: str = "") -> list[ObjectInfo]:
        """Every object whose key starts with ``prefix`` (recursive), in key order."""
        ...

    async def list_dirs(self, prefix: str = "") -> list[str]:
        """The immediate 'directories' under ``prefix`` (names without the trailing ``/``)."""
        ...

    async def upload_file(self, path: Path, key: str, priority: int = 0) -> None:
        """Copy a local file to ``key``; large files go in parallel parts."""
        ...

    async def begin_upload(self, key: str, part_size: int) -> PartUpload:
        """Start writing ``key`` part by part (a file that is still growing, uploaded as it is written)."""
        ...

    async def download_file(self, key: str, path: Path) -> None:
        """Copy ``key`` to a local file, creating parent directories; large objects in parallel ranges.

        Raises :class:`ObjectMissing` if there is no such object, :class:`StorageError` for anything else.
        """
        ...

    async def put_bytes(self, key: str, data: Buffer) -> None: ...

    async def get_bytes(self, key: str) -> bytes | None:
        """The object's content, or ``None`` when it does not exist."""
        ...

    async def delete(self, keys: list[str]) -> None:
        """Delete these keys; missing ones are not an error."""
        ...

    async def close(self) -> None:
        """Release connections; uploads given up with ``discard`` get a bounded moment to be removed first."""
        ...


def read_fully(file: FileIO, offset: int, view: memoryview) -> int:
    """Fill ``view`` from ``offset`` of an unbuffered file (no copy through a ``bytes``); returns how much was there."""
    file.seek(offset)
    got = 0
    while got < len(view):
        count = file.readinto(view[got:])
        if not count:
            break
        got += count
    return got
