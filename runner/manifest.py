"""The checkpoint manifest: written last, so its presence is what makes a checkpoint count.

It lists every file with its size and checksums; restore trusts nothing the manifest does not vouch for. A file's
checksums are the CRC32C of each of its parts (``checksums``), the same values the upload sent and S3 verified
(:mod:`runner.checksums`). A manifest that vouches for a file any other way is malformed: that checkpoint is skipped.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from handlers.clock import utcnow
from runner.beneath import regular_files
from runner.checksums import ALGORITHM, part_count
from runner.held import HELD_MARKER

MANIFEST_NAME = "MANIFEST.json"
COMPLETE_MARKER = ".finetune-complete"


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
    checksums: PartChecksums

    @model_validator(mode="after")
    def _vouched_for(self) -> ManifestFile:
        if len(self.checksums.parts) != part_count(self.size, self.checksums.part_size):
            raise ValueError(f"{self.path}: {len(self.checksums.parts)} part checksums for {self.size} bytes")
        return self


class Manifest(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    version: Literal[2] = 2
    job_id: str
    attempt: int
    step: int
    created: datetime = Field(default_factory=utcnow)
    files: list[ManifestFile]

    @property
    def total_bytes(self) -> int:
        return sum(item.size for item in self.files)

    def to_json(self) -> bytes:
        """What is stored: a field without a value is left out, not null."""
        return self.model_dump_json(indent=1, exclude_none=True).encode()


def checkpoint_files(directory: Path) -> list[Path]:
    """The files of a local checkpoint that belong in the store (our marker is local bookkeeping only); a link is
    none of them, nor is what a link leads to: the trainer writes the checkpoint, and a link would have the runner
    upload what it points at (``runner.beneath``)."""
    local = (COMPLETE_MARKER, HELD_MARKER)
    return [directory / relative for relative in regular_files(directory) if Path(relative).name not in local]
