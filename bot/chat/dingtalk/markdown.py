"""The bot's sentences as DingTalk markdown messages, with a page's on-call people as real mentions."""

from __future__ import annotations

from datetime import datetime

from bot.chat.catalog import Lang, plain, text
from bot.chat.dingtalk.webhooks import Markdown, Mentions
from bot.chat.render import message_text
from handlers.jobs import Job
from handlers.messages import Notify
from handlers.notes import Paged, ResumeFailedPage

# What could make a link, an image or HTML (DingTalk renders <font>) out of text that came from elsewhere (a user's
# words echoed back, a log line, a failure message): each becomes its full-width twin, which reads the same and is
# never markup; so does a "#" that would start a heading. Emphasis and code spans are left alone: they change no
# more than the type face (and the catalogue's own sentences use code spans).
_INERT = str.maketrans({"[": "［", "]": "］", "<": "＜", ">": "＞"})


def escape_markdown(text: str) -> str:
    """``text`` as DingTalk markdown that shows it as written and makes nothing of it (persons as their names)."""
    lines = plain(text).translate(_INERT).split("\n")
    return "\n".join("＃" + line.lstrip()[1:] if line.lstrip().startswith("#") else line for line in lines)


def to_markdown(sentence: str) -> str:
    """A sentence, escaped; DingTalk markdown keeps a line break only between paragraphs: one per non-empty line."""
    return "\n\n".join(line.strip() for line in escape_markdown(sentence).splitlines() if line.strip())


def reply(answer: str, lang: Lang) -> Markdown:
    """A command's answer, back to the group it came from."""
    return Markdown(text(lang, "title.reply"), to_markdown(answer))


def note_message(job: Job, note: Notify, now: datetime, lang: Lang) -> Markdown:
    """A thread message, an alert or a page about ``job``, in ``lang``."""
    page = note.note if note.channel == "page" and isinstance(note.note, ResumeFailedPage) else None
    mentions = page_mentions(page) if page is not None else Mentions()
    body = to_markdown(message_text(job, note, now, lang))
    unreachable = [f"@{p.name}" for p in page.mention if not _reachable(p)] if page is not None else []
    if unreachable:  # named on the ladder but with no DingTalk id: say who, at least
        body += "\n\n" + " ".join(unreachable)
    channel = note.channel if note.channel in ("alert", "page") else "thread"
    return Markdown(text(lang, f"title.{channel}", job=job.id), body, mentions)


def page_mentions(page: ResumeFailedPage) -> Mentions:
    """Who a page step calls (the on-call contract: ``mention`` people, ``everyone`` channel/here).

    A person is mentioned by DingTalk userId when they have one, else by mobile; ``channel`` and ``here`` are
    both @all, as DingTalk has no "only those online".
    """
    user_ids = [p.dingtalk for p in page.mention if p.dingtalk]
    mobiles = [p.mobile for p in page.mention if not p.dingtalk and p.mobile]
    return Mentions(user_ids, mobiles, everyone=page.everyone in ("channel", "here"))


def _reachable(person: Paged) -> bool:
    return bool(person.dingtalk or person.mobile)
