"""Block Kit layouts: the job card, thread text, pages with their buttons, and a page once acknowledged.

The words come from :mod:`bot.chat.render` (shared with the console and DingTalk); this module only lays them
out. Everything that came from elsewhere (a failure message, a user's id) is escaped, so it can neither break
the markup nor mention anyone; mentions are built only from validated Slack ids.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from bot.chat.render import card, message_text
from handlers.jobs import TERMINAL_STATES, Job, JobState
from handlers.messages import Notify

Block = dict[str, Any]

ACTION_STOP = "finetune_stop"
ACTION_DRILL = "finetune_drill"
ACTION_ACK = "finetune_ack"
ACTION_RETRY = "finetune_retry"
ACTION_ON_DEMAND = "finetune_ondemand"

_USER_ID = re.compile(r"^[UW][A-Z0-9]{2,}$")
_GROUP_ID = re.compile(r"^S[A-Z0-9]{2,}$")
_SLACK_USER_IN_TEXT = re.compile(r"\bslack:([UW][A-Z0-9]{2,})\b")
MAX_FIELDS = 10  # per section block
MAX_TEXT = 2900  # a section's text may hold 3000 characters


def escape(text: str) -> str:
    """Slack's three control characters, as its docs ask; nothing else needs escaping in mrkdwn."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def mrkdwn(text: str) -> str:
    """Escaped text in which our own ``slack:U…`` user names become mentions."""
    return _SLACK_USER_IN_TEXT.sub(r"<@\1>", escape(text))[:MAX_TEXT]


def user(name: str) -> str:
    """``slack:U…`` as a mention; anyone else (``console:bob``, ``dingtalk:…``) as escaped text."""
    platform, _, ident = name.partition(":")
    if platform == "slack" and _USER_ID.match(ident):
        return f"<@{ident}>"
    return escape(name)


def mentions(fields: dict[str, Any]) -> str:
    """Who a page calls: users ``<@U…>``, user groups ``<!subteam^S…>``, then ``<!channel>`` / ``<!here>``."""
    called: list[str] = []
    for person in fields.get("mention") or []:
        ident = str(person.get("slack") or "") if isinstance(person, dict) else ""
        if _USER_ID.match(ident):
            called.append(f"<@{ident}>")
        elif _GROUP_ID.match(ident):
            called.append(f"<!subteam^{ident}>")
    everyone = fields.get("everyone")
    if everyone in ("channel", "here"):
        called.append(f"<!{everyone}>")
    return " ".join(dict.fromkeys(called))


def _plain(text: str, limit: int = 75) -> Block:
    return {"type": "plain_text", "text": text[:limit], "emoji": True}


def _button(action_id: str, label: str, job_id: str, style: str | None = None, confirm: Block | None = None) -> Block:
    button: Block = {"type": "button", "action_id": action_id, "text": _plain(label), "value": job_id}
    if style:
        button["style"] = style
    if confirm:
        button["confirm"] = confirm
    return button


def _confirm(title: str, text: str, yes: str, danger: bool = True) -> Block:
    dialog: Block = {
        "title": _plain(title, 100),
        "text": {"type": "mrkdwn", "text": text[:300]},
        "confirm": _plain(yes, 30),
        "deny": _plain("Cancel", 30),
    }
    if danger:
        dialog["style"] = "danger"
    return dialog


def stop_button(job_id: str) -> Block:
    return _button(
        ACTION_STOP,
        "Stop",
        job_id,
        "danger",
        _confirm(f"Stop {job_id}?", "The job checkpoints, uploads, then its instance is released.", "Stop it"),
    )


def drill_button(job_id: str) -> Block:
    text = "A real spot interruption drill: the instance gets a notice and is reclaimed; the job should resume."
    return _button(ACTION_DRILL, "Interrupt-test", job_id, None, _confirm(f"Interrupt {job_id}?", text, "Interrupt"))


def card_layout(job: Job, now: datetime) -> tuple[str, list[Block]]:
    """The card's fallback text and blocks: header, fields, who and when, and the buttons that apply now."""
    shown = card(job, now)
    fields = [{"type": "mrkdwn", "text": f"*{escape(label)}*\n{mrkdwn(value)[:1900]}"} for label, value in shown.fields]
    blocks: list[Block] = [{"type": "header", "text": _plain(shown.title, 150)}]
    blocks += [{"type": "section", "fields": chunk} for chunk in _chunks(fields, MAX_FIELDS)]
    blocks.append(
        {
            "type": "context",
            "elements": [
                {"type": "mrkdwn", "text": f"Started by {user(job.requested_by)} · updated {now:%H:%M:%S} UTC"}
            ],
        }
    )
    buttons: list[Block] = []
    if job.state not in TERMINAL_STATES and job.state is not JobState.STOPPING:
        buttons.append(stop_button(job.id))
    if job.state is JobState.RUNNING:
        buttons.append(drill_button(job.id))
    if buttons:
        blocks.append({"type": "actions", "block_id": "finetune_card", "elements": buttons})
    state = next(value for label, value in shown.fields if label == "State")
    return f"{shown.title}: {state}", blocks


def note_text(job: Job, note: Notify, now: datetime) -> str:
    """A thread reply or an alert: the shared sentence, escaped, with our Slack users as mentions."""
    return mrkdwn(message_text(job, note, now))


def page_layout(job: Job, note: Notify, now: datetime) -> tuple[str, str, list[Block]]:
    """A page: ``(text with mentions first, text without them, blocks with the four on-call buttons)``.

    The mentions lead the text because that is what notifies people (and shows in the notification).
    """
    plain = note_text(job, note, now)
    called = mentions(note.fields)
    text = f"{called} {plain}" if called else plain
    buttons = [
        _button(ACTION_ACK, "Acknowledge", job.id, "primary"),
        _button(ACTION_RETRY, "Retry resume", job.id),
        _button(
            ACTION_ON_DEMAND,
            "Fall back to on-demand",
            job.id,
            None,
            _confirm(
                f"Resume {job.id} on-demand?",
                "Relaunch on on-demand capacity, at the on-demand price.",
                "Resume",
                False,
            ),
        ),
        stop_button(job.id),
    ]
    blocks: list[Block] = [
        {"type": "section", "text": {"type": "mrkdwn", "text": text[:MAX_TEXT]}},
        {"type": "actions", "block_id": "finetune_page", "elements": buttons},
    ]
    return text, plain, blocks


def acked_page_layout(page_text: str, by: str, at: datetime) -> tuple[str, list[Block]]:
    """A page once someone owns it: the same words, no buttons, who acknowledged and when."""
    acked = f"✅ Acknowledged by {user(by)} at {at:%H:%M} UTC"
    blocks: list[Block] = [
        {"type": "section", "text": {"type": "mrkdwn", "text": page_text[:MAX_TEXT]}},
        {"type": "context", "elements": [{"type": "mrkdwn", "text": acked}]},
    ]
    return f"{page_text}\n{acked}", blocks


def _chunks(items: list[Block], size: int) -> Iterable[list[Block]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]
