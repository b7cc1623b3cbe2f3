"""``redis.durability: replica`` on a real Valkey cluster: a state change is acknowledged only once a replica has
it, so a primary killed right after (SIGKILL, its replica promoted) loses nothing the bot was told was written;
and a change no replica confirms within the bounded wait fails as StoreUnavailable (an outage: the bus runs it
again)."""

from __future__ import annotations

import os
import signal
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.crc import key_slot

from bot.durability import DurableWrites
from bot.errors import ConfigError, StoreUnavailable
from bot.keys import Keys
from bot.partitions import open_keys
from bot.redis_server import RedisHandle
from bot.settings import parse_file_config
from bot.store import JobStore
from fakes.notes import notify
from fakes.valkey_cluster import Node, ValkeyCluster
from handlers.change import Change
from handlers.jobs import Job
from tests.cluster_fixtures import fixture_valkey_cluster, fixture_valkey_cluster_server  # noqa: F401 - fixtures
from tests.redis_fixtures import (  # noqa: F401 - fixtures
    fixture_key_prefix,
    fixture_redis_client,
    fixture_redis_client_factory,
    fixture_valkey_url,
)

PREFIX = "fd:"
REPLICA = DurableWrites("replica", timeout_ms=2000)


@pytest.fixture
async def client(valkey_cluster: ValkeyCluster) -> AsyncIterator[aioredis.Redis]:
    handle = RedisHandle(url=valkey_cluster.url)
    await handle.start()
    try:
        yield handle.client
    finally:
        await handle.close()


def job_on(store: JobStore, cluster: ValkeyCluster, primary: Node) -> str:
    """A job id whose partition ``primary`` serves."""
    for n in range(1000):
        job_id = f"ft-d{n:03d}"
        if cluster.node_of_slot(key_slot(store.keys.job(job_id).encode())).port == primary.port:
            return job_id
    raise AssertionError(f"no job id on {primary.port}")


def with_replica(cluster: ValkeyCluster) -> Node:
    """A primary (as started) whose replica is alive: the one these tests take down."""
    return next(node for node in cluster.nodes[:3] if node.alive() and cluster.replica_of(node).alive())


def step(number: int) -> Any:
    def decide(job: Job) -> Change:
        note = notify(job.id, "thread", "stop-requested", by=f"U{number}")
        return Change(job=job.model_copy(update={"step": number}), history={"type": "step"}, outbox=[note])

    return decide


async def test_a_change_no_replica_confirms_in_time_fails_as_not_durable(
    client: aioredis.Redis, valkey_cluster: ValkeyCluster
) -> None:
    keys = await open_keys(client, PREFIX)
    store = JobStore(client, keys, durability=DurableWrites("replica", timeout_ms=300))
    primary = with_replica(valkey_cluster)
    job_id = job_on(store, valkey_cluster, primary)
    assert await store.create(Job(id=job_id, recipe="tiny", requested_by="U1"), {"type": "created"})
    replica = valkey_cluster.replica_of(primary)
    os.kill(replica.process.pid, signal.SIGSTOP)  # alive, connected, and silent: it acknowledges nothing
    try:
        not_durable = r"^the write reached the primary but not any replica within 300 ms$"
        with pytest.raises(StoreUnavailable, match=not_durable):
            await store.apply(job_id, step(1), dedup_key="ev-1")
    finally:
        os.kill(replica.process.pid, signal.SIGCONT)
    # Once the replica answers again, the event's rerun finds its change written (the dedup key says so).
    assert (await store.apply(job_id, step(1), dedup_key="ev-1")).duplicate


async def test_what_was_acknowledged_survives_its_primarys_death(
    client: aioredis.Redis, valkey_cluster: ValkeyCluster
) -> None:
    keys = await open_keys(client, PREFIX)
    store = JobStore(client, keys, durability=REPLICA)
    primary = with_replica(valkey_cluster)
    job_id = job_on(store, valkey_cluster, primary)
    assert await store.create(Job(id=job_id, recipe="tiny", requested_by="U1"), {"type": "created"})
    for number in range(1, 21):
        assert (await store.apply(job_id, step(number), dedup_key=f"ev-{number}")).changed
    valkey_cluster.kill(primary)  # right after the last acknowledgement: no time for anything to catch up
    valkey_cluster.promote(valkey_cluster.replica_of(primary))

    handle = RedisHandle(url=valkey_cluster.url)
    await handle.start()
    try:
        after = JobStore(handle.client, await open_keys(handle.client, PREFIX))
        job = await after.get(job_id)
        assert job is not None and job.step == 20 and job.version == 20
        assert len(await after.history(job_id)) == 21
        notes = await handle.client.xlen(keys.chat_in(keys.partition_of(job_id)))
        assert notes == 20  # every note written with an acknowledged change: none lost
        for number in range(1, 21):  # and a redelivered event changes nothing
            assert (await after.apply(job_id, step(number), dedup_key=f"ev-{number}")).duplicate
    finally:
        await handle.close()


def test_the_setting_is_read_from_the_config_file_and_a_bad_one_is_refused() -> None:
    assert DurableWrites.of(parse_file_config("redis: {durability: replica}", "t").redis).wait == ("WAIT", 1, 2000)
    assert DurableWrites.of(parse_file_config("redis: {durability: aof}", "t").redis).wait == ("WAITAOF", 1, 0, 2000)
    assert DurableWrites.of(parse_file_config("", "t").redis).wait is None  # none: the default, waits for nothing
    with pytest.raises(ConfigError, match="durability"):
        parse_file_config("redis: {durability: always}", "t")


async def test_on_a_lone_server_aof_waits_for_its_fsync_and_replica_fails_for_want_of_one(
    redis_client: aioredis.Redis, key_prefix: str
) -> None:
    """The embedded Valkey keeps an append-only file and has no replica."""
    aof = JobStore(redis_client, Keys(key_prefix), durability=DurableWrites("aof", timeout_ms=2000))
    assert await aof.create(Job(id="ft-aof", recipe="tiny", requested_by="U1"), {"type": "created"})
    assert (await aof.apply("ft-aof", step(1), dedup_key="ev-1")).changed
    lone = JobStore(redis_client, Keys(key_prefix), durability=DurableWrites("replica", timeout_ms=50))
    with pytest.raises(StoreUnavailable, match=r"^the write reached the primary but not any replica within 50 ms$"):
        await lone.apply("ft-aof", step(2), dedup_key="ev-2")
