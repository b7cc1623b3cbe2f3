"""The runner's error root, :class:`RunnerError`: the runner never imports the bot, so its tree is its own.

RunnerError
├── StorageError (runner/storage/base.py)   the checkpoint store (file, S3, OSS); ObjectMissing, OutOfTime
├── NoticeUnavailable                       a notice source gave no usable answer; training goes on
│   ├── MetadataUnavailable                 the instance metadata service (AWS IMDS, Alibaba's)
│   └── ControlUnreadable                   the bot's control object in the bucket
├── ReportRejected                          the bot refused a report for good (HTTP 400/401): not retried
├── ReportNotDelivered                      no answer, or a 5xx / 429: retried
├── NoReportKey (runner/reports/key_object.py)   no report key for this attempt: the runner does not start
├── CheckpointInvalid (runner/checkpoints.py)    a stored checkpoint that does not verify: the next older is tried
├── FileChanged (runner/upload.py)               a checkpoint file changed while it was uploaded: tried again
├── TrainerStartError (runner/trainer.py)        the trainer's program cannot be run at all
├── GuardError (runner/metadata_guard.py)        the metadata guard's firewall rule could not be put in place
└── NotARegularFile (runner/beneath.py)          a FIFO, device or socket where the runner reads a file (an OSError too)

Control-flow signals that never leave their module (``_CannotStart``, ``_Shrank``, ``_Cut``) stay plain exceptions.
"""

from __future__ import annotations


class RunnerError(Exception):
    """The root of the runner's own errors: ``except RunnerError`` is "one of ours"."""


class NoticeUnavailable(RunnerError):
    """A notice source (metadata service, control object) did not answer usefully; training goes on regardless."""


class MetadataUnavailable(NoticeUnavailable):
    """The instance metadata service did not answer, or answered something unreadable."""


class ControlUnreadable(NoticeUnavailable):
    """The bot's control object in the bucket could not be read, or is malformed."""


class ReportRejected(RunnerError):
    """The report target refused the report for good (e.g. HTTP 400/401): retrying cannot help."""


class ReportNotDelivered(RunnerError):
    """The report target did not take the report this time (no answer, a timeout, a 5xx or 429): retried."""
