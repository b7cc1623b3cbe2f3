"""Block Kit layouts: the job card, thread text, pages with their buttons, and a page once acknowledged.

The words come from :mod:`bot.chat.render` and :mod:`bot.chat.catalog` (shared with the console and DingTalk),
in the channel's language; this module only lays them out. Everything that came from elsewhere (a failure
message, a user's id) is escaped, so it can neither break the markup nor mention anyone; mentions are built only
from validated Slack ids.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from bot.chat.catalog import PERSON_CLOSE, PERSON_OPEN, Lang, text
from bot.chat.render import card, message_text
from handlers.jobs import TERMINAL_STATES, Job, JobState
from handlers.messages import Notify
from handlers.notes import ResumeFailedPage

Block = dict[str, Any]

ACTION_STOP = "finetune_stop"
ACTION_INTERRUPT_TEST = "finetune_interrupt_test"
ACTION_ACK = "finetune_ack"
ACTION_RESUME = "finetune_resume"
ACTION_ON_DEMAND = "finetune_ondemand"

_USER_ID = re.compile(r"[UW][A-Z0-9]{2,}")  # fullmatch only: "$" would let a trailing newline through
_GROUP_ID = re.compile(r"S[A-Z0-9]{2,}")
_PERSON = re.compile(f"{PERSON_OPEN}([^{PERSON_OPEN}{PERSON_CLOSE}]*){PERSON_CLOSE}")
_MARKERS = re.compile(f"[{PERSON_OPEN}{PERSON_CLOSE}]")
MAX_FIELDS = 10  # per section block
MAX_TEXT = 2900  # a section's text may hold 3000 characters


def escape(text: str) -> str:
    """Slack's three control characters, as its docs ask; nothing else needs escaping in mrkdwn."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def mrkdwn(text: str) -> str:
    """Escaped text in which the persons the bot named (:func:`bot.chat.catalog.person`) become mentions.

    A ``slack:U…`` anywhere else (a log line, a failure message) stays text: mentions are never read out of words.
    """
    return reply_text(text)[:MAX_TEXT]


def reply_text(text: str) -> str:
    """An answer to one person (a command's reply, the log lines ``logs`` shows), escaped as :func:`mrkdwn` is."""
    escaped = _PERSON.sub(lambda found: _mention(found.group(1)), escape(text))
    return _MARKERS.sub("", escaped)


def _mention(escaped_name: str) -> str:
    platform, _, ident = escaped_name.partition(":")
    return f"<@{ident}>" if platform == "slack" and _USER_ID.fullmatch(ident) else escaped_name


def user(name: str) -> str:
    """``slack:U…`` as a mention; anyone else (``console:bob``, ``dingtalk:…``) as escaped text."""
    platform, _, ident = name.partition(":")
    if platform == "slack" and _USER_ID.fullmatch(ident):
        return f"<@{ident}>"
    return escape(name)


def mentions(page: ResumeFailedPage) -> str:
    """Who a page calls: users ``<@U…>``, user groups ``<!subteam^S…>``, then ``<!channel>`` / ``<!here>``."""
    called: list[str] = []
    for person in page.mention:
        ident = person.slack or ""
        if _USER_ID.fullmatch(ident):
            called.append(f"<@{ident}>")
        elif _GROUP_ID.fullmatch(ident):
            called.append(f"<!subteam^{ident}>")
    everyone = page.everyone
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


def _confirm(lang: Lang, what: str, job_id: str, danger: bool = True) -> Block:
    dialog: Block = {
        "title": _plain(text(lang, f"slack.{what}-title", job=job_id), 100),
        "text": {"type": "mrkdwn", "text": text(lang, f"slack.{what}-text")[:300]},
        "confirm": _plain(text(lang, f"slack.{what}-yes"), 30),
        "deny": _plain(text(lang, "slack.cancel"), 30),
    }
    if danger:
        dialog["style"] = "danger"
    return dialog


def stop_button(job_id: str, lang: Lang = "en") -> Block:
    return _button(ACTION_STOP, text(lang, "button.stop"), job_id, "danger", _confirm(lang, "stop", job_id))


def interrupt_test_button(job_id: str, lang: Lang = "en") -> Block:
    confirm = _confirm(lang, "interrupt-test", job_id)
    return _button(ACTION_INTERRUPT_TEST, text(lang, "slack.interrupt-test"), job_id, None, confirm)


def card_layout(job: Job, now: datetime, lang: Lang = "en") -> tuple[str, list[Block]]:
    """The card's fallback text and blocks: header, fields, who and when, and the buttons that apply now."""
    shown = card(job, now, lang)
    fields = [{"type": "mrkdwn", "text": f"*{escape(label)}*\n{mrkdwn(value)[:1900]}"} for label, value in shown.fields]
    blocks: list[Block] = [{"type": "header", "text": _plain(shown.title, 150)}]
    blocks += [{"type": "section", "fields": chunk} for chunk in _chunks(fields, MAX_FIELDS)]
    blocks.append(
        {
            "type": "context",
            "elements": [{"type": "mrkdwn", "text": text(lang, "slack.footer", user=user(job.requested_by), at=now)}],
        }
    )
    buttons: list[Block] = []
    if job.state not in TERMINAL_STATES and job.state is not JobState.STOPPING:
        buttons.append(stop_button(job.id, lang))
    if job.state is JobState.RUNNING:
        buttons.append(interrupt_test_button(job.id, lang))
    if buttons:
        blocks.append({"type": "actions", "block_id": "finetune_card", "elements": buttons})
    state = shown.fields[0][1]  # the card's first field is always the state
    return f"{shown.title}: {state}", blocks


def note_text(job: Job, note: Notify, now: datetime, lang: Lang = "en") -> str:
    """A thread reply or an alert: the shared sentence, escaped, with our Slack users as mentions."""
    return mrkdwn(message_text(job, note, now, lang))


def page_layout(job: Job, note: Notify, now: datetime, lang: Lang = "en") -> tuple[str, str, list[Block]]:
    """A page: ``(text with mentions first, text without them, blocks with the four on-call buttons)``.

    The mentions lead the text because that is what notifies people (and shows in the notification).
    """
    plain = note_text(job, note, now, lang)
    called = mentions(note.note) if isinstance(note.note, ResumeFailedPage) else ""
    said = f"{called} {plain}" if called else plain
    on_demand = _confirm(lang, "on-demand", job.id, danger=False)
    buttons = [
        _button(ACTION_ACK, text(lang, "button.ack"), job.id, "primary"),
        _button(ACTION_RESUME, text(lang, "slack.resume"), job.id),
        _button(ACTION_ON_DEMAND, text(lang, "slack.on-demand"), job.id, None, on_demand),
        stop_button(job.id, lang),
    ]
    blocks: list[Block] = [
        {"type": "section", "text": {"type": "mrkdwn", "text": said[:MAX_TEXT]}},
        {"type": "actions", "block_id": "finetune_page", "elements": buttons},
    ]
    return said, plain, blocks


def acked_page_layout(page_text: str, by: str, at: datetime, lang: Lang = "en") -> tuple[str, list[Block]]:
    """A page once someone owns it: the same words, no buttons, who acknowledged and when."""
    acked = text(lang, "slack.acked", user=user(by), at=at)
    blocks: list[Block] = [
        {"type": "section", "text": {"type": "mrkdwn", "text": page_text[:MAX_TEXT]}},
        {"type": "context", "elements": [{"type": "mrkdwn", "text": acked}]},
    ]
    return f"{page_text}\n{acked}", blocks


def _chunks(items: list[Block], size: int) -> Iterable[list[Block]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]
