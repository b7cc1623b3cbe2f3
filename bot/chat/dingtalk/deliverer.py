"""DingTalk's side of every notification: the job card in place, group messages, alerts and pages.

``deliver(job, note)`` sends one notification and raises a transient or permanent delivery error when it did
not go (:mod:`bot.chat.delivery`), so it plugs into the durable chat outbox (:mod:`bot.chat.outbox`) as it
is. Where things go:

- ``card``: the job's interactive card, created in the job's group the first time and updated in place after
  (its outTrackId is derived from the job; Redis remembers that it exists). Without a card template, a markdown
  card is posted for the latest state whenever the state changes instead.
- ``thread``: a markdown message from the app robot to the job's group (DingTalk has no threads); the card is
  refreshed too, as these are the moments the job changes.
- ``alert`` and ``page``: through the group's custom robot webhook (signed), pages with real @mentions; with no
  robot configured, as an app robot message;
- a ``chart`` note: the PNG uploaded as media (:meth:`OpenApi.upload_image`), then a markdown message from the app
  robot to the job's group that shows it under its words;
- a costs report's chart (no job's): the same, into the group where ``/finetune costs`` was asked, under the
  report's words.

One alert per group: an interruption warning is told twice by the core, as the alert and in the job's thread
(on Slack those are two places: the alert channel and the card's thread). DingTalk has no threads, so both would
land in the job's group, from two senders with the same words. The alert is the one kept: it is the path with
the priority sender (the custom robot, able to @ people) and the one alert groups watch; the thread copy only
refreshes the card. A default robot that speaks in another group (an alert group) therefore tells the warning
there, and the job's group sees it on its card and in the follow-up (checkpoint saved, relaunching).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime

from bot.chat.catalog import Lang, text
from bot.chat.delivery import Draw, DrawPicture, MessageRef, PermanentDeliveryError
from bot.chat.dingtalk.cards import card_params, out_track_id
from bot.chat.dingtalk.config import DingTalkConfig
from bot.chat.dingtalk.ledger import Ledger
from bot.chat.dingtalk.markdown import note_message, to_markdown
from bot.chat.dingtalk.openapi import OpenApi
from bot.chat.dingtalk.transport import Rejected
from bot.chat.dingtalk.webhooks import Markdown, Webhooks
from bot.chat.render import card_text
from handlers.clock import utcnow
from handlers.jobs import ChatRef, Job
from handlers.messages import Notify
from handlers.notes import InterruptionWarning

log = logging.getLogger(__name__)

MAX_SHOWN = 4096


class DingTalkDeliverer:
    def __init__(
        self,
        api: OpenApi,
        webhooks: Webhooks,
        config: DingTalkConfig,
        ledger: Ledger,
        robot_code: str,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        self.api = api
        self.webhooks = webhooks
        self.config = config
        self.ledger = ledger
        self.robot_code = robot_code
        self.clock = clock
        self._shown: dict[str, int] = {}  # card -> the job version it shows (skips refreshes that change nothing)

    async def deliver(self, job: Job, note: Notify) -> None:
        chat = job.chat
        if chat is None or chat.platform != "dingtalk":
            raise PermanentDeliveryError(f"{job.id} was not started from DingTalk")
        lang = self.config.language_for(chat.channel)
        now = self.clock()
        if note.channel == "card":
            await self._card(job, chat.channel, lang, now)
            return
        if self.config.card_template_id is not None:
            try:
                await self._card(job, chat.channel, lang, now)
            except PermanentDeliveryError as exc:  # a broken card must not silence the message itself
                log.warning("card of %s not refreshed: %s", job.id, exc)
        if note.channel == "thread" and isinstance(note.note, InterruptionWarning):
            log.debug("%s: the warning's thread copy is not posted; its alert is the group's one message", job.id)
            return
        message = note_message(job, note, now, lang)
        robot = self.config.robot_for(chat.channel)
        if note.channel in ("alert", "page") and robot is not None:
            await self.webhooks.robot(robot, message)
        else:
            await self.api.send_group_markdown(chat.channel, self.robot_code, message.title, message.full_text)

    async def post_image(self, job: Job, note: Notify, draw: Draw, card: MessageRef | None) -> None:
        """The job's chart in its group: uploaded, then shown in a markdown message (its one post, last)."""
        chat = job.chat
        if chat is None or chat.platform != "dingtalk":
            raise PermanentDeliveryError(f"{job.id} was not started from DingTalk")
        lang = self.config.language_for(chat.channel)
        now = self.clock()
        media_id = await self.api.upload_image(await draw(lang, now), f"{note.id}.png")
        message = note_message(job, note, now, lang)
        shown = f"{message.full_text}\n\n![{text(lang, 'chart.title', job=job.id, recipe=job.recipe)}]({media_id})"
        await self.api.send_group_markdown(chat.channel, self.robot_code, message.title, shown)

    async def post_channel_image(
        self, chat: ChatRef, name: str, at: datetime, draw: DrawPicture, in_doubt: bool
    ) -> None:
        """A picture that is no job's (a costs report's chart) in ``chat``'s group: uploaded as ``name``, then shown
        under its caption in a markdown message (its one post, last). A message DingTalk may have taken unheard
        is sent again (at least once), as a job's chart is: the app robot's messages cannot be looked up."""
        if chat.platform != "dingtalk":
            raise PermanentDeliveryError(f"{chat.channel} is not a DingTalk group")
        picture = await draw(self.config.language_for(chat.channel))
        media_id = await self.api.upload_image(picture.png, name)
        shown = f"{to_markdown(picture.caption)}\n\n![{picture.title}]({media_id})"
        await self.api.send_group_markdown(chat.channel, self.robot_code, picture.title, shown)

    async def _card(self, job: Job, conversation: str, lang: Lang, now: datetime) -> None:
        template = self.config.card_template_id
        if template is None:
            await self._markdown_card(job, conversation, lang, now)
            return
        track = out_track_id(job)
        if self._shown.get(track, -1) >= job.version:
            return
        params = card_params(job, now, lang)
        if await self.ledger.done(f"card:{track}"):
            await self.api.update_card(track, params)
        else:
            try:
                await self.api.create_and_deliver_card(template, track, conversation, self.robot_code, params)
            except Rejected as refused:  # created already (another replica, or a crash before the mark): update
                try:
                    await self.api.update_card(track, params)
                except Rejected:
                    raise refused from None
            await self.ledger.mark(f"card:{track}")
        if len(self._shown) >= MAX_SHOWN:
            self._shown.clear()
        self._shown[track] = job.version

    async def _markdown_card(self, job: Job, conversation: str, lang: Lang, now: datetime) -> None:
        """No template: the card as a message, once per state of each attempt (a chat cannot edit it)."""
        key = f"state:{job.id}:{job.attempt}:{job.state.value}"
        if await self.ledger.done(key):
            return
        title = text(lang, "title.card", job=job.id, recipe=job.recipe)
        message = Markdown(title, to_markdown(card_text(job, now, lang)))
        await self.api.send_group_markdown(conversation, self.robot_code, message.title, message.full_text)
        await self.ledger.mark(key)
