"""The store on a real Valkey cluster (three primaries, three replicas): every script and pipeline it runs stays in
one slot (the cluster client refuses one that would not), and a store's keys spread over every primary."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.asyncio.connection import AbstractConnection
from redis.crc import key_slot
from redis.exceptions import RedisClusterException, ResponseError

from bot.bus_set import BusSet, bus_for
from bot.chat.delivery import MessageRef
from bot.chat.refs import ChatRefs
from bot.errors import ConfigError, StoreUnavailable
from bot.keys import CLUSTER_PARTITIONS, Keys
from bot.partitions import PARTITIONS_FIELD, open_keys
from bot.redis_server import MappedRedisCluster, RedisHandle
from bot.store import JobCapReached, JobStore
from bot.timers import Timers
from fakes.notes import notify
from fakes.valkey_cluster import ValkeyCluster
from handlers.caps import Caps
from handlers.change import Change
from handlers.clock import utcnow
from handlers.jobs import Attempt, ChatRef, Job, JobState
from handlers.messages import Launch, Launched, StartDeadline
from tests.cluster_fixtures import fixture_valkey_cluster, fixture_valkey_cluster_server  # noqa: F401 - fixtures

PREFIX = "fc:"


@pytest.fixture
async def client(valkey_cluster: ValkeyCluster) -> AsyncIterator[aioredis.Redis]:
    handle = RedisHandle(url=valkey_cluster.url)
    await handle.start()
    try:
        yield handle.client
    finally:
        await handle.close()


def job_ids_on_every_primary(keys: Keys, cluster: ValkeyCluster, per_primary: int = 2) -> list[str]:
    """Job ids whose partitions lie on each of the three primaries, ``per_primary`` of each."""
    chosen: dict[int, list[str]] = {}
    for n in range(1000):
        job_id = f"ft-c{n:03d}"
        port = cluster.node_of_slot(key_slot(keys.job(job_id).encode())).port
        if len(chosen.setdefault(port, [])) < per_primary:
            chosen[port].append(job_id)
        if len(chosen) == 3 and all(len(ids) == per_primary for ids in chosen.values()):
            return [job_id for ids in chosen.values() for job_id in ids]
    raise AssertionError("no job ids reach every primary")


def new_job(job_id: str, **fields: Any) -> Job:
    chat = ChatRef(platform="console", channel="C1")
    return Job.model_validate({"id": job_id, "recipe": "tiny", "requested_by": "U1", "chat": chat, **fields})


def launched(instance_id: str) -> Any:
    def decide(job: Job) -> Change:
        attempt = Attempt(number=job.attempt + 1, instance_id=instance_id, zone="local-a")
        updated = job.model_copy(update={"state": JobState.PROVISIONING, "attempts": [*job.attempts, attempt]})
        note = notify(job.id, "thread", "stop-requested", by="U1")
        return Change(job=updated, history={"type": "launched"}, outbox=[note])

    return decide


def ended(job: Job) -> Change:
    updated = job.model_copy(update={"state": JobState.SUCCEEDED, "updated_at": utcnow() - timedelta(days=60)})
    return Change(job=updated, history={"type": "state", "to": "SUCCEEDED"})


async def test_a_cluster_is_found_at_redis_url_and_a_new_store_gets_its_partitions(
    client: aioredis.Redis, valkey_cluster: ValkeyCluster
) -> None:
    assert isinstance(client, MappedRedisCluster)
    keys = await open_keys(client, PREFIX)
    assert keys.partitions == CLUSTER_PARTITIONS
    assert (await open_keys(client, PREFIX, partitions=4)).partitions == CLUSTER_PARTITIONS  # recorded: it stays


async def test_a_store_of_one_partition_found_on_a_cluster_is_refused_and_its_data_left_as_it_is(
    client: aioredis.Redis,
) -> None:
    await client.hset(Keys("old:").layout, PARTITIONS_FIELD, "1")  # a store a bot on a single server created
    await client.zadd(Keys("old:").created, {"ft-old": 1.0})
    with pytest.raises(ConfigError, match="one partition"):
        await open_keys(client, "old:")
    assert await client.zcard(Keys("old:").created) == 1
    with pytest.raises(ConfigError):  # and so it stays (recorded: the next start says the same)
        await open_keys(client, "old:")


async def test_every_script_and_pipeline_of_the_store_runs_on_the_cluster(
    client: aioredis.Redis, valkey_cluster: ValkeyCluster
) -> None:
    keys = await open_keys(client, PREFIX)
    store = JobStore(client, keys)
    ids = job_ids_on_every_primary(keys, valkey_cluster)
    due = utcnow() - timedelta(seconds=1)
    for number, job_id in enumerate(ids):
        outbox = [Launch(job_id=job_id, attempt=1), StartDeadline(job_id=job_id, attempt=1, due=due)]
        roomy = Caps("user:U1", None, 1, len(ids) + 5, len(ids) + 5, None)
        assert await store.create(new_job(job_id), {"type": "created"}, outbox, caps=roomy)
        assert await store.apply(job_id, launched(f"i-{number}"), dedup_key=f"in:{job_id}")
    with pytest.raises(JobCapReached) as full:  # the node caps count every partition's active jobs
        await store.create(new_job("ft-over", requested_by="U2"), {"type": "created"}, caps=Caps("user:U2", None, 1, 5, len(ids), None))  # noqa: E501
    assert full.value.full == "total"
    with pytest.raises(JobCapReached) as full:
        await store.create(new_job("ft-over"), {"type": "created"}, caps=Caps("user:U1", None, 1, len(ids), None, None))
    assert full.value.full == "group"
    assert await store.active_nodes("user:U1") == (len(ids), len(ids))
    assert (await store.apply(ids[0], launched("i-x"), dedup_key=f"in:{ids[0]}")).duplicate
    many = await store.apply_many(ids[1], [(launched("i-y"), "a"), (launched("i-z"), "b"), (launched("i-z"), "a")])
    assert [applied.duplicate for applied in many] == [False, False, True]

    # Effects, messages of no change, reads across partitions.
    assert await store.finish_effect("launch-1", "instance:i-0", [Launched(job_id=ids[0], attempt=1, instance_id="i-0")], job_id=ids[0]) is None  # noqa: E501
    assert await store.effect_record("launch-1", ids[0]) == "instance:i-0"
    await store.send([notify(job_id, "thread", "stop-requested", by="U1") for job_id in ids])
    assert {job.id for job in await store.list_jobs()} == set(ids)
    assert {job.id for job in await store.list_jobs([JobState.PROVISIONING])} == set(ids)
    assert len(await store.recent(ChatRef(platform="console", channel="C1"), count=4)) == 4
    assert len(await store.recent(count=100)) == len(ids)
    assert (await store.counts_by_state())[JobState.PROVISIONING] == len(ids)
    assert [entry["type"] for entry in await store.history(ids[0])] == ["created", "launched"]
    assert await store.jobs_for_instances(["i-0", "i-3", "i-none"]) == {"i-0": ids[0], "i-3": ids[3]}
    assert await store.job_for_instance("i-z") == ids[1]
    assert await store.claim_once("slack:abc") and not await store.claim_once("slack:abc")
    assert await store.was_done("slack:abc")
    await store.audit({"what": "start"})
    assert await store.audit_log() == [{"what": "start"}]

    # Timers: every partition's fire onto its own events stream.
    timers = Timers(client, keys)
    await timers.schedule(StartDeadline(job_id=ids[2], attempt=2, due=due))
    assert len(await timers.pending()) == len(ids) + 1
    assert await timers.fire_due() == len(ids) + 1
    assert await timers.pending() == []

    # The chat outbox's refs and marks (read together) and the card and page refs.
    refs = ChatRefs(client, keys)
    await refs.save_card(ids[0], MessageRef(channel="C1", ts="1.0"), 3)
    await refs.add_page(ids[0], MessageRef(channel="C1", ts="2.0"))
    assert await refs.shown_version(ids[0]) == 3 and len(await refs.pages(ids[0])) == 1
    assert await client.mget(keys.sent("note-1"), keys.sending("note-1")) == [None, None]

    # Retention: ended jobs go with everything that names them.
    for job_id in ids[:2]:
        await store.apply(job_id, ended)
    assert await store.sweep(utcnow() - timedelta(days=30)) == 2
    assert {job.id for job in await store.list_jobs()} == set(ids[2:])

    # Each job's keys in one slot; the store's keys on every primary.
    for job_id in ids[2:]:
        part = keys.partition_of(job_id)
        slots = {key_slot(key.encode()) for key in (keys.job(job_id), keys.history(job_id), keys.events_in(part))}
        assert len(slots) == 1
    holders = {node.port for node in valkey_cluster.primaries() if node.client().dbsize() > 0}
    assert holders == {node.port for node in valkey_cluster.primaries()} and len(holders) == 3


async def test_the_consumers_read_every_partition(client: aioredis.Redis, valkey_cluster: ValkeyCluster) -> None:
    keys = await open_keys(client, PREFIX)
    bus = bus_for(client, keys, "events", consumer="c1", claim_idle_ms=60_000)
    assert isinstance(bus, BusSet) and len(bus.buses) == keys.partitions
    await bus.ensure_group()
    ids = job_ids_on_every_primary(keys, valkey_cluster)
    for job_id in ids:
        await bus.publish({"id": f"ev-{job_id}", "job_id": job_id})
    seen: list[str] = []
    stop = asyncio.Event()

    async def handle(event: dict[str, Any]) -> None:
        seen.append(str(event["job_id"]))
        if len(seen) == len(ids):
            stop.set()

    await asyncio.wait_for(bus.run(handle, stop), 60)
    assert sorted(seen) == sorted(ids) and bus.handled == len(ids)
    for job_id in ids:  # each went to its job's own partition
        assert await client.xlen(keys.events_in(keys.partition_of(job_id))) >= 1


async def test_a_script_that_would_touch_two_slots_is_refused(client: aioredis.Redis) -> None:
    """The check above can fail: the store's apply script given two partitions' keys is refused by the cluster."""
    keys = await open_keys(client, PREFIX)
    store = JobStore(client, keys)
    job_id = "ft-c000"
    others = (f"ft-c{n:03d}" for n in range(1, 100))
    other = next(other for other in others if keys.partition_of(other) != keys.partition_of(job_id))
    await store.create(new_job(job_id), {"type": "created"})
    raw = await client.get(keys.job(job_id))
    crossing = [keys.job(job_id), *(keys.state(JobState.PENDING, 0) for _ in range(3)), keys.history(other)]
    options = json.dumps({"write": False, "job_id": job_id, "dedup_ttl": 60, "instances": [], "routes": []})
    with pytest.raises((RedisClusterException, ResponseError), match=r"(?i)slot"):
        await store._apply(keys=crossing, args=[options, raw, ""])


async def test_a_connection_closed_under_a_command_is_an_outage_and_any_other_attribute_error_stays_a_bug(
    client: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """redis-py 8.1's cluster client, failing over, can write on a connection its rediscovery just closed: an
    AttributeError that ended a partition's consumer until it was an outage like the rest (bench/cluster_path.py)."""
    await client.set(f"{PREFIX}probe", "1")
    message = "'NoneType' object has no attribute 'writelines'"

    async def closed_under_it(self: AbstractConnection, *args: Any, **kwargs: Any) -> None:
        raise AttributeError(message)

    monkeypatch.setattr(AbstractConnection, "send_packed_command", closed_under_it)
    with pytest.raises(StoreUnavailable, match="writelines"):
        await client.get(f"{PREFIX}probe")
    with pytest.raises(StoreUnavailable, match="writelines"):
        async with client.pipeline(transaction=False) as pipe:
            pipe.get(f"{PREFIX}probe")
            await pipe.execute()
    message = "'Job' object has no attribute 'nodes'"
    with pytest.raises(AttributeError, match="nodes"):
        await client.get(f"{PREFIX}probe")
    monkeypatch.undo()
    assert await client.get(f"{PREFIX}probe") == "1"
