"""The event bus's batching against a real Valkey: per-job order, concurrency across jobs, leases, hand-back."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest

from bot.bus import BatchHandler, EventBus, Handler, partition_key
from tests.redis_fixtures import (  # noqa: F401 - fixtures
    RedisClientFactory,
    fixture_key_prefix,
    fixture_redis_client,
    fixture_redis_client_factory,
    fixture_valkey_url,
)
from tests.test_bus import Running, pending, wait_for


@pytest.fixture
async def running(redis_client_factory: RedisClientFactory, key_prefix: str) -> AsyncIterator[Running]:
    consumers = Running(redis_client_factory, key_prefix + "events")
    yield consumers
    await consumers.close()


def report(job_id: str, n: int) -> dict[str, Any]:
    return {"type": "report", "report": {"type": "progress", "job_id": job_id, "step": n}, "n": n}


def test_partition_key_is_the_job_else_the_instance() -> None:
    assert partition_key(report("ft-a1", 1)) == "job:ft-a1"
    assert partition_key({"type": "notify", "job_id": "ft-a1", "channel": "card"}) == "job:ft-a1"
    assert partition_key({"type": "launched", "job_id": "ft-a1", "instance_id": "i-1"}) == "job:ft-a1"
    assert partition_key({"type": "cloud", "instance_id": "i-1"}) == "instance:i-1"
    assert partition_key({"type": "other"}) is None
    assert partition_key({"report": "not a mapping", "job_id": 7}) is None


async def test_one_job_in_stream_order_and_jobs_side_by_side(running: Running) -> None:
    bus = await running.bus("c1")
    running_now: Counter[str] = Counter()
    overlap = 0
    seen: dict[str, list[int]] = {"ft-a1": [], "ft-b2": [], "ft-c3": []}
    violations: list[str] = []  # an assertion in the handler would only make the bus retry the event

    async def handler(event: dict[str, Any]) -> None:
        nonlocal overlap
        job_id = event["report"]["job_id"]
        running_now[job_id] += 1
        if running_now[job_id] != 1:
            violations.append(f"two events of {job_id} ran at once")
        overlap = max(overlap, sum(1 for count in running_now.values() if count))
        await asyncio.sleep(0.002 * (event["n"] % 3))  # uneven, so a lane that ignored order would show it
        seen[job_id].append(event["n"])
        running_now[job_id] -= 1

    for n in range(60):
        await bus.publish(report(list(seen)[n % 3], n))
    running.start(bus, handler)
    await wait_for(lambda: bus.handled == 60)

    for index, job_id in enumerate(seen):
        assert seen[job_id] == list(range(index, 60, 3))
    assert violations == []
    assert overlap > 1  # different jobs did run concurrently
    assert bus.failed == 0
    assert await pending(bus) == 0


async def test_a_message_without_a_key_runs_alone_in_stream_order(running: Running) -> None:
    bus = await running.bus("c1")
    log: list[str] = []
    active: set[str] = set()
    violations: list[str] = []

    async def handler(event: dict[str, Any]) -> None:
        name = event["name"]
        if (name == "barrier" and active) or "barrier" in active:
            violations.append(f"{name} ran beside {active}")
        active.add(name)
        log.append(f"start {name}")
        await asyncio.sleep(0.02 if name.startswith("before") else 0.005)
        log.append(f"end {name}")
        active.discard(name)

    await bus.publish({**report("ft-a1", 1), "name": "before-a"})
    await bus.publish({**report("ft-b2", 1), "name": "before-b"})
    await bus.publish({"name": "barrier"})
    await bus.publish({**report("ft-a1", 2), "name": "after-a"})
    await bus.publish({**report("ft-c3", 1), "name": "after-c"})
    running.start(bus, handler)
    await wait_for(lambda: bus.handled == 5)

    assert violations == [] and bus.failed == 0
    barrier_start, barrier_end = log.index("start barrier"), log.index("end barrier")
    assert {"end before-a", "end before-b"} <= set(log[:barrier_start])
    assert {"start after-a", "start after-c"} <= set(log[barrier_end:])
    assert {"start before-a", "start before-b"} == set(log[:2])  # and those before it ran side by side


async def test_messages_waiting_behind_a_slow_one_keep_their_lease(running: Running) -> None:
    slow = await running.bus("slow", claim_idle_ms=150)
    other = await running.bus("other", claim_idle_ms=150)
    handled: list[tuple[str, int]] = []
    started = asyncio.Event()

    def handler_for(name: str) -> Handler:
        async def handler(event: dict[str, Any]) -> None:
            if event["n"] == 0 and name == "slow":
                started.set()
                await asyncio.sleep(0.6)  # four times claim_idle_ms, with the rest of its lane queued behind it
                scans = other.claim_scans
                await wait_for(lambda: other.claim_scans >= scans + 2)  # and the other consumer has looked since
            handled.append((name, event["n"]))

        return handler

    for n in range(5):
        await slow.publish(report("ft-a1", n))
    running.start(slow, handler_for("slow"))
    await asyncio.wait_for(started.wait(), 60)
    running.start(other, handler_for("other"))
    await wait_for(lambda: len(handled) >= 5)  # a wrongful reclaim was counted before the slow one ended

    assert handled == [("slow", n) for n in range(5)]
    assert other.claimed == 0


async def test_read_ahead_is_bounded_and_the_rest_is_left_to_other_replicas(running: Running) -> None:
    greedy = await running.bus("greedy", max_in_flight=3, batch_size=2)
    release = asyncio.Event()
    got: list[str] = []

    async def stuck(event: dict[str, Any]) -> None:
        got.append("greedy")
        await release.wait()

    for n in range(10):
        await greedy.publish(report(f"ft-j{n}", n))
    running.start(greedy, stuck)
    await wait_for(lambda: len(got) == 3)
    scans = greedy.claim_scans
    await wait_for(lambda: greedy.claim_scans >= scans + 2, timeout=30)  # its loop went round with them in hand
    assert len(got) == 3  # holds three, reads no more while they run
    assert await pending(greedy) == 3  # delivered to it: the three it runs, not one more

    helper = await running.bus("helper")

    async def quick(event: dict[str, Any]) -> None:
        got.append("helper")

    running.start(helper, quick)
    await wait_for(lambda: helper.handled == 7)  # acknowledged, not only begun: else an idle claim may move them
    release.set()
    await wait_for(lambda: greedy.handled == 3)
    assert await pending(greedy) == 0


async def test_a_failed_message_does_not_hold_up_its_lane_and_is_retried(running: Running) -> None:
    bus = await running.bus("c1", claim_idle_ms=100)
    seen: list[int] = []
    failures = 0

    async def handler(event: dict[str, Any]) -> None:
        nonlocal failures
        if event["n"] == 1 and failures == 0:
            failures += 1
            raise RuntimeError("transient")
        seen.append(event["n"])

    for n in range(4):
        await bus.publish(report("ft-a1", n))
    running.start(bus, handler)
    await wait_for(lambda: bus.handled == 4)

    assert seen[:3] == [0, 2, 3] and seen[3] == 1  # retried once idle, after the rest of its lane
    assert bus.failed == 1 and bus.claimed == 1
    assert await pending(bus) == 0


async def test_stop_hands_back_what_did_not_start_to_the_next_replica(running: Running) -> None:
    bus = await running.bus("c1")
    started = asyncio.Event()
    finished: list[int] = []

    async def slow(event: dict[str, Any]) -> None:
        started.set()
        await asyncio.sleep(0.2)
        finished.append(event["n"])

    for n in range(6):
        await bus.publish(report("ft-a1", n))  # one lane: only the first runs before the stop
    stop, task = running.start(bus, slow)
    await asyncio.wait_for(started.wait(), 60)
    stop.set()
    await asyncio.wait_for(task, 60)
    assert finished == [0] and bus.handled == 1 and bus.released == 5

    successor = await running.bus("c2")  # claims stale work first thing, and the handed-back messages are stale
    seen: list[int] = []

    async def record(event: dict[str, Any]) -> None:
        seen.append(event["n"])

    running.start(successor, record)
    await wait_for(lambda: successor.handled == 5)
    assert seen == [1, 2, 3, 4, 5] and successor.claimed == 5
    entries = await successor.redis.xrange(successor.stream)
    assert len(entries) == 6 and await pending(successor) == 0


async def test_cancelling_the_consumer_acknowledges_nothing_more(running: Running) -> None:
    bus = await running.bus("c1")
    started: list[int] = []

    async def hang(event: dict[str, Any]) -> None:
        started.append(event["n"])
        await asyncio.Event().wait()

    for n in range(3):
        await bus.publish(report(f"ft-j{n}", n))  # three lanes: all three run at once
    _stop, task = running.start(bus, hang)
    await wait_for(lambda: len(started) == 3)  # every one in hand, none finished
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    assert bus.handled == 0 and await pending(bus) == 3


def start_with_batches(
    running: Running, bus: EventBus, handler: Handler, batch: BatchHandler
) -> tuple[asyncio.Event, asyncio.Task[None]]:
    """A consumer with a batch handler beside its one-at-a-time handler (stopped with the test's others)."""
    stop = asyncio.Event()
    task = asyncio.create_task(bus.run(handler, stop, batch))
    running.tasks.append((stop, task))
    return stop, task


def name_of(event: dict[str, Any]) -> str:
    return f"{event['report']['job_id']}/{event['n']}" if "report" in event else str(event["name"])


async def test_a_lane_hands_what_waits_in_it_to_the_batch_handler_in_stream_order(running: Running) -> None:
    bus = await running.bus("c1")
    calls: list[list[str]] = []

    async def alone(event: dict[str, Any]) -> None:
        calls.append([name_of(event)])

    async def together(events: Sequence[dict[str, Any]]) -> None:
        calls.append([name_of(event) for event in events])

    for n in range(1, 5):
        await bus.publish(report("ft-a1", n))
    for n in range(1, 4):
        await bus.publish(report("ft-b2", n))
    await bus.publish({"name": "barrier"})  # no key: what was read after it waits for it, in a batch of its own
    await bus.publish(report("ft-a1", 5))
    await bus.publish(report("ft-a1", 6))
    await bus.publish(report("ft-c3", 1))
    start_with_batches(running, bus, alone, together)
    await wait_for(lambda: bus.handled == 11)

    assert sorted(calls[:2]) == [["ft-a1/1", "ft-a1/2", "ft-a1/3", "ft-a1/4"], ["ft-b2/1", "ft-b2/2", "ft-b2/3"]]
    assert calls[2] == ["barrier"]
    assert sorted(calls[3:]) == [["ft-a1/5", "ft-a1/6"], ["ft-c3/1"]]  # a lane of one runs alone
    assert (bus.failed, bus.parked, bus.latency.count) == (0, 0, 11)
    assert await pending(bus) == 0


async def test_a_batch_that_fails_runs_one_message_at_a_time(running: Running) -> None:
    bus = await running.bus("c1", max_tries=2, claim_idle_ms=300)  # the failed one is retried soon
    batches = 0
    handled: list[str] = []

    async def alone(event: dict[str, Any]) -> None:
        if event["n"] == 2:
            raise RuntimeError("poison")
        handled.append(name_of(event))

    async def together(events: Sequence[dict[str, Any]]) -> None:
        nonlocal batches
        batches += 1
        raise RuntimeError("the batch fails")

    for n in range(1, 4):
        await bus.publish(report("ft-a1", n))
    start_with_batches(running, bus, alone, together)
    await wait_for(lambda: bus.handled == 2 and bus.parked == 1)

    assert handled == ["ft-a1/1", "ft-a1/3"]  # each once, in order; the one that fails alone too is parked
    assert batches == 1  # a retry of the poison message comes alone
    assert [event["event"]["n"] for event in await bus.parked_events()] == [2]
    assert await pending(bus) == 0
