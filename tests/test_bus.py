"""The event bus against a real Valkey: sharing, exactly-once handling, reclaim after a crash, parking, draining."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from bot.bus import EventBus, HandBack, Handler
from bot.keys import Keys
from bot.redis_server import connect
from bot.store import JobStore
from fakes.bot_harness import drained, eventually
from fakes.restartable_valkey import RestartableValkey
from handlers.change import Change
from handlers.jobs import Job, JobState
from handlers.messages import Launched, dump_message
from tests.redis_fixtures import (  # noqa: F401 - fixtures
    RedisClientFactory,
    fixture_key_prefix,
    fixture_redis_client,
    fixture_redis_client_factory,
    fixture_valkey_url,
)

Consumer = Callable[..., Awaitable[EventBus]]


async def wait_for(condition: Callable[[], bool], timeout: float = 60.0) -> None:
    """Poll ``condition`` until it holds (a generous ``timeout`` only turns a hang into a failure)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.01)


async def pending(bus: EventBus) -> int:
    summary = await bus.redis.xpending(bus.stream, bus.group)
    return int(summary["pending"])


class Running:
    """Consumers started by a test, each on its own connection pool; all stopped at teardown."""

    def __init__(self, factory: RedisClientFactory, stream: str) -> None:
        self.factory = factory
        self.stream = stream
        self.tasks: list[tuple[asyncio.Event, asyncio.Task[None]]] = []

    async def bus(self, consumer: str, **options: Any) -> EventBus:
        options.setdefault("block_ms", 50)
        bus = EventBus(await self.factory(), stream=self.stream, consumer=consumer, **options)
        await bus.ensure_group()
        return bus

    def start(self, bus: EventBus, handler: Handler) -> tuple[asyncio.Event, asyncio.Task[None]]:
        stop = asyncio.Event()
        task = asyncio.create_task(bus.run(handler, stop))
        self.tasks.append((stop, task))
        return stop, task

    async def close(self) -> None:
        for stop, _task in self.tasks:
            stop.set()
        for _stop, task in self.tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait_for(task, 60)


@pytest.fixture
async def running(redis_client_factory: RedisClientFactory, key_prefix: str) -> AsyncIterator[Running]:
    consumers = Running(redis_client_factory, key_prefix + "events")
    yield consumers
    await consumers.close()


async def test_publish_then_handle_and_ack(running: Running) -> None:
    bus = await running.bus("c1")
    seen: list[dict[str, Any]] = []

    async def handler(event: dict[str, Any]) -> None:
        seen.append(event)

    message_id = await bus.publish({"type": "hello", "nested": {"n": [1, 2]}})
    assert "-" in message_id
    running.start(bus, handler)
    await wait_for(lambda: bus.handled == 1)

    assert seen[0]["type"] == "hello" and seen[0]["nested"] == {"n": [1, 2]}
    assert seen[0]["id"]  # given one on publish
    assert await pending(bus) == 0
    assert (bus.failed, bus.parked) == (0, 0)
    assert bus.latency.count == 1 and bus.latency.sum > 0  # the handler ran for some time, and it was measured
    assert bus.latency.cumulative()[-1] == (float("inf"), 1)


async def test_events_published_before_the_group_exists_are_delivered(
    running: Running, redis_client: aioredis.Redis
) -> None:
    early = EventBus(redis_client, stream=running.stream)
    await early.publish({"id": "ev-early-0001"})
    bus = await running.bus("c1")
    await bus.ensure_group()  # idempotent
    seen: list[str] = []

    async def handler(event: dict[str, Any]) -> None:
        seen.append(event["id"])

    running.start(bus, handler)
    await wait_for(lambda: seen == ["ev-early-0001"])


async def test_two_consumers_share_the_work_and_handle_each_event_once(running: Running) -> None:
    buses = [await running.bus("a"), await running.bus("b")]
    handled: list[tuple[str, str]] = []

    def handler_for(name: str) -> Handler:
        async def handler(event: dict[str, Any]) -> None:
            await asyncio.sleep(0.005)
            handled.append((name, event["id"]))

        return handler

    for bus in buses:
        running.start(bus, handler_for(bus.consumer))
    ids = [await buses[0].publish({"id": f"ev-{n:04d}-share", "n": n}) for n in range(40)]
    await wait_for(lambda: len(handled) >= 40)
    await eventually(lambda: drained(buses[0]))  # all acknowledged: no copy can come any more

    counts = Counter(event_id for _name, event_id in handled)
    assert len(ids) == 40 and sorted(counts) == [f"ev-{n:04d}-share" for n in range(40)]
    assert set(counts.values()) == {1}
    by_consumer = Counter(name for name, _id in handled)
    assert by_consumer["a"] > 0 and by_consumer["b"] > 0
    # The server records an acknowledgement before the acking task resumes to count it: wait for the count.
    await wait_for(lambda: buses[0].handled + buses[1].handled >= 40)
    assert buses[0].handled + buses[1].handled == 40
    assert await pending(buses[0]) == 0
    for bus in buses:  # one latency sample per handled event, each covering the handler's 5 ms sleep
        await wait_for(lambda bus=bus: bus.latency.count == bus.handled)  # observed just after the ack counts
        assert bus.latency.sum >= bus.handled * 0.004, (bus.latency.sum, bus.handled)
        counts = [count for _bound, count in bus.latency.cumulative()]
        assert counts == sorted(counts) and counts[-1] == bus.handled  # cumulative buckets, ending at the count


async def test_an_event_a_crashed_consumer_held_is_reclaimed_and_handled(running: Running) -> None:
    crashing = await running.bus("crashing", claim_idle_ms=200)
    started = asyncio.Event()

    async def hang(event: dict[str, Any]) -> None:
        started.set()
        await asyncio.Event().wait()  # never returns

    _stop, task = running.start(crashing, hang)
    await crashing.publish({"id": "ev-orphaned-01"})
    await asyncio.wait_for(started.wait(), 60)
    task.cancel()  # the replica dies mid-event: no ack
    with contextlib.suppress(asyncio.CancelledError):
        await task
    assert await pending(crashing) == 1

    survivor = await running.bus("survivor", claim_idle_ms=200)
    seen: list[str] = []

    async def record(event: dict[str, Any]) -> None:
        seen.append(event["id"])

    running.start(survivor, record)
    await wait_for(lambda: seen == ["ev-orphaned-01"] and survivor.handled == 1)  # handled: acknowledged

    assert survivor.claimed == 1 and survivor.handled == 1
    assert await pending(survivor) == 0


async def test_a_slow_handler_keeps_its_event(running: Running) -> None:
    """The lease is renewed while a handler runs, so a live consumer's event is not taken from it."""
    slow, other = await running.bus("slow", claim_idle_ms=150), await running.bus("other", claim_idle_ms=150)
    handled: list[str] = []
    started = asyncio.Event()

    async def slow_handler(event: dict[str, Any]) -> None:
        started.set()
        await asyncio.sleep(0.6)  # four times claim_idle_ms: without its lease renewed, it is anyone's by now
        scans = other.claim_scans
        await wait_for(lambda: other.claim_scans >= scans + 2)  # and the other consumer has looked since
        handled.append("slow")

    async def other_handler(event: dict[str, Any]) -> None:
        handled.append("other")

    running.start(slow, slow_handler)
    await slow.publish({"id": "ev-slow-00001"})
    await asyncio.wait_for(started.wait(), 60)
    running.start(other, other_handler)
    await wait_for(lambda: handled != [])  # a wrongful reclaim was counted before "slow" (it was looked for)

    assert handled == ["slow"]
    assert other.claimed == 0


async def test_a_poison_event_is_parked_and_the_stream_keeps_flowing(running: Running) -> None:
    bus = await running.bus("c1", max_tries=3, claim_idle_ms=100)
    good: list[int] = []

    async def handler(event: dict[str, Any]) -> None:
        if event.get("poison"):
            raise ValueError("cannot digest this")
        good.append(event["n"])

    running.start(bus, handler)
    await bus.publish({"id": "ev-poison-001", "poison": True})
    for n in range(5):
        await bus.publish({"n": n})
    await wait_for(lambda: bus.parked == 1 and len(good) == 5 and bus.handled == 5)  # handled: acknowledged

    assert good == [0, 1, 2, 3, 4]
    assert bus.failed == 3 and bus.handled == 5
    await wait_for(lambda: bus.latency.count == 5 + 3)  # every delivery is measured, the failed ones too
    [parked] = await bus.parked_events()
    assert parked["event"] == {"id": "ev-poison-001", "poison": True}
    assert parked["deliveries"] == 3
    assert parked["error"] == "ValueError: cannot digest this"
    assert await pending(bus) == 0
    await bus.publish({"n": 5})  # still flowing
    await wait_for(lambda: good[-1:] == [5])


async def test_a_malformed_message_is_parked_at_once(running: Running) -> None:
    bus = await running.bus("c1")
    seen: list[dict[str, Any]] = []

    async def handler(event: dict[str, Any]) -> None:
        seen.append(event)

    await bus.redis.xadd(bus.stream, {"event": "{not json"})
    await bus.redis.xadd(bus.stream, {"other": "field"})
    await bus.publish({"id": "ev-fine-00001"})
    running.start(bus, handler)
    await wait_for(lambda: bus.handled == 1 and bus.parked == 2)

    assert [event["id"] for event in seen] == ["ev-fine-00001"]
    assert all(entry["error"].startswith("malformed") for entry in await bus.parked_events())
    assert bus.failed == 0


async def test_stop_lets_the_handler_in_flight_finish(running: Running) -> None:
    bus = await running.bus("c1")
    started, release, finished = asyncio.Event(), asyncio.Event(), asyncio.Event()

    async def handler(event: dict[str, Any]) -> None:
        started.set()
        await release.wait()  # still in flight when stop is set: it finishes only once released
        finished.set()

    first = await bus.publish({"id": "ev-inflight-01"})
    later = await bus.publish({"id": "ev-later-00001"})
    stop, task = running.start(bus, handler)
    await asyncio.wait_for(started.wait(), 60)
    stop.set()
    release.set()
    await asyncio.wait_for(task, 60)  # generous bounds only turn a hang into a failure

    assert finished.is_set()
    assert bus.handled == 1
    # The finished one was acknowledged; the one read with it but not started was handed back, idle at once
    # and with its delivery count as before it was read.
    [left] = await bus.redis.xpending_range(bus.stream, bus.group, min="-", max="+", count=10)
    assert left["message_id"] == later != first
    assert left["time_since_delivered"] >= bus.claim_idle_ms and left["times_delivered"] == 0
    assert bus.released == 1

    successor = await running.bus("c2")  # what was not handled is there for another replica (at its first look)
    seen: list[str] = []

    async def record(event: dict[str, Any]) -> None:
        seen.append(event["id"])

    running.start(successor, record)
    await wait_for(lambda: seen == ["ev-later-00001"])


async def test_a_handler_waiting_on_something_outside_hands_its_event_back_on_stop(running: Running) -> None:
    bus = await running.bus("c1", max_tries=1)
    waiting, stop = asyncio.Event(), asyncio.Event()

    async def handler(event: dict[str, Any]) -> None:
        waiting.set()
        await stop.wait()  # e.g. a chat platform that is down, until the bot stops
        raise HandBack()

    task = asyncio.create_task(bus.run(handler, stop))
    running.tasks.append((stop, task))
    await bus.publish({"id": "ev-waiting-001"})
    await asyncio.wait_for(waiting.wait(), 60)
    stop.set()
    await asyncio.wait_for(task, 60)

    assert bus.failed == 0 and bus.parked == 0 and bus.released == 1  # not a failure, even with max_tries=1
    [left] = await bus.redis.xpending_range(bus.stream, bus.group, min="-", max="+", count=10)
    assert left["time_since_delivered"] >= bus.claim_idle_ms and left["times_delivered"] == 0

    successor = await running.bus("c2", max_tries=1)
    seen: list[str] = []

    async def record(event: dict[str, Any]) -> None:
        seen.append(event["id"])

    running.start(successor, record)
    await wait_for(lambda: seen == ["ev-waiting-001"])


async def test_the_store_outbox_is_delivered_on_the_bus(
    running: Running, redis_client: aioredis.Redis, key_prefix: str
) -> None:
    store = JobStore(redis_client, Keys(key_prefix))
    job = Job(id="ft-bus1", recipe="tiny", requested_by="U1")
    await store.create(job, {"type": "created"})

    def provision(job: Job) -> Change:
        return Change(
            job=job.model_copy(update={"state": JobState.PROVISIONING}),
            history={"type": "provisioning"},
            outbox=[Launched(job_id=job.id, attempt=1, instance_id="i-1")],  # an input: the events stream
        )

    applied = await store.apply(job.id, provision, "cmd-1")
    assert applied.change is not None
    bus = await running.bus("c1")
    seen: list[dict[str, Any]] = []

    async def handler(event: dict[str, Any]) -> None:
        seen.append(event)

    running.start(bus, handler)
    await wait_for(lambda: len(seen) == 1)
    assert seen == [dump_message(message) for message in applied.change.outbox]


async def test_a_deleted_stream_and_group_are_created_again(running: Running) -> None:
    bus = await running.bus("c1")
    seen: list[str] = []

    async def handler(event: dict[str, Any]) -> None:
        seen.append(event["id"])

    running.start(bus, handler)
    await bus.publish({"id": "ev-before-0001"})
    await wait_for(lambda: seen == ["ev-before-0001"])
    await bus.redis.delete(bus.stream)  # e.g. a server restarted without its data
    await eventually(lambda: has_group(bus))  # the consumer made the stream and its group again by itself
    await bus.publish({"id": "ev-after-00001"})
    await wait_for(lambda: seen == ["ev-before-0001", "ev-after-00001"])


async def has_group(bus: EventBus) -> bool:
    if not await bus.redis.exists(bus.stream):
        return False
    return any(str(group["name"]) == bus.group for group in await bus.redis.xinfo_groups(bus.stream))


@pytest.mark.scenario
async def test_run_survives_an_unreachable_redis_and_still_stops() -> None:
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    client = connect(f"redis://127.0.0.1:{port}")
    try:
        bus = EventBus(client, stream="unreachable:events", consumer="c1", block_ms=50)
        stop = asyncio.Event()
        task = asyncio.create_task(bus.run(lambda event: asyncio.sleep(0), stop))
        await wait_for(lambda: bus.unreachable >= 3 or task.done())  # failed, backed off and tried again, twice
        assert not task.done()  # still trying
        stop.set()
        await asyncio.wait_for(task, 60)
    finally:
        await client.aclose()


async def test_a_handler_that_cannot_reach_redis_waits_for_it_and_nothing_is_parked(
    running: Running, tmp_path: Path
) -> None:
    """Its work needs a Redis that is down: the message stays in hand and runs again once Redis answers, however
    many tries that takes; an outage is no failed delivery (with max_tries=1 any counted failure would park it)."""
    server = RestartableValkey(tmp_path / "redis")  # not started yet: "down"
    client = connect(server.url)
    bus = await running.bus("c1", max_tries=1, claim_idle_ms=200)
    done: list[str] = []

    async def handler(event: dict[str, Any]) -> None:
        await client.set("seen", event["id"])  # ConnectionError until the server is up
        done.append(event["id"])

    running.start(bus, handler)
    await bus.publish({"id": "ev-outage-0001"})
    await wait_for(lambda: bus.outages >= 3)
    await server.start()
    try:
        await wait_for(lambda: bus.handled == 1, timeout=30)
        assert done == ["ev-outage-0001"] and await client.get("seen") == "ev-outage-0001"
        assert bus.failed == 0 and bus.parked == 0 and await pending(bus) == 0
    finally:
        await client.aclose()
        await server.stop()
