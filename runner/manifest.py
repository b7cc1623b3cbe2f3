"""The checkpoint manifest: written last, so its presence is what makes a checkpoint count.

It lists every file with its size and checksums; restore trusts nothing the manifest does not vouch for. A file's
checksums are the CRC32C of each of its parts (``checksums``), the same values the upload sent and S3 verified
(:mod:`runner.checksums`); manifests written before them carry a SHA-256 of the whole file instead, and still
restore.
"""

from __future__ import annotations

import hashlib
from datetime import datetime
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from handlers.reports import utcnow
from runner.beneath import regular_files
from runner.checksums import ALGORITHM, part_count

MANIFEST_NAME = "MANIFEST.json"
COMPLETE_MARKER = ".finetune-complete"
_HASH_BLOCK = 8 * 1024 * 1024


class PartChecksums(BaseModel):
    """One CRC per ``part_size`` piece of the file (the last may be shorter), in S3's base64 form."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    algorithm: Literal["CRC32C", "CRC64NVME"] = ALGORITHM
    part_size: int = Field(gt=0)
    parts: list[str] = Field(min_length=1)


class ManifestFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    path: str
    size: int = Field(ge=0)
    sha256: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")  # manifests before per-part CRCs
    checksums: PartChecksums | None = None

    @model_validator(mode="after")
    def _vouched_for(self) -> ManifestFile:
        if self.sha256 is None and self.checksums is None:
            raise ValueError(f"{self.path}: neither sha256 nor checksums")
        if self.checksums is not None and len(self.checksums.parts) != part_count(self.size, self.checksums.part_size):
            raise ValueError(f"{self.path}: {len(self.checksums.parts)} part checksums for {self.size} bytes")
        return self


class Manifest(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    version: int = 2  # 2: per-part CRCs; 1: SHA-256 per file
    job_id: str
    attempt: int
    step: int
    created: datetime = Field(default_factory=utcnow)
    files: list[ManifestFile]

    @property
    def total_bytes(self) -> int:
        return sum(item.size for item in self.files)

    def to_json(self) -> bytes:
        """What is stored: fields a file does not have (``sha256`` in new manifests) are left out, not null."""
        return self.model_dump_json(indent=1, exclude_none=True).encode()


def sha256_file(path: Path) -> str:
    """SHA-256 of a file, read in large blocks (hashlib releases the GIL, so threads overlap with I/O)."""
    digest = hashlib.sha256()
    with path.open("rb", buffering=0) as handle:
        while block := handle.read(_HASH_BLOCK):
            digest.update(block)
    return digest.hexdigest()


def checkpoint_files(directory: Path) -> list[Path]:
    """The files of a local checkpoint that belong in the store (our marker is local bookkeeping only); a link is
    none of them, nor is what a link leads to: the trainer writes the checkpoint, and a link would have the runner
    upload what it points at (``runner.beneath``)."""
    return [directory / relative for relative in regular_files(directory) if Path(relative).name != COMPLETE_MARKER]
