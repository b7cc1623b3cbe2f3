"""The chat outbox: every note to people goes through here, on every platform (Slack, DingTalk, the console).

Notes reach its Redis stream straight from the job store, in the same atomic write as the job change that
caused them (see :mod:`bot.queues`), so a slow or absent platform never holds up event handling and a crash
loses no note. A consumer group (one consumer per replica, lanes per job, see :mod:`bot.bus`) delivers:

- in order per job: the card is posted before anything is replied under it;
- until it gets through: rate limits are waited out (the platform's own ``Retry-After``), outages and network
  errors are retried with backoff, and the message stays in the stream meanwhile (handed back untouched when the
  bot stops, delivered by whichever replica runs next). Only a refusal for good (unknown channel, bot not in the
  channel, bad token) drops a message, with one log line;
- once: a note's id is recorded when it is delivered, so a redelivery posts nothing twice; and it is marked
  *sending* before the first try, so a delivery that may have gone through unheard (the replica died mid-post,
  the platform timed out) is checked with the platform before it is tried again (:class:`PostedCheck`);
- card edits coalesced by :class:`bot.chat.cards.CardRefresher` (except on a platform that asks for every card);
- ``pager`` notes (a page opened, acknowledged or resolved in PagerDuty / Opsgenie) to the ``pager`` platform
  (:mod:`bot.pagers.calls`), whatever the job's chat platform, with the same retries and the same once-only record.
- a ``chart`` note drawn when it is delivered (:mod:`bot.charts`), from the points kept then, and posted as an
  image where the platform can (:class:`ImagePoster`), else as its words.
- a ``costs-chart`` entry (:class:`~handlers.messages.CostsChart`, no job's: ``/finetune costs`` asked in a
  channel) drawn when it is delivered, from the report read again, and posted in that channel with the report's
  words (:class:`ChannelImagePoster`), with the same retries and once-only record; where images cannot go (the
  console), not at all: the command's answer had the words.

A job of a platform with no deliverer configured (or with no chat at all) is told about on the ``fallback``
platform (the console), as before.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import datetime
from typing import Any, cast

import redis.asyncio as aioredis
from pydantic import ValidationError

from bot.bus import HandBack, default_consumer_name
from bot.bus_set import bus_for
from bot.charts.series import ChartSeries
from bot.chat.cards import CardRefresher
from bot.chat.catalog import Lang, text
from bot.chat.costs import costs_png, costs_text
from bot.chat.delivery import (
    CardDeliverer,
    Deliverer,
    Draw,
    DrawPicture,
    MessageRef,
    PermanentDeliveryError,
    Picture,
    Platform,
    PostedCheck,
    TransientDeliveryError,
)
from bot.chat.refs import ChatRefs
from bot.costs import read_costs
from bot.errors import StoreUnavailable
from bot.keys import DEFAULT_KEYS, Keys
from bot.store import JobStore
from handlers.backoff import backoff
from handlers.cost_report import WINDOWS
from handlers.jobs import Job
from handlers.messages import CostsChart, Notify, parse_message
from handlers.notes import ChartNote

log = logging.getLogger(__name__)

CHAT_STREAM = DEFAULT_KEYS.chat
SENT_TTL = 7 * 86400
CARD_POST_LEASE_MS = 60_000


class ChatOutbox:
    def __init__(
        self,
        redis: aioredis.Redis,
        store: JobStore,
        platforms: Mapping[str, Platform],
        *,
        fallback: Platform | None = None,
        refs: ChatRefs | None = None,
        consumer: str | None = None,
        keys: Keys | None = None,
        pager: Platform | None = None,
        card_interval: float = 2.0,
        backoff_cap: float = 10.0,
    ) -> None:
        self.redis = redis
        self.store = store
        self.keys = keys or store.keys
        self.platforms = dict(platforms)
        self.fallback = fallback
        self.pager = pager  # PagerDuty / Opsgenie, when a key of either is configured
        self.backoff_cap = backoff_cap
        self.refs = refs or ChatRefs(redis, self.keys)
        self.series = ChartSeries(redis, self.keys)
        coalesced = {name: platform for name, platform in self.platforms.items() if platform.coalesce_cards}
        self.cards = CardRefresher(redis, store, self.refs, coalesced, interval=card_interval, keys=self.keys)
        # Deliveries retry in the handler (the lane waits), so a failure reaching the bus is a bug: parked after 5.
        self.bus = bus_for(redis, self.keys, "chat", group="chat", consumer=consumer or default_consumer_name())
        self.delivered = 0
        self.dropped = 0
        self.coalesced = 0  # card notes superseded by the next card note of their job before either was delivered
        self._stop = asyncio.Event()

    def metrics(self) -> dict[str, float]:
        """Counters for ``/metrics`` (the shape ``bot.http.build_app(extra_metrics=…)`` takes)."""
        return {
            "finetune_chat_delivered_total": float(self.delivered),
            "finetune_chat_dropped_total": float(self.dropped),
            "finetune_chat_card_edits_total": float(self.cards.edits),
            "finetune_chat_cards_coalesced_total": float(self.coalesced),
        }

    # -- the chat port -------------------------------------------------------------------------------------

    async def notify(self, job: Job, note: Notify) -> None:
        """Queue ``note`` for delivery on the job's platform; returns once it is safely in Redis. (Job changes
        put their notes in the stream themselves; this is for a note that follows no change.)"""
        await self.store.send([note], job.chat.platform if job.chat is not None else "")

    # -- the consumer --------------------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Deliver until ``stop`` is set; what is not delivered by then stays in the stream."""
        self._stop = stop  # the bus makes its group itself, retrying through an outage
        await asyncio.gather(self.bus.run(self.handle, stop, self.handle_many), self.cards.run(stop))

    async def handle_many(self, items: Sequence[dict[str, Any]]) -> None:
        """Entries of one job's lane, in stream order: a card note followed right away by another card note of the
        same job is superseded (a card shows the job as stored when it is drawn, so the later one shows all the
        earlier would have); every other note is handled as :meth:`handle` does, in order."""
        for item, after in zip(items, [*items[1:], None], strict=True):
            if after is not None and _card_of(item) is not None and _card_of(item) == _card_of(after):
                self.coalesced += 1
                continue
            await self.handle(item)

    async def handle(self, item: dict[str, Any]) -> None:
        try:
            note = parse_message(item.get("note"))  # the edge: a stored entry's note becomes a message here
        except ValidationError as exc:
            log.error("dropped a malformed chat outbox entry %s: %s", item.get("id"), exc.errors()[:3])
            return
        if isinstance(note, CostsChart):
            await self._costs_chart(item, note)
            return
        if not isinstance(note, Notify):
            log.error("dropped chat outbox entry %s: a %s, not a note", item.get("id"), note.type)
            return
        name = "pager" if note.channel == "pager" else str(item.get("platform"))
        platform = self.pager if note.channel == "pager" else self.platforms.get(name, self.fallback)
        if platform is None:
            log.warning("no deliverer for platform %r: note %s of %s dropped", name, note.id, note.job_id)
            return
        what = f"{note.channel} note {note.note_type} of {note.job_id}"

        async def deliver(in_doubt: bool) -> bool:
            return await self._deliver(platform, note, in_doubt=in_doubt)

        # Card notes need no record: posting the card is guarded by its ref, and an edit only marks the job.
        if not await self._once(platform, note.id if note.channel != "card" else None, what, deliver):
            return
        # Whatever the note was, the job changed: its card should show that (coalesced, latest state).
        if platform.coalesce_cards:
            await self._until_done(platform, what, lambda: self.cards.mark(note.job_id), gated=False)

    async def _costs_chart(self, item: Mapping[str, Any], chart: CostsChart) -> None:
        """A costs report's chart, into the channel where it was asked, once, as a job's chart is (same retries,
        same record); a platform that posts no images (the console) had the words only."""
        name = str(item.get("platform"))
        platform = self.platforms.get(name, self.fallback)
        poster = platform.channel_images if platform is not None else None
        if platform is None or poster is None:
            log.info("costs chart %s not posted: %r posts no images (its words were the answer)", chart.id, name)
            return
        draw = self._draw_costs(chart)

        async def deliver(in_doubt: bool) -> bool:
            await poster.post_channel_image(chart.chat, f"{chart.id}.png", chart.at, draw, in_doubt)
            return True

        await self._once(platform, chart.id, f"costs chart {chart.id} for {chart.chat.channel}", deliver)

    async def _once(
        self, platform: Platform, note_id: str | None, what: str, attempt: Callable[[bool], Awaitable[bool]]
    ) -> bool:
        """Deliver with ``attempt(in_doubt)`` until it goes or is refused for good, once per ``note_id`` (None: no
        record kept): marked *sending* before the first try, *sent* after. False when it was sent already."""
        sent = self.keys.sent(note_id) if note_id else None
        in_doubt = False
        if sent:
            sending = self.keys.sending(cast(str, note_id))
            done, tried = await self._until_done(platform, what, lambda: self.redis.mget(sent, sending), gated=False)
            if done is not None:
                return False
            in_doubt = tried is not None  # an earlier delivery started and was not heard back from
            if not in_doubt:
                consumer = self.bus.consumer

                async def mark_sending() -> None:
                    await self.store.mark(sending, consumer, SENT_TTL)

                await self._until_done(platform, what, mark_sending, gated=False)

        async def deliver() -> bool:
            nonlocal in_doubt
            try:
                return await attempt(in_doubt)
            except TransientDeliveryError as exc:
                # A timeout or a 5xx may have posted it all the same; a rate limit (it says when) posted nothing.
                in_doubt = in_doubt or exc.retry_after is None
                raise

        if await self._until_done(platform, what, deliver):
            self.delivered += 1
        if sent:  # bookkeeping waits for no gate: stopping now must not hand back what was posted
            await self._until_done(platform, what, lambda: self.store.mark(sent, "1", SENT_TTL), gated=False)
        return True

    async def _deliver(self, platform: Platform, note: Notify, in_doubt: bool = False) -> bool:
        job = await self.store.get(note.job_id)
        if job is None:
            log.warning("note %s is for job %s, which does not exist: dropped", note.id, note.job_id)
            return False
        images = platform.images if isinstance(note.note, ChartNote) else None  # a chart, where images can go
        deliverer = platform.cards
        if deliverer is None:
            plain = cast(Deliverer, platform.deliverer)
            if images is not None:
                await images.post_image(job, note, await self._draw(job), None)
            elif note.channel != "card" or not platform.coalesce_cards:
                await plain.deliver(job, note)
            elif await self.refs.shown_version(job.id) is None:  # the first card goes in order, before the rest
                await plain.deliver(job, note)
                await self.refs.card_shows(job.id, job.version)
            return True
        if note.channel == "card":
            if await self.refs.card(job.id) is None:
                await self._post_card(deliverer, job)
            return True  # an existing card is edited by the refresher, from the mark set after this
        card: MessageRef | None = None
        try:
            card = await self._card(deliverer, job)
        except PermanentDeliveryError as exc:
            log.warning("card of %s cannot be posted: %s", job.id, exc)
        if in_doubt and platform.checks_posted and await cast(PostedCheck, deliverer).posted(job, note, card):
            log.info("the %s note %s of %s was posted already", note.note_type, note.id, job.id)
            return False
        if images is not None:
            await images.post_image(job, note, await self._draw(job), card)
            return True
        await deliverer.post_note(job, note, card)
        return True

    async def _draw(self, job: Job) -> Draw:
        """The job's chart, drawn on demand (off the event loop: matplotlib takes a CPU for a moment) from the
        points kept now."""
        points = await self.series.points(job.id)

        async def draw(lang: Lang, now: datetime) -> bytes:
            try:
                from bot.charts.render import render_chart  # matplotlib loads with the first chart, not the bot

                return await asyncio.to_thread(render_chart, job, points, now, lang)
            except Exception as exc:  # no matplotlib, or data it cannot draw: the same next time; the lane goes on
                log.exception("the chart of %s could not be drawn", job.id)
                raise PermanentDeliveryError(f"the chart of {job.id} could not be drawn: {exc!r}") from exc

        return draw

    def _draw_costs(self, chart: CostsChart) -> DrawPicture:
        """The costs chart, drawn on demand from the report read again (the same window, end and teams as the words
        the person got), with those words as its caption."""

        async def draw(lang: Lang) -> Picture:
            report = await read_costs(self.store, chart.window, chart.end, chart.teams)
            try:
                png = await asyncio.to_thread(costs_png, report, lang)  # matplotlib loads with the first chart drawn
            except Exception as exc:  # no matplotlib, or data it cannot draw: the same next time; the lane goes on
                log.exception("the costs chart %s could not be drawn", chart.id)
                raise PermanentDeliveryError(f"the costs chart {chart.id} could not be drawn: {exc!r}") from exc
            title = text(lang, "costs.chart-title", days=WINDOWS[report.window].days)
            return Picture(png, title, costs_text(report, lang))

        return draw

    async def _card(self, deliverer: CardDeliverer, job: Job) -> MessageRef:
        existing = await self.refs.card(job.id)
        return existing.message if existing is not None else await self._post_card(deliverer, job)

    async def _post_card(self, deliverer: CardDeliverer, job: Job) -> MessageRef:
        """Post the card once, even with several replicas delivering notes of the same job at the same time."""
        lock = self.keys.card_posting(job.id)
        token = uuid.uuid4().hex
        if not await self.redis.set(lock, token, nx=True, px=CARD_POST_LEASE_MS):
            for _ in range(50):  # another replica is posting it: wait for its ref
                await asyncio.sleep(0.1)
                existing = await self.refs.card(job.id)
                if existing is not None:
                    return existing.message
            raise TransientDeliveryError(f"the card of {job.id} is being posted elsewhere")
        try:
            existing = await self.refs.card(job.id)
            if existing is not None:
                return existing.message
            latest = await self.store.get(job.id) or job
            message = await deliverer.post_card(latest)
            await self.refs.save_card(job.id, message, latest.version)
            return message
        finally:
            if await self.redis.get(lock) == token:
                await self.redis.delete(lock)

    async def _until_done(
        self, platform: Platform, what: str, work: Callable[[], Awaitable[Any]], gated: bool = True
    ) -> Any:
        """Run ``work`` until it succeeds or is refused for good (then None); hand the note back on stop.

        ``gated`` work talks to the platform, so it first waits while the platform's gate is closed.
        """
        attempt = 0
        while True:
            if gated and not await platform.gate.wait(self._stop):
                raise HandBack()
            try:
                return await work()
            except TransientDeliveryError as exc:
                attempt += 1
                delay = exc.retry_after if exc.retry_after is not None else backoff(attempt, cap=self.backoff_cap)
                platform.gate.close_for(delay)
                level = logging.WARNING if attempt == 1 or attempt % 20 == 0 else logging.DEBUG
                log.log(level, "%s waits %.1fs (#%d): %s", what, delay, attempt, exc)
            except PermanentDeliveryError as exc:
                self.dropped += 1
                log.warning("dropped the %s: %s", what, exc)
                return None
            except StoreUnavailable as exc:
                attempt += 1
                delay = backoff(attempt, cap=self.backoff_cap)
                log.warning("chat outbox cannot reach Redis (%s): again in %.1fs", exc, delay)
                try:
                    await asyncio.wait_for(self._stop.wait(), delay)
                except TimeoutError:
                    continue
                raise HandBack() from exc


def _card_of(item: Mapping[str, Any]) -> str | None:
    """The job whose card a chat outbox entry refreshes, if it is a card note (read from the entry as stored)."""
    note = item.get("note")
    if isinstance(note, Mapping) and note.get("channel") == "card" and isinstance(note.get("job_id"), str):
        return str(note["job_id"])
    return None
