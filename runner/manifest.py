"""The checkpoint manifest: written last, so its presence is what makes a checkpoint count.

It lists every file with its size and SHA-256; restore trusts nothing the manifest does not vouch for.
"""

from __future__ import annotations

import hashlib
import os
from datetime import datetime
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from handlers.events import utcnow

MANIFEST_NAME = "MANIFEST.json"
COMPLETE_MARKER = ".finetune-complete"
_HASH_BLOCK = 8 * 1024 * 1024


class ManifestFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    path: str
    size: int = Field(ge=0)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")


class Manifest(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    version: int = 1
    job_id: str
    attempt: int
    step: int
    created: datetime = Field(default_factory=utcnow)
    files: list[ManifestFile]

    @property
    def total_bytes(self) -> int:
        return sum(item.size for item in self.files)


def sha256_file(path: Path) -> str:
    """SHA-256 of a file, read in large blocks (hashlib releases the GIL, so threads overlap with I/O)."""
    digest = hashlib.sha256()
    with path.open("rb", buffering=0) as handle:
        while block := handle.read(_HASH_BLOCK):
            digest.update(block)
    return digest.hexdigest()


def checkpoint_files(directory: Path) -> list[Path]:
    """The files of a local checkpoint that belong in the store (our marker is local bookkeeping only)."""
    found = []
    for dirpath, _dirs, files in os.walk(directory):
        for name in files:
            if name != COMPLETE_MARKER:
                found.append(Path(dirpath) / name)
    return sorted(found)
