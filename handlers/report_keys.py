"""Per-attempt report keys: each runner holds a key good for its own (job, attempt) only, never the bot's master.

The key of an attempt is ``HMAC-SHA256(master, "finetune-report-key/v2\\0<job id>\\0<attempt>\\0<salt>")`` in hex,
where the salt is 128 random bits drawn when the attempt is planned and stored with it in the job's record
(:attr:`handlers.jobs.Attempt.key_salt`; the launch hands it to the cloud in the spec). The bot derives the key
again for every report it reads, from the (job, attempt) the report names and the salt it looks up for that
attempt: a leaked key speaks for one attempt of one job, no key tells anything about the master or another
attempt's key (HMAC is a PRF), and no key follows from a job id and a number alone (an id used again, or a record
written again, gets keys of its own). The label fixes the purpose and the version; the NUL separators keep
``("ft-ab", 12)`` and ``("ft-ab1", 2)`` apart. Signing itself is unchanged (:mod:`handlers.signing`).

A gang node's attempt is its own (:mod:`handlers.gang`), so its key binds its node: the rank a report claims is
checked against the attempt's record (:func:`handlers.report_fence.claims_another_rank`). How long an ended attempt's
key still counts: :data:`handlers.report_fence.ENDED_ATTEMPT_GRACE`.

:func:`verify_report` is the one check every route runs (HTTP, SNS, SQS): the claimed sender is read from the
body (its ``job_id`` and ``attempt``) before anything else (:func:`claimed_sender`), the bot looks up that
attempt's salt, the signature is checked with that attempt's key, and only then is the report parsed for real.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from dataclasses import dataclass, field

from handlers import safe_json
from handlers.ids import JOB_ID_PATTERN
from handlers.report_freshness import reference_time, signed_at, why_stale
from handlers.signing import verify

KEY_LABEL = b"finetune-report-key/v2"
SALT_PATTERN = r"^[0-9a-f]{32}$"  # handlers.ids.new_key_salt
_SALT = re.compile(SALT_PATTERN)
MAX_ATTEMPT = 10_000  # the spec's own bound
_JOB_ID = re.compile(JOB_ID_PATTERN)


def derive_report_key(master: str, job_id: str, attempt: int, salt: str) -> str:
    """The report key of ``attempt`` of ``job_id`` whose salt is ``salt`` (what that attempt's runner gets as
    ``FINETUNE_REPORT_SECRET``, or in its key object)."""
    if not master:
        raise ValueError("no master report secret to derive a key from")
    if not _SALT.fullmatch(salt):
        raise ValueError("an attempt's key salt is 32 hex digits")
    info = KEY_LABEL + b"\x00" + job_id.encode() + b"\x00" + str(attempt).encode() + b"\x00" + salt.encode()
    return hmac.new(master.encode(), info, hashlib.sha256).hexdigest()


@dataclass(frozen=True, slots=True)
class Sender:
    """Who a report says it comes from."""

    job_id: str
    attempt: int


def claimed_sender(body: bytes | str) -> Sender | None:
    """The (job, attempt) a report body names, or None when it names none a runner could hold a key for."""
    try:
        document = safe_json.loads(body)
    except ValueError:
        return None
    if not isinstance(document, dict):
        return None
    job_id, attempt = document.get("job_id"), document.get("attempt")
    if not isinstance(job_id, str) or not _JOB_ID.fullmatch(job_id):
        return None
    if not isinstance(attempt, int) or isinstance(attempt, bool) or not 1 <= attempt <= MAX_ATTEMPT:
        return None
    return Sender(job_id, attempt)


def verify_report(
    master: str,
    sender: Sender,
    salt: str,
    body: bytes,
    timestamp: str | None,
    signature: str | None,
    now: float,
    queued_at: float | None = None,
) -> str | None:
    """None when ``body`` (which names ``sender``, whose salt is ``salt``) is signed with that attempt's key and fresh
    (:mod:`handlers.report_freshness`: within the tolerance window of when a queue received it, ``queued_at``, or
    else of ``now``); else why not (a short reason for the log: the report is refused and changes nothing)."""
    if not timestamp or not signature:
        return "unsigned"
    signed = signed_at(timestamp)
    stale = why_stale(signed, now=now, queued_at=queued_at) if signed is not None else None
    if stale is not None:
        return stale
    key = derive_report_key(master, sender.job_id, sender.attempt, salt)
    if not verify(key, timestamp, body, signature, reference_time(now, queued_at)):
        return f"not signed with the key of {sender.job_id} attempt {sender.attempt}"
    return None


@dataclass(frozen=True, slots=True)
class ReportKeys:
    """The bot's side: the master, and the key of any attempt given its salt (what a cloud hands that attempt's
    runner)."""

    master: str = field(repr=False)

    def __post_init__(self) -> None:
        if not self.master:
            raise ValueError("no master report secret")

    def of(self, job_id: str, attempt: int, salt: str) -> str:
        return derive_report_key(self.master, job_id, attempt, salt)
