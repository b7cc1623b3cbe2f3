"""How a runner is tuned: its periods, patience and reserves, from the environment (``FINETUNE_*``)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from runner.metadata_guard import METADATA_GUARD_ENV, MetadataGuard, metadata_guard
from runner.notices.control import CONTROL_POLL_SECONDS
from runner.trainer_env import TrainerSetup
from runner.trainer_user import TRAINER_USER_ENV, trainer_user


@dataclass(frozen=True, slots=True)
class RunnerOptions:
    work_dir: Path
    stop_grace_seconds: float = 90.0  # a SIGTERM to the runner itself (systemctl stop) has no cloud deadline
    progress_seconds: float = 10.0  # at most one progress report per this many seconds
    sync_seconds: float = 1.0  # how often to look for a newly completed checkpoint
    storage_patience_seconds: float = 300.0  # how long start-up and completion keep retrying storage
    echo_trainer: bool = True
    control_seconds: float = CONTROL_POLL_SECONDS  # how often to look for a stop or interrupt test from the bot
    report_reserve_seconds: float | None = None  # before a deadline, kept for the interrupted report (None: auto)
    settle_seconds: float = 1.0  # a checkpoint file unchanged this long is sent before the trainer's marker
    credentials_check_seconds: float = 30.0  # how often the attempt's storage session (AWS) is looked at
    credentials_wait_seconds: float = 6 * 3600.0  # a finished job's output waits this long for a renewed session
    trainer: TrainerSetup = field(default_factory=TrainerSetup)  # as whom, with what of the runner's environment
    metadata_guard: MetadataGuard | None = None  # the rule that keeps the trainer's user from the metadata service
    collective_timeout_seconds: float = 120.0  # a gang's trainer: how long a collective waits for a lost peer
    gang_wait_seconds: float = 300.0  # a gang node stopping: how long it waits for every node's part of its step
    early_save_seconds: float = 600.0  # an early signal: how long the trainer's fresh save is waited for

    @classmethod
    def from_env(cls, work_dir: Path) -> RunnerOptions:
        def number(name: str, default: float) -> float:
            raw = os.environ.get(name)
            return float(raw) if raw else default

        user = trainer_user(os.environ.get(TRAINER_USER_ENV))
        return cls(
            work_dir=work_dir,
            stop_grace_seconds=number("FINETUNE_STOP_GRACE_SECONDS", 90.0),
            progress_seconds=number("FINETUNE_PROGRESS_SECONDS", 10.0),
            sync_seconds=number("FINETUNE_SYNC_SECONDS", 1.0),
            storage_patience_seconds=number("FINETUNE_STORAGE_PATIENCE_SECONDS", 300.0),
            echo_trainer=os.environ.get("FINETUNE_TRAINER_ECHO", "1") != "0",
            control_seconds=number("FINETUNE_CONTROL_POLL_SECONDS", CONTROL_POLL_SECONDS),
            report_reserve_seconds=number("FINETUNE_REPORT_RESERVE_SECONDS", 0.0) or None,
            settle_seconds=number("FINETUNE_SETTLE_SECONDS", 1.0),
            credentials_check_seconds=number("FINETUNE_CREDENTIALS_CHECK_SECONDS", 30.0),
            credentials_wait_seconds=number("FINETUNE_CREDENTIALS_WAIT_SECONDS", 6 * 3600.0),
            trainer=TrainerSetup.from_env(os.environ, user),
            metadata_guard=metadata_guard(os.environ.get(METADATA_GUARD_ENV), user),
            collective_timeout_seconds=number("FINETUNE_COLLECTIVE_TIMEOUT_SECONDS", 120.0),
            gang_wait_seconds=number("FINETUNE_GANG_WAIT_SECONDS", 300.0),
            early_save_seconds=number("FINETUNE_EARLY_SAVE_SECONDS", 600.0),
        )

    def report_reserve(self, window: float) -> float:
        """Seconds before a deadline that belong to the interrupted report: 5% of the window, 2–5 s."""
        if self.report_reserve_seconds is not None:
            return self.report_reserve_seconds
        return min(max(0.05 * window, 2.0), 5.0)
