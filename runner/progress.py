"""Follow the trainer's progress file (JSON lines from our callback) without blocking on it."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path


@dataclass(slots=True)
class ProgressState:
    step: int | None = None
    total_steps: int | None = None
    loss: float | None = None
    epoch: float | None = None


class ProgressTail:
    """Reads only what was appended since the last call; tolerates a half-written last line."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.state = ProgressState()
        self._offset = 0

    def read_new(self) -> None:
        """Fold the lines appended since the last call into ``state``."""
        try:
            with self.path.open("rb") as handle:
                handle.seek(self._offset)
                chunk = handle.read()
        except FileNotFoundError:
            return
        complete = chunk[: chunk.rfind(b"\n") + 1]
        self._offset += len(complete)
        for line in complete.splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if not isinstance(record, dict):
                continue
            self._fold(record)

    def _fold(self, record: dict[str, object]) -> None:
        step = record.get("step")
        if isinstance(step, int):
            self.state.step = step
        total = record.get("total_steps")
        if isinstance(total, int):
            self.state.total_steps = total
        loss = record.get("loss")
        if isinstance(loss, int | float):
            self.state.loss = float(loss)
        epoch = record.get("epoch")
        if isinstance(epoch, int | float):
            self.state.epoch = float(epoch)
