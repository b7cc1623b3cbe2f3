"""The runner's error root, :class:`RunnerError`: the runner never imports the bot, so its tree is its own.

RunnerError
├── StorageError (runner/storage/base.py)   the checkpoint store (file, S3, OSS), retried; a step out of time too
│   └── ObjectMissing                       no such object: waiting will not make one, so not retried
├── NoticeUnavailable                       a notice source (the metadata service, the bot's control object) gave
│                                           no usable answer; training goes on
├── ReportRejected                          the bot refused a report for good (HTTP 400/401): dropped, not retried
├── NoReportKey (runner/reports/key_object.py)   no report key for this attempt: the runner does not start
├── CheckpointInvalid (runner/checkpoints.py)    a stored checkpoint that does not verify: the next older is tried
├── FileChanged (runner/upload.py)               a checkpoint file changed under its upload: started over, or the
│                                                checkpoint tried again
├── TrainerStartError (runner/trainer.py)        the trainer's program cannot be run at all
└── GuardError (runner/metadata_guard.py)        the metadata guard's firewall rule could not be put in place

A class only where a caller catches it by type: a report target that did not take a report raises RunnerError itself
(retried, as any failure of a target is); a path someone else could change is a PermissionError, and a FIFO, device or
socket where the runner reads a file an OSError (EINVAL), taken as every other unreadable path is.
"""

from __future__ import annotations


class RunnerError(Exception):
    """The root of the runner's own errors: ``except RunnerError`` is "one of ours"."""


class NoticeUnavailable(RunnerError):
    """A notice source (the instance metadata service, the bot's control object in the bucket) did not answer, or
    answered something unreadable; training goes on regardless."""


class ReportRejected(RunnerError):
    """The report target refused the report for good (e.g. HTTP 400/401): retrying cannot help."""
