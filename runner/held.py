"""The step a gang's survivor held when its world broke: the marker its trainer writes into that checkpoint.

In data-parallel training every rank holds the same weights and optimizer state after each optimizer step. When a
peer is lost without notice, the survivors' collective fails; a trainer that keeps the contract then saves the step
it holds on its own, without a collective (:mod:`runner.hf.held_state`), as ``checkpoint-<step>/`` with the usual
completion marker and this one beside it. The runner commits it as the gang's checkpoint: what only the lost node
held (its RNG stream, its data order) is rebuilt by rule (:mod:`runner.gang_checkpoints`): derived from
``(seed, step, rank)`` where the trainer says its state is a function of them (``rebuilt`` = :data:`DERIVED`, the
``tiny`` recipe), else taken from that node's part of the gang's newest committed checkpoint.

Only light imports: the runner reads it (the trainer, unprivileged, wrote it: parsed strictly, at most a few KiB).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

log = logging.getLogger(__name__)

HELD_MARKER = ".finetune-held.json"
DERIVED = "seed-step-rank"
"""Every rank's RNG state and data order are a function of (seed, step, rank): the trainer wrote every rank's."""
MAX_BYTES = 4096


class HeldCheckpoint(BaseModel):
    """``checkpoint-<step>/`` was saved by global rank ``rank`` of ``world`` after its world broke."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    step: int = Field(ge=0)
    rank: int = Field(ge=0)
    world: int = Field(ge=1)
    rebuilt: Literal["seed-step-rank"] | None = None


def read_held(checkpoint: Path) -> HeldCheckpoint | None:
    """The held marker of a local checkpoint directory, or None (none there, or not one we can trust)."""
    path = checkpoint / HELD_MARKER
    try:
        if path.is_symlink() or not path.is_file() or path.stat().st_size > MAX_BYTES:
            return None
        return HeldCheckpoint.model_validate_json(path.read_bytes())
    except (OSError, ValidationError) as exc:
        log.warning("%s is not a held marker: %s", path, exc)
        return None
