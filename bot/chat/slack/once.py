"""Each command and each click runs once, however often Slack (or anyone replaying it) delivers it.

Slack delivers again when it thinks a request failed (no answer within three seconds: HTTP retries carry
``X-Slack-Retry-Num``, Socket Mode redelivers an envelope with ``retry_attempt``), and a signed request captured
on the way can be sent again for the five minutes its timestamp is good. Every delivery of one request carries
the same ``trigger_id`` (Slack makes one per command typed and per click), so a bolt middleware claims
``slack:<hash of the request's identity>`` (:meth:`bot.keys.Keys.slack_request`) in Redis
(:meth:`bot.store.JobStore.claim_once`, shared by every replica) before any listener runs; a delivery that finds
the claim taken is answered with an empty 200 and does nothing, whether the first one is done or still running.
The claim outlives Slack's retries and the replay window by far.

While Redis is unavailable the claim cannot be made, and the request is answered 503 without running: the person
sees Slack's "failed" notice and tries again; a Slack retry that comes after Redis is back runs it, once.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from slack_bolt.request.async_request import AsyncBoltRequest
from slack_bolt.response import BoltResponse

from bot.errors import StoreUnavailable
from bot.keys import Keys
from bot.log_limit import LimitedLog

log = logging.getLogger(__name__)

CLAIM_TTL_SECONDS = 3600  # Slack retries for about six minutes at most; a replay is refused after five
RETRY_HEADER = "x-slack-retry-num"

FirstDelivery = Callable[[str], Awaitable[bool]]
Next = Callable[[], Awaitable[None]]


def request_key(body: Mapping[str, Any]) -> str:
    """The claim key of a request: the same for every delivery of it, different for anything a person does anew."""
    trigger = body.get("trigger_id")
    if isinstance(trigger, str) and trigger:
        kind = "command" if "command" in body else str(body.get("type"))
        actions = body.get("actions")
        first = actions[0] if isinstance(actions, list) and actions and isinstance(actions[0], dict) else {}
        identity = f"{kind}|{trigger}|{first.get('action_id', '')}|{first.get('action_ts', '')}"
    else:  # nothing Slack sends lacks a trigger_id; a whole-body hash is the safe default anyway
        identity = json.dumps(body, sort_keys=True, default=str)
    return Keys.slack_request(hashlib.sha256(identity.encode()).hexdigest()[:40])


def once_per_request(first_delivery: FirstDelivery) -> Callable[..., Awaitable[BoltResponse | None]]:
    """The bolt middleware: ``first_delivery(key)`` claims the key and says whether this delivery is the first."""
    quiet = LimitedLog(log)

    async def middleware(request: AsyncBoltRequest, body: dict[str, Any], next_: Next) -> BoltResponse | None:
        try:
            first = await first_delivery(request_key(body))
        except StoreUnavailable as exc:
            quiet.warning("redis-unavailable", "a Slack request answered 503: Redis is unavailable (%s)", exc)
            return BoltResponse(status=503, body=json.dumps({"error": "store unavailable, retry"}))
        if not first:
            retry = (request.headers.get(RETRY_HEADER) or ["no"])[0]
            quiet.info("slack-again", "a Slack request delivered again (retry %s): already handled", retry)
            return BoltResponse(status=200, body="")
        await next_()
        return None

    return middleware
