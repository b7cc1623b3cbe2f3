"""The job is done: store the final output and the completion record, say so, give the capacity back.

A trainer that exited 0 has written the final output; it goes to the store (retried with the storage patience,
and when the storage session had ended, after waiting for the bot to renew it), then the completion record that
tells a later attempt the job is done. A runner that finds that record at start-up only says the job is complete.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime

from handlers.failures import Failure
from handlers.spec import JobSpec
from runner.checkpoints import OUTPUT_PREFIX, CheckpointStore
from runner.exit_codes import EXIT_COMPLETED, EXIT_FAILED
from runner.options import RunnerOptions
from runner.progress import ProgressTail
from runner.release import release_capacity
from runner.reports.attempt import AttemptReports
from runner.retry import with_retries
from runner.storage.attempt_credentials import AttemptCredentials
from runner.storage.base import ObjectStore, StorageError
from runner.trainer import TrainerFiles

log = logging.getLogger(__name__)


class Completion:
    def __init__(
        self,
        options: RunnerOptions,
        store: ObjectStore,
        files: TrainerFiles,
        progress: ProgressTail,
        reports: AttemptReports,
        credentials: AttemptCredentials | None,
    ) -> None:
        self.options = options
        self.store = store
        self.files = files
        self.progress = progress
        self.reports = reports
        self.credentials = credentials

    async def complete(self, spec: JobSpec, checkpoints: CheckpointStore, instance_id: str | None) -> int:
        """The trainer exited 0: the output stored, ``completed`` reported, the capacity released; the exit code."""
        state = self.progress.state
        if spec.gang is not None and spec.gang.node_rank != 0:
            # Node 0's trainer writes the final output and its runner stores it; this node's part is done.
            self.reports.completed(self.store.uri(OUTPUT_PREFIX), state.step, state.total_steps)
            await self.release(spec, instance_id)
            return EXIT_COMPLETED
        while True:
            try:
                output_uri = await self._store_output(spec, checkpoints)
                break
            except StorageError as exc:
                if await self._credentials_came_back():
                    continue
                self.reports.failed(Failure.of("output-not-stored", error=str(exc)), step=self.progress.state.step)
                return EXIT_FAILED
        self.reports.completed(output_uri, self.progress.state.step, self.progress.state.total_steps)
        await self.release(spec, instance_id)
        return EXIT_COMPLETED

    async def already_complete(self, spec: JobSpec, record: bytes, instance_id: str | None) -> int:
        """A scaling group launched one instance too many: say the job is done and give the capacity back."""
        try:
            done = json.loads(record)
        except ValueError:
            done = {}
        self.reports.completed(
            str(done.get("output_uri") or self.store.uri("output/")), done.get("step"), already_complete=True
        )
        await self.release(spec, instance_id)
        return EXIT_COMPLETED

    async def release(self, spec: JobSpec, instance_id: str | None) -> None:
        if spec.release is None:
            return
        # Reports first: once the capacity is released this process may be gone.
        await self.reports.drain(timeout=30.0)
        try:
            done = await release_capacity(spec.release, instance_id)
            log.info("%s", done)
        except Exception as exc:
            self.reports.warning("release-failed", str(exc))

    async def _store_output(self, spec: JobSpec, checkpoints: CheckpointStore) -> str:
        """The final output, then the completion record; its URI. StorageError once the retries are spent."""
        patience = self.options.storage_patience_seconds
        output_uri = await with_retries(
            "uploading the final output", lambda: checkpoints.upload_output(self.files.output_dir), patience
        )
        record = {
            "job_id": spec.job_id,
            "attempt": spec.attempt,
            "step": self.progress.state.step,
            "output_uri": output_uri,
            "time": datetime.now(UTC).isoformat(),
        }
        await with_retries(
            "writing the completion record",
            lambda: checkpoints.mark_completed(json.dumps(record).encode()),
            patience,
        )
        return output_uri

    async def _credentials_came_back(self) -> bool:
        """After storing the output failed: when the storage session had ended (the bot down for longer than its
        life), wait for the bot to renew it rather than lose a finished job's output; True once it did."""
        credentials = self.credentials
        if credentials is None or not credentials.ended():
            return False
        wait = self.options.credentials_wait_seconds
        message = (
            f"the job is finished but its storage session ended and the bot has not renewed it: the output stays on "
            f"this instance and is stored once the bot is back (waiting up to {wait / 3600:.1f} h)"
        )
        log.error(message)
        self.reports.warning("storage-credentials", message)
        return await credentials.wait_until_usable(wait, self.options.credentials_check_seconds)
