"""Checkpoints to the store while the trainer trains: the periodic look, early commits, a gang's markers.

Every ``sync_seconds`` the output directory is looked at (:class:`runner.checkpoint_sync.CheckpointSync` decides
what goes up); a rebalance recommendation, a crashed trainer or a storage session running out commits the newest
complete checkpoint at once. In a gang every node commits its own part of a step; node 0's runner writes the step's
marker once every node's part is there, and only then is the checkpoint reported as saved.
"""

from __future__ import annotations

import asyncio
import logging
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from handlers.spec import Gang, JobSpec
from runner.checkpoint_sync import CheckpointSync, SyncReason
from runner.checkpoints import CheckpointInvalid, CheckpointStore, Committed, Restored
from runner.gang_checkpoints import GangCheckpointStore
from runner.held import DERIVED, HeldCheckpoint
from runner.local_checkpoints import LocalCheckpoint
from runner.manifest import checkpoint_files
from runner.options import RunnerOptions
from runner.reports.attempt import AttemptReports
from runner.retry import with_retries
from runner.storage.attempt_credentials import AttemptCredentials
from runner.storage.base import ObjectStore, StorageError

log = logging.getLogger(__name__)


class PeriodicSync:
    """The attempt's checkpoint store and its sync. ``regroup`` moves both to a gang's next generation."""

    def __init__(
        self,
        spec: JobSpec,
        options: RunnerOptions,
        store: ObjectStore,
        output_dir: Path,
        reports: AttemptReports,
    ) -> None:
        self.spec = spec
        self.options = options
        self.store = store
        self.output_dir = output_dir
        self.reports = reports
        self._marking: dict[int, asyncio.Task[None]] = {}  # gang node 0: steps waiting for every node's part
        self.checkpoints = self._checkpoint_store()
        self.sync = self._checkpoint_sync()

    @property
    def committed(self) -> Committed | None:
        """The newest checkpoint known to be committed in the store (restored, or uploaded by this attempt)."""
        return self.sync.committed

    def resumed(self, restored: Restored) -> None:
        """The trainer starts from ``restored``: it counts as committed."""
        if restored.step is not None:
            self.sync.committed = Committed(restored.step, restored.uri or "", restored.bytes, 0.0)
            self.sync.checkpoint_bytes = restored.bytes or None

    async def loop(self) -> None:
        while True:
            await asyncio.sleep(self.options.sync_seconds)
            self.sync.scan()

    async def commit_newest(self, reason: SyncReason, newest: LocalCheckpoint | None = None) -> None:
        """Commit ``newest`` (default: the newest complete checkpoint) now if it is newer than the last commit,
        and wait for it. Storage trouble is reported once per outage and retried later; it never raises."""
        await self.sync.commit_newest(reason, newest)

    async def watch_credentials(self, credentials: AttemptCredentials) -> None:
        """Renew the storage session ahead of need (botocore only asks when a request is made); when the bot has not
        renewed it and it ends within ``LOW_SECONDS``, say so loudly and commit the newest complete checkpoint while
        the credentials still work, once per such spell, so a notice after the end loses little."""
        warned = False
        while True:
            await asyncio.sleep(self.options.credentials_check_seconds)
            if await credentials.renew_if_due() or not credentials.running_out():
                warned = False
                continue
            if warned:
                continue
            warned = True
            left = max(credentials.seconds_left(), 0.0)
            message = (
                f"the storage credentials end in {left / 60:.0f} min and the bot has not renewed them: committing "
                "the newest checkpoint now; after they end no checkpoint can be stored until the bot is back"
            )
            log.error(message)
            self.reports.warning("storage-credentials", message)
            await self.commit_newest("periodic")

    # -- a gang: parts and the marker -------------------------------------------------------------------------

    def marking(self) -> list[asyncio.Task[None]]:
        """Node 0's tasks still waiting to write a step's marker."""
        return list(self._marking.values())

    async def newest_marked(self, at_least: int | None, wait: float) -> int | None:
        """The newest step every node's part of which is committed; waits up to ``wait`` seconds for ``at_least``
        (this node's own newest part) to be marked, by node 0's runner (which may be this one)."""
        return await self._gang_checkpoints().newest_marked(at_least, wait, self._gang_poll_seconds)

    async def await_marker(self, committed: Committed | None, until: float) -> None:
        """Gang node 0: wait, until ``until`` (monotonic) at most, for the marker of the step just committed (every
        node's part of it; the others commit theirs side by side). Its ``interrupted`` report waits for it: the bot
        may release every node on that report (a stop, the whole gang lost), and told before, a bot that released
        node 0 at once left the step without a marker, and the resume took an older one. The marking task is
        neither cancelled at the timeout nor lets its own error end the notice path (``asyncio.wait``)."""
        marking = self._marking.get(committed.step) if committed is not None else None
        if marking is not None:
            await asyncio.wait([marking], timeout=max(until - time.monotonic(), 0.1))

    async def regroup(self, spec: JobSpec) -> None:
        """Into the next generation (``spec.gang``): the previous one's uploads and markers are dropped, the
        checkpoint store and its sync made anew for this node's new rank."""
        for task in self._marking.values():
            task.cancel()
        self._marking.clear()
        await self.sync.aclose()
        self.spec = spec
        self.checkpoints = self._checkpoint_store()
        self.sync = self._checkpoint_sync()

    async def restore_generation(self) -> Restored:
        """The newest complete checkpoint of the gang (the local copy's files reused where they verify); nothing
        when the store stays unreachable."""
        checkpoints = self._gang_checkpoints()
        try:
            return await with_retries(
                "restoring the newest checkpoint",
                lambda: checkpoints.restore(self.output_dir, reuse=True),
                self.options.storage_patience_seconds,
            )
        except StorageError as exc:
            log.error("restoring for the next generation failed: %s", exc)
            return Restored()

    async def commit_held(self, held: HeldCheckpoint) -> dict[str, str] | None:
        """A survivor whose world broke committed its part of the step it held (``held``): the lost nodes' parts
        are rebuilt by rule and the step is marked as the gang's checkpoint, and reported. The parts rebuilt and
        their rules; None when the step could not be completed (no rule applies, or the store failed).

        Which nodes are lost: with two nodes, the other one; with more, the parts still missing after a short
        wait for the other survivors' own (every survivor of a data-parallel world holds the same step)."""
        checkpoints = self._gang_checkpoints()
        step = held.step
        marking = self._marking.pop(step, None)
        if marking is not None:  # node 0's look for every part: this path writes the marker, saying what it rebuilt
            marking.cancel()
        try:
            deadline = time.monotonic() + (0.0 if self._gang.nodes <= 2 else min(self.options.gang_wait_seconds, 30.0))
            missing = await checkpoints.missing_parts(step)
            while missing and time.monotonic() < deadline:
                await asyncio.sleep(self._gang_poll_seconds)
                missing = await checkpoints.missing_parts(step)
            source = None
            if held.rebuilt != DERIVED:
                source = await checkpoints.newest_marked(None, 0.0, self._gang_poll_seconds)
                if source is None:
                    log.warning("checkpoint-%d: no committed part to rebuild a lost node's from", step)
                    return None
            local = self.output_dir / f"checkpoint-{step}"
            own = {path.relative_to(local).as_posix() for path in checkpoint_files(local)}
            rebuilt: dict[str, str] = {}
            with tempfile.TemporaryDirectory(dir=self.output_dir.parent, prefix="rebuild-") as scratch:
                for rank in missing:
                    rebuilt[f"node-{rank}"] = await checkpoints.rebuild_part(step, rank, own, source, Path(scratch))
            marker = await checkpoints.mark_if_complete(step, rebuilt)
        except (StorageError, CheckpointInvalid, OSError) as exc:
            log.error("checkpoint-%d: the held step could not be committed as the gang's: %s", step, exc)
            return None
        if marker is None:
            return None
        committed = self.sync.committed
        fallback = self.store.uri(f"checkpoint-{step}/")
        uri = committed.uri if committed is not None and committed.step == step else fallback
        self.reports.checkpoint_saved(Committed(step, uri, marker.bytes, 0.0), "periodic")
        return rebuilt

    def _checkpoint_store(self) -> CheckpointStore:
        gang = self.spec.gang
        if gang is None:
            return CheckpointStore(self.store, self.spec.job_id, self.spec.attempt)
        return GangCheckpointStore(
            self.store,
            self.spec.job_id,
            self.spec.attempt,
            nodes=gang.nodes,
            node_rank=gang.node_rank,
            generation=gang.generation,
        )

    def _checkpoint_sync(self) -> CheckpointSync:
        return CheckpointSync(
            self.checkpoints,
            self.output_dir,
            keep=self.spec.keep_checkpoints,
            on_commit=self.reports.checkpoint_saved if self.spec.gang is None else self._part_committed,
            on_trouble=self.reports.storage_trouble,
            settle_seconds=self.options.settle_seconds,
        )

    def _gang_checkpoints(self) -> GangCheckpointStore:
        checkpoints = self.checkpoints
        assert isinstance(checkpoints, GangCheckpointStore)
        return checkpoints

    @property
    def _gang(self) -> Gang:
        assert self.spec.gang is not None
        return self.spec.gang

    @property
    def _gang_poll_seconds(self) -> float:
        return min(max(self.options.sync_seconds, 0.1), 1.0)

    def _part_committed(self, committed: Committed, reason: SyncReason) -> None:
        """This node's part of a checkpoint is committed. The checkpoint counts once every node's is: node 0's
        runner writes the marker then and reports it; the other nodes only log theirs."""
        log.info("committed node %d's part of checkpoint-%d", self._gang.node_rank, committed.step)
        if self._gang.node_rank == 0 and committed.step not in self._marking:
            task = asyncio.get_running_loop().create_task(self._mark_when_complete(committed, reason))
            self._marking[committed.step] = task

    async def _mark_when_complete(self, committed: Committed, reason: SyncReason) -> None:
        """Node 0: look for every node's part of ``committed.step`` until it is there, then write the marker and
        report the checkpoint; given up once a newer step is marked (storage trouble is retried)."""
        marker = await self._gang_checkpoints().mark_when_complete(committed.step, self._gang_poll_seconds)
        self.reports.checkpoint_saved(replace(committed, bytes=marker.bytes), reason)
        for older, task in list(self._marking.items()):
            if older < committed.step:
                task.cancel()
