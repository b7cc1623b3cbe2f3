"""The object-store port the checkpoint protocol talks to; one adapter per backend (file, S3 API)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol


class StorageError(RuntimeError):
    """A storage operation failed after the backend's own retries."""


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    """One stored object; ``key`` is relative to the store's base URI."""

    key: str
    size: int


class ObjectStore(Protocol):
    """A flat key space under one base URI (``s3://bucket/prefix/``, ``file:///dir/``).

    Keys use ``/`` separators and are relative to the base. Writes of one object are atomic for readers:
    a reader sees the whole object or none of it, which the commit protocol relies on for manifests.
    """

    base_uri: str

    def uri(self, key: str) -> str:
        """The absolute URI of ``key``, as reported to people."""
        ...

    async def list_objects(self, prefix: str = "") -> list[ObjectInfo]:
        """Every object whose key starts with ``prefix`` (recursive), in key order."""
        ...

    async def list_dirs(self, prefix: str = "") -> list[str]:
        """The immediate 'directories' under ``prefix`` (names without the trailing ``/``)."""
        ...

    async def upload_file(self, path: Path, key: str) -> None:
        """Copy a local file to ``key``; large files go in parallel parts."""
        ...

    async def download_file(self, key: str, path: Path) -> None:
        """Copy ``key`` to a local file, creating parent directories; large objects in parallel ranges."""
        ...

    async def put_bytes(self, key: str, data: bytes) -> None: ...

    async def get_bytes(self, key: str) -> bytes | None:
        """The object's content, or ``None`` when it does not exist."""
        ...

    async def delete(self, keys: list[str]) -> None:
        """Delete these keys; missing ones are not an error."""
        ...

    async def close(self) -> None: ...
