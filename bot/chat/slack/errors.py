"""What a failed Slack Web API call means for the message: wait and retry, or give up on it.

slack_sdk raises :class:`SlackApiError` for every answer that is not ``ok`` (its ``response`` has the HTTP
status, headers and Slack's ``error`` code), other ``SlackClientError`` subclasses for a request it will not
send; it lets aiohttp's errors through for network trouble, and a ``UnicodeDecodeError`` / ``JSONDecodeError`` for
a 200 whose body it cannot read (a proxy's page, a cut reply). All of it is mapped here, once, by :func:`call`.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable

import aiohttp
from slack_sdk.errors import SlackApiError, SlackClientError, SlackClientNotConnectedError
from slack_sdk.web.async_slack_response import AsyncSlackResponse

from bot.chat.delivery import PermanentDeliveryError, TransientDeliveryError

# Error codes Slack documents as temporary (besides any 429 or 5xx answer).
TRANSIENT_ERRORS = frozenset(
    {"ratelimited", "internal_error", "fatal_error", "service_unavailable", "request_timeout", "timeout"}
)


def slack_error(exc: SlackApiError) -> str:
    data = exc.response.data
    error = data.get("error") if isinstance(data, dict) else None
    return str(error or f"HTTP {exc.response.status_code}")


def classify(exc: BaseException) -> TransientDeliveryError | PermanentDeliveryError | None:
    """The delivery outcome of ``exc``; None for an exception that is no Slack or network failure (a bug)."""
    if isinstance(exc, SlackApiError):
        status = exc.response.status_code
        error = slack_error(exc)
        if status == 429:
            return TransientDeliveryError("rate limited by Slack", retry_after=_retry_after(exc))
        if status >= 500 or error in TRANSIENT_ERRORS:
            return TransientDeliveryError(f"Slack answered {status} {error}")
        return PermanentDeliveryError(error)
    if isinstance(exc, aiohttp.ClientError | OSError | SlackClientNotConnectedError):  # network, timeouts included
        return TransientDeliveryError(f"cannot reach Slack: {type(exc).__name__}: {exc}")
    if isinstance(exc, UnicodeDecodeError | json.JSONDecodeError):  # an answer, but not Slack's: a proxy, a cut reply
        return TransientDeliveryError(f"Slack's answer could not be read: {type(exc).__name__}")
    if isinstance(exc, SlackClientError):  # SlackRequestError and kin: the SDK will not send this request
        return PermanentDeliveryError(f"slack_sdk refused the request: {type(exc).__name__}: {exc}")
    return None


def _retry_after(exc: SlackApiError) -> float | None:
    headers = exc.response.headers or {}
    value = headers.get("Retry-After") or headers.get("retry-after")
    try:
        return max(float(value), 0.0) if value is not None else None
    except (TypeError, ValueError):
        return None


async def call(request: Awaitable[AsyncSlackResponse]) -> AsyncSlackResponse:
    """Await one Web API call; a failure comes out as a Transient / PermanentDeliveryError (anything else: a bug)."""
    try:
        return await request
    except Exception as exc:
        outcome = classify(exc)
        if outcome is None:
            raise
        raise outcome from exc
