"""The chat outbox against a real Valkey: card notes a later card note of the same job supersedes are not drawn
(the card shows the job as stored, so the later one shows all of it); every other note is delivered, in order."""

from __future__ import annotations

import asyncio
import contextlib

import redis.asyncio as aioredis

from bot.chat.delivery import Platform
from bot.chat.outbox import ChatOutbox
from bot.keys import Keys
from bot.store import JobStore
from fakes.notes import notify
from handlers.change import Change
from handlers.failures import Failure
from handlers.jobs import ChatRef, Job
from handlers.messages import Notify
from tests.redis_fixtures import (  # noqa: F401 - fixtures
    RedisClientFactory,
    fixture_key_prefix,
    fixture_redis_client,
    fixture_redis_client_factory,
    fixture_valkey_url,
)
from tests.test_bus import pending, wait_for


class Terminal:
    """A platform that draws every card note it is handed (as a terminal does), recording what it showed."""

    def __init__(self) -> None:
        self.shown: list[tuple[str, int | None, str]] = []  # (channel, the job's step drawn, note id)

    async def deliver(self, job: Job, note: Notify) -> None:
        self.shown.append((note.channel, job.step, note.id))


async def test_superseded_card_notes_are_skipped_and_every_other_note_is_delivered(
    redis_client: aioredis.Redis, redis_client_factory: RedisClientFactory, key_prefix: str
) -> None:
    store = JobStore(redis_client, Keys(key_prefix))
    job = Job.model_validate(
        {"id": "ft-card1", "recipe": "tiny", "requested_by": "U1", "chat": ChatRef(platform="term", channel="c")}
    )
    await store.create(job, {"type": "created"})
    alert = notify(job.id, "alert", "failed", reason=Failure.of("launch-failed", error="disk full"))
    thread = notify(job.id, "thread", "stop-requested", by="console:ann")
    # What the decisions put on the chat stream, in order: three cards, an alert, two cards, a thread note, a card.
    outboxes = [["card"], ["card"], ["card", alert], ["card"], ["card", thread], ["card"]]
    for number, outbox in enumerate(outboxes):
        notes = [notify(job.id, "card", "progress") if item == "card" else item for item in outbox]

        def decide(current: Job, notes: list[Notify] = notes) -> Change:
            return Change(current.model_copy(update={"step": (current.step or 0) + 1}), {"type": "step"}, notes)

        await store.apply(job.id, decide, f"ev-{number}")
    terminal = Terminal()
    outbox = ChatOutbox(
        await redis_client_factory(), store, {"term": Platform(terminal, coalesce_cards=False)}, consumer="c1"
    )
    stop = asyncio.Event()
    task = asyncio.create_task(outbox.run(stop))  # everything is on the stream already: read in one go
    try:
        await wait_for(lambda: outbox.bus.handled == 8)
    finally:
        stop.set()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(task, 60)

    assert [(channel, step) for channel, step, _id in terminal.shown] == [
        ("card", 6),  # the three card notes before the alert: one card, drawn from the job as it is
        ("alert", 6),
        ("card", 6),
        ("thread", 6),
        ("card", 6),
    ]
    assert [note_id for _channel, _step, note_id in terminal.shown[1::2]] == [alert.id, thread.id]
    assert (outbox.coalesced, outbox.delivered, outbox.bus.failed) == (3, 5, 0)
    assert await pending(outbox.bus) == 0  # the superseded ones are acknowledged too
