"""Is the local cloud ready? Its instances are processes on this machine, so all it needs is a state dir it may
write (their registry, logs and, by default, checkpoints live there)."""

from __future__ import annotations

import os
from pathlib import Path

from bot.checks.result import Check, failed, passed
from bot.cloud.base import SetupScope


class LocalSetup:
    """The local cloud's :class:`~bot.cloud.base.ChecksSetup` (needs no Redis, unlike the cloud itself)."""

    def __init__(self, state_dir: Path, zones: tuple[str, ...], checkpoint_base: str | None) -> None:
        self.state_dir = state_dir
        self.zones = zones
        self.checkpoints = checkpoint_base or (state_dir / "bucket").resolve().as_uri() + "/"

    async def check_setup(self, scope: SetupScope) -> list[Check]:
        name = "local cloud"
        try:
            self.state_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            fix = "set FINETUNE_STATE_DIR to a directory the bot may write"
            return [failed(name, f"FINETUNE_STATE_DIR={self.state_dir} cannot be made: {exc.strerror}", fix)]
        if not os.access(self.state_dir, os.W_OK | os.X_OK):
            fix = "set FINETUNE_STATE_DIR to a directory the bot may write"
            return [failed(name, f"FINETUNE_STATE_DIR={self.state_dir} is not writable", fix)]
        where = f"instances are processes on this machine (zones {', '.join(self.zones)})"
        return [passed(name, f"{where}; checkpoints in {self.checkpoints}")]

    async def close(self) -> None:
        """Nothing to close (the same shape as a cloud's)."""
