"""A file into a Slack thread, through Slack's upload flow as slack_sdk's ``files_upload_v2`` runs it:
``files.getUploadURLExternal`` (a URL and a file id for this many bytes), the bytes POSTed to that URL, then
``files.completeUploadExternal`` (the file id, shared in the channel under ``thread_ts``).

The middle step is no Web API call: slack_sdk reports its failure as a ``SlackRequestError`` naming the HTTP
status, which :func:`upload_outcome` reads so that a 5xx or 429 of the upload host is tried again (a retry starts a
new upload) and anything else is a refusal, as :mod:`bot.chat.slack.errors` does for the Web API calls.
"""

from __future__ import annotations

import re
from typing import Any

from slack_sdk.errors import SlackRequestError
from slack_sdk.web.async_client import AsyncWebClient

from bot.chat.delivery import PermanentDeliveryError, TransientDeliveryError
from bot.chat.slack.errors import call

_STATUS = re.compile(r"Failed to upload a file \(status: (\d+)")


def upload_outcome(exc: SlackRequestError) -> TransientDeliveryError | PermanentDeliveryError | None:
    """What a failed upload of the bytes means; None when ``exc`` is not that (slack_sdk refused the request)."""
    found = _STATUS.match(str(exc))
    if found is None:
        return None
    status = int(found.group(1))
    if status >= 500 or status == 429:
        return TransientDeliveryError(f"Slack's upload host answered {status}")
    return PermanentDeliveryError(f"Slack's upload host refused the file: {status}")


async def upload_to_thread(
    client: AsyncWebClient,
    *,
    channel: str,
    thread_ts: str | None,
    content: bytes,
    filename: str,
    title: str,
    comment: str,
    alt_text: str,
) -> dict[str, Any]:
    """Upload ``content`` and share it in ``channel`` (under ``thread_ts``) with ``comment``; the file Slack made."""
    thread: dict[str, Any] = {"thread_ts": thread_ts} if thread_ts else {}
    try:
        reply = await call(
            client.files_upload_v2(
                channel=channel,
                content=content,
                filename=filename,
                title=title,
                initial_comment=comment,
                alt_txt=alt_text,
                **thread,
            )
        )
    except PermanentDeliveryError as exc:
        cause = exc.__cause__
        outcome = upload_outcome(cause) if isinstance(cause, SlackRequestError) else None
        if outcome is None:
            raise
        raise outcome from cause
    files = reply.get("files") or []
    return dict(files[0]) if files else {}
