"""The bot's sentences as DingTalk markdown messages, with a page's on-call people as real mentions."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from bot.chat.catalog import Lang, text
from bot.chat.dingtalk.webhooks import Markdown, Mentions
from bot.chat.render import message_text
from handlers.jobs import Job
from handlers.messages import Notify


def to_markdown(plain: str) -> str:
    """DingTalk markdown keeps a line break only between paragraphs: one paragraph per non-empty line."""
    return "\n\n".join(line.strip() for line in plain.splitlines() if line.strip())


def reply(answer: str, lang: Lang) -> Markdown:
    """A command's answer, back to the group it came from."""
    return Markdown(text(lang, "title.reply"), to_markdown(answer))


def note_message(job: Job, note: Notify, now: datetime, lang: Lang) -> Markdown:
    """A thread message, an alert or a page about ``job``, in ``lang``."""
    mentions = page_mentions(note.fields) if note.channel == "page" else Mentions()
    body = to_markdown(message_text(job, note, now, lang))
    unreachable = [f"@{p.get('name')}" for p in note.fields.get("mention") or [] if not _reachable(p)]
    if note.channel == "page" and unreachable:  # named on the ladder but with no DingTalk id: say who, at least
        body += "\n\n" + " ".join(unreachable)
    channel = note.channel if note.channel in ("alert", "page") else "thread"
    return Markdown(text(lang, f"title.{channel}", job=job.id), body, mentions)


def page_mentions(fields: dict[str, Any]) -> Mentions:
    """Who a page step calls (the on-call contract: ``mention`` people, ``everyone`` channel/here).

    A person is mentioned by DingTalk userId when they have one, else by mobile; ``channel`` and ``here`` are
    both @all, as DingTalk has no "only those online".
    """
    people = fields.get("mention") or []
    user_ids = [str(p["dingtalk"]) for p in people if p.get("dingtalk")]
    mobiles = [str(p["mobile"]) for p in people if not p.get("dingtalk") and p.get("mobile")]
    return Mentions(user_ids, mobiles, everyone=fields.get("everyone") in ("channel", "here"))


def _reachable(person: dict[str, Any]) -> bool:
    return bool(person.get("dingtalk") or person.get("mobile"))
