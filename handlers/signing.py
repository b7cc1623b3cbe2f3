"""HMAC-SHA256 signing of runner reports sent over HTTP(S) to the bot.

The scheme mirrors Slack's: the signature covers ``v1:<unix timestamp>:<body>`` so a captured report cannot be
replayed after the tolerance window, and the comparison is constant-time.
"""

from __future__ import annotations

import hashlib
import hmac
import re

SIGNATURE_HEADER = "X-Finetune-Signature"
TIMESTAMP_HEADER = "X-Finetune-Timestamp"
TOLERANCE_SECONDS = 300
_TIMESTAMP = re.compile(r"[0-9]{1,12}")
_SIGNATURE = re.compile(r"v1=[0-9a-f]{64}")


def sign(secret: str, timestamp: int, body: bytes) -> str:
    """The header value for ``body`` sent at ``timestamp`` (seconds since the epoch)."""
    base = b"v1:" + str(timestamp).encode() + b":" + body
    return "v1=" + hmac.new(secret.encode(), base, hashlib.sha256).hexdigest()


def verify(secret: str, timestamp: str | None, body: bytes, signature: str | None, now: float) -> bool:
    """True only for a well-formed, correctly signed report sent within the tolerance window."""
    if not secret or not timestamp or not signature:
        return False
    # Checked by form before anything else: a header of any other bytes (a non-ASCII one makes
    # hmac.compare_digest raise) is simply not a signature.
    if not _TIMESTAMP.fullmatch(timestamp) or not _SIGNATURE.fullmatch(signature):
        return False
    sent = int(timestamp)
    if abs(now - sent) > TOLERANCE_SECONDS:
        return False
    return hmac.compare_digest(sign(secret, sent, body), signature)
