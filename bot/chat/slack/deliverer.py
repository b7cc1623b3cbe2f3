"""Slack's side of the outbox: a job's card, thread replies, alerts and pages as Web API calls.

- the card: ``chat.postMessage`` once, then ``chat.update`` in place;
- thread notes: replies under the card (``thread_ts``);
- alerts: the configured alert channel (else the job's channel);
- pages: a new top-level message in the job's channel for every step (an edit would notify no one), mentions
  first, with the on-call buttons; each page's ``ts`` is kept, and an ``acked`` note turns every page of the
  job not acknowledged yet into "Acknowledged by … at …" without buttons.

Every note carries its id in the message's metadata, so when the outbox is in doubt whether a post went through
(a replica died mid-post, Slack timed out) :meth:`SlackDeliverer.posted` looks for it where it would be. A chart
goes up through Slack's file upload flow (:mod:`bot.chat.slack.upload`) into the card's thread, named after its
note's id: a file message carries no metadata, so the name is what ``posted`` looks for. A costs report's chart
goes up the same way, into the channel where ``/finetune costs`` was typed (a slash command has no thread), with
the report's words as its comment.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime
from typing import Any

from slack_sdk.web.async_client import AsyncWebClient

from bot.chat.catalog import Lang, text
from bot.chat.delivery import Draw, DrawPicture, MessageRef, PermanentDeliveryError
from bot.chat.refs import ChatRefs
from bot.chat.slack.blocks import acked_page_layout, card_layout, mrkdwn, note_text, page_layout
from bot.chat.slack.errors import call
from bot.chat.slack.upload import upload_to_thread
from handlers.clock import utcnow
from handlers.jobs import ChatRef, Job
from handlers.messages import Notify
from handlers.notes import Acked

log = logging.getLogger(__name__)

NOTE_EVENT = "finetune_note"  # the metadata event type of every note the bot posts
LOOK_BACK_SECONDS = 3600  # how far back a channel is searched for a note in doubt


class SlackDeliverer:
    def __init__(
        self,
        client: AsyncWebClient,
        refs: ChatRefs,
        alert_channel: str | None = None,
        clock: Callable[[], datetime] = utcnow,
        language_for: Callable[[str | None], Lang] = lambda channel: "en",
    ) -> None:
        self.client = client
        self.refs = refs
        self.alert_channel = alert_channel
        self.clock = clock
        self.language_for = language_for  # the language of a channel's messages (SlackConfig.language_for)

    async def post_card(self, job: Job) -> MessageRef:
        said, blocks = card_layout(job, self.clock(), self._lang(job))
        reply = await call(self.client.chat_postMessage(channel=_channel(job), text=said, blocks=blocks))
        return MessageRef(channel=str(reply["channel"]), ts=str(reply["ts"]))

    async def edit_card(self, job: Job, card: MessageRef) -> None:
        said, blocks = card_layout(job, self.clock(), self._lang(job))
        await call(self.client.chat_update(channel=card.channel, ts=card.ts, text=said, blocks=blocks))

    async def post_note(self, job: Job, note: Notify, card: MessageRef | None) -> None:
        now = self.clock()
        lang = self._lang(job)
        if note.channel == "page":
            await self._page(job, note, now, lang)
            return
        if note.channel == "alert":
            channel = self.alert_channel or _channel(job)
            said = note_text(job, note, now, lang)
            if channel != _channel(job):
                said += text(lang, "slack.job-channel", channel=f"<#{_channel(job)}>")
            await call(self.client.chat_postMessage(channel=channel, text=said, metadata=_metadata(note)))
            return
        if isinstance(note.note, Acked):
            await self._acknowledge_pages(job, note.note, lang)
        thread: dict[str, Any] = {"thread_ts": card.ts} if card is not None else {}
        channel = card.channel if card is not None else _channel(job)
        said = note_text(job, note, now, lang)
        await call(self.client.chat_postMessage(channel=channel, text=said, metadata=_metadata(note), **thread))

    async def post_image(self, job: Job, note: Notify, draw: Draw, card: MessageRef | None) -> None:
        """The job's chart, uploaded into the card's thread (the job's channel when there is no card)."""
        now = self.clock()
        lang = self._lang(job)
        png = await draw(lang, now)
        title = text(lang, "chart.title", job=job.id, recipe=job.recipe)
        await upload_to_thread(
            self.client,
            channel=card.channel if card is not None else _channel(job),
            thread_ts=card.ts if card is not None else None,
            content=png,
            filename=chart_filename(note),
            title=title,
            comment=note_text(job, note, now, lang),
            alt_text=title,
        )

    async def post_channel_image(
        self, chat: ChatRef, name: str, at: datetime, draw: DrawPicture, in_doubt: bool
    ) -> None:
        """A picture that is no job's (a costs report's chart), uploaded into ``chat``'s channel as ``name``;
        in doubt, looked for there first (a file message carries no metadata: by its name)."""
        if in_doubt and await self._file_in_channel(chat.channel, name, at):
            log.info("the image %s was posted in %s already", name, chat.channel)
            return
        picture = await draw(self.language_for(chat.channel))
        await upload_to_thread(
            self.client,
            channel=chat.channel,
            thread_ts=None,
            content=picture.png,
            filename=name,
            title=picture.title,
            comment=mrkdwn(picture.caption),
            alt_text=picture.title,
        )

    async def _file_in_channel(self, channel: str, name: str, at: datetime) -> bool:
        oldest = f"{at.timestamp() - LOOK_BACK_SECONDS:.6f}"
        try:
            reply = await call(self.client.conversations_history(channel=channel, oldest=oldest, limit=200))
        except PermanentDeliveryError as exc:  # e.g. no channels:history scope: post it (at least once) rather than not
            log.warning("cannot look for %s in Slack (%s): posting it", name, exc)
            return False
        messages = reply.get("messages") or []
        return any(file.get("name") == name for message in messages for file in message.get("files") or [])

    async def posted(self, job: Job, note: Notify, card: MessageRef | None) -> bool:
        """Is ``note`` in Slack already? (Its thread, or the channel it goes to, searched for its id.)"""
        if note.channel == "thread" and card is not None:
            request = self.client.conversations_replies(
                channel=card.channel, ts=card.ts, include_all_metadata=True, limit=200
            )
        else:
            channel = (self.alert_channel or _channel(job)) if note.channel == "alert" else _channel(job)
            oldest = f"{note.at.timestamp() - LOOK_BACK_SECONDS:.6f}"
            request = self.client.conversations_history(
                channel=channel, oldest=oldest, include_all_metadata=True, limit=200
            )
        try:
            reply = await call(request)
        except PermanentDeliveryError as exc:  # e.g. no channels:history scope: post it (at least once) rather than not
            log.warning("cannot look for note %s in Slack (%s): posting it", note.id, exc)
            return False
        for message in reply.get("messages") or []:
            metadata = message.get("metadata") or {}
            payload = metadata.get("event_payload") or {}
            if metadata.get("event_type") == NOTE_EVENT and payload.get("note") == note.id:
                return True
            if any(file.get("name") == chart_filename(note) for file in message.get("files") or []):
                return True
        return False

    def _lang(self, job: Job) -> Lang:
        return self.language_for(job.chat.channel if job.chat is not None else None)

    async def _page(self, job: Job, note: Notify, now: datetime, lang: Lang) -> None:
        said, plain, blocks = page_layout(job, note, now, lang)
        reply = await call(
            self.client.chat_postMessage(channel=_channel(job), text=said, blocks=blocks, metadata=_metadata(note))
        )
        await self.refs.add_page(job.id, MessageRef(channel=str(reply["channel"]), ts=str(reply["ts"]), text=plain))

    async def _acknowledge_pages(self, job: Job, acked: Acked, lang: Lang) -> None:
        """Every page of the job loses its buttons and says who owns it now (repeatable: edits, not posts)."""
        by, at = acked.by, acked.at
        pages = await self.refs.pages(job.id)
        for page in pages:
            said, blocks = acked_page_layout(page.text, by, at, lang)
            try:
                await call(self.client.chat_update(channel=page.channel, ts=page.ts, text=said, blocks=blocks))
            except PermanentDeliveryError as exc:  # e.g. someone deleted that page: the others still get updated
                log.warning("page %s of %s not marked acknowledged: %s", page.ts, job.id, exc)
        await self.refs.drop_pages(job.id, len(pages))  # done with this incident's pages


def chart_filename(note: Notify) -> str:
    """A chart's file name: its note's id, so the file can be found again."""
    return f"{note.id}.png"


def _metadata(note: Notify) -> dict[str, Any]:
    return {"event_type": NOTE_EVENT, "event_payload": {"note": note.id, "job": note.job_id}}


def _channel(job: Job) -> str:
    if job.chat is None:
        raise PermanentDeliveryError(f"{job.id} has no chat channel")
    return job.chat.channel
