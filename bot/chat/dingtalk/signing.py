"""The custom robot's 加签: each webhook call carries a timestamp and an HMAC of it under the robot's secret.

DingTalk computes HMAC-SHA256 with the secret as key over ``"{timestamp}\\n{secret}"`` (timestamp in
milliseconds), base64-encodes it, and expects both as the ``timestamp`` and ``sign`` query parameters, the
signature URL-encoded. It refuses a signature that does not match or a timestamp more than an hour off.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from urllib.parse import quote

from yarl import URL


def robot_signature(secret: str, timestamp_ms: int) -> str:
    """The base64 signature of ``timestamp_ms`` (not yet URL-encoded)."""
    digest = hmac.new(secret.encode(), f"{timestamp_ms}\n{secret}".encode(), hashlib.sha256).digest()
    return base64.b64encode(digest).decode()


def signed_url(webhook: str, secret: str, now: float) -> URL:
    """``webhook`` with ``timestamp`` and ``sign`` appended (the sign's ``+``, ``/`` and ``=`` percent-encoded)."""
    timestamp = int(now * 1000)
    joiner = "&" if "?" in webhook else "?"
    sign = quote(robot_signature(secret, timestamp), safe="")
    return URL(f"{webhook}{joiner}timestamp={timestamp}&sign={sign}", encoded=True)
