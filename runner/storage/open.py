"""Pick the store for a checkpoint URI: ``file://`` locally, the S3 API for ``s3://`` and ``oss://``."""

from __future__ import annotations

from runner.storage.base import ObjectStore
from runner.storage.file import FileStore
from runner.storage.s3 import S3Store


def open_store(base_uri: str) -> ObjectStore:
    if base_uri.startswith("file://"):
        return FileStore(base_uri)
    if base_uri.startswith(("s3://", "oss://")):
        return S3Store(base_uri)
    raise ValueError(f"unsupported storage URI {base_uri!r}")
