"""Follow the trainer's progress file (JSON lines from our callback) without blocking on it."""

from __future__ import annotations

import json
import time
from collections import deque
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
        self._steps: deque[tuple[float, int]] = deque(maxlen=20)  # (when we saw it, step)

    @property
    def step_seconds(self) -> float | None:
        """About how long one training step takes, from when new steps showed up (None: too few seen)."""
        if len(self._steps) < 2:
            return None
        (first_at, first), (last_at, last) = self._steps[0], self._steps[-1]
        return (last_at - first_at) / (last - first) if last > first else None

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
        before = self.state.step
        for line in complete.splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if not isinstance(record, dict):
                continue
            self._fold(record)
        step = self.state.step
        if step is not None and step != before and (not self._steps or step > self._steps[-1][1]):
            self._steps.append((time.monotonic(), step))

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
