"""What ``POST /slack/events`` accepts, checked before bolt sees anything: a signed, fresh, well-formed request.

Slack sends slash commands and interactivity (button clicks) form-encoded and signs each request: ``v0=`` +
HMAC-SHA256 of ``v0:{X-Slack-Request-Timestamp}:{body}`` with the app's signing secret, the timestamp within five
minutes of now. This module checks, cheapest first:

1. the timestamp is a number within the window and the signature has Slack's form and matches — else 401;
2. the body is UTF-8, form-encoded, each field once — else 400;
3. it is a slash command of ours (``command``, ``user_id``, ``channel_id``, ``trigger_id``) or an interactivity
   ``payload=`` that is a JSON object: ``block_actions`` of our buttons, with the user and the channel — else 400.

Slack's certificate check (``ssl_check=1``) is answered 200 and does nothing, as bolt answers it. Bolt then gets
the fields already decoded (as JSON), so its own body parser, which takes any body containing the word "payload"
for an interaction, never guesses. A refusal is an :class:`~bot.errors.InputRefused` with the status and a short
reason for the answer and the log; nothing in a refused request reaches the bot.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl

from bot.chat.slack.actions import ACTION_IDS
from bot.errors import InputRefused
from bot.header_form import SLACK_SIGNATURE, SLACK_TIMESTAMP
from handlers import safe_json

TIMESTAMP_HEADER = SLACK_TIMESTAMP.name
SIGNATURE_HEADER = SLACK_SIGNATURE.name
FORM = "application/x-www-form-urlencoded"
WINDOW_SECONDS = 300  # Slack: refuse a request whose timestamp is more than five minutes from now
MAX_TEXT = 4000  # far above what a person types after /finetune
COMMAND_FIELDS = ("command", "user_id", "channel_id", "trigger_id")


@dataclass(frozen=True, slots=True)
class SlackRequest:
    kind: str  # "command", "block_actions" or "ssl_check"
    body: dict[str, Any]  # what bolt gets: the command's fields, or the interaction's payload


class Gate:
    """Checks requests for the app whose signing secret and slash command are given; ``clock`` is epoch seconds."""

    def __init__(self, signing_secret: str, command: str, clock: Callable[[], float]) -> None:
        self.secret = signing_secret.encode()
        self.command = command
        self.clock = clock

    def check(self, raw: bytes, headers: Mapping[str, str]) -> SlackRequest:
        """The request's decoded fields, or :class:`~bot.errors.InputRefused` (its ``status`` to answer)."""
        if _ssl_check(raw):
            return SlackRequest("ssl_check", {})
        self._verify(raw, headers)
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise InputRefused("the body is not UTF-8") from None
        content_type = headers.get("Content-Type", "").split(";", 1)[0].strip().lower()
        if content_type != FORM:
            raise InputRefused(f"expected a form-encoded body ({FORM}), not {content_type or 'no content type'}")
        fields = _form(text)
        if "payload" in fields:
            return _interaction(fields["payload"])
        return self._command(fields)

    def _verify(self, raw: bytes, headers: Mapping[str, str]) -> None:
        timestamp = SLACK_TIMESTAMP.read(headers)
        signature = SLACK_SIGNATURE.read(headers)
        if timestamp is None:
            raise InputRefused("no readable X-Slack-Request-Timestamp", status=401)
        if signature is None:
            raise InputRefused("no readable X-Slack-Signature", status=401)
        if abs(self.clock() - int(timestamp)) > WINDOW_SECONDS:
            raise InputRefused("the timestamp is more than five minutes away", status=401)
        base = b"v0:" + timestamp.encode() + b":" + raw
        expected = "v0=" + hmac.new(self.secret, base, hashlib.sha256).hexdigest()
        if not hmac.compare_digest(expected, signature):
            raise InputRefused("the signature does not match", status=401)

    def _command(self, fields: dict[str, str]) -> SlackRequest:
        missing = [name for name in COMMAND_FIELDS if not fields.get(name)]
        if missing:
            raise InputRefused(f"a slash command without {', '.join(missing)}")
        if fields["command"] != self.command:
            raise InputRefused(f"not this app's command ({fields['command'][:40]!r})")
        if len(fields.get("text", "")) > MAX_TEXT:
            raise InputRefused(f"command text over {MAX_TEXT} characters")
        return SlackRequest("command", fields)


def _ssl_check(raw: bytes) -> bool:
    """Slack's periodic certificate check (``ssl_check=1``): answered 200 unsigned, as bolt does; it does nothing."""
    return raw.startswith(b"ssl_check=") and ("ssl_check", "1") in parse_qsl(raw.decode("utf-8", "replace"))


def _form(text: str) -> dict[str, str]:
    try:
        pairs = parse_qsl(text, keep_blank_values=True, strict_parsing=bool(text), errors="strict")
    except (ValueError, UnicodeDecodeError):
        raise InputRefused("the body is not form-encoded") from None
    fields = dict(pairs)
    if len(fields) != len(pairs):
        raise InputRefused("a form field appears twice")
    return fields


def _interaction(raw: str) -> SlackRequest:
    try:
        payload = safe_json.loads(raw)
    except ValueError:
        raise InputRefused("payload is not JSON") from None
    if not isinstance(payload, dict):
        raise InputRefused("payload is not a JSON object")
    kind = payload.get("type")
    if kind != "block_actions":
        raise InputRefused(f"interaction type {str(kind)[:40]!r} is not one this app handles")
    user = payload.get("user")
    if not isinstance(user, dict) or not isinstance(user.get("id"), str) or not user["id"]:
        raise InputRefused("block_actions without user.id")
    if not _channel(payload):
        raise InputRefused("block_actions without a channel")
    actions = payload.get("actions")
    if not isinstance(actions, list) or not actions:
        raise InputRefused("block_actions without actions")
    for action in actions:
        if not isinstance(action, dict) or not ACTION_IDS.fullmatch(str(action.get("action_id", ""))):
            raise InputRefused("an action that is not one of this app's buttons")
    return SlackRequest("block_actions", payload)


def _channel(payload: dict[str, Any]) -> str:
    channel, container = payload.get("channel"), payload.get("container")
    if isinstance(channel, dict) and isinstance(channel.get("id"), str):
        return str(channel["id"])
    if isinstance(container, dict) and isinstance(container.get("channel_id"), str):
        return str(container["channel_id"])
    return ""
