"""Pick the store for a checkpoint URI: ``file://`` locally, the S3 API for ``s3://`` and ``oss://``.

``FINETUNE_S3_PART_MIB`` (default 16) and ``FINETUNE_S3_CONCURRENCY`` (default 8) tune the S3 transfers: parts
of that size, that many requests (and part buffers) in flight. The S3 store (and with it the AWS SDK) is loaded
only for an ``s3://`` or ``oss://`` URI: a runner on a directory starts without it.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from runner.storage.base import ObjectStore, StorageError
from runner.storage.file import FileStore

if TYPE_CHECKING:
    from runner.storage.s3 import CredentialProvider


def open_store(base_uri: str, credentials: CredentialProvider | None = None) -> ObjectStore:
    """``credentials`` (``s3://`` only): what signs the store's requests instead of the usual chain (the attempt's
    storage session on AWS, :mod:`runner.storage.attempt_credentials`)."""
    if base_uri.startswith("file://"):
        return FileStore(base_uri)
    if base_uri.startswith(("s3://", "oss://")):
        from runner.storage.s3 import DEFAULT_CONCURRENCY, DEFAULT_PART_SIZE, MIN_PART_SIZE, MiB, S3Store

        part_size = _number("FINETUNE_S3_PART_MIB", DEFAULT_PART_SIZE / MiB) * MiB
        if part_size < MIN_PART_SIZE:
            raise StorageError(f"FINETUNE_S3_PART_MIB must be at least {MIN_PART_SIZE // MiB} (the S3 minimum)")
        concurrency = int(_number("FINETUNE_S3_CONCURRENCY", DEFAULT_CONCURRENCY))
        if concurrency < 1:
            raise StorageError("FINETUNE_S3_CONCURRENCY must be at least 1")
        return S3Store(
            base_uri,
            part_size=int(part_size),
            multipart_threshold=int(part_size),
            concurrency=concurrency,
            credentials=credentials,
        )
    raise ValueError(f"unsupported storage URI {base_uri!r}")


def _number(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if not raw:
        return default
    try:
        return float(raw)
    except ValueError:
        raise StorageError(f"{name} must be a number, not {raw!r}") from None
