"""Is a signed runner report fresh? Judged against when it reached the bot's side, not against when it is read.

A report signed by its runner and sent straight to the bot (HTTP) must arrive within the signature's tolerance
window (:data:`handlers.signing.TOLERANCE_SECONDS`) of the bot's clock: nothing stands between the two.

A report published to SNS waits wherever SNS and SQS keep it (a retry, every bot down during an upgrade) and is
read minutes or days later. Its age at reading says nothing about who sent it; what matters is that the runner
signed it when the queue took it. So a queued report is judged against the time the queue received it (the SNS
envelope's ``Timestamp``, else the SQS message's ``SentTimestamp``): signed within the tolerance window of that
moment, and queued no longer than any SQS queue keeps a message (:data:`MAX_QUEUED_SECONDS`).

A delivery that passes is still applied once only: the bot remembers every applied report by its id, job and
attempt (the bus message id, :func:`handlers.messages.report_received`) for :data:`REPORT_SEEN_SECONDS`, longer
than a report can be accepted after it was queued. Every later delivery of it (SQS's at-least-once, a redrive
from the dead-letter queue) is a duplicate; a copy published to SNS again is queued anew, long after it was
signed, and refused here.
"""

from __future__ import annotations

import re

from handlers.signing import TOLERANCE_SECONDS

DAY = 86_400
MAX_QUEUED_SECONDS = 14 * DAY  # SQS's longest message retention: nothing read from a queue was queued earlier
REPORT_SEEN_SECONDS = MAX_QUEUED_SECONDS + DAY  # outlives every delivery the rule below can accept
_TIMESTAMP = re.compile(r"[0-9]{1,12}")  # handlers.signing's form of a signature timestamp


def signed_at(timestamp: str) -> int | None:
    """The signature's time (seconds since the epoch), or None for a timestamp of any other form."""
    return int(timestamp) if _TIMESTAMP.fullmatch(timestamp) else None


def reference_time(now: float, queued_at: float | None) -> float:
    """The moment a report's signature time is compared with: when the queue received it, else now."""
    return now if queued_at is None else queued_at


def why_stale(signed: int, *, now: float, queued_at: float | None) -> str | None:
    """None when a report signed at ``signed`` and queued at ``queued_at`` (None: sent straight to the bot, now)
    is fresh; else why not, one line for the log and the dead-letter queue."""
    if queued_at is not None:
        if queued_at - now > TOLERANCE_SECONDS:
            return f"queued {queued_at - now:.0f} s ahead of the bot's clock"
        if now - queued_at > MAX_QUEUED_SECONDS:
            return f"queued {(now - queued_at) / DAY:.1f} days ago, longer than any queue keeps a message"
    received = "the queue received it" if queued_at is not None else "it arrived"
    gap = reference_time(now, queued_at) - signed
    if gap > TOLERANCE_SECONDS:
        return f"signed {gap:.0f} s before {received} (the window is {TOLERANCE_SECONDS} s)"
    if gap < -TOLERANCE_SECONDS:
        return f"signed {-gap:.0f} s after {received} (the window is {TOLERANCE_SECONDS} s)"
    return None
