"""One HTTP call to DingTalk, its answer read the way every DingTalk endpoint answers, its failure classified.

DingTalk answers in two styles: the OpenAPI (``api.dingtalk.com``) uses HTTP status codes with
``{"code", "message"}`` bodies, the webhooks answer 200 with ``{"errcode", "errmsg"}``. Either way a failure
becomes :class:`TransientDeliveryError` (network, timeouts, 5xx, 429, throttling codes: try again) or
:class:`Rejected` (anything else: the request is wrong and will stay wrong).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import aiohttp
from yarl import URL

from bot.chat.delivery import PermanentDeliveryError, TransientDeliveryError
from handlers import safe_json

TIMEOUT = aiohttp.ClientTimeout(total=15)
THROTTLED_RETRY_SECONDS = 2.0
# Webhook errcodes worth retrying: -1 system busy; 130101 over the custom robot's 20 messages a minute.
TRANSIENT_ERRCODES = {-1: 5.0, 130101: 60.0}
# OpenAPI codes of the per-app / per-API QPS limits (answered 403, not 429).
THROTTLED_CODES = ("QpsLimit", "Throttling", "TooManyRequests")


class Rejected(PermanentDeliveryError):
    """DingTalk refused the request: ``status`` and its ``code`` say why (e.g. 400 InvalidAuthentication)."""

    def __init__(self, what: str, status: int, code: str, message: str) -> None:
        super().__init__(f"{what}: HTTP {status} {code}: {message}".rstrip(": "))
        self.status = status
        self.code = code


async def call(
    session: aiohttp.ClientSession,
    method: str,
    url: str | URL,
    what: str,
    body: Mapping[str, Any],
    headers: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Send ``body`` as JSON; the decoded answer, or a delivery error that says whether to retry."""
    try:
        async with session.request(method, url, json=body, headers=headers, timeout=TIMEOUT) as response:
            status, raw = response.status, await response.read()
            retry_after = response.headers.get("Retry-After")
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        raise TransientDeliveryError(f"{what}: {exc or type(exc).__name__}") from exc
    return _answer(what, status, raw, retry_after)


async def post_file(
    session: aiohttp.ClientSession,
    url: str | URL,
    what: str,
    field: str,
    filename: str,
    content: bytes,
    content_type: str,
) -> dict[str, Any]:
    """POST one file as ``multipart/form-data`` (the oapi's media upload); answered and classified as :func:`call`."""
    form = aiohttp.FormData()
    form.add_field(field, content, filename=filename, content_type=content_type)
    try:
        async with session.post(url, data=form, timeout=TIMEOUT) as response:
            status, raw = response.status, await response.read()
            retry_after = response.headers.get("Retry-After")
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        raise TransientDeliveryError(f"{what}: {exc or type(exc).__name__}") from exc
    return _answer(what, status, raw, retry_after)


def _answer(what: str, status: int, raw: bytes, retry_after: str | None) -> dict[str, Any]:
    """The decoded answer of a call that got one, or the delivery error it means."""
    answer = _decode(raw)
    code = str(answer.get("code") or answer.get("errcode") or "")
    message = str(answer.get("message") or answer.get("errmsg") or raw[:200].decode(errors="replace"))
    if status == 429 or any(mark in code for mark in THROTTLED_CODES):
        wait = _seconds(retry_after)
        wait = THROTTLED_RETRY_SECONDS if wait is None else wait
        raise TransientDeliveryError(f"{what}: throttled ({status} {code})", wait)
    if status >= 500:
        raise TransientDeliveryError(f"{what}: HTTP {status} {code} {message}".rstrip(), _seconds(retry_after))
    if status >= 400:
        raise Rejected(what, status, code, message)
    errcode = answer.get("errcode")
    if isinstance(errcode, int) and errcode != 0:
        if errcode in TRANSIENT_ERRCODES:
            raise TransientDeliveryError(f"{what}: errcode {errcode} {message}", TRANSIENT_ERRCODES[errcode])
        raise Rejected(what, status, str(errcode), message)
    return answer


def _decode(raw: bytes) -> dict[str, Any]:
    try:
        answer = safe_json.loads(raw) if raw else {}
    except ValueError:
        return {}
    return answer if isinstance(answer, dict) else {}


def _seconds(retry_after: str | None) -> float | None:
    """``Retry-After`` in seconds, when the platform sent one we can read."""
    try:
        return max(float(retry_after), 0.0) if retry_after else None
    except ValueError:
        return None
