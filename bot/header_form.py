"""The form of every security header a route reads, checked in one place before anything compares or encodes it.

aiohttp hands a route each header as ``str``, decoded as UTF-8 with ``surrogateescape``: a stranger's byte 0xFF
arrives as ``"\\udcff"``, which ``str.encode()`` refuses (``UnicodeEncodeError``), and any non-ASCII text makes
``hmac.compare_digest`` of two strings raise ``TypeError``: each was a 500 with a traceback. So a route never
reads a signature, a token or a timestamp from ``request.headers`` itself; it asks its :class:`HeaderForm`, which
gives the value only when it is visible ASCII (spaces only where the form has them), within the form's length and
matching the form's whole pattern, and ``None`` otherwise: a malformed header is the same as a missing one (401),
and what comes out may be encoded and compared without a check of its own.

The forms of every route are below, side by side, so a reviewer reads them all at once.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

MAX_HEADER_CHARS = 1024  # no form below needs more; a longer value is not looked at


@dataclass(frozen=True, slots=True)
class HeaderForm:
    """A header ``name`` whose value must fullmatch ``pattern`` (printable ASCII) within ``max_chars``."""

    name: str
    pattern: re.Pattern[str]
    max_chars: int = MAX_HEADER_CHARS

    def read(self, headers: Mapping[str, str]) -> str | None:
        """The header's value when it has this form; None when it is missing or has any other form."""
        value = headers.get(self.name)
        return value if value is not None and well_formed(value, self.pattern, self.max_chars) else None


def well_formed(value: str, pattern: re.Pattern[str], max_chars: int = MAX_HEADER_CHARS) -> bool:
    """``value`` is printable ASCII (space included), at most ``max_chars`` long and matches ``pattern`` whole.

    The length comes first (a pattern never runs over a long stranger's value), then ASCII (so the pattern's
    classes cannot take a non-ASCII digit or letter), then the pattern with ``fullmatch`` (``$`` would let a
    trailing newline through)."""
    return len(value) <= max_chars and value.isascii() and value.isprintable() and bool(pattern.fullmatch(value))


_HEX64 = "[0-9a-fA-F]{64}"
_TOKEN = r"[\x21-\x7e]{1,512}"  # a shared secret: visible ASCII, no space

# Runner reports (bot/http.py): handlers.signing checks the values once more, as the core's own rule.
REPORT_TIMESTAMP = HeaderForm("X-Finetune-Timestamp", re.compile(r"[0-9]{1,12}"))
REPORT_SIGNATURE = HeaderForm("X-Finetune-Signature", re.compile(r"v1=[0-9a-f]{64}"))
# Slack's HTTP mode (bot/chat/slack/ingress.py).
SLACK_TIMESTAMP = HeaderForm("X-Slack-Request-Timestamp", re.compile(r"[0-9]{1,12}"))
SLACK_SIGNATURE = HeaderForm("X-Slack-Signature", re.compile(r"v0=[0-9a-f]{64}"))
# PagerDuty's v3 webhooks (bot/pagers/webhooks.py): one v1= signature per secret while it rotates.
PAGERDUTY_SIGNATURE = HeaderForm(
    "X-PagerDuty-Signature", re.compile(rf"v1={_HEX64}(?:, ?v1={_HEX64}){{0,7}}", re.IGNORECASE)
)
# The shared-secret token of the Alibaba webhooks and Opsgenie's (bot/sources/aliyun_http.py, bot/pagers/webhooks.py).
FINETUNE_TOKEN = HeaderForm("X-Finetune-Token", re.compile(_TOKEN))
# ``Authorization: Bearer <token>`` (GET /costs, the Alibaba webhooks), the scheme's name in any case.
BEARER = HeaderForm("Authorization", re.compile(rf"[Bb][Ee][Aa][Rr][Ee][Rr] +(?P<token>{_TOKEN})"))
# ``Authorization: Basic <base64>`` (Opsgenie's basic auth; the decoded password is the token).
BASIC = HeaderForm("Authorization", re.compile(r"[Bb][Aa][Ss][Ii][Cc] +(?P<credentials>[A-Za-z0-9+/]{1,680}={0,2})"))
# SNS names the message type beside the body (bot/sources/sns_http.py); compared with the body's Type.
SNS_MESSAGE_TYPE = HeaderForm("x-amz-sns-message-type", re.compile(r"[A-Za-z]{1,40}"), 40)

# The local cloud's control server of each instance (bot/cloud/local/instance.py): a token_urlsafe(24).
LOCAL_INSTANCE_TOKEN = HeaderForm("X-Local-Instance-Token", re.compile(r"[A-Za-z0-9_-]{16,64}"))


def header_part(form: HeaderForm, headers: Mapping[str, str], group: str) -> str | None:
    """The named ``group`` of a well-formed header (a Bearer token, Basic credentials), else None."""
    value = form.read(headers)
    found = form.pattern.fullmatch(value) if value is not None else None
    return found.group(group) if found else None
